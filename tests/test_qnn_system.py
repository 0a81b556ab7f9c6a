"""Reading QNN context binaries and DLCs back with the vendor's libQnnSystem (genie_build.qnn_wheel.system).

The binaries are compiled here from tiny QDQ models by the wheel's HTP backend (tests/qnn_helpers.py): what is read
back is compared with what the models say. The layout and decoding tests need no wheel; the rest skip with one
reason where the onnxruntime-qnn wheel is not installed.
"""

from __future__ import annotations

import ctypes
import importlib.util
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from genie_build.errors import GenieBuildError
from genie_build.qnn_wheel import locate_wheel, system
from genie_build.qnn_wheel.system import HtpGraphBlob, read_context_binary, read_dlc
from genie_build.toolchains.base import QuantInfo, TensorInfo
from qnn_helpers import SM8650, TinyQdq, compile_context_binary, dump_dlc, write_tiny_qdq


def _wheel_missing() -> str | None:
    try:
        locate_wheel()
    except GenieBuildError as error:
        return str(error)
    return None


WHEEL_MISSING = _wheel_missing()
needs_wheel = pytest.mark.skipif(WHEEL_MISSING is not None, reason=WHEEL_MISSING or "")
BINARY_REFUSED = "not a QNN context binary that libQnnSystem can read"
DLC_REFUSED = "not a DLC that libQnnSystem can read"
PROMPT, TOKEN = "prompt_ar4_cl16_1_of_1", "token_ar1_cl16_1_of_1"
# One changed byte of the shared binary below that makes QnnSystemContext_getMetadata segfault (found by fuzzing
# the binary QNN 2.51 writes for these models; the compile is deterministic).
CRASHING_BYTE = (456, 222)


def io_of(model: TinyQdq) -> tuple[TensorInfo, TensorInfo]:
    """The IO the binary should report for ``model``: uint16, QNN's offset = -(the Q/DQ zero point)."""
    def tensor(name: str, shape: tuple[int, ...], scale: np.float32, zero_point: int) -> TensorInfo:
        return TensorInfo(name, shape, "uint16", QuantInfo("uint16", float(scale), -zero_point, 16))
    return (tensor(model.input_name, model.input_shape, model.input_scale, model.input_zero_point),
            tensor(model.output_name, model.output_shape, model.output_scale, model.output_zero_point))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TinyQdq]:
    folder = tmp_path_factory.mktemp("qdq")
    return {PROMPT: write_tiny_qdq(folder / "prompt.onnx", seq=4), TOKEN: write_tiny_qdq(folder / "token.onnx", seq=1)}


