"""evaluate: a variant's binaries against the float model on held-out text, one part at a time.

The activation quantizers the evaluation adds compute the reference quantizer's grid bit for bit; the metrics are
what their definitions say; the windows follow calibration's schedule; and on the demo a variant with one decoder
layer's weight scales ×4 is told apart from the correct one by every metric (tests/test_workflow_hf.py: w8a16 is
closer to the float model than w4a16 on a checkpoint)."""

from __future__ import annotations

import argparse
import csv
import json
import re
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from genie_build.commands.evaluate import rope_of
from genie_build.encodings import Encodings, TensorEncoding, read_encodings
from genie_build.errors import GenieBuildError
from genie_build.evaluate.evaluate import (CLIP_STATS_SUFFIX, ClipSums, compare_logits, fake_quantize_activations,
                                           grid_of, quality_of, text_windows)
from genie_build.evaluate.evaluation_table import (Clipping, ClippedTensor, Quality, QualityBounds, quality_flags,
                                                   quality_rows, write_quality_table)
from genie_build.toolchains.reference.quantize import quantize
from rebuild_helpers import (EXPORTS, USER_MODEL, export_small_demo, scale_initializer, user_model_checkout,
                             user_model_config)
from workflow_helpers import (REFERENCE_BUILD, copy_workflow, load_json, run_snakemake, scale_encoding,
                              stated_axes_encodings, write_config)

LAYER_1_WEIGHTS = [f"model.layers.1.{module}.weight" for module in
                   ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, feed)))


