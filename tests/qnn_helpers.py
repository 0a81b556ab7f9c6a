"""Tiny QDQ ONNX models compiled by the vendor's HTP backend (through ONNX Runtime's QNN execution provider, from
the ``onnxruntime-qnn`` wheel), for the tests that read QNN context binaries and DLCs back.

The model: ``y = x @ W`` with ``x`` and ``y`` as uint16 QuantizeLinear/DequantizeLinear pairs (what Genie feeds a
part) and ``W`` an int8 per-channel DequantizeLinear initializer (axis 1, zero point 0), opset 21. Every compile runs
in a child process: ORT's threads and the graph renaming below stay out of the test process.

Graph names: ORT names every graph ``QNNExecutionProvider_..._<hash>_<n>_0``; the child renames them by replacing
``graphCreate`` in libQnnHtp.so's interface table (entry 16 of ``QnnInterface_t``'s function table, byte offset 160,
a fact of QNN's layout) with a Python function that passes the next requested name on. The EP loads the same
libQnnHtp.so, so it calls the replacement.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 21
SM8750 = {"soc_model": "69", "htp_arch": "79"}
SM8650 = {"soc_model": "57", "htp_arch": "75"}
_GRAPH_CREATE_OFFSET = 160          # QnnInterface_t: 40 B of header, then graphCreate as the 16th function pointer


@dataclass(frozen=True)
class TinyQdq:
    """A written model and the encodings its Q/DQ nodes say (zero points as ONNX stores them)."""

    path: Path
    input_name: str
    output_name: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    input_scale: np.float32
    input_zero_point: int
    output_scale: np.float32
    output_zero_point: int


def write_tiny_qdq(path: Path, *, seq: int = 4, hidden: int = 8, out_features: int = 16, seed: int = 0,
                   input_name: str = "x", output_name: str = "y") -> TinyQdq:
    """Write the tiny model; the same ``seed`` and sizes give the same weight (what weight sharing shares)."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((hidden, out_features)).astype(np.float32)
    weight_scale = (np.abs(weight).max(axis=0) / 127).astype(np.float32)
    weight_q = np.clip(np.rint(weight / weight_scale), -127, 127).astype(np.int8)
    x_scale, x_zero, y_scale, y_zero = np.float32(1e-4), 33288, np.float32(2e-3), 30000
    initializers = [
        numpy_helper.from_array(weight_q, "w_q"), numpy_helper.from_array(weight_scale, "w_scale"),
        numpy_helper.from_array(np.zeros(out_features, np.int8), "w_zero"),
        numpy_helper.from_array(np.array(x_scale), "x_scale"),
        numpy_helper.from_array(np.array(x_zero, np.uint16), "x_zero"),
        numpy_helper.from_array(np.array(y_scale), "y_scale"),
        numpy_helper.from_array(np.array(y_zero, np.uint16), "y_zero"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", [input_name, "x_scale", "x_zero"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"]),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], axis=1),
        helper.make_node("MatMul", ["x_dq", "w"], ["y_float"]),
        helper.make_node("QuantizeLinear", ["y_float", "y_scale", "y_zero"], ["y_q"]),
        helper.make_node("DequantizeLinear", ["y_q", "y_scale", "y_zero"], [output_name]),
    ]
    input_shape, output_shape = (1, seq, hidden), (1, seq, out_features)
    graph = helper.make_graph(nodes, "tiny",
                              [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, input_shape)],
                              [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, output_shape)],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return TinyQdq(path, input_name, output_name, input_shape, output_shape, x_scale, x_zero, y_scale, y_zero)


