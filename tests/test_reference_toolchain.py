"""The reference toolchain end to end: convert (runnable, weights as the numpy formula gives them), compile
into one container (executes bit for bit like the converted graphs; sharing and packing as asked; close to
the information minimum; deterministic), inspect, and the three CLI commands."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from demo_shapes import DEFAULT
from tiny_decoder import build_tiny_decoder

from genie_build import __version__
from genie_build.chipsets import lookup
from genie_build.cli import main
from genie_build.demo.demo import generate_demo
from genie_build.encodings import Encodings, TensorEncoding, layout_of, write_encodings
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import WeightLayout
from genie_build.toolchains import get_toolchain
from genie_build.toolchains.base import CompileOptions, QuantInfo
from genie_build.toolchains.reference import container
from genie_build.toolchains.reference import convert as reference_convert
from genie_build.toolchains.reference.container import load_container, read_graphs
from genie_build.toolchains.reference.container_format import read_header
from genie_build.toolchains.reference.packing import pack_int4
from genie_build.toolchains.reference.quantize import broadcast_params, dequantize, quantize, stored_bitwidth
from genie_build.toolchains.reference.records import Quantization

HIDDEN, VOCAB, LAYERS, AR, CONTEXT = 16, 64, 2, 4, 8
PROMPT, TOKEN = "prompt_ar4_cl8_1_of_1", "token_ar1_cl8_1_of_1"
OPTIONS = CompileOptions(weights_packing=True, optimization_type=3, weight_sharing_enabled=True, vtcm_mb=0,
                         soc_model=69, dsp_arch="v79", float_bitwidth=16)
REFERENCE = get_toolchain("reference")

L0, L1 = "model.layers.0", "model.layers.1"
BLOCKED_Q = f"{L0}.self_attn.q_proj.weight"     # per-block 4-bit, asymmetric
LPBQ_K = f"{L0}.self_attn.k_proj.weight"        # LPBQ 8 -> 4 bits
WIDE_V = f"{L0}.self_attn.v_proj.weight"        # 16-bit per tensor
NARROW_8BIT = f"{L0}.mlp.down_proj.weight"      # 8-bit whose values happen to fit 4 bits
BIAS_32BIT = f"{L1}.mlp.down_proj.bias"         # 32-bit, read from inside an If branch


# ------------------------------------------------------------------------------------------- fixtures

def source_weights(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(path)  # tiny: loading its external data is fine here
    return {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}


def symmetric(name: str, w: np.ndarray, bits: int, axis: int | None, levels: int | None = None) -> TensorEncoding:
    """AIMET min/max symmetric encoding; ``levels`` (default 2**(bits-1) - 1) sets how much range is used."""
    reduce_axes = None if axis is None else tuple(d for d in range(w.ndim) if d != axis)
    amax = np.maximum(np.abs(w).max(axis=reduce_axes), 1e-8).reshape(-1)
    scale = amax / (levels or 2 ** (bits - 1) - 1)
    return TensorEncoding(name, "int", bits, "per_tensor" if axis is None else "per_channel", True,
                          tuple(map(float, scale)), (-(2 ** (bits - 1)),) * scale.size)


def tiny_encodings(weights: dict[str, np.ndarray]) -> Encodings:
    """One weight of every kind the converter handles; the rest 4-bit per channel or float."""
    rng = np.random.default_rng(7)
    params = {name: symmetric(name, w, 4, w.ndim - 1) for name, w in weights.items()
              if w.ndim == 2 and name != "model.embed_tokens.weight"}
    params["model.embed_tokens.weight"] = symmetric("model.embed_tokens.weight",
                                                    weights["model.embed_tokens.weight"], 8, 0)
    params["lm_head.weight"] = symmetric("lm_head.weight", weights["lm_head.weight"], 8, 1)
    params[BLOCKED_Q] = TensorEncoding(BLOCKED_Q, "int", 4, "per_block", False,
                                       tuple(rng.uniform(0.05, 0.1, HIDDEN // 4 * HIDDEN).tolist()),
                                       tuple(rng.integers(-14, 0, HIDDEN // 4 * HIDDEN).tolist()), block_size=4)
    params[LPBQ_K] = TensorEncoding(LPBQ_K, "int", 8, "lpbq", True, tuple(rng.uniform(0.005, 0.01, HIDDEN).tolist()),
                                    (-128,) * HIDDEN, block_size=8, compressed_bitwidth=4,
                                    per_block_int_scale=tuple(rng.integers(1, 17, 2 * HIDDEN).tolist()))
    params[WIDE_V] = TensorEncoding(WIDE_V, "int", 16, "per_tensor", False, (1e-5,), (-30000,))
    params[NARROW_8BIT] = symmetric(NARROW_8BIT, weights[NARROW_8BIT], 8, None, levels=7)
    params[BIAS_32BIT] = TensorEncoding(BIAS_32BIT, "int", 32, "per_tensor", True, (1e-7,), (-(2**31),))
    params["model.norm.weight"] = TensorEncoding("model.norm.weight", "float", 32)
    activations = {
        "attention_mask": TensorEncoding("attention_mask", "int", 16, "per_tensor", False, (0.001,), (-50000,)),
        "logits": TensorEncoding("logits", "int", 16, "per_tensor", False, (0.0002,), (-32768,)),
        "past_key_0_in": TensorEncoding("past_key_0_in", "int", 8, "per_tensor", True, (0.01,), (-128,)),
        "past_key_0_out": TensorEncoding("past_key_0_out", "int", 8, "per_tensor", True, (0.01,), (-128,)),
        "position_ids_cos": TensorEncoding("position_ids_cos", "float", 16),
    }
    return Encodings(activations=activations, params=params)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """The tiny decoder's prompt (AR 4) and token (AR 1) graphs, their encodings and converted graphs."""
    root = tmp_path_factory.mktemp("tiny")
    sources = {name: build_tiny_decoder(root / f"{name}.onnx", layers=LAYERS, hidden=HIDDEN, vocab=VOCAB, ar=ar,
                                        context=CONTEXT, if_in_layer=1)
               for name, ar in ((PROMPT, AR), (TOKEN, 1))}
    weights = source_weights(sources[PROMPT])
    encodings = tiny_encodings(weights)
    write_encodings(root / "tiny.encodings.json", encodings)
    converted = {}
    for name, source in sources.items():
        converted[name] = root / "converted" / f"{name}.onnx"
        REFERENCE.convert(source, root / "tiny.encodings.json", converted[name], graph_name=name, float_bitwidth=16)
    return {"root": root, "sources": sources, "weights": weights, "encodings": encodings,
            "encodings_path": root / "tiny.encodings.json", "converted": converted}


