"""The demo at its own shape is a trained model (resources/demo_model.safetensors, scripts/train_demo.py): its graphs
hold the trained weights, its float model continues the README's prompt readably, the quick start's bundle prints
the README's continuation (the reference bundle the float model's), and its evaluation tells the recipes and the
calibrations apart as a trained model's should: w8a16 closer to the float model than w4a16, and a calibration on
text unlike the held-out text clips."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from genie_build.config import DEFAULT_CALIBRATION_TOKENS
from genie_build.conventions import INPUT_IDS, LOGITS, MASK, POS_COS, POS_SIN, causal_mask, rope_tables
from genie_build.demo.demo import TRAINED_SHAPE, TRAINED_WEIGHTS, generate_demo, graph_inputs
from genie_build.demo.train_tokenizer import train_tokenizer
from genie_build.errors import GenieBuildError
from genie_build.genie_config import load_tokenizer
from workflow_helpers import REFERENCE_BUILD, REPO, copy_workflow, load_json, run_snakemake, write_config

HOST_PROMPT = "And Moses said unto the LORD"
RECIPE_OF = {"packed": "w4a16", "w8a16": "w8a16"}
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def trained_demo(tmp_path_factory):
    """The demo's source at its own shape, from the trained weights, and its tokenizer."""
    out = tmp_path_factory.mktemp("trained")
    generate_demo(TRAINED_SHAPE, out, REPO / TRAINED_WEIGHTS)
    train_tokenizer(REPO / "resources" / "tokenizer_corpus.txt", TRAINED_SHAPE.vocab, out / "tokenizer.json")
    return out


def float_logits(model_dir, prompt: str, new_tokens: int) -> list[np.ndarray]:
    """The float prompt graph's logits at each step of its greedy continuation of ``prompt`` as Genie's first query
    (the config's BOS, then the prompt's tokens): the whole sequence run again for each token (the cache left empty,
    the positions after the sequence masked off by causality)."""
    session = ort.InferenceSession(str(model_dir / "prompt.onnx"), providers=["CPUExecutionProvider"])
    tokenizer = load_tokenizer(model_dir / "tokenizer.json")
    bos = json.loads((model_dir / "config.json").read_text())["bos_token_id"]
    ids = [bos] + tokenizer.encode(prompt, add_special_tokens=False).ids
    shape, ar = TRAINED_SHAPE, TRAINED_SHAPE.ar
    cos, sin = rope_tables(shape.head_dim, shape.rope_theta, np.arange(ar))
    feed = {spec.name: np.zeros(spec.dims, np.float32) for spec in graph_inputs(shape, "prompt")[4:]}
    feed.update({MASK: causal_mask(ar, shape.context, 0), POS_COS: cos, POS_SIN: sin})
    new: list[int] = []
    steps: list[np.ndarray] = []
    for _ in range(new_tokens):
        sequence = ids + new
        window = np.zeros((1, ar), np.int32)
        window[0, :len(sequence)] = sequence
        steps.append(session.run([LOGITS], {**feed, INPUT_IDS: window})[0][0, len(sequence) - 1])
        new.append(int(np.argmax(steps[-1])))
    return steps


def float_greedy(model_dir, prompt: str, new_tokens: int) -> list[int]:
    return [int(np.argmax(logits)) for logits in float_logits(model_dir, prompt, new_tokens)]


def test_the_demos_shape_is_built_from_the_trained_weights_and_no_other_shape_is(trained_demo, tmp_path):
    from safetensors.numpy import load_file

    stored = load_file(REPO / TRAINED_WEIGHTS)
    graph = onnx.load(trained_demo / "prompt.onnx")
    values = {tensor.name: onnx.numpy_helper.to_array(tensor, base_dir=str(trained_demo))
              for tensor in graph.graph.initializer if tensor.name in stored}
    assert set(values) == set(stored)    # every trained tensor is in the graph
    name = "model.layers.3.self_attn.q_proj.weight"   # square: only the role tells it must be transposed
    np.testing.assert_array_equal(values[name], stored[name].astype(np.float32).T)
    np.testing.assert_array_equal(values["model.embed_tokens.weight"], stored["model.embed_tokens.weight"])
    with pytest.raises(GenieBuildError, match="trained weights fit only the demo's own shape"):
        generate_demo(dataclasses.replace(TRAINED_SHAPE, layers=2), tmp_path, REPO / TRAINED_WEIGHTS)


def test_the_float_model_continues_the_host_prompt_and_ranks_two_tokens_first_as_the_readme_says(trained_demo):
    """Its text reads; its first token is "." with "," within 0.1% of its logit range, the near tie the README names
    (a quantized bundle may take either)."""
    tokenizer = load_tokenizer(trained_demo / "tokenizer.json")
    steps = float_logits(trained_demo, HOST_PROMPT, NEW_TOKENS)
    text = tokenizer.decode([int(np.argmax(logits)) for logits in steps])
    assert re.search(r"[A-Za-z]+ [a-z]+ [a-z]+", text)   # words, not a repeated token
    first = steps[0]
    best, second = np.argsort(first)[::-1][:2]
    assert [tokenizer.decode([int(best)]), tokenizer.decode([int(second)])] == [".", ","]
    assert (first[best] - first[second]) / (first.max() - first.min()) < 0.001
    assert 'ranks "." and "," after "LORD" within 0.1%' in (REPO / "README.md").read_text()


