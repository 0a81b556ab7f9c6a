"""The qnn-cli toolchain against recording doubles of the SDK executables (tests/doubles)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from genie_build.conventions import graph_name
from genie_build.errors import GenieBuildError
from genie_build.toolchains import get_toolchain
from genie_build.toolchains.base import CompileOptions
from genie_build.toolchains.context_binary_json import binary_info_from_utility_json
from genie_build.toolchains.qnn_cli import QnnCliToolchain
from doubles import compile_options, FAIL_VARIABLE, LOG_VARIABLE, install_fake_sdk, read_log, write_tiny_part

# Spaces, both quotes, $ and a backtick: anything a shell would reinterpret.
AWKWARD = "dir with space 'single' \"double\" $HOME `tick`"
PROMPT = graph_name("prompt", 32, 256, 1, 2)
TOKEN = graph_name("token", 1, 256, 1, 2)


def options(**changes) -> CompileOptions:
    return compile_options(**{"vtcm_mb": 8, **changes})


@pytest.fixture
def sdk(tmp_path, monkeypatch) -> Path:
    root = install_fake_sdk(tmp_path / "sdk")
    monkeypatch.setenv("QAIRT_SDK_ROOT", str(root))
    monkeypatch.setenv(LOG_VARIABLE, str(tmp_path / "calls.jsonl"))
    monkeypatch.delenv(FAIL_VARIABLE, raising=False)
    return root


@pytest.fixture
def work(tmp_path) -> Path:
    return tmp_path / AWKWARD


def convert_both(work: Path) -> dict[str, Path]:
    """Both graphs of part 1 converted, keyed by graph name (prompt first), as the compile rule passes them."""
    toolchain = QnnCliToolchain()
    result = {}
    for name, kind, ar in ((PROMPT, "prompt", 32), (TOKEN, "token", 1)):
        onnx_path, encodings_path = write_tiny_part(work / "parts" / kind, ar)
        out = work / "converted" / "qnn-cli-fp16" / kind / "part_1_of_2.dlc"
        toolchain.convert(onnx_path, encodings_path, out, graph_name=name, float_bitwidth=16)
        result[name] = out
    return result


@pytest.fixture(scope="module")
def converted_once(tmp_path_factory) -> dict[str, Path]:
    """Converting costs a second per graph (the fake converter imports onnx): done once for the compile tests."""
    base = tmp_path_factory.mktemp("once")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QAIRT_SDK_ROOT", str(install_fake_sdk(base / "sdk")))
        patch.delenv(LOG_VARIABLE, raising=False)
        patch.delenv(FAIL_VARIABLE, raising=False)
        return convert_both(base / AWKWARD)


@pytest.fixture
def converted(converted_once, sdk, work) -> dict[str, Path]:
    """This test's own copies of the converted DLCs."""
    copies = {}
    for name, path in converted_once.items():
        copies[name] = work / "converted" / name / path.name
        copies[name].parent.mkdir(parents=True)
        shutil.copyfile(path, copies[name])
    return copies


def calls(tmp_path: Path, tool: str) -> list[dict]:
    return [entry for entry in read_log(tmp_path / "calls.jsonl") if entry.get("tool") == tool]


def flags(argv: list[str]) -> dict[str, str]:
    """``["--a", "1", "--b", "2"]`` -> ``{"--a": "1", "--b": "2"}``, refusing anything else."""
    if len(argv) % 2 or not all(key.startswith("--") for key in argv[::2]):
        raise AssertionError(f"argv is not --flag value pairs: {argv}")
    return dict(zip(argv[::2], argv[1::2], strict=True))


def test_registry_maps_qnn_cli_to_this_class():
    assert isinstance(get_toolchain("qnn-cli"), QnnCliToolchain)


def test_convert_calls_the_converter_with_the_documented_arguments(sdk, tmp_path, work):
    convert_both(work)
    first, second = calls(tmp_path, "qairt-converter")
    assert Path(flags(second["argv"][:2])["--input_network"]).name == f"{TOKEN}.onnx"
    layout_at = first["argv"].index("--input_layout")
    assert first["argv"][layout_at:layout_at + 3] == ["--input_layout", "input_ids", "NONTRIVIAL"]
    argv = flags(first["argv"][:layout_at] + first["argv"][layout_at + 3:])
    assert list(argv) == ["--input_network", "--quantization_overrides", "--float_bitwidth", "--output_path"]
    assert Path(argv["--input_network"]).name == f"{PROMPT}.onnx"
    assert argv["--quantization_overrides"] == str(work / "parts" / "prompt" / "part_1_of_2.encodings.json")
    assert argv["--float_bitwidth"] == "16"
    assert Path(argv["--output_path"]).name == f"{PROMPT}.dlc"