def feeds(model_path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    model = onnx.load(model_path, load_external_data=False)
    initializers = {tensor.name for tensor in model.graph.initializer}
    rng = np.random.default_rng(seed)
    feed = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        shape = [dim.dim_value for dim in value.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        feed[value.name] = (rng.integers(0, VOCAB, shape) if value.name == "input_ids"
                            else rng.standard_normal(shape)).astype(dtype)
    return feed


def run(model: onnx.ModelProto | Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feed)


def with_outputs(path: Path, names: list[str]) -> onnx.ModelProto:
    """The model at ``path`` (weights loaded) with ``names`` added as float32 outputs."""
    model = onnx.load(path)
    model.graph.output.extend(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in names)
    return model


def with_opset(source: Path, opset: int, out: Path) -> Path:
    """``source`` declaring another opset, its external data shared (same folder, same data file)."""
    model = onnx.load(source, load_external_data=False)
    model.opset_import[0].version = opset
    onnx.save(model, out)
    return out


def compile_to(tiny: dict, out: Path, options: CompileOptions = OPTIONS, graphs: tuple[str, ...] = (PROMPT, TOKEN)
               ) -> Path:
    REFERENCE.compile({name: tiny["converted"][name] for name in graphs}, out, options)
    return out


def expected_weight(name: str, w: np.ndarray, encodings: Encodings, consumer_op: str | None) -> np.ndarray:
    """What the converted graph must hand its nodes for ``name``: the numpy formula, or fp16-rounded."""
    enc = encodings.of_initializer(name)
    if enc is None:
        return w.astype(np.float16).astype(np.float32)
    if enc.dtype == "float":
        return w
    consumer = (WeightLayout(0, 1) if consumer_op == "Gather" else WeightLayout(w.ndim - 1, w.ndim - 2)
                if w.ndim > 1 else WeightLayout(0, None))
    layout = layout_of(enc, w.shape, consumer)
    return dequantize(*quantize(w, enc, layout), None if layout is None else layout.channel_axis)


# ------------------------------------------------------------------------------------------- convert

@pytest.mark.parametrize("opset", [17, 21])
def test_converted_graph_runs_and_rebuilds_each_weight_exactly_as_the_numpy_formula(tiny, tmp_path, opset):
    source = with_opset(tiny["sources"][PROMPT], opset, tiny["root"] / f"{PROMPT}_opset{opset}.onnx")
    out = tmp_path / "part.onnx"
    REFERENCE.convert(source, tiny["encodings_path"], out, graph_name=PROMPT, float_bitwidth=16)
    float_weights = {name: w for name, w in tiny["weights"].items() if w.dtype == np.float32}
    model = with_outputs(out, list(float_weights))
    rebuilt = dict(zip([o.name for o in model.graph.output], run(model, feeds(source))))
    consumers = {name: "Gather" if name == "model.embed_tokens.weight" else "MatMul" for name in float_weights}
    for name, w in float_weights.items():
        np.testing.assert_array_equal(rebuilt[name], expected_weight(name, w, tiny["encodings"], consumers[name]),
                                      err_msg=name)
    producers = {output: node.op_type for node in onnx.load(out, load_external_data=False).graph.node
                 for output in node.output}
    # LPBQ is always written out: the graph multiplies its stored integer and float scales
    written_out = {BLOCKED_Q: "Reshape", LPBQ_K: "Reshape", WIDE_V: "Mul"} if opset < 21 else {LPBQ_K: "Reshape"}
    for name in tiny["encodings"].params:
        if tiny["encodings"].params[name].dtype == "int":
            assert producers[name] == written_out.get(name, "DequantizeLinear"), name


def test_each_weight_is_rebuilt_just_before_the_first_node_reading_it(tiny):
    """onnxruntime runs ready nodes in node order: rebuilt at the start, every weight would be float at once."""
    graph = onnx.load(tiny["converted"][PROMPT], load_external_data=False).graph
    available = {tensor.name for tensor in graph.initializer}
    top_level_reads = {name for node in graph.node for name in node.input}
    runs, run = [], []  # consecutive nodes that read initializers or each other only, with the node after them
    for node in graph.node:
        if all(name in available for name in node.input if name):
            available.update(node.output)
            run.append(node)
        elif run:
            runs.append((run, node))
            run = []
    assert len(runs) > 10
    for position, (rebuilding, reader) in enumerate(runs):
        produced = {name for node in rebuilding for name in node.output}
        used_later = produced - {name for node in rebuilding for name in node.input}
        if position == 0 and rebuilding[0] is graph.node[0]:  # weights only If bodies read go first
            used_later &= top_level_reads
        assert used_later and used_later <= set(reader.input), (reader.name, sorted(used_later))


def test_converted_graph_keeps_the_graph_name_metadata_and_relative_external_data(tiny):
    path = tiny["converted"][PROMPT]
    model = onnx.load(path, load_external_data=False)
    assert model.graph.name == PROMPT
    locations = {entry.value for tensor in model.graph.initializer for entry in tensor.external_data
                 if entry.key == "location"}
    assert locations == {f"{PROMPT}.onnx.data"} and (path.parent / f"{PROMPT}.onnx.data").is_file()
    types = {tensor.name: tensor.data_type for tensor in model.graph.initializer}
    assert types[f"{L0}.input_layernorm.weight_float16"] == onnx.TensorProto.FLOAT16
    assert types["model.norm.weight"] == onnx.TensorProto.FLOAT            # float encoding of 32 bits
    assert types[f"{BLOCKED_Q}_quantized"] == onnx.TensorProto.UINT8
    assert types[f"{WIDE_V}_quantized"] == onnx.TensorProto.UINT16
    assert types[f"{BIAS_32BIT}_quantized"] == onnx.TensorProto.INT32
    metadata = {entry.key: json.loads(entry.value) for entry in model.metadata_props}
    assert metadata["genie_build.io_encodings"]["attention_mask"] == {
        "dtype": "int", "bitwidth": 16, "scale": 0.001, "offset": -50000, "is_symmetric": False}
    assert metadata["genie_build.quantized_weights"][f"{LPBQ_K}_quantized"]["bitwidth"] == 4
    assert metadata["genie_build.float_bitwidth"] == 16


def test_float_bitwidth_32_keeps_float_weights_in_float32(tiny, tmp_path):
    out = tmp_path / "fp32.onnx"
    REFERENCE.convert(tiny["sources"][PROMPT], tiny["encodings_path"], out, graph_name=PROMPT, float_bitwidth=32)
    types = {tensor.name: tensor.data_type for tensor in onnx.load(out, load_external_data=False).graph.initializer}
    assert types[f"{L0}.input_layernorm.weight"] == onnx.TensorProto.FLOAT
    assert not any(name.endswith("_float16") for name in types)


def test_convert_refuses_bad_inputs_naming_the_file(tiny, tmp_path):
    source = tiny["sources"][PROMPT]
    with pytest.raises(GenieBuildError, match="is the input model"):
        REFERENCE.convert(source, tiny["encodings_path"], source, graph_name=PROMPT, float_bitwidth=16)
    stray = replace(tiny["encodings"], params={**tiny["encodings"].params,
                                               "no.such.weight": TensorEncoding("no.such.weight", "float", 16)})
    write_encodings(tmp_path / "stray.json", stray)
    with pytest.raises(GenieBuildError, match="no.such.weight") as caught:
        REFERENCE.convert(source, tmp_path / "stray.json", tmp_path / "x.onnx", graph_name=PROMPT, float_bitwidth=16)
    assert caught.value.where == str(tmp_path / "stray.json")
    assert not (tmp_path / "x.onnx").exists()


# ------------------------------------------------------------------------------------------- compile

@pytest.mark.parametrize("packing", [False, True])
@pytest.mark.parametrize("sharing", [False, True])
def test_container_executes_bit_for_bit_like_the_converted_graphs(tiny, tmp_path, packing, sharing):
    options = replace(OPTIONS, weights_packing=packing, weight_sharing_enabled=sharing)
    models = load_container(compile_to(tiny, tmp_path / "part.bin", options))
    assert sorted(models) == [PROMPT, TOKEN]
    for name, converted in tiny["converted"].items():
        feed = feeds(converted, seed=len(name))
        for restored, expected in zip(run(models[name], feed), run(converted, feed), strict=True):
            assert restored.dtype == expected.dtype and np.array_equal(restored, expected), name


def test_sharing_stores_each_shared_tensor_once_and_twice_without(tiny, tmp_path):
    per_graph = len(onnx.load(tiny["converted"][PROMPT], load_external_data=False).graph.initializer)
    shared = read_header(compile_to(tiny, tmp_path / "shared.bin"))["weights"]
    assert len(shared) == per_graph
    assert all(entry["graphs"] == [PROMPT, TOKEN] for entry in shared)
    unshared = read_header(compile_to(tiny, tmp_path / "unshared.bin",
                                      replace(OPTIONS, weight_sharing_enabled=False)))["weights"]
    assert len(unshared) == 2 * per_graph
    assert {entry["name"] for entry in unshared} == {entry["name"] for entry in shared}
    assert all(len(entry["graphs"]) == 1 for entry in unshared)


@pytest.mark.parametrize("sharing", [False, True])
def test_read_graphs_decodes_a_shared_weight_once_for_every_graph(tiny, tmp_path, sharing):
    container = compile_to(tiny, tmp_path / "part.bin", replace(OPTIONS, weights_packing=True,
                                                                 weight_sharing_enabled=sharing))
    graphs, models = read_graphs(container), load_container(container)
    prompt, token = graphs[PROMPT].weights, graphs[TOKEN].weights
    assert prompt.keys() == token.keys() and prompt
    assert all((prompt[name] is token[name]) == sharing for name in prompt)
    for name, graph in graphs.items():
        assert all(not tensor.HasField("raw_data") for tensor in graph.model.graph.initializer)
        for tensor in models[name].graph.initializer:
            assert np.array_equal(graph.weights[tensor.name], numpy_helper.to_array(tensor)), tensor.name


def test_packing_stores_4_bit_values_two_per_byte_and_other_widths_as_they_are(tiny, tmp_path):
    def table(packing: bool) -> dict[str, dict]:
        header = read_header(compile_to(tiny, tmp_path / f"{packing}.bin", replace(OPTIONS, weights_packing=packing)))
        return {entry["name"]: entry for entry in header["weights"]}

    packed, unpacked = table(True), table(False)
    expected = {f"{BLOCKED_Q}_quantized": ("packed4", "u8"), f"{LPBQ_K}_quantized": ("packed4", "u8"),
                f"{NARROW_8BIT}_quantized": ("packed4_signed", "u8"), f"{WIDE_V}_quantized": ("u16", "u16"),
                "model.embed_tokens.weight_quantized": ("u8", "u8"), "lm_head.weight_quantized": ("u8", "u8"),
                f"{BIAS_32BIT}_quantized": ("i32", "i32"), f"{L0}.input_layernorm.weight_float16": ("f16", "f16"),
                f"{BLOCKED_Q}_scale": ("f32", "f32"), f"{BLOCKED_Q}_zero_point": ("u8", "u8")}
    for name, storages in expected.items():
        assert (packed[name]["storage"], unpacked[name]["storage"]) == storages, name
    count = HIDDEN * HIDDEN
    assert unpacked[f"{BLOCKED_Q}_quantized"]["length"] == count
    assert packed[f"{BLOCKED_Q}_quantized"]["length"] == count // 2


def test_compiles_are_byte_identical(tiny, tmp_path):
    assert compile_to(tiny, tmp_path / "a.bin").read_bytes() == compile_to(tiny, tmp_path / "b.bin").read_bytes()


def whole_tensor_signed(values: np.ndarray, quantization: Quantization, zero_point: np.ndarray) -> np.ndarray:
    """``q - zero_point`` as the container computed it before it avoided tensor-sized temporaries."""
    return values.astype(np.int64) - broadcast_params(zero_point, values.shape, quantization.axis)


def whole_tensor_packable(values: np.ndarray, quantization: Quantization | None,
                          zero_point: np.ndarray | None) -> bool:
    """The packing rule as the container decided it before (an int64 copy of the whole tensor)."""
    if quantization is None or quantization.bitwidth > 8:
        return False
    if quantization.bitwidth <= 4:
        return True
    signed = whole_tensor_signed(values, quantization, zero_point)
    return bool(signed.size and signed.min() >= -8 and signed.max() <= 7)


def weight_quantization(bitwidth: int, axis: int | None) -> Quantization:
    """The record of a weight ``w`` as convert writes it, with its bitwidth and channel axis."""
    return Quantization(weight="w", bitwidth=bitwidth, encoding="per_channel" if axis is not None else "per_tensor",
                        axis=axis, block_axis=None, block_size=None, scale="w_scale", zero_point="w_zero_point")


def packing_cases() -> list[tuple[np.ndarray, Quantization, np.ndarray]]:
    """8-bit values against zero points in every layout, at, inside and one past the [-8, 7] bounds."""
    rng = np.random.default_rng(3)
    cases = []
    layouts = [((6, 8), None, ()), ((6, 8), 0, (6,)), ((6, 8), 1, (8,)), ((6, 8), -1, (8,)),
               ((6, 8), None, (3, 8)), ((6, 8), None, (6, 8)), ((6, 8), None, (1, 8)), ((9,), 0, (9,)),
               ((9,), None, ()), ((2, 3, 4), 1, (3,)), ((), None, ()), ((0, 8), 1, (8,)), ((0, 8), None, ())]
    for shape, axis, zero_shape in layouts:
        for low, high in ((-8, 7), (-9, 7), (-8, 8), (-3, 2), (-20, 20)):
            zero = rng.integers(9, 248, zero_shape).astype(np.uint8)  # room for -9 and +8 (0 and 255: below)
            expanded = broadcast_params(zero, shape, axis).astype(np.int64)
            values = np.clip(expanded + rng.integers(low, high + 1, shape), 0, 255).astype(np.uint8)
            if values.size:  # make the bounds reached exactly somewhere
                values.flat[0] = np.clip(expanded.flat[0] + low, 0, 255)
                values.flat[-1] = np.clip(expanded.flat[-1] + high, 0, 255)
            cases.append((values, weight_quantization(8, axis), zero))
    edge = np.array([[0, 255], [255, 0]], dtype=np.uint8)
    cases += [(edge, weight_quantization(8, None), np.array(0, np.uint8)),
              (edge, weight_quantization(8, None), np.array(255, np.uint8)),
              (np.array([[0, 7], [8, 15]], np.uint8), weight_quantization(8, 0), np.array([8, 8], np.uint8)),
              (np.array([[0, 7], [8, 16]], np.uint8), weight_quantization(8, 0), np.array([8, 8], np.uint8)),
              (np.array([[3, 4]], np.uint8), weight_quantization(4, None), np.array(0, np.uint8)),
              (np.array([[3, 4]], np.uint16), weight_quantization(16, None), np.array(3, np.uint16))]
    return cases


def test_packable_decides_as_the_whole_tensor_formula():
    decisions = []
    for values, quantization, zero_point in packing_cases():
        decision = container._packable(values, quantization, zero_point)
        assert decision == whole_tensor_packable(values, quantization, zero_point), (values.shape, quantization)
        decisions.append(decision)
    assert any(decisions) and not all(decisions)


def test_packed_signed_values_are_computed_in_row_blocks_as_on_the_whole_tensor(monkeypatch):
    monkeypatch.setattr(container, "BLOCK_VALUES", 5)  # blocks of one row, and of less than a row
    packed = 0
    for values, quantization, zero_point in packing_cases():
        if quantization.bitwidth == 8 and whole_tensor_packable(values, quantization, zero_point):
            storage, payload = container._encode(values, quantization, zero_point, True, Path("w"))
            assert storage == "packed4_signed"
            assert payload == pack_int4(whole_tensor_signed(values, quantization, zero_point) + 8)
            packed += 1
    assert packed >= 10


def test_compiled_bytes_do_not_change_with_the_blockwise_packing_rule(tiny, tmp_path, monkeypatch):
    new = compile_to(tiny, tmp_path / "new.bin").read_bytes()
    monkeypatch.setattr(container, "_packable", whole_tensor_packable)
    monkeypatch.setattr(container, "_signed_nibbles", lambda values, quantization, zero_point:
                        whole_tensor_signed(values, quantization, zero_point) + 8)
    assert compile_to(tiny, tmp_path / "old.bin").read_bytes() == new
    assert read_header(tmp_path / "new.bin")["applied_options"]["packable_weights"] > 0


def test_converts_are_byte_identical(tiny, tmp_path):
    out = tmp_path / "again" / f"{PROMPT}.onnx"
    REFERENCE.convert(tiny["sources"][PROMPT], tiny["encodings_path"], out, graph_name=PROMPT, float_bitwidth=16)
    first = tiny["converted"][PROMPT]
    assert out.read_bytes() == first.read_bytes()
    assert out.with_name(out.name + ".data").read_bytes() == first.with_name(first.name + ".data").read_bytes()


def convert_sharing(tiny: dict, folder: Path, token_source: Path | None = None) -> dict[str, Path]:
    """The prompt graph converted into ``folder``, and the token graph beside it sharing its weights."""
    prompt, token = folder / "prompt.onnx", folder / "token.onnx"
    REFERENCE.convert(tiny["sources"][PROMPT], tiny["encodings_path"], prompt, graph_name=PROMPT, float_bitwidth=16)
    REFERENCE.convert(token_source or tiny["sources"][TOKEN], tiny["encodings_path"], token, graph_name=TOKEN,
                      float_bitwidth=16, share_weights_with=prompt)
    return {PROMPT: prompt, TOKEN: token}


def external_locations(path: Path) -> dict[str, str]:
    """Each external initializer of a converted graph -> the data file it points at."""
    return {tensor.name: {entry.key: entry.value for entry in tensor.external_data}["location"]
            for tensor in onnx.load(path, load_external_data=False).graph.initializer
            if tensor.data_location == onnx.TensorProto.EXTERNAL}


def test_a_graph_converted_sharing_weights_points_at_their_bytes_and_compiles_to_the_same_binary(tiny, tmp_path):
    converted = convert_sharing(tiny, tmp_path / "part")
    locations = external_locations(converted[TOKEN])
    assert locations and set(locations.values()) == {"prompt.onnx.data"}
    assert converted[TOKEN].with_name("token.onnx.data").stat().st_size == 0
    feed = feeds(converted[TOKEN])
    for shared, alone in zip(run(converted[TOKEN], feed), run(tiny["converted"][TOKEN], feed), strict=True):
        assert np.array_equal(shared, alone)
    for sharing in (False, True):
        options = replace(OPTIONS, weight_sharing_enabled=sharing)
        REFERENCE.compile(converted, tmp_path / "shared.bin", options)
        assert (tmp_path / "shared.bin").read_bytes() == compile_to(tiny, tmp_path / "alone.bin", options).read_bytes()


def test_a_weight_that_differs_from_the_shared_graphs_is_stored_in_the_graphs_own_data(tiny, tmp_path):
    changed = "lm_head.weight"
    token = onnx.load(tiny["sources"][TOKEN])
    tensor = next(t for t in token.graph.initializer if t.name == changed)
    tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * np.float32(1.5), changed))
    (tmp_path / "source").mkdir()
    onnx.save(token, tmp_path / "source" / "token.onnx", save_as_external_data=True, location="token.onnx.data")
    locations = external_locations(convert_sharing(tiny, tmp_path / "part", tmp_path / "source" / "token.onnx")[TOKEN])
    assert locations.pop(f"{changed}_quantized") == "token.onnx.data"
    assert set(locations.values()) == {"prompt.onnx.data"}