@pytest.fixture(scope="module")
def shared(models: dict[str, TinyQdq], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both graphs in one weight-shared binary for SM8750, O3, 8 MB of VTCM."""
    if WHEEL_MISSING:
        pytest.skip(WHEEL_MISSING)
    return compile_context_binary([(model.path, name) for name, model in models.items()],
                                  tmp_path_factory.mktemp("shared"), vtcm_mb=8)


@pytest.fixture(scope="module")
def sm8650(models: dict[str, TinyQdq], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The prompt graph alone (no weight sharing) for SM8650, O2, the default VTCM."""
    if WHEEL_MISSING:
        pytest.skip(WHEEL_MISSING)
    return compile_context_binary([(models[PROMPT].path, PROMPT)], tmp_path_factory.mktemp("sm8650"), device=SM8650,
                                  optimization_level=2)


@needs_wheel
def test_a_weight_shared_binary_reads_back_with_its_graphs_their_io_and_encodings(shared, models):
    binary = read_context_binary(shared)
    assert [graph.name for graph in binary.graphs] == [PROMPT, TOKEN]
    for graph in binary.graphs:
        assert (graph.info.inputs + graph.info.outputs) == io_of(models[graph.name])
        assert graph.encodings == {"x": "scale_offset", "y": "scale_offset"}
    assert (binary.backend_id, binary.soc_model, binary.dsp_arch) == (6, 69, "v79")
    assert binary.build_id.startswith(f"v{locate_wheel().qnn_version}.")
    assert binary.file_bytes == shared.stat().st_size and 0 < binary.context_blob_bytes < binary.file_bytes
    assert all(version.count(".") == 2 for version in (binary.core_api_version, binary.backend_api_version,
                                                        binary.context_blob_version))


@needs_wheel
def test_the_htp_graph_blob_says_what_the_compile_asked_and_where_the_weights_are(shared, sm8650):
    blobs = [graph.htp for graph in read_context_binary(shared).graphs]
    assert [blob.versions for blob in blobs] == [(1, 2), (1, 2)]
    assert [(blob.optimization_level, blob.vtcm_bytes, blob.spill_fill_bytes) for blob in blobs] == \
        [(3, 8 << 20, 0)] * 2
    assert all(blob.shared_weights_bytes > 0 and blob.const_bytes == 0 for blob in blobs)
    alone = read_context_binary(sm8650).graphs[0].htp
    assert (alone.optimization_level, alone.shared_weights_bytes) == (2, 0) and alone.const_bytes > 0


@needs_wheel
def test_another_soc_is_read_as_compiled(sm8650, models):
    binary = read_context_binary(sm8650)
    assert (binary.soc_model, binary.dsp_arch) == (57, "v75")
    assert [(graph.name, graph.info.inputs + graph.info.outputs) for graph in binary.graphs] == \
        [(PROMPT, io_of(models[PROMPT]))]


@needs_wheel
def test_the_dlc_the_execution_provider_dumps_opens_again_with_its_graph_and_io(models, tmp_path):
    path = dump_dlc(models[PROMPT].path, tmp_path)
    dlc = read_dlc(path)
    # ORT names the graph (and the file after it); the IO keeps the model's names and the Q/DQ encodings.
    assert [graph.name for graph in dlc.graphs] == [path.stem]
    assert dlc.graphs[0].name.startswith("QNNExecutionProvider_")
    assert dlc.graphs[0].info.inputs + dlc.graphs[0].info.outputs == io_of(models[PROMPT])
    assert (dlc.graphs[0].htp, dlc.file_bytes) == (None, path.stat().st_size)


def _hostile(kind: str, folder: Path, shared: Path) -> Path:
    path = folder / f"{kind}.bin"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(shared.read_bytes()[: shared.stat().st_size // 2])
    elif kind == "random bytes":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 1 << 16, dtype=np.uint8).tobytes())
    elif kind == "text":
        path.write_text("prompt_ar32_cl256_1_of_6\n" * 100)
    elif kind == "huge":
        with path.open("wb") as file:  # 8 GiB, sparse: no disk used
            file.truncate(8 << 30)
    elif kind == "a ZIP archive":
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("model", "not a graph")
    return path


@needs_wheel
@pytest.mark.parametrize("kind", ["empty", "truncated", "random bytes", "text", "huge", "a ZIP archive"])
def test_a_hostile_file_is_one_line_naming_it_quickly(kind, shared, tmp_path):
    path = _hostile(kind, tmp_path, shared)
    for reader, refused in ((read_context_binary, BINARY_REFUSED), (read_dlc, DLC_REFUSED)):
        start = time.monotonic()
        with pytest.raises(GenieBuildError) as raised:
            reader(path)
        message = str(raised.value)
        assert message.startswith(f"{path}: {refused}: ") and "\n" not in message
        assert time.monotonic() - start < 20, message


@needs_wheel
def test_a_binary_given_as_a_dlc_and_a_dlc_given_as_a_binary_are_refused(shared, models, tmp_path):
    with pytest.raises(GenieBuildError, match=f"{DLC_REFUSED}: not a ZIP archive"):
        read_dlc(shared)
    dlc = dump_dlc(models[TOKEN].path, tmp_path)
    with pytest.raises(GenieBuildError, match=f"{BINARY_REFUSED}: libQnnSystem refused it .*malformed binary"):
        read_context_binary(dlc)


@needs_wheel
def test_a_binary_that_crashes_the_library_is_one_line_naming_the_signal(shared, tmp_path):
    offset, value = CRASHING_BYTE
    data = bytearray(shared.read_bytes())
    data[offset] = value
    path = tmp_path / "corrupt.bin"
    path.write_bytes(data)
    with pytest.raises(GenieBuildError) as raised:
        read_context_binary(path)
    assert str(raised.value) == f"{path}: {BINARY_REFUSED}: reading it crashed (SIGSEGV)"


@needs_wheel
def test_the_reader_is_stopped_after_its_timeout(shared):
    start = time.monotonic()
    with pytest.raises(GenieBuildError, match=f"{BINARY_REFUSED}: libQnnSystem gave no answer within 0.01 s"):
        read_context_binary(shared, timeout=0.01)
    assert time.monotonic() - start < 5


@needs_wheel
def test_the_reader_works_within_its_address_space_limit(shared, tmp_path):
    # The library refuses a binary with bytes after its end; mapping 300 MiB in 128 MiB fails first.
    padded = tmp_path / "padded.bin"
    padded.write_bytes(shared.read_bytes())
    with padded.open("r+b") as file:
        file.truncate(300 << 20)
    with pytest.raises(GenieBuildError, match="malformed binary"):
        read_context_binary(padded)
    with pytest.raises(GenieBuildError, match="reading it needs more than 134,217,728 B of address space"):
        read_context_binary(padded, address_space=128 << 20)
    assert read_context_binary(shared, address_space=128 << 20).graphs


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(GenieBuildError, match="no such file"):
        read_context_binary(tmp_path / "part.bin")


@needs_wheel  # installed, then hidden
def test_a_missing_wheel_is_the_one_line_naming_the_requirements_file(tmp_path, monkeypatch):
    path = tmp_path / "part.bin"
    path.write_bytes(b"\0" * 64)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "onnxruntime_qnn" else real_find_spec(name, *args))
    locate_wheel.cache_clear()
    try:
        with pytest.raises(GenieBuildError) as raised:
            read_context_binary(path)
    finally:
        locate_wheel.cache_clear()
    assert str(raised.value).startswith(f"{system._WHAT}: the onnxruntime-qnn wheel is not installed")
    assert str(raised.value).endswith(": pip install -r envs/requirements-qnn.txt")


