"""genie_build.sizes.estimate and the ``estimate`` command: weights from a config or a graph, the precision, stored
sizes by hand, config == graph, and the prediction against compiled reference containers."""

from __future__ import annotations

import csv
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import helper, numpy_helper

from genie_build.cli import main
from genie_build.config import validate_config
from genie_build.conventions import EMBED_WEIGHT, LM_HEAD_WEIGHT, part_encodings_path, part_graph_path
from genie_build.demo.demo import generate_demo
from genie_build.encodings import read_encodings, slice_encodings, write_encodings
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import initializer_specs, load_graph, part_tensor_names
from genie_build.plan.boundaries import find_boundaries
from genie_build.plan.plan import by_encodings, weighed_pieces
from genie_build.plan.plan_file import read_plan
from genie_build.plan.planners import plan_by_num_parts
from genie_build.plan.precision import Precision, WeightRule, precision_from_dict, read_precision, weight_encoding
from genie_build.plan.recipes import RECIPES, precision_of
from genie_build.plan.weight_inventory import ModelWeights, weights_from_graph, weights_from_hf_config
from genie_build.quantize.calibrate import calibrate
from genie_build.sizes.estimate import (LAYER_CONSTANT_BYTES, PREDICTED_VARIANTS, TABLE_ENTRY_BYTES, StoredSize,
                                        container_overhead, estimate, stored_size)
from genie_build.split.split import split_graphs
from genie_build.toolchains import get_toolchain
from genie_build.toolchains.base import CompileOptions
from genie_build.toolchains.graph_edits import IO_ENCODINGS_KEY
from genie_build.toolchains.reference.container import stored_nbytes, write_container
from genie_build.toolchains.reference.container_format import inspect_container, read_header
from genie_build.toolchains.reference.convert import FLOAT_BITWIDTH_KEY, QUANTIZED_WEIGHTS_KEY, convert_model
from genie_build.toolchains.reference.onnx_io import set_metadata_json
from demo_shapes import THREE_LAYERS, WIDE
from workflow_helpers import SMALL_DEMO, copy_workflow, run_snakemake
from workflow_helpers import write_config as write_workflow_config

REPO = Path(__file__).resolve().parents[1]
QWEN_7B = REPO / "config" / "hf" / "qwen2_5_7b_instruct.json"
MIB = 2 ** 20
REFERENCE = get_toolchain("reference")
# hidden 8, 2 heads of 4, 1 KV head, intermediate 16, vocab 32, 2 layers
SMALL = {"model_type": "qwen2", "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
         "intermediate_size": 16, "vocab_size": 32, "num_hidden_layers": 2, "max_position_embeddings": 64,
         "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


def write_config(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**SMALL, **changes}))
    return path


def graph_weights(path: Path) -> ModelWeights:
    """The weights of an ONNX graph at the boundaries its node scopes give."""
    model = load_graph(path)
    return weights_from_graph(model, find_boundaries(model, path))


def sizes(result, variant: str, key: str = "weight_bytes") -> list[int]:
    return [getattr(part, key) for part in result.parts if part.variant == variant]


# ------------------------------------------------------------------------------------------- by hand

def test_piece_and_part_bytes_of_a_small_qwen2_config_match_hand_computation(tmp_path):
    result = estimate(weights_from_hf_config(write_config(tmp_path)), Precision(), num_parts=3)
    # planner rule (plan.quantized_bytes): bits/8 per value + 4 bytes per scale; fp16 norms and biases
    #   embedding [32, 8] 8-bit, 32 channels: 256 + 128; head: norm 16 + lm_head [8, 32] 8-bit 256 + 128
    #   layer: q,o [8,8] 32+32 each; k,v [8,4] 16+16 each; gate,up [8,16] 64+64 each; down [16,8] 64+32;
    #          biases (8 + 4 + 4) * 2 = 32; two norms 32
    assert [piece.bytes for piece in result.plan.pieces] == [384, 608, 608, 400]
    assert [part.pieces for part in result.plan.parts] == [("embedding",), ("layer_0",), ("layer_1", "head")]
    # container rule: values one per byte (packed: 4-bit two per byte) + float32 scale and uint8 zero point
    # per channel; layer unpacked 104+52+52+104+208+208+168+64 = 960, packed 72+36+36+72+144+144+104+64 = 672
    embedding, head = 256 + 32 * 5, 16 + 256 + 32 * 5
    layer = {"unpacked": 960 + LAYER_CONSTANT_BYTES, "packed": 672 + LAYER_CONSTANT_BYTES}
    for name, copies in (("unpacked", 1), ("packed", 1), ("unpacked_unshared", 2), ("packed_unshared", 2)):
        per_layer = layer[name.removesuffix("_unshared")]
        assert sizes(result, name) == [copies * embedding, copies * per_layer, copies * (per_layer + head)]
    # table entries: 3 per quantized weight, 1 per float one: embedding 3, layer 7*3 + 3 + 2, head 1 + 3
    pieces = {piece.name: piece for piece in result.plan.pieces}
    overheads = [container_overhead([pieces["embedding"]], 3), container_overhead([pieces["layer_0"]], 26),
                 container_overhead([pieces["layer_1"], pieces["head"]], 30)]
    file_minus_weights = [file - weights for file, weights in zip(sizes(result, "packed", "file_bytes"),
                                                                   sizes(result, "packed"))]
    assert file_minus_weights == overheads
    assert overheads[1] - container_overhead([pieces["layer_0"]], 0) == 26 * TABLE_ENTRY_BYTES