def one_data_file(tiny: dict, folder: Path) -> dict[str, Path]:
    """The prompt and token sources in ``folder``, the token graph reading its weights from the prompt's data file
    (as a checkpoint's export writes a part's graphs)."""
    folder.mkdir()
    sources = {name: folder / tiny["sources"][name].name for name in (PROMPT, TOKEN)}
    for suffix in ("", ".data"):
        Path(f"{sources[PROMPT]}{suffix}").write_bytes(Path(f"{tiny['sources'][PROMPT]}{suffix}").read_bytes())
    prompt = {t.name: t for t in onnx.load(sources[PROMPT], load_external_data=False).graph.initializer}
    token = onnx.load(tiny["sources"][TOKEN], load_external_data=False)
    for tensor in token.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            tensor.CopyFrom(prompt[tensor.name])
    onnx.save(token, sources[TOKEN])
    return sources


def counting_quantize(monkeypatch) -> list[str]:
    """The names of the weights the reference converter quantizes from now on."""
    quantized, real = [], reference_convert.quantize
    def counted(array, enc, layout):
        quantized.append(enc.name)
        return real(array, enc, layout)
    monkeypatch.setattr(reference_convert, "quantize", counted)
    return quantized


def test_a_weight_converted_before_from_the_same_bytes_and_encoding_is_taken_not_quantized_again(tiny, tmp_path,
                                                                                                 monkeypatch):
    sources, quantized = one_data_file(tiny, tmp_path / "source"), counting_quantize(monkeypatch)
    part = tmp_path / "part"
    REFERENCE.convert(sources[PROMPT], tiny["encodings_path"], part / "prompt.onnx", graph_name=PROMPT,
                      float_bitwidth=16)
    in_prompt = len(quantized)
    REFERENCE.convert(sources[TOKEN], tiny["encodings_path"], part / "token.onnx", graph_name=TOKEN,
                      float_bitwidth=16, share_weights_with=part / "prompt.onnx")
    inline = {t.name for t in onnx.load(sources[TOKEN], load_external_data=False).graph.initializer
              if t.data_location != onnx.TensorProto.EXTERNAL}
    assert in_prompt > len(quantized) - in_prompt and set(quantized[in_prompt:]) <= inline  # small: converted again
    assert (part / "token.onnx.data").stat().st_size == 0
    feed = feeds(part / "token.onnx")
    for taken, alone in zip(run(part / "token.onnx", feed), run(tiny["converted"][TOKEN], feed), strict=True):
        assert np.array_equal(taken, alone)
    converted = {PROMPT: part / "prompt.onnx", TOKEN: part / "token.onnx"}
    for sharing in (False, True):
        options = replace(OPTIONS, weight_sharing_enabled=sharing)
        REFERENCE.compile(converted, tmp_path / "taken.bin", options)
        assert (tmp_path / "taken.bin").read_bytes() == compile_to(tiny, tmp_path / "alone.bin", options).read_bytes()


