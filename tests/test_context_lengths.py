"""Several context lengths: the config's lists, the demo's graphs at another length, the estimate and the size table
counting every length's graphs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml

from genie_build import cli
from genie_build.config import context_lengths, validate_config
from genie_build.conventions import length_graph_key
from genie_build.demo.demo import example_inputs, generate_demo, generate_demo_length
from genie_build.errors import GenieBuildError
from genie_build.plan.load_model import IoDims, estimated_contexts
from genie_build.plan.plan_file import PartPlan
from genie_build.split.check_model import check_model

import demo_shapes

REPO = Path(__file__).resolve().parents[1]
QWEN_7B = REPO / "config" / "hf" / "qwen2_5_7b_instruct.json"
DEFAULT_CONFIG = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
BASE = dataclasses.replace(demo_shapes.TINY, context=48)   # the largest length
SHORT = 24


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lengths")
    generate_demo(BASE, out)
    return out


def _external(path: Path) -> dict[str, tuple]:
    """Each initializer's external-data reference (location, offset, length), or its inline size."""
    refs = {}
    for tensor in onnx.load(path, load_external_data=False).graph.initializer:
        entries = {entry.key: entry.value for entry in tensor.external_data}
        refs[tensor.name] = ((entries["location"], entries["offset"], entries["length"]) if entries
                             else ("inline", len(tensor.raw_data)))
    return refs