@pytest.mark.workflow
def test_the_quick_starts_bundle_prints_the_readmes_text_and_the_reference_bundle_the_float_models(trained_demo,
                                                                                                    tmp_path):
    """The default config (the trained demo, the builtin calibrator, w4a16): the qnn-htp bundle's 16 greedy tokens on
    the host are the README's; the reference toolchain's bundle of the same build prints the float model's."""
    workdir = copy_workflow(tmp_path)
    run_snakemake(workdir)
    host_run = load_json(workdir / "results" / "demo" / "host_run.json")
    assert host_run["prompt"] == HOST_PROMPT
    assert f"{HOST_PROMPT}{host_run['text']}\n" in (REPO / "README.md").read_text()
    run_snakemake(workdir, config_file=write_config(workdir, {"bundle": {"variant": "reference"}}))
    reference = load_json(workdir / "results" / "demo" / "host_run.json")
    assert reference["new_ids"] == float_greedy(trained_demo, HOST_PROMPT, NEW_TOKENS) != host_run["new_ids"]


# ------------------------------------------------------------------------------ the evaluation, calibrated by aimet

# the evaluation runs the reference toolchain's binaries: its unpacked and packed variants (w4a16) and one of w8a16
RECIPES_CONFIG = {**REFERENCE_BUILD, "demo": {"calibrator": "aimet"},
                  "split": {"num_parts": 2, "embedding_alone": False},
                  "variants": {**REFERENCE_BUILD["variants"], "w8a16": {"recipe": "w8a16"}},
                  "bundle": {**REFERENCE_BUILD["bundle"], "enabled": False},
                  "evaluate": {"enabled": True, "max_windows": 8}}


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """The trained demo calibrated by aimet-onnx's chain under w4a16 and w8a16 at the default windows and
    calibrator, every variant evaluated on the held-out text."""
    pytest.importorskip("aimet_onnx")
    workdir = copy_workflow(tmp_path_factory.mktemp("evaluated"))
    run_snakemake(workdir, config_file=write_config(workdir, RECIPES_CONFIG))
    return workdir


@pytest.mark.workflow
@pytest.mark.hf
def test_w8a16_agrees_with_the_float_model_more_than_w4a16_and_each_report_says_what_it_clipped(evaluated):
    """At the default windows and calibrator (``packed`` is the reference toolchain's w4a16 variant): the windows that
    hold DEFAULT_CALIBRATION_TOKENS, on which w8a16's mean KL is at most 2e-4 and a quarter of w4a16's."""
    reports = {variant: load_json(evaluated / "results" / "demo" / "evaluation" / f"{variant}.json")
               for variant in ("packed", "w8a16")}
    assert reports["w8a16"]["top1_agreement"] > reports["packed"]["top1_agreement"]
    assert reports["w8a16"]["mean_kl"] <= min(2e-4, reports["packed"]["mean_kl"] / 4)
    windows = DEFAULT_CALIBRATION_TOKENS // TRAINED_SHAPE.ar
    for report in reports.values():
        assert report["calibration"] == {"calibrator": "aimet-onnx min-max", "recipe": RECIPE_OF[report["variant"]],
                                         "windows": windows, "tokens": DEFAULT_CALIBRATION_TOKENS,
                                         "text": "calibration_corpus.txt"}
        assert 0 <= report["clipping"]["share"] < 1e-3
    # w4a16 loses to its 4-bit weights (the activation grids add little), w8a16 to its activation grids
    assert reports["packed"]["weights_only"]["mean_kl"] > reports["packed"]["mean_kl"] / 2
    assert reports["w8a16"]["weights_only"]["mean_kl"] < reports["w8a16"]["mean_kl"] / 2
    table = (evaluated / "results" / "demo" / "evaluation.md").read_text()
    assert "## Calibration and the tensors that clip most" in table and f"aimet-onnx min-max, {windows} windows" in table


@pytest.mark.workflow
@pytest.mark.hf
def test_a_calibration_on_text_unlike_the_held_out_text_shows_up_as_clipping(evaluated):
    """On 8 windows (256 tokens, few enough for the text to decide the grids), calibrated on the tokenizer's corpus
    (Python docstrings) instead of Genesis, the w8a16 variant's held-out (Exodus) activations fall outside their
    grids more often, and report.max_clipped_share flags it: with strict, the target fails naming the tensor that
    clips most."""
    few = {**RECIPES_CONFIG, "evaluate": {**RECIPES_CONFIG["evaluate"], "weights_only": False},
           "quantize": {"num_samples": 8}}
    run_snakemake(evaluated, config_file=write_config(evaluated, few, "genesis.yaml"))
    genesis = load_json(evaluated / "results" / "demo" / "evaluation" / "w8a16.json")
    unlike = {**few, "quantize": {"num_samples": 8, "corpus": "resources/tokenizer_corpus.txt"},
              "report": {**RECIPES_CONFIG["report"], "max_clipped_share": 1.5 * genesis["clipping"]["share"],
                         "strict": True}}
    result = run_snakemake(evaluated, config_file=write_config(evaluated, unlike, "unlike.yaml"), check=False)
    assert result.returncode != 0
    docstrings = load_json(evaluated / "results" / "demo" / "evaluation" / "w8a16.json")
    assert docstrings["calibration"]["text"] == "tokenizer_corpus.txt"
    assert docstrings["clipping"]["share"] > 1.5 * genesis["clipping"]["share"]
    worst = docstrings["clipping"]["tensors"][0]
    assert "report.strict" in result.stdout + result.stderr and worst["name"] in result.stdout + result.stderr
