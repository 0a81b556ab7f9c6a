"""The AIMET driver (genie_build.quantize.calibrate_unit) against aimet-onnx itself, on Genie-shaped graph pairs
calibrated whole (tests/whole_model.py: what the calibration chain must equal, tests/test_calibration_chain.py).

A graph pair is a fixture parameter (:data:`PAIRS`: a name -> a function writing ``prompt.onnx``, ``token.onnx``,
``config.json`` and ``tokenizer.json`` into a folder): the demo's graphs today; exported Hugging Face graphs join by
adding an entry. For each recipe: the encodings say what the recipe says; the reference toolchain's quantized weights
are AIMET's own (``load_encodings_to_sim`` + ``fold_param_quantizers``); the logits of the converted graph equal
AIMET's simulation with its weight quantizers alone, and stay close to its full simulation (16-bit activations, 8-bit
KV cache); a changed recipe or corpus changes the encodings.

Skips when aimet-onnx is not installed, unless ``GENIE_BUILD_REQUIRE_AIMET=1`` (set by ``.ci/run``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from workflow_helpers import REPO, load_json, run_snakemake

from genie_build.conventions import EMBEDDING_BOUNDARY, KV_TENSOR, LOGITS, kv_name
from genie_build.encodings import check_graphs_consistent, check_kv_cache_tied, read_encodings
from genie_build.errors import GenieBuildError
from genie_build.evaluate.evaluate import fake_quantize_activations
from genie_build.onnx_graph import load_graph, read_graph_tensors
from genie_build.plan.recipes import LPBQ_BLOCK_SIZE, RECIPES
from genie_build.quantize.calibrate_unit import kv_cache_io, lm_head_weight, recipe_sim
from genie_build.quantize.calibration_feeds import FeedShape, feed_shape, session_outputs, text_forward_pass
from genie_build.tokens import text_token_ids

pytestmark = pytest.mark.hf
if os.environ.get("GENIE_BUILD_REQUIRE_AIMET") == "1":
    import aimet_onnx  # noqa: F401  -- CI installs it (envs/requirements-hf.txt): a missing one fails
else:
    pytest.importorskip("aimet_onnx", reason="aimet-onnx is not installed (envs/requirements-hf.txt)")

from aimet_onnx.quantsim import load_encodings_to_sim  # noqa: E402
from aimet_onnx.utils import disable_quantizers  # noqa: E402
from test_aimet import converted_weights, count_one_step_ties, largest_step  # noqa: E402
from test_real_exports import demo_sources, user_workdir  # noqa: E402
from whole_model import feeds_forward_pass, quantize  # noqa: E402

CORPUS = REPO / "resources" / "calibration_corpus.txt"
NUM_SAMPLES = 12   # past = 56, AR 8: 8 windows per sequence, so the cache fills and a second sequence starts
# Logits tolerances (the demo's |logits| reach 0.65). Weights alone: the converted graph's weights are AIMET's but
# for its one-step rounding ties (about 3 per 10,000 values, most in the 16-bit table), and one step of a 4- or
# 8-bit weight moves a logit by up to ~5e-4 (measured worst 8e-4). AIMET's full simulation also rounds every
# activation to 16 bits and the KV cache and attention MatMul inputs to 8 (measured worst 1.2e-2 over the recipes).
WEIGHTS_ONLY_LOGITS_ATOL = 2e-3
FULL_SIM_LOGITS_ATOL = 3e-2
# What evaluate runs, on AIMET's own weights: what remains are rounding ties of a few activation values (a 16-bit
# step here and there, from float sums in another order), which the layers after them amplify: measured 6e-5 to
# 7.8e-4 for the demo, Llama and Qwen3, 2.3e-3 for Qwen2's w4a16; with float activations 5.3e-3 to 1.5e-2.
EVALUATION_LOGITS_ATOL = 4e-3


# the small demo's float graphs, config.json and a tokenizer trained on the repository's text
def hf_pair(family: str) -> Callable[[Path], Path]:
    def make(out: Path) -> Path:
        import hf_checkpoints
        from genie_build.export.export import export_checkpoint
        hf_checkpoints.make_checkpoint(out / "ckpt", family, hidden=128, heads=4, kv_heads=2, intermediate=256)
        export_checkpoint(out / "ckpt", out, ar=8, context=64)
        for name in ("config.json", "tokenizer.json"):
            shutil.copy(out / "ckpt" / name, out / name)
        return out
    return make


PAIRS: dict[str, Callable[[Path], Path]] = {"demo": demo_sources, **{f: hf_pair(f) for f in ("qwen2", "llama", "qwen3")}}


@pytest.fixture(scope="module", params=list(PAIRS))
def pair(request, tmp_path_factory) -> Path:
    return PAIRS[request.param](tmp_path_factory.mktemp(request.param))


def run_quantize(pair: Path, recipe: str, out: Path, corpus: Path = CORPUS) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "prompt.encodings.json", out / "token.encodings.json"
    quantize(pair / "prompt.onnx", pair / "token.onnx", *paths, hf_config_path=pair / "config.json",
             tokenizer_path=pair / "tokenizer.json", corpus_path=corpus, recipe=recipe, num_samples=NUM_SAMPLES)
    return paths


@pytest.fixture(scope="module")
def quantized(pair, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    out = tmp_path_factory.mktemp("quantized")
    return {recipe: run_quantize(pair, recipe, out / recipe) for recipe in RECIPES}


def backbone_weights(graph: onnx.GraphProto) -> set[str]:
    """Initializers that a MatMul or Gemm takes as its weight (also through a Transpose), the LM head aside."""
    initializers = {tensor.name for tensor in graph.initializer}
    transposed = {node.output[0]: node.input[0] for node in graph.node
                  if node.op_type == "Transpose" and node.input[0] in initializers}
    weights = {transposed.get(node.input[1], node.input[1]) for node in graph.node
               if node.op_type in ("MatMul", "Gemm")}
    return (weights & initializers) - {lm_head_weight(graph, "graph")[1]}


# --- (a) the encodings are what the recipe says --------------------------------------------------------------

@pytest.mark.parametrize("recipe", list(RECIPES))
def test_the_encodings_are_what_the_recipe_says(pair, quantized, recipe):
    prompt_path, token_path = quantized[recipe]
    prompt, token = read_encodings(prompt_path), read_encodings(token_path)
    graph = load_graph(pair / "prompt.onnx").graph
    assert prompt.header["producer"]["package"] == "aimet-onnx"

    weights = backbone_weights(graph)
    assert weights
    for name in weights:
        enc = prompt.params[name]
        if recipe == "w4a16-lpbq":
            assert (enc.kind, enc.bitwidth, enc.compressed_bitwidth, enc.block_size) == ("lpbq", 8, 4, LPBQ_BLOCK_SIZE)
        else:
            assert (enc.kind, enc.bitwidth, enc.is_symmetric) == ("per_channel", {"w4a16": 4, "w8a16": 8}[recipe], True)
    lm_head = prompt.params[lm_head_weight(graph, "graph")[1]]
    assert (lm_head.kind, lm_head.bitwidth) == ("per_channel", 8)

    kv_io = kv_cache_io(graph)
    assert len(kv_io) == 2 * json.loads((pair / "config.json").read_text())["num_hidden_layers"]
    for cache_in, cache_out in kv_io.items():
        enc_in, enc_out = prompt.activations[cache_in], prompt.activations[cache_out]
        assert (enc_in.bitwidth, enc_in.is_symmetric) == (8, True)
        assert replace(enc_out, name=cache_in) == enc_in
    others = {name: enc for name, enc in prompt.activations.items() if not KV_TENSOR.match(name)}
    assert {enc.bitwidth for enc in others.values()} == {8, 16}   # 8: AIMET's K/V MatMul inputs, the rest 16
    assert others[LOGITS].bitwidth == 16

    token_names = read_graph_tensors(pair / "token.onnx").tensor_names
    assert token.activations == {name: enc for name, enc in prompt.activations.items() if name in token_names}
    assert token.params == {name: enc for name, enc in prompt.params.items() if name in token_names}
    assert len(token.activations) > 0.9 * len(prompt.activations)
    check_graphs_consistent(prompt, token)                     # what slice_encodings and check-bundle require
    check_kv_cache_tied(prompt, read_graph_tensors(pair / "prompt.onnx").tensor_names)
    check_kv_cache_tied(token, token_names)


# --- (b) the quantized graph is AIMET's simulation ------------------------------------------------------------

def aimet_sim_with(pair: Path, recipe: str, encodings: Path, scratch: Path):
    """A fresh QuantizationSimModel of the prompt graph, set up by the recipe, with ``encodings`` loaded."""
    model = onnx.load(pair / "prompt.onnx")
    graph = load_graph(pair / "prompt.onnx").graph
    sim = recipe_sim(model, RECIPES[recipe], lm_head_weight(graph, "prompt"), kv_cache_io(graph), pair, scratch)
    # AIMET holds a layer's tied cache quantizer under past_*_in alone; past_*_out is the stage's copy of it, and so
    # is the embedding's output of the table's encoding (AIMET leaves that quantizer off: embedding_encoding)
    data = json.loads(encodings.read_text())
    data["activation_encodings"] = [entry for entry in data["activation_encodings"]
                                    if not re.fullmatch(r"past_(key|value)_\d+_out", entry["name"])
                                    and entry["name"] != EMBEDDING_BOUNDARY]
    as_aimet_exported = scratch.parent / "as_aimet_exported.json"
    as_aimet_exported.write_text(json.dumps(data))
    load_encodings_to_sim(sim, str(as_aimet_exported), strict=True)
    return model, sim


class Recorder:
    """Records the feeds a forward pass gives a session, passing them on to it."""

    def __init__(self, session) -> None:
        self.session, self.feeds = session, []

    def get_outputs(self):
        return self.session.get_outputs()

    def run(self, names, feed):
        self.feeds.append(dict(feed))
        return self.session.run(names, feed)


def text_feeds(pair: Path) -> list[dict[str, np.ndarray]]:
    """Feeds of the corpus as the stage makes them, the cache filled by the float graph: the first window (empty
    cache) and the fourth (three windows cached)."""
    import onnxruntime as ort

    shape = feed_shape(load_graph(pair / "prompt.onnx"), pair / "prompt.onnx", pair / "config.json")
    ids = text_token_ids(CORPUS, pair / "tokenizer.json")
    recorder = Recorder(ort.InferenceSession(str(pair / "prompt.onnx"), providers=["CPUExecutionProvider"]))
    text_forward_pass(shape, ids, 4)(recorder)
    return [recorder.feeds[0], recorder.feeds[3]]


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_the_quantized_graph_is_aimets_simulation(pair, quantized, recipe, tmp_path, record_property):
    """Weights: every value the reference toolchain converts equals AIMET's folded (or, for the embedding table,
    quantize-dequantized) value but for one-step rounding ties. Logits: the converted graph (quantized weights,
    float activations) equals AIMET's session with only its weight quantizers on, within the ties' effect
    (:data:`WEIGHTS_ONLY_LOGITS_ATOL`); AIMET's full simulation stays within :data:`FULL_SIM_LOGITS_ATOL`."""
    prompt_path, _ = quantized[recipe]
    enc = read_encodings(prompt_path)
    model, sim = aimet_sim_with(pair, recipe, prompt_path, tmp_path / "sim")
    feeds = text_feeds(pair)
    initializers = {tensor.name for tensor in model.graph.initializer}
    # the embedding table is an AIMET activation quantizer too, but a weight the converted graph holds quantized
    activations = set(sim.activation_names) - initializers
    with disable_quantizers(sim, activations):
        weights_only = [session_outputs(sim.session, feed)[LOGITS] for feed in feeds]
    full = [session_outputs(sim.session, feed)[LOGITS] for feed in feeds]

    original = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer
                if tensor.data_type == onnx.TensorProto.FLOAT and enc.of_initializer(tensor.name) is not None}
    truth = {name: sim.qc_quantize_op_dict[name].quantize_dequantize(value) for name, value in original.items()
             if name not in sim.param_names}
    sim.fold_param_quantizers()
    truth |= {tensor.name: numpy_helper.to_array(tensor) for tensor in sim.model.model.graph.initializer
              if tensor.name in original and tensor.name in sim.param_names}
    assert truth.keys() == original.keys()

    compared = ties = 0
    worst_weights_only = worst_full = 0.0
    for index, feed in enumerate(feeds):
        ours = converted_weights(pair / "prompt.onnx", prompt_path, list(original), feed,
                                 tmp_path / f"converted_{index}.onnx")
        if index == 0:
            for name, value in original.items():
                compared += value.size
                ties += count_one_step_ties(ours[name], truth[name], largest_step(prompt_path, name))
        worst_weights_only = max(worst_weights_only, float(np.abs(ours[LOGITS] - weights_only[index]).max()))
        worst_full = max(worst_full, float(np.abs(ours[LOGITS] - full[index]).max()))
    record_property("values_compared", compared)
    print(f"{recipe}: {compared} weight values compared, {ties} one-step ties; logits vs AIMET weights-only "
          f"{worst_weights_only:.2e}, vs AIMET full simulation {worst_full:.2e}")
    assert ties <= compared // 200
    assert worst_weights_only <= WEIGHTS_ONLY_LOGITS_ATOL
    assert worst_full <= FULL_SIM_LOGITS_ATOL


