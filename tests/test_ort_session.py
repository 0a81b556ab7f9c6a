"""Sessions take the job's thread count (Snakemake's OMP_NUM_THREADS), and results do not depend on it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from genie_build.calibrate import calibrate
from demo_shapes import TINY
from genie_build.demo import generate_demo
from genie_build.ort_session import THREADS_VARIABLE, cpu_session_options, job_threads

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