def test_convert_then_quantizes_as_qairt_convert_does(sdk, tmp_path, work):
    convert_both(work)
    converter, _ = calls(tmp_path, "qairt-converter")
    quantizer, _ = calls(tmp_path, "qairt-quantizer")
    converted = converter["argv"][converter["argv"].index("--output_path") + 1]
    assert Path(converted).name == f"{PROMPT}.dlc" and Path(converted).parent.name == "converted"
    assert quantizer["argv"] == ["--input_dlc", converted, "--output_dlc", str(Path(converted).parents[1] /
                                                                               f"{PROMPT}.dlc"),
                                 "--float_fallback", "--act_bitwidth", "16", "--bias_bitwidth", "32"]


def test_converted_dlcs_carry_the_graph_name_and_sit_only_at_their_final_paths(converted_once):
    for name, path in converted_once.items():
        dlc = json.loads(path.read_text())
        assert dlc["graph_name"] == name
        assert dlc["quantizer"] == {"float_fallback": True, "act_bitwidth": 16, "bias_bitwidth": 32}
        assert dlc["weight_bytes"] == 16 * 8 * 4  # the converter read the weights from the staged data file
    work = next(iter(converted_once.values())).parents[3]
    assert [path for path in work.rglob("*") if path.name.endswith(".tmp")] == []


def test_compile_calls_the_generator_with_the_documented_arguments(converted, sdk, tmp_path, work):
    out = work / "compiled" / "cli-packed" / "part_1_of_2.bin"
    QnnCliToolchain().compile(converted, out, options())
    (call,) = calls(tmp_path, "qnn-context-binary-generator")
    argv = flags(call["argv"])
    lib = sdk / "lib" / "x86_64-linux-clang"
    assert list(argv) == ["--backend", "--model", "--dlc_path", "--config_file", "--input_output_tensor_mem_type",
                          "--binary_file", "--output_dir"]
    assert argv["--input_output_tensor_mem_type"] == "memhandle"
    assert argv["--backend"] == str(lib / "libQnnHtp.so")
    assert argv["--model"] == str(lib / "libQnnModelDlc.so")
    assert argv["--dlc_path"] == f"{PROMPT}.dlc,{TOKEN}.dlc"
    assert argv["--binary_file"] == "part_1_of_2"
    assert call["config_file"] == {"backend_extensions": {
        "shared_library_path": str(lib / "libQnnHtpNetRunExtensions.so"),
        "config_file_path": str(Path(argv["--output_dir"]) / "htp_backend_extensions.json")}}
    assert out.is_file()


