"""Proof against aimet-onnx itself: encodings that AIMET computes and exports, in every format it writes,
converted by the reference toolchain, give AIMET's own fake-quantized weights value for value.

AIMET's truth is ``QuantizationSimModel.fold_param_quantizers`` (each parameter quantize-dequantized by
AIMET's kernel, baked into the model) and, for the embedding table AIMET quantizes as an activation, that
quantizer's ``quantize_dequantize``. Graphs: a Gather table, a MatMul weight ``[in, out]``, one ``[out, in]``
behind a Transpose, a square one (where counting scales cannot tell the axes apart), a Gemm with
``transB=1`` and a bias, and a Conv with a bias.

Skips when aimet-onnx is not installed, unless ``GENIE_BUILD_REQUIRE_AIMET=1`` (set by ``.ci/run``), which
turns the skip into a failure.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from genie_build.encodings import read_encodings
from genie_build.toolchains.reference.convert import convert_model

pytestmark = pytest.mark.hf
if os.environ.get("GENIE_BUILD_REQUIRE_AIMET") == "1":
    import aimet_onnx  # noqa: F401  -- CI installs it (envs/requirements-hf.txt): a missing one fails
else:
    pytest.importorskip("aimet_onnx", reason="aimet-onnx is not installed (envs/requirements-hf.txt)")

from aimet_onnx.quantsim import (QuantizationSimModel, set_blockwise_quantization_for_weights,  # noqa: E402
                                 set_lpbq_for_params)

VOCAB, HIDDEN, WIDE, BLOCK = 32, 64, 96, 32
# How a QuantizationSimModel is set up (not a named recipe of genie_build.plan.recipes): setup -> (param type, the
# formats aimet-onnx writes for it: 0.6.1 has no blocked encodings)
QUANTSIM_SETUPS = {"per_tensor": ("int8", ("0.6.1", "1.0.0", "2.0.0")),
                   "per_channel_4": ("int4", ("0.6.1", "1.0.0", "2.0.0")),
                   "per_channel_8": ("int8", ("0.6.1", "1.0.0", "2.0.0")), "per_block": ("int4", ("1.0.0", "2.0.0")),
                   "lpbq": ("int4", ("1.0.0", "2.0.0"))}


def _model(nodes: list, inputs: list, outputs: list, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    initializers = [numpy_helper.from_array(value, name) for name, value in weights.items()]
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def linear_model(rng: np.random.Generator) -> onnx.ModelProto:
    """ids -> Gather(table) -> MatMul [in, out] -> Transpose+MatMul [out, in] -> square MatMul -> Gemm transB."""
    def normal(*shape: int) -> np.ndarray:
        return rng.normal(size=shape).astype(np.float32)

    weights = {"table": normal(VOCAB, HIDDEN), "w_in_out": normal(HIDDEN, WIDE), "w_out_in": normal(HIDDEN, WIDE),
               "w_square": normal(HIDDEN, HIDDEN), "w_gemm": normal(HIDDEN, HIDDEN), "b_gemm": normal(HIDDEN),
               "rows": np.array([4, HIDDEN], np.int64), "out_shape": np.array([1, 4, HIDDEN], np.int64)}
    nodes = [helper.make_node("Gather", ["table", "ids"], ["x"], name="embed"),
             helper.make_node("MatMul", ["x", "w_in_out"], ["a"], name="in_out"),
             helper.make_node("Transpose", ["w_out_in"], ["w_out_in_t"], perm=[1, 0], name="transpose"),
             helper.make_node("MatMul", ["a", "w_out_in_t"], ["b"], name="out_in"),
             helper.make_node("MatMul", ["b", "w_square"], ["c"], name="square"),
             helper.make_node("Reshape", ["c", "rows"], ["c2"], name="flatten"),
             helper.make_node("Gemm", ["c2", "w_gemm", "b_gemm"], ["d"], transB=1, name="gemm"),
             helper.make_node("Reshape", ["d", "out_shape"], ["y"], name="unflatten")]
    return _model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, HIDDEN])], weights)


def conv_model(rng: np.random.Generator) -> onnx.ModelProto:
    weights = {"w_conv": rng.normal(size=(16, HIDDEN, 3, 3)).astype(np.float32),
               "b_conv": rng.normal(size=16).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w_conv", "b_conv"], ["y"], pads=[1, 1, 1, 1], name="conv")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, HIDDEN, 4, 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 4, 4])], weights)


MODELS = {"linear": (linear_model, lambda rng: {"ids": rng.integers(0, VOCAB, (1, 4))}),
          "conv": (conv_model, lambda rng: {"x": rng.normal(size=(1, HIDDEN, 4, 4)).astype(np.float32)})}


def aimet_export(model: onnx.ModelProto, setup: str, feeds: list[dict], out: Path
                 ) -> tuple[dict[str, np.ndarray], dict[str, Path]]:
    """AIMET's fake-quantized weights and its export in every format of the setup (``version -> dir``)."""
    param_type, versions = QUANTSIM_SETUPS[setup]
    config = None if setup == "per_tensor" else "htp_v79"
    sim = QuantizationSimModel(model, param_type=param_type, activation_type="int16", config_file=config)
    op_types = ("MatMul", "Gemm", "Conv")
    if setup == "per_block":
        set_blockwise_quantization_for_weights(sim, op_types, 4, True, BLOCK)
    elif setup == "lpbq":
        set_lpbq_for_params(sim, 4, BLOCK, op_types=set(op_types))
    sim.compute_encodings(feeds)
    exports = {}
    for version in versions:
        exports[version] = out / version
        exports[version].mkdir(parents=True)
        sim.export(str(exports[version]), "model", encoding_version=version)
    original = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    truth = {name: quantizer.quantize_dequantize(original[name]) for name, quantizer in sim.qc_quantize_op_dict.items()
             if name in original and name not in sim.param_names and quantizer.enabled}
    sim.fold_param_quantizers()
    truth.update({tensor.name: numpy_helper.to_array(tensor) for tensor in sim.model.model.graph.initializer
                  if tensor.name in sim.param_names})
    return truth, exports


