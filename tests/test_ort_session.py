"""Sessions take the job's thread count (Snakemake's OMP_NUM_THREADS), and results do not depend on it; a float32
check's session reads each linear weight as stored."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from genie_build.quantize.calibrate import calibrate
from demo_shapes import TINY
from genie_build.demo.demo import generate_demo
from genie_build.ort_session import THREADS_VARIABLE, cpu_session_options, float_check_options, job_threads

SHAPE = dataclasses.replace(TINY, hidden=128, intermediate=256)


@pytest.mark.parametrize(("value", "threads"), [("1", 1), ("3", 3), ("", 0), ("0", 0), ("-2", 0), ("two", 0)])
def test_job_threads_reads_a_positive_omp_num_threads_else_leaves_it_to_onnxruntime(value: str, threads: int) -> None:
    assert job_threads({THREADS_VARIABLE: value}) == threads
    assert job_threads({}) == 0


def test_sessions_use_the_jobs_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THREADS_VARIABLE, "1")
    assert cpu_session_options().intra_op_num_threads == 1
    monkeypatch.setenv(THREADS_VARIABLE, "2")
    assert cpu_session_options().intra_op_num_threads == 2


def test_encodings_are_the_same_bytes_whatever_the_thread_count(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A local build (one thread per job) and a cluster job given more threads calibrate alike."""
    generate_demo(SHAPE, tmp_path)
    outputs = {}
    for threads in ("1", "2"):
        monkeypatch.setenv(THREADS_VARIABLE, threads)
        outputs[threads] = (tmp_path / f"p{threads}.json", tmp_path / f"t{threads}.json")
        calibrate(tmp_path / "prompt.onnx", tmp_path / "token.onnx", *outputs[threads], num_samples=2)
    assert all(first.read_bytes() == second.read_bytes() for first, second in zip(outputs["1"], outputs["2"]))


def test_a_float_check_reads_each_linear_weight_as_stored(tmp_path: Path) -> None:
    """torch.onnx's MatMul of a Transposed weight runs as one fused MatMul of the stored weight: no Transpose copies
    the weight at each run, no folded transposed copy or packed copy is kept in the session, and the result is the
    unfused session's within float32 rounding."""
    weight = np.random.default_rng(0).standard_normal((48, 32)).astype(np.float32)   # nn.Linear(32, 48)'s [out, in]
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["linear.weight"], ["weight_t"], perm=[1, 0]),
         helper.make_node("MatMul", ["x", "weight_t"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 32])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 48])],
        [numpy_helper.from_array(weight, "linear.weight")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), tmp_path / "linear.onnx")
    options = float_check_options()
    options.optimized_model_filepath = str(tmp_path / "as_run.onnx")
    x = np.random.default_rng(1).standard_normal((1, 4, 32)).astype(np.float32)
    fused = ort.InferenceSession(tmp_path / "linear.onnx", options, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    as_run = onnx.load(tmp_path / "as_run.onnx")
    assert [node.op_type for node in as_run.graph.node] == ["FusedMatMul"]
    assert [tensor.name for tensor in as_run.graph.initializer] == ["linear.weight"]
    assert np.array_equal(numpy_helper.to_array(as_run.graph.initializer[0]), weight)
    assert options.get_session_config_entry("session.disable_prepacking") == "1"
    unfused = ort.InferenceSession(tmp_path / "linear.onnx", cpu_session_options(),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.allclose(fused, unfused, rtol=1e-6, atol=1e-6)