def on_grid(values: np.ndarray, encoding) -> np.ndarray:
    """``values`` quantize-dequantized by a per-tensor encoding."""
    scale, offset = encoding.scale[0], encoding.offset[0]
    codes = np.clip(np.round(values / scale) - offset, 0, 2 ** encoding.bitwidth - 1)
    return ((codes + offset) * scale).astype(np.float32)


def without_aimets_quantizers(sim) -> onnx.ModelProto:
    """The sim's graph with its weights folded (AIMET's quantized values), a quantized initializer (the embedding
    table) replaced by its quantize-dequantized values, and every QcQuantizeOp node taken out: AIMET's weights in a
    plain graph, its activations float."""
    sim.fold_param_quantizers()
    model = onnx.ModelProto()
    model.CopyFrom(sim.model.model)
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    renamed, kept, quantizer_domains = {}, [], set()
    for node in graph.node:
        if node.op_type == "QcQuantizeOp":
            quantizer_domains.add(node.domain)
        if node.op_type != "QcQuantizeOp":
            kept.append(node)
            continue
        renamed[node.output[0]] = node.input[0]
        if node.input[0] in initializers and sim.qc_quantize_op_dict[node.input[0]].enabled:
            tensor = initializers[node.input[0]]
            values = sim.qc_quantize_op_dict[node.input[0]].quantize_dequantize(numpy_helper.to_array(tensor))
            tensor.CopyFrom(numpy_helper.from_array(np.asarray(values, dtype=np.float32), tensor.name))
    for node in kept:
        node.input[:] = [renamed.get(name, name) for name in node.input]
    for output in graph.output:
        output.name = renamed.get(output.name, output.name)
    graph.ClearField("node")
    graph.node.extend(kept)
    kept_opsets = [opset for opset in model.opset_import if opset.domain not in quantizer_domains]
    model.ClearField("opset_import")
    model.opset_import.extend(kept_opsets)
    return model


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_the_evaluations_arithmetic_is_aimets_full_simulation(pair, quantized, recipe, tmp_path):
    """The activation quantizers ``evaluate`` adds (genie_build.evaluate.evaluate.fake_quantize_activations), on AIMET's
    own quantized weights, against AIMET's session with every quantizer on: the logits agree within
    :data:`EVALUATION_LOGITS_ATOL`, at least three times closer than the same graph with float activations."""
    import onnxruntime as ort

    prompt_path, _ = quantized[recipe]
    encodings = read_encodings(prompt_path)
    _, sim = aimet_sim_with(pair, recipe, prompt_path, tmp_path / "sim")
    # the evaluation's cache holds what the quantized graph wrote, values on the cache's 8-bit grid (AIMET's graph
    # does not clip a float cache value beyond that grid, though its quantizer's own quantize_dequantize does)
    feeds = [{name: on_grid(value, encodings.activations[name]) if KV_TENSOR.match(name) else value
              for name, value in feed.items()} for feed in text_feeds(pair)]
    plain = without_aimets_quantizers(sim)
    full = [session_outputs(sim.session, feed)[LOGITS] for feed in feeds]
    with_quantizers = onnx.ModelProto()
    with_quantizers.CopyFrom(plain)
    assert len(fake_quantize_activations(with_quantizers, encodings)) > 10

    def worst(model: onnx.ModelProto) -> float:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return max(float(np.abs(session.run([LOGITS], feed)[0] - expected).max())
                   for feed, expected in zip(feeds, full))

    quantized_activations, float_activations = worst(with_quantizers), worst(plain)
    print(f"{recipe}: logits vs AIMET's full simulation {quantized_activations:.2e} with the activation quantizers, "
          f"{float_activations:.2e} with float activations")
    assert quantized_activations <= EVALUATION_LOGITS_ATOL
    assert quantized_activations < float_activations / 3