def test_a_tied_head_is_its_own_lm_head_as_the_export_writes_it(tmp_path):
    model = weights_from_hf_config(write_config(tmp_path, tie_word_embeddings=True))
    by_name = {weight.spec.name: weight for weight in model.weights}
    assert by_name[EMBED_WEIGHT].pieces == {0}
    assert by_name[LM_HEAD_WEIGHT].pieces == {3} and by_name[LM_HEAD_WEIGHT].spec.shape == (8, 32)
    result = estimate(model, Precision(), num_parts=3)
    assert result.plan.pieces[-1].bytes == 16 + 384      # final norm + the 8-bit head, a copy of the table


def test_llama_biases_follow_attention_bias_and_mlp_bias(tmp_path):
    def biases(**config) -> list[str]:
        model = weights_from_hf_config(write_config(tmp_path, **config))
        return sorted(weight.spec.name.split(".")[-2] for weight in model.weights
                      if weight.spec.name.endswith(".bias") and ".layers.0." in weight.spec.name)

    assert biases() == ["k_proj", "q_proj", "v_proj"]
    assert biases(model_type="llama") == []
    assert biases(model_type="llama", attention_bias=True) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert biases(model_type="llama", mlp_bias=True) == ["down_proj", "gate_proj", "up_proj"]


def test_qwen3_has_its_head_dim_and_query_key_norms(tmp_path):
    model = weights_from_hf_config(write_config(tmp_path, model_type="qwen3", head_dim=8))
    shapes = {weight.spec.name: weight.spec.shape for weight in model.weights if ".layers.0." in weight.spec.name}
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (8, 16)     # 2 heads of 8
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == (16, 8)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (8, 8)      # 1 KV head of 8
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == shapes["model.layers.0.self_attn.k_norm.weight"] == (8,)
    assert not any(name.endswith(".bias") for name in shapes)