def test_a_weight_whose_encoding_differs_is_quantized_again_and_the_others_taken(tiny, tmp_path, monkeypatch):
    sources, quantized = one_data_file(tiny, tmp_path / "source"), counting_quantize(monkeypatch)
    changed = "lm_head.weight"
    encodings = tiny["encodings"]
    enc = encodings.params[changed]
    token_encodings = replace(encodings, params={**encodings.params,
                                                 changed: replace(enc, scale=tuple(2 * x for x in enc.scale))})
    write_encodings(tmp_path / "token.encodings.json", token_encodings)
    part = tmp_path / "part"
    REFERENCE.convert(sources[PROMPT], tiny["encodings_path"], part / "prompt.onnx", graph_name=PROMPT,
                      float_bitwidth=16)
    in_prompt = len(quantized)
    REFERENCE.convert(sources[TOKEN], tmp_path / "token.encodings.json", part / "token.onnx", graph_name=TOKEN,
                      float_bitwidth=16, share_weights_with=part / "prompt.onnx")
    inline = {t.name for t in onnx.load(sources[TOKEN], load_external_data=False).graph.initializer
              if t.data_location != onnx.TensorProto.EXTERNAL}
    assert set(quantized[in_prompt:]) - inline == {changed}
    locations = external_locations(part / "token.onnx")
    assert locations.pop(f"{changed}_quantized") == "token.onnx.data"
    assert set(locations.values()) == {"prompt.onnx.data"}