# --- Layouts and decoding, without the library ----------------------------------------------------------------------

def test_the_structures_have_the_sizes_and_offsets_of_qnns_abi():
    assert ctypes.sizeof(system._Tensor) == 144
    assert ctypes.sizeof(system._GraphInfo) == 88
    binary_v3 = dict(dict(system._BinaryInfo._fields_)["u"]._fields_)["v3"]
    assert (binary_v3.num_graphs.offset, binary_v3.graphs.offset) == (88, 96)
    # Read from the library: the SoC model and the context metadata behind them.
    assert (binary_v3.context_metadata_size.offset, binary_v3.soc_model.offset) == (112, 128)


def _c_tensor(name: bytes, data_type: int, shape: list[int], *, version: int = 1, encoding: int = 0,
            definition: int = 1, keep: list) -> system._Tensor:
    tensor = system._Tensor(version=version)
    body = tensor.u.v1 if version == 1 else tensor.u.v2
    dimensions = (ctypes.c_uint32 * len(shape))(*shape)
    keep.append(dimensions)
    body.name, body.data_type, body.rank, body.dimensions = name, data_type, len(shape), dimensions
    body.quantize_params.definition, body.quantize_params.encoding = definition, encoding
    return tensor


@pytest.mark.parametrize("version", [1, 2])
def test_binary_info_versions_1_and_2_are_read_with_spill_fill_from_the_hardware_blob(version):
    keep: list = []
    quantized = _c_tensor(b"x", 0x0416, [1, 4, 8], version=2, keep=keep)
    quantized.u.v2.quantize_params.u.scale_offset.scale, quantized.u.v2.quantize_params.u.scale_offset.offset = \
        0.5, -33288
    tensors = (system._Tensor * 2)(quantized, _c_tensor(b"mask", 0x0232, [1, 16], keep=keep))
    graph = system._GraphInfo(version=1)
    graph.u.v1.name, graph.u.v1.num_inputs, graph.u.v1.inputs = b"prompt", 2, tensors
    graph.u.v1.num_outputs = 0
    graphs = (system._GraphInfo * 1)(graph)
    hw_blob = ctypes.create_string_buffer(np.array([1, 0, 0, 0], np.uint32).tobytes()
                                          + np.array([12345], np.uint64).tobytes())
    info = system._BinaryInfo(version=version)
    body = getattr(info.u, f"v{version}")
    body.backend_id, body.build_id, body.num_graphs, body.graphs = 6, b"v2.0.0", 1, graphs
    body.hw_info_blob, body.hw_info_blob_size = ctypes.cast(hw_blob, ctypes.c_void_p), 24
    body.context_blob_version.major = 3
    data = system._binary_dict(info)
    assert (data["soc_model"], data["dsp_arch"], data["context_blob_version"]) == (None, None, "3.0.0")
    read = system._graph(data["graphs"][0])
    assert read.info.inputs == (TensorInfo("x", (1, 4, 8), "uint16", QuantInfo("uint16", 0.5, -33288, 16)),
                                TensorInfo("mask", (1, 16), "float32", None))
    assert read.htp == HtpGraphBlob(versions=(), spill_fill_bytes=12345)