def _run(path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    wanted = {node.name for node in session.get_inputs()}
    return dict(zip(names, session.run(names, {name: value for name, value in feed.items() if name in wanted})))


def _at_length(feed: dict[str, np.ndarray], shape, kind: str, context: int, past_len: int) -> dict[str, np.ndarray]:
    """The feed of the graph at ``context``: the mask at that length, the first slots of each past KV input."""
    ar = shape.ar if kind == "prompt" else 1
    short = {**feed, "attention_mask": example_inputs(dataclasses.replace(shape, context=context), kind, past_len,
                                                      np.random.default_rng(0))["attention_mask"]}
    for name, value in feed.items():
        if name.startswith("past_key_"):
            short[name] = value[..., :context - ar]
        elif name.startswith("past_value_"):
            short[name] = value[..., :context - ar, :]
    return short


# --- config ------------------------------------------------------------------------------------------------

def _validated(**sections: dict) -> dict:
    """The default config, each of ``sections`` merged into its section."""
    return validate_config({**DEFAULT_CONFIG, **{name: {**DEFAULT_CONFIG.get(name, {}), **values}
                                                 for name, values in sections.items()}})


def test_context_lists_validate_and_read_ascending():
    config = _validated(demo={"context": [256, 128]}, export={"context": [4096, 512, 1024]})
    assert context_lengths(config["demo"]) == (128, 256)
    assert context_lengths(config["export"]) == (512, 1024, 4096)
    assert context_lengths(_validated()["demo"]) == (256,)


def test_a_command_line_list_of_lengths_reads_as_numbers():
    """``snakemake --config demo='{context: [128, 256]}'`` passes the items as text."""
    assert context_lengths(_validated(demo={"context": ["256", "128"]})["demo"]) == (128, 256)


@pytest.mark.parametrize("lengths, message", [
    ([128, 128], "config demo.context"),
    ([], "config demo.context"),
    ([16, 256], "must be smaller than context=16"),
])
def test_bad_length_lists_are_refused_in_one_line(lengths, message):
    with pytest.raises(GenieBuildError, match=message) as caught:
        _validated(demo={"context": lengths})
    assert "\n" not in str(caught.value)


def test_unpaired_user_graph_lists_are_refused_naming_the_key():
    model = {"name": "mine", "prompt_onnx": ["a.onnx", "b.onnx"], "token_onnx": "c.onnx",
             "tokenizer": "t.json", "hf_config": "c.json", "encodings": "e.json"}
    with pytest.raises(GenieBuildError, match=r"config model\.token_onnx: give as many token graphs as prompt graphs, "
                                              r"one of each per context length \(got prompt_onnx: 2 paths, "
                                              r"token_onnx: 1 path\)$"):
        _validated(model=model)
    _validated(model={**model, "prompt_onnx": ["a.onnx"]})   # one graph each, as a list or a path


# --- the demo's graphs at another length ----------------------------------------------------------------------

def test_graphs_at_another_length_share_the_base_weights_and_leave_the_base_files(demo_dir, tmp_path):
    before = {path.name: (path.read_bytes(), path.stat().st_mtime_ns) for path in demo_dir.iterdir()}
    written = generate_demo_length(BASE, demo_dir, SHORT)
    try:
        assert {path.name for path in written.values()} == {"prompt_cl24.onnx", "token_cl24.onnx"}
        assert {name: (path.read_bytes(), path.stat().st_mtime_ns) for name, path in
                ((p.name, p) for p in demo_dir.iterdir()) if name in before} == before
        assert not [path for path in demo_dir.iterdir() if path.name not in before and path not in written.values()]
        for kind, path in written.items():
            model = onnx.load(path, load_external_data=False)
            assert model.graph.name == f"{kind}_ar{8 if kind == 'prompt' else 1}_cl24"
            base_refs, refs = _external(demo_dir / f"{kind}.onnx"), _external(path)
            shared = {name: ref for name, ref in refs.items() if ref[0] != "inline"}
            assert shared and all(base_refs[name] == ref for name, ref in shared.items())
            onnx.checker.check_model(str(path))
    finally:
        for path in written.values():
            path.unlink()


@pytest.mark.parametrize("kind", ["prompt", "token"])
def test_graphs_at_another_length_compute_what_the_base_graphs_compute(demo_dir, kind):
    """The same tokens after the same valid cache give the same logits and new KV at either length."""
    written = generate_demo_length(BASE, demo_dir, SHORT)
    try:
        past_len = 9
        feed = example_inputs(BASE, kind, past_len, np.random.default_rng(3))
        base = _run(demo_dir / f"{kind}.onnx", feed)
        short = _run(written[kind], _at_length(feed, BASE, kind, SHORT, past_len))
        assert base.keys() == short.keys()
        for name in base:
            np.testing.assert_allclose(short[name], base[name], rtol=1e-5, atol=1e-5, err_msg=name)
    finally:
        for path in written.values():
            path.unlink()


@pytest.mark.parametrize("context, message", [(48, "must lie between"), (8, "must lie between"),
                                              (96, "must lie between")])
def test_a_length_outside_the_range_is_refused(demo_dir, context, message):
    with pytest.raises(GenieBuildError, match=message):
        generate_demo_length(BASE, demo_dir, context)


def test_a_missing_base_graph_is_refused_naming_it(tmp_path):
    with pytest.raises(GenieBuildError, match=r"prompt\.onnx: missing: generate the demo"):
        generate_demo_length(BASE, tmp_path, SHORT)


def test_the_command_writes_the_graphs_of_one_length(demo_dir):
    shape = json.dumps(dataclasses.asdict(BASE))
    try:
        assert cli.main(["generate-demo-length", "--out-dir", str(demo_dir), "--shape-json", shape,
                         "--context", "32"]) == 0
        assert all((demo_dir / f"{length_graph_key(kind, 32)}.onnx").is_file() for kind in ("prompt", "token"))
    finally:
        for kind in ("prompt", "token"):
            (demo_dir / f"{length_graph_key(kind, 32)}.onnx").unlink(missing_ok=True)


def test_check_model_refuses_a_graph_at_another_length_with_other_weights(demo_dir, tmp_path):
    """Weights that differ would be stored twice in each binary: the user's export is refused before any split."""
    written = generate_demo_length(BASE, demo_dir, SHORT)
    try:
        summary = check_model(str(demo_dir / "prompt.onnx"), str(demo_dir / "token.onnx"), tmp_path / "ok.json",
                              [(kind, str(path)) for kind, path in written.items()])
        stored = [ref for ref in _external(demo_dir / "prompt.onnx").values() if ref[0] != "inline"]
        assert set(summary["lengths"].values()) == {len(stored)} and stored
        other = tmp_path / "other"
        generate_demo(dataclasses.replace(BASE, seed=1), other)
        generate_demo_length(dataclasses.replace(BASE, seed=1), other, SHORT)
        with pytest.raises(GenieBuildError, match=r"prompt_cl24\.onnx: \d+ weight\(s\) differ from .*same shape"):
            check_model(str(demo_dir / "prompt.onnx"), str(demo_dir / "token.onnx"), tmp_path / "bad.json",
                        [("prompt", str(other / "prompt_cl24.onnx"))])
        assert not (tmp_path / "bad.json").exists()
    finally:
        for path in written.values():
            path.unlink()


# --- counted: the load model's buffers, the estimate ---------------------------------------------------------

def _dims(*lengths: int) -> IoDims:
    return IoDims(hidden=64, kv_width=32, head_dim=16, intermediate=128, vocab=256, ar=8, context_lengths=lengths,
                  activation_bytes=2)


def test_every_length_adds_its_graphs_io_and_the_kv_cache_stays_the_largest_lengths():
    part = PartPlan(index=2, label="2_of_3", pieces=("layer_0", "layer_1"), first_layer=0, last_layer=1,
                    input_boundary="x", output_boundary="y", estimated_bytes=1000)
    one, two = (estimated_contexts([part], [1000], dims)[0] for dims in (_dims(64), _dims(32, 64)))
    buffers = {context: {buffer.kind: buffer.bytes for buffer in context.buffers} for context in (one, two)}
    assert buffers[two]["KV cache"] == buffers[one]["KV cache"] == 2 * 2 * 32 * (64 - 1)
    # the mask [1, AR, CL] and the rest of each graph's IO, at 32 beside 64
    at_32 = estimated_contexts([part], [1000], _dims(32))[0]
    assert buffers[two]["IO"] == buffers[one]["IO"] + {b.kind: b.bytes for b in at_32.buffers}["IO"]


def test_the_7b_estimate_with_four_lengths_stores_the_weights_once(tmp_path):
    outs = {}
    for name, lengths in (("one", ["4096"]), ("four", ["512", "1024", "2048", "4096"])):
        outs[name] = tmp_path / name
        assert cli.main(["estimate", "--hf-config", str(QWEN_7B), "--ar", "128", "--context", *lengths,
                         "--split-json", '{"num_parts": 6, "max_part_mb": null, "embedding_alone": true, '
                                         '"boundaries": []}', "--out-dir", str(outs[name])]) == 0
    one, four = (json.loads((outs[name] / "estimate.json").read_text()) for name in ("one", "four"))
    assert (one["graphs_per_part"], four["graphs_per_part"]) == (2, 8)
    assert four["context_lengths"] == [512, 1024, 2048, 4096]
    for variant in ("packed", "unpacked"):
        assert four["totals"][variant]["weight_bytes"] == one["totals"][variant]["weight_bytes"]
        extra = four["totals"][variant]["file_bytes"] - one["totals"][variant]["file_bytes"]
        assert 0 < extra < 0.01 * one["totals"][variant]["file_bytes"]   # graph structures, not weights
    # without sharing every graph holds its own copy
    assert four["totals"]["packed_unshared"]["weight_bytes"] == 4 * one["totals"]["packed_unshared"]["weight_bytes"]
    io = {name: sum(buffer["bytes"] for context in json.loads((outs[name] / "memory_plan.json").read_text())
                    ["load"]["contexts"] for buffer in context["buffers"] if buffer["kind"] == "IO")
          for name in outs}
    assert io["four"] > 3 * io["one"]