def test_a_weight_changed_in_place_at_the_same_size_is_quantized_again_not_taken(tiny, tmp_path):
    """``convert --share-weights-with`` after a weight's bytes were rewritten in the data file (same size, same place):
    the weight is converted from its new bytes, the others are taken."""
    sources, part, changed = one_data_file(tiny, tmp_path / "source"), tmp_path / "part", "lm_head.weight"
    common = ["convert", "--toolchain", "reference", "--encodings", str(tiny["encodings_path"]),
              "--float-bitwidth", "16"]
    assert main([*common, "--onnx", str(sources[PROMPT]), "--graph-name", PROMPT, "--out",
                 str(part / "prompt.onnx")]) == 0
    tensor = next(t for t in onnx.load(sources[PROMPT], load_external_data=False).graph.initializer
                  if t.name == changed)
    where = {entry.key: entry.value for entry in tensor.external_data}
    with open(sources[PROMPT].with_name(where["location"]), "r+b") as data:
        data.seek(int(where["offset"]))
        values = np.frombuffer(data.read(int(where["length"])), dtype=np.float32)
        data.seek(int(where["offset"]))
        data.write((values * np.float32(1.5)).tobytes())
    assert main([*common, "--onnx", str(sources[TOKEN]), "--graph-name", TOKEN, "--out", str(part / "token.onnx"),
                 "--share-weights-with", str(part / "prompt.onnx")]) == 0
    locations = external_locations(part / "token.onnx")
    assert locations.pop(f"{changed}_quantized") == "token.onnx.data"
    assert set(locations.values()) == {"prompt.onnx.data"}
    assert main([*common, "--onnx", str(sources[TOKEN]), "--graph-name", TOKEN, "--out",
                 str(tmp_path / "alone" / "token.onnx")]) == 0
    feed = feeds(part / "token.onnx")
    for taken, alone in zip(run(part / "token.onnx", feed), run(tmp_path / "alone" / "token.onnx", feed), strict=True):
        assert np.array_equal(taken, alone)