# --- (c) a changed recipe or corpus changes the encodings -----------------------------------------------------

def test_a_changed_recipe_or_corpus_changes_the_encodings(pair, quantized, tmp_path):
    base = read_encodings(quantized["w4a16"][0])
    for recipe in ("w4a16-lpbq", "w8a16"):
        other = read_encodings(quantized[recipe][0])
        assert all(other.params[name] != base.params[name] for name in backbone_weights(
            load_graph(pair / "prompt.onnx").graph))
    other_text = tmp_path / "other.txt"
    other_text.write_text((REPO / "resources" / "tokenizer_corpus.txt").read_text(encoding="utf-8")[:40000],
                          encoding="utf-8")
    recalibrated = read_encodings(run_quantize(pair, "w4a16", tmp_path / "other", other_text)[0])
    assert recalibrated.params == base.params   # min/max weight encodings do not depend on the data
    changed = [name for name in base.activations if recalibrated.activations[name] != base.activations[name]]
    assert len(changed) > len(base.activations) // 2
    again = read_encodings(run_quantize(pair, "w4a16", tmp_path / "again")[0])
    assert again == base   # the same inputs give the same encodings


@pytest.mark.parametrize("pair", ["demo"], indirect=True)
def test_each_calibrator_reaches_aimets_activation_quantizers_and_leaves_the_matmul_weights_min_max(pair):
    """quantize.calibrator sets the activation quantizers' scheme: percentile's grids lie within min-max's (the
    windows' extremes; AIMET takes the percentile from a histogram, whose bins leave up to 0.3% over), and cut
    tensors with rare outliers by more than 1%; TF-enhanced's differ; the MatMul weights' encodings are min-max's."""
    from genie_build.quantize.calibrate_unit import CALIBRATORS, calibrate_prompt

    shape = feed_shape(load_graph(pair / "prompt.onnx"), pair / "prompt.onnx", pair / "config.json")
    ids = text_token_ids(CORPUS, pair / "tokenizer.json")
    calibrated = {calibrator: calibrate_prompt(pair / "prompt.onnx", RECIPES["w8a16"],
                                               text_forward_pass(shape, ids, NUM_SAMPLES), calibrator)
                  for calibrator in CALIBRATORS}
    base = calibrated["min-max"]
    assert all(enc.params == base.params for enc in calibrated.values())

    def width(encoding) -> float:
        return encoding.scale[0] * (2 ** encoding.bitwidth - 1)

    names = sorted(base.activations)
    ratios = [width(calibrated["percentile"].activations[name]) / width(base.activations[name]) for name in names]
    assert max(ratios) < 1.01 and sum(ratio < 0.99 for ratio in ratios) >= len(names) // 10
    assert sum(calibrated["tf-enhanced"].activations[name] != base.activations[name] for name in names) > len(names) // 2


