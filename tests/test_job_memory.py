"""Each kind of job is planned with at least the memory it was measured to take (docs/large-models.md: the 7B
checkpoint's jobs, exact peak RSS per process; the 4 GB ONNX model's), so that Snakemake never runs side by side two
jobs that do not fit ``--resources mem_mb`` or a node."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from genie_build import job_memory
from genie_build.plan.calibration_units import CalibrationUnit, unit_peak_mb

MIB = 2**20 / 1e6   # MB per MiB


LAYER, LARGEST, TABLE = 932_231_168, 271_581_184, 2_180_003_840   # Qwen2.5-7B: a layer, its largest weight, the head


def unit(pieces: tuple[str, ...], float_bytes: int, largest: int, slices: int = 1) -> CalibrationUnit:
    return CalibrationUnit("u01_of_01", "1_of_1", pieces, None, None, float_bytes, largest, slices)


@pytest.mark.parametrize("planned, measured_mb", [
    # the 7B export's parts: 6.53 GB of float32 weights, 7.86 GB peak; 4.05 GB (two layers and the head), 5.53 GB;
    # the embedding's 2.18 GB, 3.67 GB
    (job_memory.export_mb(6530), 7860),
    (job_memory.export_mb(4050), 5530),
    (job_memory.export_mb(2180), 3670),
    # a 7B-shaped part's 8 graphs (4 lengths) against transformers' modules: a layer and the head (3.11 GB, the
    # head's 2.18 GB the largest weight), 3.80 GB; the embedding, 3.70 GB; a layer alone, 1.83 GB
    (job_memory.verify_parts_mb(3110, 2180), 3800),
    (job_memory.verify_parts_mb(2180, 2180), 3700),
    (job_memory.verify_parts_mb(932, 272), 1830),
    # the float model's evaluation, one part at a time: 8.06 GB
    (job_memory.evaluation_mb(6530), 8060),
    # calibration units: the LM head whole, 9.47 GB; in two slices, 5.94 GB; in four, 3.34 GB; the embedding's
    # table read in place, 2.60 GB; two layers, 6.71 GB; one, 3.92 GB
    (unit_peak_mb(unit(("head",), TABLE, TABLE)), 9470),
    (unit_peak_mb(unit(("head",), TABLE, TABLE, slices=2)), 5940),
    (unit_peak_mb(unit(("head",), TABLE, TABLE, slices=4)), 3340),
    (unit_peak_mb(unit(("embedding",), TABLE, TABLE)), 2600),
    (unit_peak_mb(unit(("layer_0", "layer_1"), 2 * LAYER, LARGEST)), 6710),
    (unit_peak_mb(unit(("layer_0",), LAYER, LARGEST)), 3920),
    # 20 MB of text tokenized: 0.42 GB
    (job_memory.tokenize_mb(20), 420),
    # the 7B embedding part converted: its float32 table of 2.18 GB, 3.38 GB peak
    (job_memory.convert_mb(job_memory.GraphWeights(2182, 2180)), 3380),
    # a 7B layer part converted: 6.5 GB of weights, the largest 0.27 GB, 0.56 GB peak
    (job_memory.convert_mb(job_memory.GraphWeights(6500, 271.6)), 560),
    # the 4 GB model's embedding part converted: its float16 table of 593.5 MiB, 1,025 MiB peak
    (job_memory.convert_mb(job_memory.GraphWeights(593.5 * MIB, 593.5 * MIB)), 1025 * MIB),
    # the 7B embedding part's compile: 1.09 GB of 16-bit codes, 1.17 GB peak
    (job_memory.compile_mb(1090), 1170),
    # qnn-htp at Qwen2.5-7B's width: a part's weights (stored bytes) x its graphs, all held until the binary is written
    (job_memory.compile_mb(117, graphs=4, toolchain="qnn-htp"), 3560),
    (job_memory.compile_mb(662, graphs=2, toolchain="qnn-htp"), 5750),
    (job_memory.compile_mb(700, graphs=8, toolchain="qnn-htp"), 21730),
    # ... in 16 parts at four lengths: two layers' 235 MB x 8 graphs, 7.64 GB; one layer's 117 MB x 8, 3.97 GB; the
    # last layer and the LM head (662 MB) x 8, 18.47 GB
    (job_memory.compile_mb(235, graphs=8, toolchain="qnn-htp"), 7640),
    (job_memory.compile_mb(117, graphs=8, toolchain="qnn-htp"), 3970),
    (job_memory.compile_mb(662, graphs=8, toolchain="qnn-htp"), 18470),
])
def test_each_job_is_planned_with_at_least_what_it_was_measured_to_take(planned, measured_mb):
    assert planned >= measured_mb


@pytest.mark.parametrize("part_mb, largest_mb, measured_mb", [(3110, 2180, 3800), (2180, 2180, 3700), (932, 272, 1830)])
def test_the_verification_is_planned_within_a_tenth_of_what_it_took(part_mb, largest_mb, measured_mb):
    """Its plan feeds split.num_parts auto: planned far above the measure, it would cut a model into parts it does
    not need."""
    assert measured_mb <= job_memory.verify_parts_mb(part_mb, largest_mb) <= 1.1 * measured_mb


def test_files_mb_counts_the_files_that_exist(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 3_000_000)
    assert job_memory.files_mb([tmp_path / "a", tmp_path / "missing"]) == 3.0


def test_graph_weights_counts_what_the_graph_declares_not_its_shared_data_file(tmp_path):
    """A checkpoint part's prompt and token graphs refer to one data file: each graph counts its own weights."""
    big, small = np.zeros((1000, 500), np.float32), np.zeros((10, 500), np.float16)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "big"], ["y"])], "part",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1000])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 500])],
        [numpy_helper.from_array(big, "big"), numpy_helper.from_array(small, "small")])
    onnx.save(helper.make_model(graph), tmp_path / "prompt.onnx", save_as_external_data=True,
              all_tensors_to_one_file=True, location="weights.onnx.data", size_threshold=0)
    (tmp_path / "weights.onnx.data").open("ab").write(b"\0" * 9_000_000)   # another graph's weights

    weights = job_memory.graph_weights(tmp_path / "prompt.onnx")

    assert weights == job_memory.GraphWeights(2.01, 2.0)
    assert job_memory.convert_mb(weights) == 603
    assert job_memory.convert_mb(weights, sdk=True) == 1000


def test_graph_weights_of_a_graph_not_written_yet_are_none(tmp_path):
    assert job_memory.graph_weights(tmp_path / "missing.onnx") == job_memory.GraphWeights(0.0, 0.0)