def test_convert_shares_weights_only_with_a_graph_in_its_own_folder(tiny, tmp_path):
    with pytest.raises(GenieBuildError, match="shares weights only with a graph in the output's folder"):
        REFERENCE.convert(tiny["sources"][TOKEN], tiny["encodings_path"], tmp_path / "token.onnx", graph_name=TOKEN,
                          float_bitwidth=16, share_weights_with=tiny["converted"][PROMPT])


def test_compile_refuses_a_graph_given_under_another_name(tiny, tmp_path):
    with pytest.raises(GenieBuildError, match="--graph-name token_x") as caught:
        REFERENCE.compile({"token_x": tiny["converted"][TOKEN]}, tmp_path / "x.bin", OPTIONS)
    assert caught.value.where == str(tiny["converted"][TOKEN])
    assert not (tmp_path / "x.bin").exists()


# ------------------------------------------------------------------------------------------- inspect

def test_inspect_reads_sizes_graphs_io_quantization_and_applied_options(tiny, tmp_path):
    path = compile_to(tiny, tmp_path / "part.bin")
    info = REFERENCE.inspect(path)
    assert info.file_bytes == path.stat().st_size
    assert info.weight_bytes == read_header(path)["weight_section"]["bytes"] < info.file_bytes
    assert (info.toolchain, info.tool_version) == ("reference", __version__)
    assert [graph.name for graph in info.graphs] == [PROMPT, TOKEN]
    prompt = info.graphs[0]
    inputs = {tensor.name: tensor for tensor in prompt.inputs}
    assert inputs["attention_mask"].shape == (1, AR, CONTEXT) and inputs["attention_mask"].dtype == "float32"
    assert inputs["attention_mask"].quant == QuantInfo(dtype="uint16", scale=0.001, offset=-50000, bitwidth=16)
    assert inputs["position_ids_cos"].quant == QuantInfo(dtype="float16", bitwidth=16)
    assert inputs["input_ids"].quant is None and inputs["input_ids"].dtype == "int32"
    assert {tensor.name: tensor.quant.bitwidth for tensor in prompt.outputs if tensor.quant} == {
        "logits": 16, "past_key_0_out": 8}
    applied = info.applied_options.to_dict()
    four_bit = [enc for enc in tiny["encodings"].params.values() if enc.dtype == "int" and stored_bitwidth(enc) <= 4]
    assert applied["weights_packing"] is True and applied["packed_weights"] == len(four_bit) + 1  # + NARROW_8BIT
    assert applied["weight_sharing_enabled"] is True and applied["shared_weights"] == len(read_header(path)["weights"])
    assert (applied["soc_model"], applied["dsp_arch"], applied["optimization_type"]) == (69, "v79", 3)
    assert applied["float_bitwidth"] == 16