# --- the calibration feeds -------------------------------------------------------------------------------------

class RecordingSession:
    """Stands in for AIMET's session: records each feed, outputs K/V entries numbered by call."""

    def __init__(self, shape: FeedShape) -> None:
        self.shape, self.feeds = shape, []
        self.outputs = [LOGITS] + [kv_name(match.group(1), int(match.group(2)), "out")
                                   for match in map(KV_TENSOR.match, shape.caches)]

    def get_outputs(self):
        return [type("Output", (), {"name": name}) for name in self.outputs]

    def run(self, _names, feed):
        self.feeds.append({name: np.copy(value) for name, value in feed.items()})
        call = len(self.feeds)
        new = []
        for name, dims in self.shape.caches.items():
            axis = len(dims) - 1 if "key" in name else len(dims) - 2
            out_dims = list(dims)
            out_dims[axis] = self.shape.ar
            new.append(np.full(out_dims, call, np.float32))
        return [np.zeros((1, self.shape.ar, 1), np.float32), *new]   # the logits: never read


def test_each_window_sees_the_cache_the_windows_before_it_wrote(pair):
    shape = feed_shape(load_graph(pair / "prompt.onnx"), pair / "prompt.onnx", pair / "config.json")
    ids = text_token_ids(CORPUS, pair / "tokenizer.json")
    session = RecordingSession(shape)
    text_forward_pass(shape, ids, NUM_SAMPLES)(session)
    per_sequence = (shape.context - shape.ar) // shape.ar + 1
    assert len(session.feeds) == NUM_SAMPLES > per_sequence
    key, value = "past_key_0_in", "past_value_0_in"
    for index, feed in enumerate(session.feeds):
        k = index % per_sequence
        past_len = k * shape.ar
        np.testing.assert_array_equal(feed["input_ids"][0], ids[index * shape.ar:(index + 1) * shape.ar])
        mask = feed["attention_mask"][0, 0]
        assert (mask[:past_len] == 0).all() and (mask[past_len:-shape.ar] < 0).all()
        # columns written by window j of this sequence hold j's outputs (its call number); the rest are empty
        written = np.repeat(np.arange(index - k + 1, index + 1), shape.ar)[:past_len]
        np.testing.assert_array_equal(feed[key][0, 0, 0, :past_len], written)
        np.testing.assert_array_equal(feed[value][0, 0, :past_len, 0], written)
        assert not feed[key][..., past_len:].any() and not feed[value][:, :, past_len:].any()


