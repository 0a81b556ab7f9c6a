"""Tiny QDQ ONNX models compiled by the vendor's HTP backend (through ONNX Runtime's QNN execution provider, from
the ``onnxruntime-qnn`` wheel), for the tests that read QNN context binaries and DLCs back.

The model: ``y = x @ W`` with ``x`` and ``y`` as uint16 QuantizeLinear/DequantizeLinear pairs (what Genie feeds a
part) and ``W`` an int8 per-channel DequantizeLinear initializer (axis 1, zero point 0), opset 21. Every compile runs
in a child process: ORT's threads and the graph renaming below stay out of the test process.

The compiles use the qnn-htp toolchain's own backend (graph names as asked, weight sharing as asked).
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
                           optimization_level: int = 3, vtcm_mb: int | None = None, weight_sharing: bool = True,
                           timeout: float = 600) -> Path:
    """Compile ``(model, graph name)`` pairs into ONE context binary with the qnn-htp toolchain's backend
    (:func:`genie_build.toolchains.qnn_htp.backend.prepare_context`) and return the ``.bin`` it wrote."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _run_child({"call": "prepare_context", "graphs": [[str(model), name] for model, name in graphs],
                "target": _target(device, optimization_level, vtcm_mb), "folder": str(out_dir),
                "weight_sharing": weight_sharing}, timeout)
    binaries = sorted(out_dir.glob("*.bin"))
    assert len(binaries) == 1, f"expected one context binary in {out_dir}, found {binaries}"
    return binaries[0]


def dump_dlc(model: Path, out_dir: Path, name: str = "tiny", *, device: dict[str, str] = SM8750,
             timeout: float = 600) -> Path:
    """The DLC QNN's IR backend writes of ``model``, its graph called ``name``
    (:func:`genie_build.toolchains.qnn_htp.backend.write_dlc`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{name}.dlc"
    _run_child({"call": "write_dlc", "graph": str(model), "name": name, "out": str(out),
                "target": _target(device, 3, None)}, timeout)
    return out


def _target(device: dict[str, str], optimization_level: int, vtcm_mb: int | None) -> dict[str, int]:
    return {"soc_model": int(device["soc_model"]), "htp_arch": int(device["htp_arch"]),
            "optimization": optimization_level, "vtcm_mb": vtcm_mb or 0}


def _run_child(request: dict, timeout: float) -> None:
    done = subprocess.run([sys.executable, __file__, json.dumps(request)], check=False, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"compile failed ({done.returncode}): {done.stderr[-3000:]}"


def _compile_main(request: dict) -> None:
    from genie_build.toolchains.qnn_htp.backend import HtpTarget, prepare_context, write_dlc

    target = HtpTarget(**request["target"])
    if request["call"] == "write_dlc":
        write_dlc(Path(request["graph"]), request["name"], Path(request["out"]), target)
    else:
        prepare_context({name: Path(model) for model, name in request["graphs"]}, Path(request["folder"]), target,
                        weight_sharing=request["weight_sharing"])


if __name__ == "__main__":
    _compile_main(json.loads(sys.argv[1]))