@pytest.mark.parametrize("changes, message", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"hidden_size": None}, "hidden_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
])
def test_unsupported_configs_are_refused_naming_the_file(tmp_path, changes, message):
    config = {key: value for key, value in {**SMALL, **changes}.items() if value is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(GenieBuildError, match=message) as error:
        weights_from_hf_config(path)
    assert str(path) in str(error.value)


# ------------------------------------------------------------------------------------------- precision

def test_overrides_come_first_and_granularity_sets_the_scale_count(tmp_path):
    model = weights_from_hf_config(write_config(tmp_path))
    by_name = {weight.spec.name: weight for weight in model.weights}
    precision = Precision(granularity="per_tensor", overrides=(
        WeightRule("*.down_proj.weight", 8, granularity="per_block", block_size=4),
        WeightRule("model.layers.1.*", 16, dtype="float"),
        WeightRule("*.down_proj.weight", 16)))
    for layer in (0, 1):    # first match wins: layer 1's down_proj takes the per-block rule, not the later ones
        down = weight_encoding(by_name[f"model.layers.{layer}.mlp.down_proj.weight"], precision)
        assert (down.bitwidth, down.kind, len(down.scale)) == (8, "per_block", 4 * 8)   # [16, 8]: 4 blocks x 8
    assert weight_encoding(by_name["model.layers.1.mlp.up_proj.weight"], precision).dtype == "float"
    q0 = weight_encoding(by_name["model.layers.0.self_attn.q_proj.weight"], precision)
    assert (q0.bitwidth, q0.kind, len(q0.scale)) == (4, "per_tensor", 1)
    assert weight_encoding(by_name["model.layers.0.input_layernorm.weight"], precision) is None
    table = weight_encoding(by_name[EMBED_WEIGHT], Precision())
    assert (table.bitwidth, len(table.scale)) == (8, 32)      # per vocab row, as calibration does


def test_a_16_bit_lm_head_costs_two_bytes_per_value_packed_or_not(tmp_path):
    model = weights_from_hf_config(write_config(tmp_path))
    base = estimate(model, Precision(), num_parts=3)
    wide = estimate(model, Precision(lm_head=16), num_parts=3)
    for variant in ("unpacked", "packed"):
        # 256 values 1 -> 2 bytes, 32 zero points 1 -> 2 bytes
        assert sizes(wide, variant)[-1] - sizes(base, variant)[-1] == 256 + 32


def test_shipped_estimate_configs_hold_the_default_precision():
    for parts in (6, 11):
        assert read_precision(REPO / "config" / f"qwen2_5_7b_{parts}parts.yaml") == Precision()


@pytest.mark.parametrize("precision, message", [
    ({"layer": 4}, "Additional properties"),
    ({"layers": 3}, "precision layers"),
    ({"granularity": "per_block"}, "per_block needs a block_size"),
    ({"overrides": [{"pattern": "x", "bitwidth": 8, "dtype": "float"}]}, "float bitwidth 8"),
    ({"overrides": [{"pattern": "x", "bitwidth": 5}]}, "int bitwidth 5"),
])
def test_bad_precisions_are_refused_naming_the_field(precision, message):
    with pytest.raises(GenieBuildError, match=message):
        precision_from_dict(precision, "r.yaml")


def test_precision_file_without_a_precision_mapping_is_refused(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("model: {name: x}\nrecipe: {layers: 8}\n")
    with pytest.raises(GenieBuildError, match="top-level 'precision'"):
        read_precision(path)


def test_a_per_block_rule_that_does_not_divide_the_weight_is_refused(tmp_path):
    model = weights_from_hf_config(write_config(tmp_path))
    with pytest.raises(GenieBuildError, match="whole number of blocks"):
        estimate(model, Precision(granularity="per_block", block_size=3), num_parts=2)


# ------------------------------------------------------------------------------------------- config == graph

# the export dims of the demo below (its max_position_embeddings is its context, 16)
DEMO_DIMS = ("--ar", "4", "--context", "16")


@pytest.fixture(scope="module", params=["float32", "float16"])
def demo(request, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp(f"demo_{request.param}")
    generate_demo(dataclasses.replace(THREE_LAYERS, weight_dtype=request.param), out)
    return out


@pytest.mark.parametrize("num_parts, embedding_alone", [(2, True), (3, True), (3, False), (4, True)])
def test_config_and_graph_of_the_same_shape_estimate_exactly_alike(demo, num_parts, embedding_alone):
    precision = Precision(overrides=(WeightRule("model.layers.1.mlp.*", 8), WeightRule("*.bias", 16, dtype="float")))
    from_config = estimate(weights_from_hf_config(demo / "config.json"), precision, num_parts=num_parts,
                           embedding_alone=embedding_alone)
    from_graph = estimate(graph_weights(demo / "prompt.onnx"), precision, num_parts=num_parts,
                          embedding_alone=embedding_alone)
    assert from_graph == from_config
    assert len(from_config.parts) == num_parts * len(PREDICTED_VARIANTS)


def test_graph_weights_leave_constants_out_and_take_roles_from_their_pieces(demo):
    model = graph_weights(demo / "prompt.onnx")
    roles = {weight.spec.name: weight.role for weight in model.weights}
    assert roles[EMBED_WEIGHT] == "embedding" and roles[LM_HEAD_WEIGHT] == "lm_head"
    assert roles["model.layers.2.mlp.up_proj.weight"] == "layers"
    assert roles["model.layers.0.self_attn.q_proj.bias"] == "float"
    assert not any("shape" in name or name.endswith("eps") for name in roles)


# ------------------------------------------------------------------------------------------- vs compiled

@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict:
    """A demo built by the package functions: calibrate, plan, split, slice, convert, compile 4 variants."""
    root = tmp_path_factory.mktemp("compiled")
    source = root / "source"
    generate_demo(WIDE, source)
    encodings = {kind: source / f"{kind}.encodings.json" for kind in ("prompt", "token")}
    calibrate(source / "prompt.onnx", source / "token.onnx", encodings["prompt"], encodings["token"], num_samples=1)
    prompt = load_graph(source / "prompt.onnx")
    pieces = weighed_pieces(weights_from_graph(prompt, find_boundaries(prompt, source / "prompt.onnx")),
                            by_encodings(read_encodings(encodings["prompt"])))
    plan = plan_by_num_parts(pieces, 3)
    parts = split_graphs({kind: source / f"{kind}.onnx" for kind in encodings}, plan, root / "parts")
    converted: dict[str, dict[str, Path]] = {part.label: {} for part in plan.parts}
    for kind, paths in parts.items():
        full = read_encodings(encodings[kind])
        for part, path in zip(plan.parts, paths):
            assert path == part_graph_path(root / "parts", part.label, kind)
            part_encodings = part_encodings_path(root / "encodings", part.label, kind)
            write_encodings(part_encodings, slice_encodings(full, *part_tensor_names(path)))
            name = load_graph(path).graph.name
            out = root / "converted" / kind / f"part_{part.label}.onnx"
            convert_model(path, part_encodings, out, graph_name=name, float_bitwidth=16)
            converted[part.label][name] = out
    measured = {}
    for variant in PREDICTED_VARIANTS:
        options = CompileOptions(weights_packing=variant.weights_packing, optimization_type=3,
                                 weight_sharing_enabled=variant.weight_sharing_enabled, vtcm_mb=0, soc_model=69,
                                 dsp_arch="v79")
        for part in plan.parts:
            binary = root / "compiled" / variant.name / f"part_{part.label}.bin"
            write_container(converted[part.label], binary, options)
            info = inspect_container(binary)
            measured[(part.index, variant.name)] = (info.weight_bytes, info.file_bytes)
    return {"source": source, "plan": plan, "measured": measured, "root": root}


@pytest.mark.parametrize("source", ["config", "graph"])
def test_estimate_is_within_1_percent_of_compiled_containers_per_part_and_in_total(compiled, source):
    model = (weights_from_hf_config(compiled["source"] / "config.json") if source == "config"
             else graph_weights(compiled["source"] / "prompt.onnx"))
    result = estimate(model, Precision(), num_parts=3)
    assert [part.pieces for part in result.plan.parts] == [part.pieces for part in compiled["plan"].parts]
    for variant in PREDICTED_VARIANTS:
        predicted = [part for part in result.parts if part.variant == variant.name]
        measured = [compiled["measured"][(part.part, variant.name)] for part in predicted]
        for part, (weight_bytes, file_bytes) in zip(predicted, measured):
            assert part.file_bytes == pytest.approx(file_bytes, rel=0.01), (variant.name, part.part)
            assert part.weight_bytes == pytest.approx(weight_bytes, rel=0.01), (variant.name, part.part)
        assert sum(part.file_bytes for part in predicted) == pytest.approx(sum(m[1] for m in measured), rel=0.01)


def test_the_overhead_model_is_needed_for_1_percent(compiled):
    """Without the header and graph structures the small demo's files would be missed by far more than 1%."""
    result = estimate(weights_from_hf_config(compiled["source"] / "config.json"), Precision(), num_parts=3)
    layer_part = next(part for part in result.parts if part.part == 2 and part.variant == "packed")
    file_bytes = compiled["measured"][(2, "packed")][1]
    assert layer_part.weight_bytes < 0.95 * file_bytes


def weight_of_entries(entries: list[dict]) -> dict[str, str]:
    """Weight-table entry name -> the initializer of the source graph it stores (values, scale and zero point
    of a quantized weight, LPBQ's block integer scales and reshape constant; the float16 copy of a float32
    one)."""
    owner = {}
    for entry in entries:
        quantization = entry.get("quantization")
        if quantization is not None:
            weight = quantization["weight"]
            owner.update({name: weight for name in (entry["name"], quantization["scale"], quantization["zero_point"],
                                                    quantization.get("block_int_scale"), f"{weight}_shape") if name})
    return {entry["name"]: owner.get(entry["name"], entry["name"].removesuffix("_float16")) for entry in entries}


@pytest.mark.parametrize("variant", ["unpacked", "packed"])
def test_stored_size_of_every_weight_is_what_the_container_stores(compiled, variant):
    """Per initializer of every part: the bytes and entries :func:`stored_size` predicts from its shape and
    encoding are the lengths and entries the compiled container holds for it."""
    source = compiled["source"]
    specs = initializer_specs(load_graph(source / "prompt.onnx"))
    params = read_encodings(source / "prompt.encodings.json").params
    checked = 0
    for binary in sorted((compiled["root"] / "compiled" / variant).glob("*.bin")):
        entries = read_header(binary)["weights"]
        stored: dict[str, list[int]] = {}
        for entry in entries:
            stored.setdefault(weight_of_entries(entries)[entry["name"]], []).append(entry["length"])
        for name, lengths in stored.items():
            predicted = stored_size(specs[name], params.get(name), 16, packing=variant == "packed")
            assert (sum(lengths), len(lengths)) == (predicted.bytes, predicted.tensors), name
            checked += predicted.tensors > 1
    assert checked == len(params)      # every quantized weight was among them


STORAGE_KINDS = {"u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64", "f16", "f32", "f64", "b8", "packed4",
                 "packed4_signed"}


def write_converted_graph(path: Path, name: str) -> Path:
    """A converted graph (as convert writes it) with a tensor for each storage kind of the container: raw
    tensors of every dtype, 4-bit values, 8-bit values in the 4-bit range and full-range 8-bit values, all of
    an odd count."""
    rng = np.random.default_rng(0)
    shape = (3, 5)
    tensors = {f"raw_{dtype}": rng.integers(0, 100, size=shape).astype(dtype) for dtype in
               ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16", "float32",
                "float64", "bool")}
    codes = {"w4": rng.integers(0, 16, size=shape), "w8_narrow": 128 + rng.integers(-8, 8, size=shape),
             "w8_wide": rng.integers(0, 256, size=shape)}
    quantized = {}
    for weight, values in codes.items():
        tensors |= {f"{weight}_quantized": values.astype(np.uint8), f"{weight}_scale": np.array(0.1, np.float32),
                    f"{weight}_zero_point": np.array(8 if weight == "w4" else 128, np.uint8)}
        quantized[f"{weight}_quantized"] = {"weight": weight, "bitwidth": 4 if weight == "w4" else 8,
                                            "encoding": "per_tensor", "axis": None, "block_axis": None, "block_size": None,
                                            "scale": f"{weight}_scale", "zero_point": f"{weight}_zero_point"}
    value = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], name,
                              [value("x", onnx.TensorProto.FLOAT, [1])], [value("y", onnx.TensorProto.FLOAT, [1])],
                              [numpy_helper.from_array(array, tensor) for tensor, array in tensors.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    for key, recorded in ((QUANTIZED_WEIGHTS_KEY, quantized), (IO_ENCODINGS_KEY, {}), (FLOAT_BITWIDTH_KEY, 16)):
        set_metadata_json(model, key, recorded)
    onnx.save(model, path)
    return path


def test_stored_nbytes_is_the_length_the_container_writes_for_every_storage_kind(tmp_path):
    graph = write_converted_graph(tmp_path / "g.onnx", "g")
    seen = set()
    for packing in (False, True):
        binary = tmp_path / f"packing_{packing}.bin"
        write_container({"g": graph}, binary, CompileOptions(weights_packing=packing, optimization_type=3,
                                                             weight_sharing_enabled=True, vtcm_mb=0, soc_model=69,
                                                             dsp_arch="v79"))
        for entry in read_header(binary)["weights"]:
            packed = entry["storage"] in ("packed4", "packed4_signed")
            assert stored_nbytes(entry["shape"], entry["dtype"], packed) == entry["length"], entry["name"]
            seen.add(entry["storage"])
    assert seen == STORAGE_KINDS
    assert stored_nbytes((3, 5), "uint8", packed=True) == 8      # odd count: half a byte of padding
    with pytest.raises(GenieBuildError, match="cannot store a tensor of dtype bfloat16"):
        stored_nbytes((2,), "bfloat16")


# ------------------------------------------------------------------------------------------- precision in config

def test_the_builtin_calibrator_quantizes_every_weight_as_the_default_precision_predicts(compiled):
    """The default precision (the estimate's, and the schema's 'precision' defaults) is what the builtin calibrator
    gives the demo: every weight's encoding, scale by scale, or none where the precision keeps it float."""
    calibrated = read_encodings(compiled["source"] / "prompt.encodings.json")
    for weight in graph_weights(compiled["source"] / "prompt.onnx").weights:
        predicted, actual = weight_encoding(weight, Precision()), calibrated.of_initializer(weight.spec.name)
        if predicted is None:
            assert actual is None, weight.spec.name
            continue
        assert (actual.dtype, actual.bitwidth, actual.kind, actual.is_symmetric, len(actual.scale), actual.offset) == (
            predicted.dtype, predicted.bitwidth, predicted.kind, predicted.is_symmetric, len(predicted.scale),
            predicted.offset), weight.spec.name


@pytest.mark.parametrize("parts", [6, 11])
def test_estimate_only_configs_validate_without_onnx_paths(parts):
    """As Snakemake merges them over config/config.yaml: an HF config and no ONNX, encodings or tokenizer."""
    merged = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    for key, value in yaml.safe_load((REPO / "config" / f"qwen2_5_7b_{parts}parts.yaml").read_text()).items():
        merged[key] = {**merged.get(key, {}), **value}
    config = validate_config(merged)
    assert config["model"] == {"name": f"qwen2_5_7b_{parts}parts", "hf_config": "config/hf/qwen2_5_7b_instruct.json"}
    assert precision_from_dict(config["precision"]) == Precision()


# ------------------------------------------------------------------------------------------- Qwen2.5-7B

def test_qwen_7b_estimate_runs_in_seconds_and_matches_the_field_report_part_2():
    start = time.perf_counter()
    model = weights_from_hf_config(QWEN_7B)
    eleven = estimate(model, Precision(), num_parts=11)
    six = estimate(model, Precision(), num_parts=6)
    assert time.perf_counter() - start < 10
    part_2 = eleven.plan.parts[1]
    assert (part_2.first_layer, part_2.last_layer) == (0, 2)
    # the field report's part 2 A/B: 672.6 MB by the CLI, 337.3 MB packed; its "MB" are MiB
    assert sizes(eleven, "unpacked", "file_bytes")[1] / MIB == pytest.approx(672.6, rel=0.01)
    assert sizes(eleven, "packed", "file_bytes")[1] / MIB == pytest.approx(337.3, rel=0.01)
    assert six.plan.parts[1].last_layer - six.plan.parts[1].first_layer + 1 > 3    # not the 6-part build
    for variant in ("unpacked", "packed"):    # the split moves bytes between parts, not in or out
        assert sum(sizes(six, variant)) == sum(sizes(eleven, variant))


# ------------------------------------------------------------------------------------------- command

def test_command_writes_plan_size_table_and_memory_plan(tmp_path, demo):
    out = tmp_path / "predicted"
    assert main(["estimate", "--hf-config", str(demo / "config.json"), *DEMO_DIMS, "--num-parts", "3",
                 "--precision", str(REPO / "config" / "qwen2_5_7b_6parts.yaml"), "--out-dir", str(out)]) == 0
    plan = read_plan(out / "plan.json")
    assert plan.num_parts == 3 and plan.parts[0].pieces == ("embedding",)
    table = (out / "size_table.csv").read_text().splitlines()
    assert len(table) == 1 + 3 * len(PREDICTED_VARIANTS) and table[0].startswith("part,variant,baseline")
    memory = json.loads((out / "memory_plan.json").read_text())
    assert (memory["variant"], memory["basis"], memory["num_contexts"]) == ("packed", "predicted", 3)
    summary = json.loads((out / "estimate.json").read_text())
    assert summary["totals"]["packed"]["file_bytes"] == memory["total_file_bytes"]
    # the variants are the fixed predicted set, named as such, not the config's
    assert summary["variant_set"].startswith("predicted: weights_packing x weight_sharing_enabled")
    assert [variant["name"] for variant in summary["variants"]] == ["unpacked_unshared", "unpacked",
                                                                    "packed_unshared", "packed"]
    assert (out / "size_table.png").read_bytes().startswith(b"\x89PNG")


def test_command_from_a_graph_with_a_part_budget(tmp_path, demo):
    out = tmp_path / "predicted"
    boundaries = weights_from_hf_config(demo / "config.json").boundaries
    assert main(["estimate", "--onnx", str(demo / "prompt.onnx"), "--max-part-mb", "0.02",
                 "--boundaries", *boundaries, "--out-dir", str(out)]) == 0
    plan = read_plan(out / "plan.json")
    assert plan.mode == "max_part_mb" and max(part.estimated_bytes for part in plan.parts) <= 0.02 * MIB


def test_command_takes_the_precision_as_json_and_the_memory_limits(tmp_path, demo, capsys):
    out = tmp_path / "predicted"
    option = "--precision-json"
    assert main(["estimate", "--hf-config", str(demo / "config.json"), *DEMO_DIMS, "--num-parts", "3",
                 option, '{"lm_head": 16}', "--max-context-mb", "0.01", "--out-dir", str(out)]) == 0
    assert json.loads((out / "estimate.json").read_text())["precision"]["lm_head"] == 16
    memory = json.loads((out / "memory_plan.json").read_text())
    assert memory["limits"]["max_context_bytes"]["value"] == round(0.01 * MIB)
    assert {warning["part"] for warning in memory["warnings"] if warning["check"] == "context_size"} == {1, 2, 3}
    for bad, problem in (('{"lm_head": 3}', "precision lm_head"), ("[4]", "expected a JSON object")):
        assert main(["estimate", "--hf-config", str(demo / "config.json"), *DEMO_DIMS, "--num-parts", "3",
                     option, bad, "--out-dir", str(out)]) == 2
        assert problem in capsys.readouterr().err


def test_command_takes_a_named_recipe_as_the_precision_it_gives(tmp_path, demo):
    """``--recipe``: the bits AIMET's LLM recipe gives each weight under the named recipe, as a calibrating build's
    plan weighs them; w8a16's 8-bit layers make larger parts than w4a16's."""
    predicted = {}
    for name in ("w4a16", "w8a16"):
        out = tmp_path / name
        assert main(["estimate", "--hf-config", str(demo / "config.json"), *DEMO_DIMS, "--num-parts", "3", "--recipe", name,
                     "--out-dir", str(out)]) == 0
        direct = estimate(weights_from_hf_config(demo / "config.json"), precision_of(RECIPES[name]), num_parts=3)
        predicted[name] = predicted_bytes(out)
        assert predicted[name] == {(part.part, part.variant): part.file_bytes for part in direct.parts}
        assert json.loads((out / "estimate.json").read_text())["precision"]["layers"] == RECIPES[name].weight_bitwidth
    assert sum(predicted["w8a16"].values()) > sum(predicted["w4a16"].values())


def test_a_build_that_calibrates_refuses_a_precision_section():
    """Its weights are quantized by quantize.recipe, which the estimate then weighs them by: a precision section
    would describe another quantization. A build whose encodings come with it keeps the section."""
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    calibrating = {**base, "demo": {**base.get("demo", {}), "calibrator": "aimet"}, "precision": {"layers": 8}}
    with pytest.raises(GenieBuildError, match=r"precision: .*quantize.recipe \(w4a16\)"):
        validate_config(calibrating)
    assert validate_config({**base, "precision": {"layers": 8}})["precision"]["layers"] == 8
    assert "precision" not in validate_config(base)


def test_command_refuses_boundaries_with_a_config(tmp_path, demo, capsys):
    code = main(["estimate", "--hf-config", str(demo / "config.json"), *DEMO_DIMS, "--num-parts", "2",
                 "--boundaries", "a", "b", "--out-dir", str(tmp_path)])
    assert code == 2 and "--boundaries" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- workflow

PREDICTED_FILES = ["estimate.json", "memory_plan.json", "memory_plan.md", "memory_plan.png", "plan.json",
                   "size_table.csv", "size_table.md", "size_table.png"]


def predicted_bytes(out: Path) -> dict[tuple[int, str], int]:
    with open(out / "size_table.csv", newline="") as handle:
        return {(int(row["part"]), row["variant"]): int(row["bytes"]) for row in csv.DictReader(handle)}


@pytest.mark.workflow
def test_estimate_target_predicts_a_7b_model_from_its_config_alone(tmp_path):
    """``snakemake estimate`` with the shipped estimate-only config: no weights, no demo built, and the precision
    is the config's (here overridden by a second config file, as Snakemake merges them)."""
    workdir = copy_workflow(tmp_path)
    (workdir / "wide_head.yaml").write_text("precision: {lm_head: 16}\n")
    # targets before --configfile, which takes several files
    run_snakemake(workdir, "estimate", "--configfile", "config/qwen2_5_7b_6parts.yaml", "wide_head.yaml")
    out = workdir / "results" / "qwen2_5_7b_6parts"
    assert sorted(path.name for path in (out / "predicted").iterdir()) == PREDICTED_FILES
    assert not (out / "source").exists()
    direct = estimate(weights_from_hf_config(QWEN_7B), Precision(lm_head=16), num_parts=6)
    assert predicted_bytes(out / "predicted") == {(part.part, part.variant): part.file_bytes for part in direct.parts}
    assert read_plan(out / "predicted" / "plan.json") == direct.plan


@pytest.mark.workflow
def test_the_estimate_of_a_calibrating_build_weighs_its_named_recipe(tmp_path):
    workdir = copy_workflow(tmp_path)
    config = write_workflow_config(workdir, {**SMALL_DEMO, "demo": {**SMALL_DEMO["demo"], "calibrator": "aimet"},
                                             "quantize": {"recipe": "w8a16"}})
    result = run_snakemake(workdir, "estimate", "--dry-run", "--printshellcmds", "--configfile", str(config))
    assert "--recipe w8a16" in result.stdout and "--precision" not in result.stdout


@pytest.mark.workflow
def test_estimate_of_the_demo_predicts_the_plan_the_workflow_makes(tmp_path):
    """From the demo's prompt graph (no weights read) and the default precision: the parts of the real plan,
    which the workflow makes from the calibrated encodings."""
    workdir = copy_workflow(tmp_path)
    run_snakemake(workdir, "estimate", "results/demo/plan.json", "--configfile",
                  str(write_workflow_config(workdir, SMALL_DEMO)))
    predicted = read_plan(workdir / "results" / "demo" / "predicted" / "plan.json")
    planned = read_plan(workdir / "results" / "demo" / "plan.json")
    assert [part.pieces for part in predicted.parts] == [part.pieces for part in planned.parts]
    assert predicted.boundaries == planned.boundaries


# ------------------------------------------------------------------------------------------- LPBQ, 16-bit table

def lpbq_graph(path: Path) -> dict[str, np.ndarray]:
    """ids -> Gather(table) -> MatMul [in, out] -> Transpose + MatMul [out, in]: LPBQ weights both ways."""
    rng = np.random.default_rng(3)
    weights = {"table": rng.normal(size=(16, 64)).astype(np.float32),
               "w_in_out": rng.normal(size=(64, 96)).astype(np.float32),
               "w_out_in": rng.normal(size=(32, 96)).astype(np.float32)}
    nodes = [helper.make_node("Gather", ["table", "ids"], ["x"]), helper.make_node("MatMul", ["x", "w_in_out"], ["a"]),
             helper.make_node("Transpose", ["w_out_in"], ["w_t"], perm=[1, 0]),
             helper.make_node("MatMul", ["a", "w_t"], ["y"])]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [value("ids", onnx.TensorProto.INT64, [1, 2])],
                              [value("y", onnx.TensorProto.FLOAT, [1, 2, 32])],
                              [numpy_helper.from_array(array, name) for name, array in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), path)
    return weights


def lpbq_entry(name: str, channels: int, blocks: int) -> dict:
    return {"name": name, "dtype": "INT", "enc_type": "LPBQ", "bw": 8, "compressed_bw": 4, "is_sym": True,
            "block_size": 32, "scale": [0.01 * (c + 1) for c in range(channels)], "offset": [-128] * channels,
            "per_block_int_scale": [1 + (i % 16) for i in range(channels * blocks)]}


@pytest.mark.parametrize("packing", [False, True])
def test_lpbq_and_a_16_bit_table_are_stored_as_their_encodings_say_and_estimated_exactly(tmp_path, packing):
    """LPBQ: 4-bit values, a uint8 integer scale per block, a float scale per channel; the table, which AIMET
    encodes as an activation (16-bit per tensor), as uint16. stored_size predicts every byte and entry."""
    weights = lpbq_graph(tmp_path / "g.onnx")
    doc = {"version": "1.0.0", "activation_encodings": [
        {"name": "table", "dtype": "INT", "enc_type": "PER_TENSOR", "bw": 16, "is_sym": False,
         "scale": [1e-4], "offset": [-31344]}],
        "param_encodings": [lpbq_entry("w_in_out", 96, 2), lpbq_entry("w_out_in", 32, 3)]}
    (tmp_path / "g.encodings").write_text(json.dumps(doc))
    enc = read_encodings(tmp_path / "g.encodings")
    REFERENCE.convert(tmp_path / "g.onnx", tmp_path / "g.encodings", tmp_path / "c.onnx", graph_name="g",
                      float_bitwidth=16)
    REFERENCE.compile({"g": tmp_path / "c.onnx"}, tmp_path / "c.bin",
                      CompileOptions(weights_packing=packing, optimization_type=3, weight_sharing_enabled=True,
                                     vtcm_mb=0, soc_model=69, dsp_arch="v79"))
    entries = read_header(tmp_path / "c.bin")["weights"]
    by_name = {entry["name"]: entry for entry in entries}
    assert by_name["table_quantized"]["dtype"] == "uint16" and by_name["table_quantized"]["length"] == 16 * 64 * 2
    for name, channels, blocks in (("w_in_out", 96, 2), ("w_out_in", 32, 3)):
        values = by_name[f"{name}_quantized"]
        assert values["storage"] == ("packed4" if packing else "u8")
        assert by_name[f"{name}_block_int_scale"]["dtype"] == "uint8"
        assert int(np.prod(by_name[f"{name}_block_int_scale"]["shape"])) == channels * blocks
        assert int(np.prod(by_name[f"{name}_scale"]["shape"])) == channels
    specs = initializer_specs(load_graph(tmp_path / "g.onnx"))
    owner = weight_of_entries(entries)
    for name in weights:
        lengths = [entry["length"] for entry in entries if owner[entry["name"]] == name]
        predicted = stored_size(specs[name], enc.of_initializer(name), 16, packing=packing)
        assert (sum(lengths), len(lengths)) == (predicted.bytes, predicted.tensors), name


def test_an_lpbq_precision_counts_channel_and_block_scales(tmp_path):
    model = weights_from_hf_config(write_config(tmp_path))
    by_name = {weight.spec.name: weight for weight in model.weights}
    down = weight_encoding(by_name["model.layers.0.mlp.down_proj.weight"], Precision(granularity="lpbq", block_size=4))
    assert (down.kind, down.bitwidth, down.compressed_bitwidth) == ("lpbq", 8, 4)
    assert (len(down.scale), len(down.per_block_int_scale)) == (8, 4 * 8)          # [16, 8]: 8 channels x 4 blocks
    size = stored_size(by_name[down.name].spec, down, 16, packing=True)
    assert size == StoredSize(16 * 8 // 2 + 8 * 8 + 8 + 4 * 8 + 2 * 8, 5)


def test_the_estimate_command_refuses_a_context_a_build_of_the_model_refuses(demo, tmp_path, capsys):
    """Past ``max_position_embeddings`` (the demo's config.json says 16): one line, as the checkpoint's build says."""
    code = main(["estimate", "--hf-config", str(demo / "config.json"), "--ar", "4", "--context", "16", "32",
                 "--num-parts", "3", "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "config export.context: 32 exceeds the model's max_position_embeddings 16" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.workflow
def test_the_estimate_target_refuses_a_context_past_the_models_when_the_workflow_is_parsed(tmp_path):
    """``snakemake estimate`` of an estimate-only config whose export.context exceeds the model's
    max_position_embeddings (32,768 for Qwen2.5-7B): refused before any job, as a build of the checkpoint is."""
    workdir = copy_workflow(tmp_path)
    (workdir / "long.yaml").write_text("export: {ar: 128, context: [4096, 65536]}\n")
    result = run_snakemake(workdir, "estimate", "--configfile", "config/qwen2_5_7b_6parts.yaml", "long.yaml",
                           check=False)
    assert result.returncode != 0
    assert ("config export.context: 65536 exceeds the model's max_position_embeddings 32768 "
            "(config/hf/qwen2_5_7b_instruct.json)") in result.stdout + result.stderr
    assert not (workdir / "results").exists()


def test_auto_with_a_piece_no_session_holds_names_it_instead_of_asking_for_num_parts(tmp_path, capsys):
    """Qwen2.5-7B on sessions of 500 MiB: its embedding alone (526 MiB) fits no session, so no count of parts holds
    it and a fixed num_parts would build a part that does not map: one line says which and why."""
    code = main(["estimate", "--hf-config", str(QWEN_7B), "--num-parts", "auto", "--load-json",
                 '{"usable_mb": 500, "budget_mb": 450}', "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert ("split.num_parts: auto: part 1 of the 29-part split holds embedding alone, whose context needs 526 MiB, "
            "more than the 500 MiB of an HTP session: no part count holds it, and a fixed num_parts would build a "
            "part that does not map") in err
    assert "give num_parts" not in err