# --- bad inputs --------------------------------------------------------------------------------------------------

def test_a_token_graph_tensor_the_prompt_graph_lacks_is_named(pair, tmp_path):
    token = onnx.load(pair / "token.onnx", load_external_data=False)
    node = next(node for node in token.graph.node if node.op_type == "Add")
    renamed = node.output[0]
    for other in token.graph.node:
        other.input[:] = ["token_only_sum" if name == renamed else name for name in other.input]
    node.output[0] = "token_only_sum"
    for name in ("prompt.onnx", "prompt.onnx.data", "token.onnx.data", "config.json", "tokenizer.json"):
        shutil.copy(pair / name, tmp_path / name)
    onnx.save(token, tmp_path / "token.onnx")
    with pytest.raises(GenieBuildError, match="token_only_sum.*not in the prompt graph"):
        run_quantize(tmp_path, "w4a16", tmp_path / "out")
    assert not (tmp_path / "out" / "prompt.encodings.json").exists()


def test_lpbq_refuses_a_weight_that_does_not_split_into_blocks(tmp_path):
    from demo_shapes import ONE_LAYER
    from genie_build.demo.demo import generate_demo
    from genie_build.quantize.calibrate_unit import calibrate_prompt

    generate_demo(replace(ONE_LAYER, hidden=32, intermediate=96), tmp_path)
    with pytest.raises(GenieBuildError, match=f"LPBQ with blocks of {LPBQ_BLOCK_SIZE}"):
        calibrate_prompt(tmp_path / "prompt.onnx", RECIPES["w4a16-lpbq"], feeds_forward_pass([]))