def converted_weights(model_path: Path, encodings_path: Path, names: list[str], feeds: dict, out: Path
                      ) -> dict[str, np.ndarray]:
    """The weights the reference toolchain's converted graph hands its nodes, with the graph's outputs."""
    convert_model(model_path, encodings_path, out, graph_name="g", float_bitwidth=32)
    model = onnx.load(out)
    model.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in names)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([output.name for output in session.get_outputs()], session.run(None, feeds)))


def encodings_by_name(path: Path) -> dict[str, dict]:
    data = json.loads(path.read_text())
    if data["version"] == "2.0.0":
        return {entry["name"]: entry for entry in data["encodings"]}
    return {}


def largest_step(path: Path, name: str) -> float | None:
    """The largest quantization step of ``name``'s encoding in ``path``; None for no or an int32 encoding."""
    encoding = read_encodings(path).of_initializer(name)
    if encoding is None or encoding.bitwidth == 32:
        return None
    return max(encoding.scale) * max(encoding.per_block_int_scale or (1,))


def count_one_step_ties(ours: np.ndarray, theirs: np.ndarray, step: float) -> int:
    """How many values differ; each may differ by at most one quantization step (checked here)."""
    differ = ours != theirs
    if differ.any():
        assert np.abs(ours[differ].astype(np.float64) - theirs[differ]).max() <= step * 1.01
    return int(differ.sum())


def compare_with_aimet(model, truth, exports, feed, setup, tmp_path) -> tuple[int, int]:
    """Compare the reference toolchain's weights converted from each exported format with AIMET's ``truth``
    (its folded weights; a weight AIMET leaves in float is its original value). Values whose encoding has a
    quantization step may differ by one step (a rounding tie, counted); the others must be equal.

    Returns:
        ``(values compared, one-step ties)`` over every format.
    """
    original = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer
                if tensor.data_type == TensorProto.FLOAT}
    compared = ties = 0
    for version, export in exports.items():
        ours = converted_weights(export / "model.onnx", export / "model.encodings", list(original), feed,
                                 tmp_path / f"converted_{version}.onnx")
        stated = encodings_by_name(export / "model.encodings")
        for name, value in original.items():
            expected = truth.get(name, value)
            if stated.get(name, {}).get("output_dtype") == "int32":
                # AIMET simulates int32 biases in float (fold_param_quantizers leaves them): the encoding means
                # round(b / scale) * scale, which the converted graph must give exactly.
                scale = np.asarray(stated[name]["y_scale"], np.float32)
                expected = (np.rint(value / scale) * scale).astype(np.float32)
            compared += value.size
            step = largest_step(export / "model.encodings", name)
            if step is None:
                np.testing.assert_array_equal(ours[name], expected, err_msg=f"{setup} {version} {name}")
            else:
                ties += count_one_step_ties(ours[name], expected, step)
    return compared, ties


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("setup", list(QUANTSIM_SETUPS))
def test_reference_weights_equal_aimets_own_for_every_format(model_name, setup, tmp_path, record_property):
    """Every quantized value is AIMET's, but for rounding ties: AIMET's kernel rounds a float32 quotient
    computed from the encoding's minimum, so a value within a float32 rounding of a half step may land on
    the other side (here 2 to 3 in 1,000 values of a 16-bit table, 1 in 10,000 of an 8-bit weight). A wrong
    axis or block layout changes most values by several steps."""
    rng = np.random.default_rng(11)
    make_model, make_feed = MODELS[model_name]
    model = make_model(rng)
    feeds = [make_feed(rng) for _ in range(2)]
    truth, exports = aimet_export(model, setup, feeds, tmp_path / "aimet")
    compared, ties = compare_with_aimet(model, truth, exports, feeds[0], setup, tmp_path)
    record_property("values_compared", compared)
    record_property("one_step_ties", ties)
    print(f"{model_name} {setup}: {compared} values compared, {ties} one-step ties")
    assert ties <= compared // 200