def test_applied_options_report_the_options_in_force_and_their_effect(tiny, tmp_path):
    lone = REFERENCE.inspect(compile_to(tiny, tmp_path / "lone.bin", graphs=(PROMPT,))).applied_options.to_dict()
    assert lone["weight_sharing_enabled"] is True and lone["shared_weights"] == 0
    unpacked = REFERENCE.inspect(compile_to(tiny, tmp_path / "unpacked.bin",
                                            replace(OPTIONS, weights_packing=False))).applied_options.to_dict()
    assert unpacked["weights_packing"] is False and unpacked["packed_weights"] == 0
    packed = REFERENCE.inspect(compile_to(tiny, tmp_path / "packed.bin", OPTIONS)).applied_options.to_dict()
    assert unpacked["packable_weights"] == packed["packable_weights"] == packed["packed_weights"] > 0


def test_inspect_refuses_files_that_are_not_whole_reference_containers(tiny, tmp_path):
    onnx_file = tiny["converted"][PROMPT]
    with pytest.raises(GenieBuildError, match="not a genie-build reference context binary") as caught:
        REFERENCE.inspect(onnx_file)
    assert caught.value.where == str(onnx_file)
    truncated = tmp_path / "truncated.bin"
    truncated.write_bytes(compile_to(tiny, tmp_path / "part.bin").read_bytes()[:-1])
    with pytest.raises(GenieBuildError, match="truncated"):
        REFERENCE.inspect(truncated)
    with pytest.raises(GenieBuildError, match="truncated"):
        load_container(truncated)


# ------------------------------------------------------------------------------------------- sizes

def demo_encodings(weights: dict[str, np.ndarray]) -> Encodings:
    """Every matrix 4-bit symmetric per channel (the embedding table along axis 0): an int4-dominated part."""
    return Encodings(params={name: symmetric(name, w, 4, 0 if name == "model.embed_tokens.weight" else 1)
                             for name, w in weights.items() if w.ndim == 2})