@pytest.mark.parametrize(("encoding", "expected"), [
    (1, ("axis_scale_offset", QuantInfo("int8", bitwidth=8))),
    (4, ("block", QuantInfo("int8", bitwidth=8))),
    (2, ("bw_scale_offset", QuantInfo("int8", 0.25, 0, 4))),
    (99, ("encoding 99", QuantInfo("int8", bitwidth=8))),
])
def test_other_encodings_are_named_and_never_read_as_a_single_scale(encoding, expected):
    keep: list = []
    tensor = _c_tensor(b"w", 0x0308, [4], encoding=encoding, keep=keep)
    tensor.u.v1.quantize_params.u.bw_scale_offset.bitwidth = 4       # garbage to every other encoding
    tensor.u.v1.quantize_params.u.bw_scale_offset.scale = 0.25
    data = system._tensor_dict(tensor)
    assert (data["quant"]["encoding"], system._tensor(data).quant) == expected


def test_an_unknown_version_is_refused_by_name():
    with pytest.raises(system._Refused, match="tensor version 3 is unknown"):
        system._tensor_dict(system._Tensor(version=3))
    with pytest.raises(system._Refused, match="graph info version 4 is unknown"):
        system._graph_dict(system._GraphInfo(version=4), 6)
    with pytest.raises(system._Refused, match="cut short or of an unknown version"):
        system._htp_blob(np.array([3, 0], np.uint32).tobytes())


def test_the_htp_graph_blob_is_read_in_either_version_or_both():
    v1 = np.array([1, 0], np.uint32).tobytes() + np.array([4096], np.uint64).tobytes() + \
        np.array([8 << 20, 3, 0, 0, 0, 0], np.uint32).tobytes()
    v2 = np.array([2, 0], np.uint32).tobytes() + np.array([256, 64, 1, 10, 20, 30, 40, 50], np.uint64).tobytes()
    assert len(v1) == 40 and len(v2) == 72
    both = system._htp_blob(v1 + v2)
    assert (both["spill_fill_bytes"], both["vtcm_bytes"], both["optimization_level"]) == (4096, 8 << 20, 3)
    assert (both["io_tensor_bytes"], both["shared_weights_bytes"], both["versions"]) == (10, 50, [1, 2])
    assert system._htp_blob(v2)["versions"] == [2] and "spill_fill_bytes" not in system._htp_blob(v2)


@pytest.mark.parametrize(("code", "expected"), [
    (0x0416, ("uint16", 16, True)), (0x0308, ("int8", 8, True)), (0x0304, ("int4", 4, True)),
    (0x0232, ("float32", 32, False)), (0x0216, ("float16", 16, False)), (0x0032, ("int32", 32, False)),
    (0x0164, ("uint64", 64, False)), (0x0226, ("bfloat16", 16, False)), (0x0508, ("bool", 8, False)),
    (0x7FFFFFFF, ("qnn_datatype_0x7fffffff", None, False)),
])
def test_qnn_data_types_are_named_as_the_project_names_them(code, expected):
    assert system._dtype(code) == expected