@pytest.mark.parametrize("bitwidth, offset", [(16, -32768), (16, -1000), (8, -128), (8, -10)])
def test_a_fake_quantized_activation_is_the_reference_quantizers_grid(bitwidth, offset):
    x = np.random.default_rng(bitwidth - offset).normal(0, 3, (4, 257)).astype(np.float32)
    x[0, :4] = [1e6, -1e6, 0.0, -0.0]  # beyond the grid on both sides
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["hidden"]), helper.make_node("Neg", ["hidden"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    encodings = {name: TensorEncoding(name, "int", bitwidth, scale=(0.0173,), offset=(offset,))
                 for name in ("x", "hidden", "y")}
    assert fake_quantize_activations(model, Encodings(activations=encodings)) == ["x", "hidden", "y"]
    onnx.checker.check_model(model)

    def grid(values: np.ndarray) -> np.ndarray:
        q, scale, zero_point = quantize(values, encodings["x"], None)
        return ((q.astype(np.float32) - zero_point.astype(np.float32)) * scale).astype(np.float32)

    expected = grid(-grid(np.maximum(grid(x), 0)))
    np.testing.assert_array_equal(run(model, {"x": x})["y"], expected)


def test_clip_statistics_count_the_values_outside_the_grid_and_sum_over_windows():
    """Each quantized tensor's ``/clip_stats`` output counts the values the clip moves more than a step (more than
    one step past the grid's end; within it the clip errs no more than rounding), its size and its float extremes;
    ClipSums adds windows up and names the tensors that clip most."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["hidden"]), helper.make_node("Neg", ["hidden"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    encodings = {"x": TensorEncoding("x", "int", 8, scale=(0.01,), offset=(-128,)),   # grid [-1.28, 1.27]
                 "y": TensorEncoding("y", "int", 8, scale=(0.02,), offset=(-255,))}    # grid [-5.1, 0]
    assert fake_quantize_activations(model, Encodings(activations=encodings), clip_stats=True) == ["x", "y"]
    onnx.checker.check_model(model)
    sums = ClipSums(grids={name: grid_of(encoding) for name, encoding in encodings.items()})
    assert sums.grids["x"] == pytest.approx((-1.28, 1.27))
    rng = np.random.default_rng(0)
    feeds = [rng.normal(0, 1, (4, 8)).astype(np.float32) for _ in range(3)]
    for x in feeds:
        outputs = run(model, {"x": x})
        assert outputs[f"x{CLIP_STATS_SUFFIX}"].tolist() == pytest.approx(
            [np.sum((x / np.float32(0.01) < -129) | (x / np.float32(0.01) > 128)), 32, x.min(), x.max()])
        sums.add(outputs)
    every = np.stack(feeds)
    outside_x = int(np.sum((every / np.float32(0.01) < -129) | (every / np.float32(0.01) > 128)))
    assert outside_x > 0
    # y = -quantized(relu(x)) reaches -1.27 at most: inside y's grid
    clipping = sums.clipping()
    assert clipping.values == 2 * every.size and clipping.share == pytest.approx(outside_x / (2 * every.size))
    assert [tensor.name for tensor in clipping.tensors] == ["x"]
    (tensor,) = clipping.tensors
    assert tensor.share == pytest.approx(outside_x / every.size) and tensor.max == pytest.approx(every.max())
    assert tensor.past_end == pytest.approx(max(every.max() - 1.27, -1.28 - every.min()) / 2.55, rel=1e-5)


def test_the_weights_rebuilding_nodes_are_left_alone():
    """A DequantizeLinear of stored codes already gives the stored values: an encoding of that name (AIMET gives the
    embedding table one) adds no quantizer there."""
    codes = helper.make_tensor("w_codes", TensorProto.UINT8, [2], [3, 200])
    scale = helper.make_tensor("w_scale", TensorProto.FLOAT, [], [0.5])
    graph = helper.make_graph([helper.make_node("DequantizeLinear", ["w_codes", "w_scale"], ["w"]),
                               helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [codes, scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    encoding = TensorEncoding("w", "int", 8, scale=(1.0,), offset=(0,))
    assert fake_quantize_activations(model, Encodings(activations={"w": encoding, "y": encoding})) == ["y"]


def test_identical_logits_agree_fully_and_the_metrics_are_their_definitions():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(50, 11)).astype(np.float32)
    targets = rng.integers(0, 11, 50)
    same = compare_logits(logits, logits.copy(), targets)
    assert (same.top1_agreement, same.mean_kl) == (1.0, 0.0)
    assert same.float_perplexity == same.variant_perplexity
    probabilities = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    assert same.float_perplexity == pytest.approx(np.exp(-np.mean(np.log(probabilities[np.arange(50), targets]))))
    noisy = logits + rng.normal(0, 2, logits.shape).astype(np.float32)
    quality = compare_logits(logits, noisy, targets)
    assert quality.mean_kl > 0 and quality.top1_agreement < 1
    kl = np.sum(probabilities * (np.log(probabilities) - np.log(np.exp(noisy) / np.exp(noisy).sum(-1, keepdims=True))),
                axis=-1)
    assert quality.mean_kl == pytest.approx(kl.mean(), rel=1e-5)


def test_windows_follow_calibrations_schedule_and_a_short_text_is_refused():
    windows = text_windows(list(range(100)), ar=8, context=24, max_windows=5)
    assert [window.past_len for window in windows] == [0, 8, 16, 0, 8]   # a full cache starts a new sequence
    assert windows[1].ids == tuple(range(8, 16)) and windows[1].targets == tuple(range(9, 17))
    assert len(text_windows(list(range(17)), ar=8, context=24, max_windows=5)) == 2
    with pytest.raises(GenieBuildError, match="^held_out.txt: has 8 tokens: at least 9 are needed"):
        text_windows(list(range(8)), ar=8, context=24, max_windows=5, where="held_out.txt")


def test_bounds_flag_what_they_bound():
    quality = Quality(positions=10, top1_agreement=0.5, mean_kl=0.2, float_perplexity=3.0, variant_perplexity=4.0)
    assert quality_flags(quality, QualityBounds()) == []
    assert quality_flags(quality, QualityBounds(min_top1_agreement=0.4, max_mean_kl=0.3)) == []
    flags = quality_flags(quality, QualityBounds(min_top1_agreement=0.9, max_mean_kl=0.1))
    assert len(flags) == 2 and "min_top1_agreement" in flags[0] and "max_mean_kl" in flags[1]
    clipping = Clipping(share=0.002, values=1000, tensors=(ClippedTensor("logits", 0.01, -10.1, 10.1, -3.0, 12.1),))
    assert quality_flags(quality, QualityBounds(max_clipped_share=0.01), clipping) == []
    (flag,) = quality_flags(quality, QualityBounds(max_clipped_share=0.001), clipping)
    assert flag == ("clipped share 0.200% > max_clipped_share 0.100% (most: logits 1.00% outside [-10.1, 10.1], "
                    "reached 12.1)")


def test_the_table_puts_each_variants_size_beside_its_quality_and_strict_writes_nothing(tmp_path):
    sizes = tmp_path / "size_table.csv"
    sizes.write_text("part,variant,bytes\n1,unpacked,3000000\n2,unpacked,5000000\n1,packed,3000000\n2,packed,1000000\n")
    reports = []
    for variant, agreement, kl in (("unpacked", 0.97, 0.001), ("packed", 0.81, 0.02)):
        reports.append(tmp_path / f"{variant}.json")
        reports[-1].write_text(json.dumps({"variant": variant, "text": "t", "positions": 64,
                                           "top1_agreement": agreement, "mean_kl": kl, "float_perplexity": 9.0,
                                           "variant_perplexity": 9.5}))
    rows = quality_rows(reports, sizes, QualityBounds(min_top1_agreement=0.9))
    assert [(row.variant, row.size_bytes, bool(row.flags)) for row in rows] == [("unpacked", 8000000, False),
                                                                               ("packed", 4000000, True)]
    out = {suffix: tmp_path / f"evaluation.{suffix}" for suffix in ("md", "csv", "png")}
    with pytest.raises(GenieBuildError, match="report.strict: packed: top-1 agreement 81.0% < min_top1_agreement"):
        write_quality_table(rows, out["md"], out["csv"], out["png"], strict=True)
    assert not any(path.exists() for path in out.values())
    assert write_quality_table(rows, out["md"], out["csv"], out["png"]) == [f"packed: {rows[1].flags[0]}"]
    # the Genie perplexity column is the bundle's row's (empty here: no Genie run)
    assert ("| packed | 4.0 | 81.0% | 0.02 | 9.50 | 9.00 | |  |  |  | top-1 agreement 81.0% < min_top1_agreement 90.0% |"
            in out["md"].read_text())
    assert out["csv"].read_text().splitlines()[1].startswith("unpacked,8000000,64,0.970000,0.001,")
    assert out["png"].read_bytes().startswith(b"\x89PNG")


# ------------------------------------------- workflow (the evaluation runs the reference toolchain's binaries)

@pytest.mark.workflow
def test_without_a_reference_variant_the_target_says_so(tmp_path):
    workdir = copy_workflow(tmp_path)
    device_only = {name: {**variant, "toolchain": "qairt"} for name, variant in REFERENCE_BUILD["variants"].items()}
    config = write_config(workdir, {**REFERENCE_BUILD, "variants": device_only}, name="device_only.yaml")
    result = run_snakemake(workdir, "evaluate", "--dry-run", config_file=config, check=False)
    assert result.returncode != 0
    assert "target 'evaluate': no variant of the reference toolchain" in result.stdout + result.stderr


@pytest.mark.workflow
def test_a_variant_with_one_layers_scales_x4_is_told_apart_and_strict_bounds_fail_the_target(tmp_path):
    (tmp_path / "exporter").mkdir()
    exports = export_small_demo(copy_workflow(tmp_path / "exporter"))
    good, broken = (user_model_checkout(tmp_path / name, exports) for name in ("good", "broken"))
    for graph in ("prompt", "token"):
        for weight in LAYER_1_WEIGHTS:
            scale_encoding(broken / EXPORTS / f"{graph}.encodings.json", weight, 4.0)
    results = {}
    for name, workdir in (("good", good), ("broken", broken)):
        run_snakemake(workdir, "evaluate", config_file=user_model_config(workdir, REFERENCE_BUILD))
        out = workdir / "results" / USER_MODEL
        results[name] = {variant: load_json(out / "evaluation" / f"{variant}.json")
                         for variant in ("unpacked", "packed")}
        table = (out / "evaluation.md").read_text()
        assert "| unpacked |" in table and "| packed |" in table
        assert (out / "evaluation.csv").read_text().count("\n") == 3 and (out / "evaluation.png").exists()
    for variant in ("unpacked", "packed"):
        good_quality, broken_quality = results["good"][variant], results["broken"][variant]
        assert good_quality["positions"] == broken_quality["positions"] == 16 * 8   # 16 windows of the demo's AR
        assert broken_quality["top1_agreement"] < good_quality["top1_agreement"] - 0.1, variant
        assert broken_quality["mean_kl"] > 2 * good_quality["mean_kl"], variant
        assert good_quality["float_perplexity"] == broken_quality["float_perplexity"]   # the same float model
    # packing stores the same values: the two variants of one build compute alike
    assert results["good"]["packed"] == {**results["good"]["unpacked"], "variant": "packed"}

    bound = (results["good"]["packed"]["top1_agreement"] + results["broken"]["packed"]["top1_agreement"]) / 2
    strict = user_model_config(broken, {**REFERENCE_BUILD, "report": {**REFERENCE_BUILD["report"], "strict": True,
                                                                      "min_top1_agreement": bound}}, name="strict.yaml")
    result = run_snakemake(broken, "evaluate", config_file=strict, check=False)
    assert result.returncode != 0 and "min_top1_agreement" in result.stdout + result.stderr
    assert not (broken / "results" / USER_MODEL / "evaluation.md").exists()   # no table that looks done


def consumer_axis(model: onnx.ModelProto) -> Callable[[str], int]:
    """The channel axis of the demo's per-channel weights: a MatMul ``[in, out]`` weight's output axis 1, a Gather
    table's rows."""
    matmul_weights = {node.input[1] for node in model.graph.node if node.op_type == "MatMul"}
    return lambda name: 1 if name in matmul_weights else 0


@pytest.mark.workflow
def test_a_weight_quantized_along_the_wrong_axis_is_told_apart(tmp_path):
    """Layer 1's o_proj with half its output channels as they were and half shrunk 16x to 256x (in the float model
    too: trained weights' channels differ; shrinking keeps every activation inside its encoding), its scales right
    for its output channels, in a 2.0.0 file that states its axis: stated right, against stated along the input
    axis, which a square weight cannot refuse (each row then takes a scale meant for a column, and the large values
    of rows with small scales clip). 64 windows: 512 positions."""
    (tmp_path / "exporter").mkdir()
    exports = export_small_demo(copy_workflow(tmp_path / "exporter"))
    weight = "model.layers.1.self_attn.o_proj.weight"
    shrunk = np.r_[np.ones(32), np.geomspace(1 / 256, 1 / 16, 32)]
    factors = np.random.default_rng(1).permutation(shrunk).astype(np.float32)
    results = {}
    for name, axis in (("right", 1), ("wrong", 0)):
        workdir = user_model_checkout(tmp_path / name, exports)
        for graph in ("prompt", "token"):
            scale_initializer(workdir / EXPORTS / f"{graph}.onnx", weight, factors)
            path = workdir / EXPORTS / f"{graph}.encodings.json"
            encodings = read_encodings(path)
            spread = replace(encodings.params[weight],
                             scale=tuple(float(s) for s in np.array(encodings.params[weight].scale) * factors))
            encodings = replace(encodings, params={**encodings.params, weight: spread})
            model = onnx.load(workdir / EXPORTS / f"{graph}.onnx", load_external_data=False)
            rule = consumer_axis(model)
            path.write_text(json.dumps(stated_axes_encodings(
                encodings, lambda name: axis if name == weight else rule(name))))  # noqa: B023 (called at once)
        config = user_model_config(workdir, {**REFERENCE_BUILD, "evaluate": {"max_windows": 64}})
        run_snakemake(workdir, "evaluate", config_file=config)
        results[name] = load_json(workdir / "results" / USER_MODEL / "evaluation" / "packed.json")
    right, wrong = results["right"], results["wrong"]
    assert right["float_perplexity"] == wrong["float_perplexity"]   # one float model
    assert wrong["top1_agreement"] < right["top1_agreement"] - 0.1
    assert wrong["mean_kl"] > 2 * right["mean_kl"]


@pytest.mark.workflow
def test_enabled_the_build_evaluates_and_a_changed_encoding_reevaluates_without_the_float_model(tmp_path):
    """evaluate.enabled: the default target puts each variant's quality in the size table (CSV and Markdown) and
    draws evaluation.png; an edited encoding re-evaluates the variants, not the float model."""
    (tmp_path / "exporter").mkdir()
    workdir = user_model_checkout(tmp_path / "user", export_small_demo(copy_workflow(tmp_path / "exporter")))
    config = user_model_config(workdir, {**REFERENCE_BUILD, "evaluate": {"enabled": True}})
    run_snakemake(workdir, config_file=config)
    out = workdir / "results" / USER_MODEL
    sizes = list(csv.DictReader((out / "size_table.csv").read_text().splitlines()))
    reports = {variant: load_json(out / "evaluation" / f"{variant}.json") for variant in ("unpacked", "packed")}
    for row in sizes:
        assert float(row["top1_agreement"]) == pytest.approx(reports[row["variant"]]["top1_agreement"])
        assert float(row["mean_kl"]) == pytest.approx(reports[row["variant"]]["mean_kl"], rel=1e-5)
    assert "| top-1 agreement |" in (out / "size_table.md").read_text()
    assert (out / "evaluation.png").read_bytes().startswith(b"\x89PNG")
    assert "[evaluation.md](evaluation.md)" in (out / "memory_plan.md").read_text()

    scale_encoding(workdir / EXPORTS / "prompt.encodings.json", LAYER_1_WEIGHTS[0], 2.0)
    scale_encoding(workdir / EXPORTS / "token.encodings.json", LAYER_1_WEIGHTS[0], 2.0)
    result = run_snakemake(workdir, config_file=config)
    ran = re.findall(r"^(?:local)?rule (\w+):", result.stdout + result.stderr, re.MULTILINE)
    assert ran.count("evaluate_variant") == 2 and "evaluate_float" not in ran
    assert load_json(out / "evaluation" / "packed.json") != reports["packed"]

    # a variant is only compared with the float model's logits of the same windows
    exports = workdir / EXPORTS
    rope = rope_of(argparse.Namespace(hf_config=exports / "config.json", tokenizer=exports / "tokenizer.json"))
    with pytest.raises(GenieBuildError, match=r"float_logits.npy: holds logits of shape \[16, 8, 512\], the variant "
                                              r"gives \[3, 8, 512\]: not the same windows"):
        quality_of(sorted((out / "compiled" / "packed").glob("part_*.bin")),
                   sorted((out / "encodings" / "source").glob("part_*/prompt.encodings.json")),
                   out / "evaluation" / "float_logits.npy", tokens_path=out / "tokens" / "evaluation.npy", rope=rope,
                   max_windows=3)


def test_a_float_logits_file_that_is_not_one_is_refused_before_any_part_runs(tmp_path):
    arguments = {"tokens_path": tmp_path / "tokens.npy", "rope": {},
                 "max_windows": 1}
    (tmp_path / "garbage.npy").write_bytes(b"not an array")
    with pytest.raises(GenieBuildError, match="garbage.npy: not a logits file"):
        quality_of([tmp_path / "missing.bin"], [tmp_path / "missing.json"], tmp_path / "garbage.npy", **arguments)
    np.save(tmp_path / "doubles.npy", np.zeros((2, 3, 4)))
    with pytest.raises(GenieBuildError, match=r"doubles.npy: holds float64 of 3 dimensions, not float32"):
        quality_of([tmp_path / "missing.bin"], [tmp_path / "missing.json"], tmp_path / "doubles.npy", **arguments)