@pytest.fixture(scope="module")
def demo_part(tmp_path_factory) -> dict:
    """A two-layer demo model at the default demo's sizes (hidden 256, intermediate 768, vocab 2048),
    converted and compiled packed and unpacked."""
    root = tmp_path_factory.mktemp("demo")
    generate_demo(replace(DEFAULT, layers=2), root)
    weights = source_weights(root / "prompt.onnx")
    encodings = demo_encodings(weights)
    write_encodings(root / "encodings.json", encodings)
    converted = {}
    for kind, name in (("prompt", "prompt_ar32_cl256_1_of_1"), ("token", "token_ar1_cl256_1_of_1")):
        converted[name] = root / f"{name}.onnx"
        REFERENCE.convert(root / f"{kind}.onnx", root / "encodings.json", converted[name], graph_name=name,
                          float_bitwidth=16)
    sizes = {}
    for packing in (True, False):
        REFERENCE.compile(converted, root / f"{packing}.bin", replace(OPTIONS, weights_packing=packing))
        sizes[packing] = REFERENCE.inspect(root / f"{packing}.bin").weight_bytes
    return {"weights": weights, "encodings": encodings, "packed": sizes[True], "unpacked": sizes[False]}


def information_minimum(weights: dict[str, np.ndarray], encodings: Encodings) -> float:
    """Bytes the part's weights need at least: quantized values at their bitwidth, float32 scales and
    one zero point per scale, float fallback at 2 bytes, anything else as it is."""
    total = 0.0
    for name, w in weights.items():
        enc = encodings.params.get(name)
        if enc is not None and enc.dtype == "int":
            total += stored_bitwidth(enc) * w.size / 8 + len(enc.scale) * (4 + math.ceil(enc.bitwidth / 8))
        elif w.dtype == np.float32:
            total += 2 * w.size
        else:
            total += w.nbytes
    return total


def test_packed_weight_section_is_within_1_percent_of_the_information_minimum(demo_part):
    minimum = information_minimum(demo_part["weights"], demo_part["encodings"])
    assert minimum <= demo_part["packed"] <= 1.01 * minimum, (demo_part["packed"], minimum)


def test_unpacked_weight_section_stores_4_bit_values_one_per_byte(demo_part):
    assert 1.9 <= demo_part["unpacked"] / demo_part["packed"] <= 2.0, (demo_part["unpacked"], demo_part["packed"])


# ------------------------------------------------------------------------------------------- commands

def test_cli_convert_compile_inspect(tiny, tmp_path, capsys):
    converted = {}
    for name, source in tiny["sources"].items():
        converted[name] = tmp_path / f"{name}.onnx"
        assert main(["convert", "--toolchain", "reference", "--onnx", str(source), "--encodings",
                     str(tiny["encodings_path"]), "--graph-name", name, "--float-bitwidth", "16",
                     "--out", str(converted[name])]) == 0
    variant = {"toolchain": "reference", "weights_packing": True, "optimization_type": 3,
               "weight_sharing_enabled": True, "vtcm_mb": 0, "float_bitwidth": 16}
    binary = tmp_path / "part.bin"
    assert main(["compile", "--toolchain", "reference", *[arg for name, path in converted.items()
                                                          for arg in ("--graph", f"{name}={path}")],
                 "--variant-json", json.dumps(variant), "--chipset", "SM8750", "--out", str(binary)]) == 0
    capsys.readouterr()
    assert main(["inspect", "--toolchain", "reference", str(binary), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["file_bytes"] == binary.stat().st_size
    assert (record["applied_options"]["soc_model"], record["applied_options"]["dsp_arch"]) == (69, "v79")
    assert [graph["name"] for graph in record["graphs"]] == [PROMPT, TOKEN]
    assert main(["inspect", "--toolchain", "reference", str(binary)]) == 0
    assert "attention_mask [1, 4, 8] float32 as uint16 scale=0.001 offset=-50000" in capsys.readouterr().out


def test_cli_reports_a_non_container_as_one_line_naming_it(tiny, capsys):
    path = tiny["converted"][PROMPT]
    assert main(["inspect", "--toolchain", "reference", str(path)]) == 2
    assert capsys.readouterr().err.strip().startswith(f"genie-build: error: {path}: not a genie-build reference")


def test_compile_options_come_from_the_variant_and_the_chipset():
    variant = {"weights_packing": True, "optimization_type": 3, "weight_sharing_enabled": True, "vtcm_mb": 0,
               "float_bitwidth": 16}
    assert CompileOptions.from_variant({**variant, "toolchain": "reference"}, lookup("SM8650")) == CompileOptions(
        weights_packing=True, optimization_type=3, weight_sharing_enabled=True, vtcm_mb=0, soc_model=57,
        dsp_arch="v75", float_bitwidth=16)
    for bad, problem in (({**variant, "vtcm_mb": True}, "vtcm_mb is True"),
                         ({**variant, "weights_packing": 1}, "weights_packing is 1"),
                         ({k: v for k, v in variant.items() if k != "vtcm_mb"}, "missing options \\['vtcm_mb'\\]"),
                         ({**variant, "O": 3}, "unknown options \\['O'\\]")):
        with pytest.raises(GenieBuildError, match=problem):
            CompileOptions.from_variant(bad, lookup("SM8750"))