def test_the_demo_calibrated_by_aimet_converts_to_aimets_own_weights(tmp_path, record_property):
    """The demo calibrated by aimet-onnx (AIMET's LLM recipe, the token graph sharing the prompt graph's encodings,
    KV in/out tied; whole, as the chain's units are, tests/test_calibration_chain.py); loaded back into a fresh
    QuantizationSimModel with ``load_encodings_to_sim`` and folded, AIMET's weights are the reference toolchain's,
    value for value."""
    from aimet_onnx.quantsim import load_encodings_to_sim
    from whole_model import feeds_forward_pass, quantize_pair

    from genie_build.quantize.calibrate import calibration_feeds, graph_shape
    from bundle_helpers import TINY_DEMO
    from demo_shapes import demo_shape
    from genie_build.demo.demo import generate_demo
    from genie_build.encodings import check_graphs_consistent
    from genie_build.onnx_graph import load_graph
    from genie_build.plan.recipes import RECIPES

    generate_demo(demo_shape(TINY_DEMO, vocab=320, context=32, ar=4), tmp_path)
    shape = graph_shape(load_graph(tmp_path / "prompt.onnx"), tmp_path / "prompt.onnx", tmp_path / "config.json")
    quantize_pair(tmp_path / "prompt.onnx", tmp_path / "token.onnx", tmp_path / "prompt.encodings.json",
                  tmp_path / "token.encodings.json", recipe=RECIPES["w4a16"],
                  forward_pass=feeds_forward_pass(calibration_feeds(shape, "prompt", 2)))
    prompt = read_encodings(tmp_path / "prompt.encodings.json")
    token = read_encodings(tmp_path / "token.encodings.json")
    check_graphs_consistent(prompt, token)
    assert prompt.header["producer"]["package"] == "aimet-onnx"
    assert prompt.activations["past_key_0_out"].scale == prompt.activations["past_key_0_in"].scale
    assert (prompt.params["lm_head.weight"].bitwidth, prompt.params["model.layers.0.mlp.up_proj.weight"].bitwidth,
            prompt.of_initializer("model.embed_tokens.weight").bitwidth) == (8, 4, 16)

    model = onnx.load(tmp_path / "prompt.onnx")
    sim = QuantizationSimModel(model, param_type="int4", activation_type="int16", config_file="htp_v79")
    load_encodings_to_sim(sim, str(tmp_path / "prompt.encodings.json"), strict=False)  # the LM head: 8-bit
    original = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer
                if tensor.data_type == TensorProto.FLOAT and tensor.name in prompt.params | prompt.activations}
    table = "model.embed_tokens.weight"
    truth = {table: sim.qc_quantize_op_dict[table].quantize_dequantize(original[table])}
    sim.fold_param_quantizers()
    truth |= {tensor.name: numpy_helper.to_array(tensor) for tensor in sim.model.model.graph.initializer
              if tensor.name in original and tensor.name != table}

    convert_model(tmp_path / "prompt.onnx", tmp_path / "prompt.encodings.json", tmp_path / "converted.onnx",
                  graph_name="g", float_bitwidth=32)
    converted = onnx.load(tmp_path / "converted.onnx")
    converted.graph.ClearField("output")
    converted.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in original)
    session = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {value.name: np.zeros([dim.dim_value for dim in value.type.tensor_type.shape.dim],
                                  helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
             for value in converted.graph.input}
    ours = dict(zip(original, session.run(list(original), feeds)))
    compared = ties = 0
    for name, value in original.items():
        compared += value.size
        ties += count_one_step_ties(ours[name], truth[name], largest_step(tmp_path / "prompt.encodings.json", name))
    record_property("values_compared", compared)
    print(f"demo: {compared} values compared, {ties} one-step ties")
    assert ties <= compared // 200


@pytest.mark.workflow
def test_the_workflow_builds_the_demo_calibrated_by_aimet(tmp_path):
    """demo.calibrator: aimet, end to end on the small demo: the split parts are calibrated by the chain, the
    bundle passes Genie's load-time rules, its host run gives the tokens of the parts' converted graphs, and Genie
    itself gives the host run's tokens: the first binary takes inputs_embeds at the table's encoding (AIMET leaves
    the Gather output unencoded; a float32 input under the ufixed16 table made Genie answer one token over and
    over)."""
    from workflow_helpers import SMALL_DEMO, copy_workflow, load_json, run_snakemake, write_config

    from genie_build.qnn_wheel.system import read_context_binary
    from genie_build.run.run_bundle import PARTS_REFERENCE, TABLE_REFERENCE

    workdir = copy_workflow(tmp_path)
    config = write_config(workdir, {**SMALL_DEMO, "demo": {**SMALL_DEMO["demo"], "calibrator": "aimet"},
                                    "model": {"name": "aimet"}, "quantize": {"num_samples": 4}})
    run_snakemake(workdir, config_file=config)
    out = workdir / "results" / "aimet"
    assert not list((out / "source").glob("*.encodings.json"))   # no whole-model calibration
    units = sorted((out / "calibration" / "w4a16").glob("u*_of_*.encodings.json"))
    assert len(units) == SMALL_DEMO["split"]["num_parts"]
    assert all(json.loads(path.read_text())["producer"]["package"] == "aimet-onnx" for path in units)
    assert load_json(out / "plan_check.json")["same_parts"]
    assert load_json(out / "bundle_check.json")["errors"] == 0
    host_run = load_json(out / "host_run.json")
    assert host_run["new_ids"] == host_run["reference_ids"]
    assert host_run["compared_with"] == PARTS_REFERENCE + TABLE_REFERENCE
    genie = load_json(out / "genie_run.json")
    assert genie["mode"] == "generate" and len(genie["new_ids"]) == 16
    assert genie["equal_to_host_run"] is True and genie["new_ids"] == host_run["new_ids"], genie.get("difference")
    assert len(set(genie["new_ids"])) > 1
    table = load_json(out / "genie_bundle" / "genie_config.json")["dialog"]["embedding"]
    graphs = read_context_binary(out / "twin" / "part_2_of_3" / "context.bin").graphs
    embeds = [tensor.quant for graph in graphs for tensor in graph.info.inputs if tensor.name == "inputs_embeds"]
    assert [(quant.dtype, quant.offset) for quant in embeds] == [("uint16", table["quant-param"]["offset"])] * 2
    assert [quant.scale for quant in embeds] == pytest.approx([table["quant-param"]["scale"]] * 2, rel=1e-6)


def test_aimet_refuses_float16_weights_it_would_leave_unquantized(tmp_path):
    from demo_shapes import ONE_LAYER
    from genie_build.demo.demo import generate_demo
    from genie_build.errors import GenieBuildError
    from genie_build.plan.recipes import RECIPES
    from genie_build.quantize.calibrate_unit import calibrate_prompt
    from whole_model import feeds_forward_pass

    generate_demo(dataclasses.replace(ONE_LAYER, weight_dtype="float16"), tmp_path)
    with pytest.raises(GenieBuildError, match="float16 weights"):
        calibrate_prompt(tmp_path / "prompt.onnx", RECIPES["w4a16"], feeds_forward_pass([]))


@pytest.fixture(scope="module")
def qwen2_dynamo(tmp_path_factory):
    """The issue's case: a Qwen2 exported by torch.onnx (dynamo), ``[out, in]`` weights reaching MatMul through
    a Transpose (q_proj and o_proj square), q/k/v biases, the table and inv_freq as AIMET activations."""
    from hf_export import export_tiny_qwen2

    prompt, _ = export_tiny_qwen2(tmp_path_factory.mktemp("qwen2"), layers=1, hidden=64, heads=2, kv_heads=1,
                                  intermediate=128, vocab=256, context=16, prompt_ar=4)
    return onnx.load(prompt)


def qwen2_feed(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = {value.name: [dim.dim_value for dim in value.type.tensor_type.shape.dim] for value in model.graph.input}
    past = shapes["past_key_0_in"][2]
    feed = {"input_ids": rng.integers(0, 256, shapes["input_ids"]), "attention_mask": np.ones(shapes["attention_mask"],
                                                                                               np.int64),
            "position_ids": np.arange(past, past + shapes["position_ids"][1])[None]}
    feed |= {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items() if name.startswith("past")}
    return feed


@pytest.mark.parametrize("setup", ["per_channel_4", "per_channel_8", "per_block", "lpbq"])
def test_a_torch_dynamo_qwen2_quantized_by_aimet_converts_to_aimets_own_weights(qwen2_dynamo, setup, tmp_path):
    rng = np.random.default_rng(5)
    feeds = [qwen2_feed(qwen2_dynamo, rng) for _ in range(2)]
    truth, exports = aimet_export(qwen2_dynamo, setup, feeds, tmp_path / "aimet")
    compared, ties = compare_with_aimet(qwen2_dynamo, truth, exports, feeds[0], setup, tmp_path)
    print(f"qwen2 {setup}: {compared} values compared, {ties} one-step ties")
    assert ties <= compared // 200