def compile_context_binary(graphs: list[tuple[Path, str]], out_dir: Path, *, device: dict[str, str] = SM8750,
                           optimization_level: int = 3, vtcm_mb: int | None = None, timeout: float = 600) -> Path:
    """Compile ``(model, graph name)`` pairs into ONE weight-shared context binary (``ep.share_ep_contexts`` on
    every session, ``ep.stop_share_ep_contexts`` on the last) and return the ``.bin`` the EP wrote."""
    options = {"backend_type": "htp", **device, "htp_graph_finalization_optimization_mode": str(optimization_level)}
    if vtcm_mb is not None:
        options["vtcm_mb"] = str(vtcm_mb)
    out_dir.mkdir(parents=True, exist_ok=True)
    _run_child({"graphs": [[str(model), name] for model, name in graphs], "provider_options": options,
                "context_dir": str(out_dir)}, timeout)
    binaries = sorted(out_dir.glob("*.bin"))
    assert len(binaries) == 1, f"expected one context binary in {out_dir}, found {binaries}"
    return binaries[0]


def dump_dlc(model: Path, out_dir: Path, *, device: dict[str, str] = SM8750, timeout: float = 600) -> Path:
    """The DLC the EP's QNN IR backend writes of ``model`` (``dump_qnn_ir_dlc``), named after ORT's graph name."""
    options = {"backend_type": "htp", **device, "dump_qnn_ir_dlc": "1", "dump_qnn_ir_dlc_dir": str(out_dir)}
    out_dir.mkdir(parents=True, exist_ok=True)
    _run_child({"graphs": [[str(model), ""]], "provider_options": options, "context_dir": None}, timeout)
    dlcs = sorted(out_dir.glob("*.dlc"))
    assert len(dlcs) == 1, f"expected one DLC in {out_dir}, found {dlcs}"
    return dlcs[0]


def _run_child(request: dict, timeout: float) -> None:
    done = subprocess.run([sys.executable, __file__, json.dumps(request)], check=False, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"compile failed ({done.returncode}): {done.stderr[-3000:]}"


def _rename_graphs(names: list[str]) -> object:
    """Make libQnnHtp's graphCreate use ``names`` in order; returns what must stay alive while sessions run."""
    import ctypes
    import mmap

    import onnxruntime_qnn

    backend = ctypes.CDLL(str(Path(onnxruntime_qnn.get_library_path()).with_name("libQnnHtp.so")),
                          mode=ctypes.RTLD_GLOBAL)
    providers, count = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_uint32()
    backend.QnnInterface_getProviders(ctypes.byref(providers), ctypes.byref(count))
    slot = providers[0] + _GRAPH_CREATE_OFFSET
    prototype = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p)
    original = prototype(ctypes.c_void_p.from_address(slot).value)
    pending = [name.encode() for name in names]

    def graph_create(context: int, name: bytes, configs: int, graph: int) -> int:
        return original(context, pending.pop(0) if pending else name, configs, graph)

    replacement = prototype(graph_create)
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = slot & ~(mmap.PAGESIZE - 1)
    assert libc.mprotect(page, mmap.PAGESIZE, 3) == 0, "cannot make libQnnHtp's interface table writable"
    ctypes.c_void_p.from_address(slot).value = ctypes.cast(replacement, ctypes.c_void_p).value
    return replacement, original, backend


def _compile_main(request: dict) -> None:
    import onnxruntime as ort
    import onnxruntime_qnn

    graphs = request["graphs"]
    keep_alive = _rename_graphs([name for _, name in graphs]) if all(name for _, name in graphs) else None
    ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    devices = [device for device in ort.get_ep_devices() if device.ep_name == "QNNExecutionProvider"]
    for index, (model, _) in enumerate(graphs):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.add_provider_for_devices(devices, request["provider_options"])
        if request["context_dir"]:
            for key, value in (("ep.context_enable", "1"), ("ep.context_embed_mode", "0"),
                               ("ep.context_file_path", str(Path(request["context_dir"]) / f"graph{index}_ctx.onnx")),
                               ("ep.share_ep_contexts", "1")):
                options.add_session_config_entry(key, value)
            if index == len(graphs) - 1:
                options.add_session_config_entry("ep.stop_share_ep_contexts", "1")
        ort.InferenceSession(model, options)
    del keep_alive


if __name__ == "__main__":
    _compile_main(json.loads(sys.argv[1]))
