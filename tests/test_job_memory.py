"""Each kind of job is planned with at least the memory it was measured to take (docs/large-models.md: the 7B
checkpoint's jobs, exact peak RSS per process; the 4 GB ONNX model's), so that Snakemake never runs side by side two
jobs that do not fit ``--resources mem_mb`` or a node."""

from __future__ import annotations

import pytest

from genie_build import job_memory
from genie_build.calibration_units import predicted_peak_mb

MIB = 2**20 / 1e6   # MB per MiB


@pytest.mark.parametrize("planned, measured_mb", [
    # the 7B export's largest part: 6.5 GB of float32 weights, 7.86 GB peak
    (job_memory.export_mb(6500), 7860),
    # the parts against transformers' modules: one part's session, 7.79 GB
    (job_memory.verify_parts_mb(6500), 7790),
    # the float model's evaluation, one part at a time: 8.06 GB
    (job_memory.evaluation_mb(6500), 8060),
    # the LM head's calibration unit: 152,064 x 3,584 float32 weights, 9.47 GB
    (predicted_peak_mb(152064 * 3584 * 4), 9470),
    # 20 MB of text tokenized: 0.42 GB
    (job_memory.tokenize_mb(20), 420),
    # the 4 GB model's embedding part converted: 593.5 MiB of graph and data, 1,025 MiB peak
    (job_memory.convert_mb(593.5 * MIB), 1025 * MIB),
    # the 7B embedding part's compile: 1.09 GB of 16-bit codes, 1.17 GB peak
    (job_memory.compile_mb(1090), 1170),
])
def test_each_job_is_planned_with_at_least_what_it_was_measured_to_take(planned, measured_mb):
    assert planned >= measured_mb


def test_files_mb_counts_the_files_that_exist(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 3_000_000)
    assert job_memory.files_mb([tmp_path / "a", tmp_path / "missing"]) == 3.0