def test_compile_writes_the_backend_extension_json_exactly(converted, tmp_path, work):
    # The shape qairt-dev's HtpConfigHelper serializes (tests/qairt_api checks it against the real serializer):
    # context a list, one graphs entry per graph.
    QnnCliToolchain().compile(converted, work / "part_1_of_2.bin", options(chipset="SM8650"))
    (call,) = calls(tmp_path, "qnn-context-binary-generator")
    assert call["backend_extension"] == {
        "context": [{"weight_sharing_enabled": True}],
        "graphs": [{"vtcm_mb": 8, "O": 3, "weights_packing": True, "graph_names": [PROMPT]},
                   {"vtcm_mb": 8, "O": 3, "weights_packing": True, "graph_names": [TOKEN]}],
        "devices": [{"soc_model": 57, "dsp_arch": "v75",
                     "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 100}]}],
        "memory": {"mem_type": "shared_buffer"},
    }


@pytest.mark.parametrize(("packing", "o_level"), [(True, 3), (False, 2), (True, 2), (False, 3)])
def test_weights_packing_and_o_reach_every_graph(converted, tmp_path, work, packing, o_level):
    QnnCliToolchain().compile(converted, work / "part_1_of_2.bin", options(packing=packing, o_level=o_level))
    (call,) = calls(tmp_path, "qnn-context-binary-generator")
    settings = {name: (entry["weights_packing"], entry["O"])
                for entry in call["backend_extension"]["graphs"] for name in entry["graph_names"]}
    assert settings == {PROMPT: (packing, o_level), TOKEN: (packing, o_level)}


def test_graph_names_agree_from_conversion_to_binary(converted, work):
    toolchain = QnnCliToolchain()
    out = work / "part_1_of_2.bin"
    toolchain.compile(converted, out, options())
    assert [graph.name for graph in toolchain.inspect(out).graphs] == [PROMPT, TOKEN]


def test_compile_refuses_a_binary_whose_graph_names_differ(converted, work):
    swapped = {PROMPT: converted[TOKEN], TOKEN: converted[PROMPT]}
    renamed = {"prompt_other_name": converted[PROMPT], TOKEN: converted[TOKEN]}
    out = work / "part_1_of_2.bin"
    with pytest.raises(GenieBuildError, match="holds graphs"):
        QnnCliToolchain().compile(renamed, out, options())
    assert not out.exists()
    QnnCliToolchain().compile(swapped, out, options())  # same set of names: accepted


def test_inspect_reads_graphs_io_and_quantization(converted, work):
    toolchain = QnnCliToolchain()
    out = work / "part_1_of_2.bin"
    toolchain.compile(converted, out, options())
    info = toolchain.inspect(out)
    prompt = info.graphs[0]
    assert (info.file_bytes, info.weight_bytes, info.tool_version, info.toolchain) == (
        out.stat().st_size, 0, "v2.99.0.double", "qnn-cli")
    (ids,) = prompt.inputs
    (hidden,) = prompt.outputs
    assert (ids.name, ids.shape, ids.dtype, ids.quant) == ("input_ids", (1, 32), "int32", None)
    assert (hidden.name, hidden.shape, hidden.dtype) == ("hidden", (1, 32, 8), "uint16")
    assert (hidden.quant.scale, hidden.quant.offset, hidden.quant.bitwidth) == (2.0 ** -10, -32768, 16)


def test_inspect_reports_the_o_level_and_vtcm_each_graph_was_compiled_with(converted, work):
    toolchain = QnnCliToolchain()
    out = work / "part_1_of_2.bin"
    toolchain.compile(converted, out, options(o_level=2, vtcm_mb=8))
    assert toolchain.inspect(out).applied_options.to_dict() == {"optimization_type": {PROMPT: 2, TOKEN: 2},
                                                      "vtcm_size": {PROMPT: 8, TOKEN: 8}}


def test_spaced_utility_keys_are_read_as_camel_case(tmp_path):
    # Some SDK versions write "graph name", "graph blob info", ... (qairt-dev normalises them the same way).
    document = {"info": {"build id": "v2.50.0", "graphs": [{"info": {
        "graph name": "g", "graph inputs": [{"info": {"name": "x", "dimensions": [1, 4],
                                                      "data type": "QNN_DATATYPE_INT_32"}}],
        "graph outputs": [], "graph blob info": {"info": {"optimization level": 3, "vtcm size": 8}}}}]}}
    info = binary_info_from_utility_json(document, tmp_path / "a.bin", 10, "qnn-cli")
    assert (info.tool_version, info.graphs[0].name, info.graphs[0].inputs[0].dtype) == ("v2.50.0", "g", "int32")
    assert info.applied_options.to_dict() == {"optimization_type": {"g": 3}, "vtcm_size": {"g": 8}}


def test_a_binary_that_reports_no_blob_info_applies_nothing_known(tmp_path):
    document = {"info": {"graphs": [{"info": {"graphName": "g", "graphInputs": [], "graphOutputs": []}}]}}
    assert binary_info_from_utility_json(document, tmp_path / "a.bin", 10, "qnn-cli").applied_options.to_dict() == {}


def test_a_failing_executable_gives_tool_exit_code_and_stderr(converted, monkeypatch, work):
    monkeypatch.setenv(FAIL_VARIABLE, "qnn-context-binary-generator")
    out = work / "part_1_of_2.bin"
    with pytest.raises(GenieBuildError) as caught:
        QnnCliToolchain().compile(converted, out, options())
    message = str(caught.value)
    assert message.startswith("qnn-context-binary-generator: exited with code 1:")
    assert "ERROR: double asked to fail" in message and "\n" not in message
    assert not out.exists() and not any(path.name.endswith(".tmp") for path in work.iterdir())


def test_a_failing_converter_leaves_no_output(sdk, monkeypatch, work):
    monkeypatch.setenv(FAIL_VARIABLE, "qairt-converter")
    onnx_path, encodings_path = write_tiny_part(work, 32)
    out = work / "converted" / "part_1_of_2.dlc"
    with pytest.raises(GenieBuildError, match="^qairt-converter: exited with code 1"):
        QnnCliToolchain().convert(onnx_path, encodings_path, out, graph_name=PROMPT, float_bitwidth=16)
    assert list(out.parent.iterdir()) == []


def test_missing_sdk_root_is_named(monkeypatch):
    monkeypatch.delenv("QAIRT_SDK_ROOT", raising=False)
    with pytest.raises(GenieBuildError, match="^toolchain qnn-cli: QAIRT_SDK_ROOT is not set"):
        QnnCliToolchain().check_available()


def test_sdk_root_that_is_not_a_directory_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("QAIRT_SDK_ROOT", str(tmp_path / "nowhere"))
    with pytest.raises(GenieBuildError, match="nowhere is not a directory"):
        QnnCliToolchain().check_available()


def test_every_missing_tool_and_library_is_named(sdk, monkeypatch, tmp_path):
    (sdk / "bin" / "x86_64-linux-clang" / "qnn-context-binary-generator").unlink()
    (sdk / "lib" / "x86_64-linux-clang" / "libQnnModelDlc.so").unlink()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(GenieBuildError) as caught:
        QnnCliToolchain().check_available()
    message = str(caught.value)
    assert "executable qnn-context-binary-generator" in message and "library libQnnModelDlc.so" in message
    assert "qairt-converter" not in message


def test_executables_are_also_found_on_path(sdk, monkeypatch, tmp_path):
    bin_dir = sdk / "bin" / "x86_64-linux-clang"
    elsewhere = tmp_path / "elsewhere"
    bin_dir.rename(elsewhere)
    monkeypatch.setenv("PATH", str(elsewhere))
    QnnCliToolchain().check_available()


def test_unsafe_graph_names_are_refused_before_running_anything(sdk, work, tmp_path):
    onnx_path, encodings_path = write_tiny_part(work, 32)
    with pytest.raises(GenieBuildError, match="^prompt,1: graph names may hold only"):
        QnnCliToolchain().convert(onnx_path, encodings_path, work / "x.dlc", graph_name="prompt,1",
                                  float_bitwidth=16)
    assert calls(tmp_path, "qairt-converter") == []


def test_missing_input_is_named(sdk, work):
    with pytest.raises(GenieBuildError, match="missing.encodings.json: file not found"):
        QnnCliToolchain().convert(work / "part.onnx", work / "missing.encodings.json", work / "x.dlc",
                                  graph_name=PROMPT, float_bitwidth=16)


def test_utility_json_without_graphs_is_a_clear_error(tmp_path):
    with pytest.raises(GenieBuildError, match="no info.graphs list"):
        binary_info_from_utility_json({"info": {"buildId": "x"}}, tmp_path / "a.bin", 10, "qnn-cli")


@pytest.mark.parametrize(("qnn", "dtype", "bits"), [
    ("QNN_DATATYPE_UFIXED_POINT_8", "uint8", 8), ("QNN_DATATYPE_SFIXED_POINT_16", "int16", 16),
    ("QNN_DATATYPE_FIXED_POINT_16", "int16", 16), ("QNN_DATATYPE_FLOAT_16", "float16", None),
    ("QNN_DATATYPE_INT_64", "int64", None), ("QNN_DATATYPE_BOOL_8", "bool", None),
    ("QNN_DATATYPE_STRING", "QNN_DATATYPE_STRING", None),
])
def test_utility_datatypes_map_to_numpy_names(tmp_path, qnn, dtype, bits):
    quantize = {"definition": "QNN_DEFINITION_DEFINED",
                "quantizationEncoding": "QNN_QUANTIZATION_ENCODING_SCALE_OFFSET",
                "scaleOffset": {"scale": 0.5, "offset": -7}}
    tensor = {"info": {"name": "t", "dimensions": [1, 2], "dataType": qnn, "quantizeParams": quantize}}
    document = {"info": {"graphs": [{"info": {"graphName": "g", "graphInputs": [tensor], "graphOutputs": []}}]}}
    (parsed,) = binary_info_from_utility_json(document, tmp_path / "a.bin", 1, "qnn-cli").graphs[0].inputs
    assert parsed.dtype == dtype
    # Only fixed-point types carry quantization; a float with stray params is not quantized.
    assert (parsed.quant.bitwidth if parsed.quant else None) == bits


def test_relative_paths_work_as_snakemake_passes_them(sdk, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QAIRT_SDK_ROOT", sdk.name)  # relative too
    converted = convert_both(Path("results"))
    out = Path("results") / "compiled" / "cli-default" / "part_1_of_2.bin"
    QnnCliToolchain().compile(converted, out, options(packing=False))
    assert [graph.name for graph in QnnCliToolchain().inspect(out).graphs] == [PROMPT, TOKEN]


def test_an_sdk_with_its_libqnnsystem_reads_binaries_with_it_not_the_utility(sdk, tmp_path):
    """The SDK's own libQnnSystem.so (here: the wheel's, placed where an SDK has it) reads a real QNN binary in a
    child process; the utility is not called."""
    qnn_wheel = pytest.importorskip("genie_build.qnn_wheel")
    try:
        library = qnn_wheel.library_path("libQnnSystem.so")
    except GenieBuildError as exc:
        pytest.skip(str(exc))
    from qnn_helpers import compile_context_binary, write_tiny_qdq

    (sdk / "lib" / "x86_64-linux-clang" / "libQnnSystem.so").symlink_to(library)
    binary = compile_context_binary([(write_tiny_qdq(tmp_path / "tiny.onnx").path, PROMPT)], tmp_path / "bin")
    info = QnnCliToolchain().inspect(binary)
    assert [graph.name for graph in info.graphs] == [PROMPT] and info.toolchain == "qnn-cli"
    assert info.tool_version.startswith("QNN v2.51.0") and info.applied_options.soc_model == 69
    assert calls(tmp_path, "qnn-context-binary-utility") == []