# --- through the workflow --------------------------------------------------------------------------------------

@pytest.mark.workflow
@pytest.mark.parametrize("pair", ["demo"], indirect=True)
def test_the_quantized_pair_builds_a_bundle_that_passes_check_bundle(pair, quantized, tmp_path):
    """The encodings as a user model's: slice_encodings, the bundle's shared-quantization checks and the host run
    (the exported pairs build their bundles as model.hf_checkpoint, in tests/test_workflow_hf.py)."""
    recipe = "w4a16-lpbq"
    exports = tmp_path / "exports"
    exports.mkdir()
    for name in ("prompt.onnx", "prompt.onnx.data", "token.onnx", "token.onnx.data", "config.json",
                 "tokenizer.json"):
        shutil.copy(pair / name, exports / name)
    for kind, path in zip(("prompt", "token"), quantized[recipe]):
        shutil.copy(path, exports / f"{kind}.encodings")
    workdir, config = user_workdir(tmp_path, exports, {"encodings": {"share_from": "none"}})
    run_snakemake(workdir, config_file=config)
    out = workdir / "results" / "user"
    assert load_json(out / "bundle_check.json")["errors"] == 0
    host_run = load_json(out / "host_run.json")
    assert host_run["new_ids"] == host_run["reference_ids"]
