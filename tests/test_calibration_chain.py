"""The calibration chain against whole-model calibration, with aimet-onnx itself.

For random checkpoints of every registered family (tests/hf_checkpoints.py), exported part by part (3 parts, the
middle one in two units), and each recipe: the units calibrated one after the other, each fed the residual stream
the unit before it stored, merged per part (genie_build.quantize.part_encodings), give every encoding, activation and
weight, that whole-model calibration (tests/whole_model.py: the whole export's prompt graph in one
QuantizationSimModel) gives the same part's tensors, bit for bit, over windows that fill the cache and start a
second sequence. The plan made from config.json weighs every piece as the calibrated encodings store it. Also: the
command's one-line errors, and the plan check refusing encodings that would cut the model elsewhere.

Skips when aimet-onnx is not installed, unless ``GENIE_BUILD_REQUIRE_AIMET=1`` (set by ``.ci/run``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workflow_helpers import REPO

from genie_build.conventions import EMBED_WEIGHT, EMBEDDING_BOUNDARY, unit_label
from genie_build.encodings import read_encodings, slice_encodings
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import load_graph, part_tensor_names, read_graph_tensors
from genie_build.plan.calibration_units import CalibrationUnit, calibration_units, part_units, unit_peak_mb
from genie_build.plan.recipes import RECIPES
from genie_build.plan.shape_plan import piece_floats, plan_from_hf_config
from genie_build.quantize.check_plan import check_plan, measured_pieces
from genie_build.split.split import split_graphs

pytestmark = pytest.mark.hf
if os.environ.get("GENIE_BUILD_REQUIRE_AIMET") == "1":
    import aimet_onnx  # noqa: F401  -- CI installs it: a missing one fails
else:
    pytest.importorskip("aimet_onnx", reason="aimet-onnx is not installed (envs/requirements-hf.txt)")
pytest.importorskip("torch")

import hf_checkpoints  # noqa: E402

from genie_build.export.export import export_checkpoint, export_part, part_files  # noqa: E402
from genie_build.quantize.part_encodings import write_part_encodings  # noqa: E402
from genie_build.quantize.calibrate_unit import calibrate_prompt, calibrate_unit, copy_kv_input_encodings  # noqa: E402
from genie_build.quantize.calibration_feeds import feed_shape, text_forward_pass  # noqa: E402
from genie_build.tokens import text_token_ids, tokenize_text  # noqa: E402

CORPUS = REPO / "resources" / "calibration_corpus.txt"
AR, CONTEXT, NUM_SAMPLES = 8, 32, 6    # 4 windows fill a sequence: the fifth starts a new one


def one_piece_units(plan, split_part: str) -> tuple[CalibrationUnit, ...]:
    """The plan's pieces as units: one per part, but ``split_part``'s pieces one unit each (so a unit starts inside
    a part)."""
    boundaries = {piece.name: piece.output_boundary for piece in plan.pieces}
    groups: list[tuple[str, list[str]]] = []
    for part in plan.parts:
        groups += [(part.label, [name]) for name in part.pieces] if part.label == split_part else [
            (part.label, list(part.pieces))]
    return tuple(CalibrationUnit(unit_label(i, len(groups)), part, tuple(pieces),
                                 boundaries[groups[i - 2][1][-1]] if i > 1 else None, boundaries[pieces[-1]], 0)
                 for i, (part, pieces) in enumerate(groups, start=1))


def corpus_tokens(root: Path, checkpoint: Path) -> Path:
    """The calibration corpus's token ids, as the workflow's tokenize-text job writes them (once per folder)."""
    path = root / "calibration.npy"
    if not path.exists():
        tokenize_text(CORPUS, checkpoint / "tokenizer.json", checkpoint / "config.json", path, needed=1,
                      use="calibration")
    return path


def run_chain(root: Path, checkpoint: Path, plan, units, recipe: str, calibrator: str = "min-max") -> Path:
    """Every unit in chain order, then every part's encodings; returns the folder holding them."""
    out = root / f"chain-{recipe}-{calibrator}"
    out.mkdir()
    for index, unit in enumerate(units):
        before = units[index - 1] if index else None
        calibrate_unit(part_files(root / "parts" / unit.part)[0]["prompt"], part_units(units, unit.part), unit.label,
                       out / f"unit_{unit.label}.json", out / f"unit_{unit.label}.npy",
                       hf_config_path=checkpoint / "config.json", tokens_path=corpus_tokens(root, checkpoint),
                       recipe=recipe, num_samples=NUM_SAMPLES, ar=AR, context=CONTEXT,
                       boundary_in=out / f"unit_{before.label}.npy" if before else None, calibrator=calibrator)
    for part in plan.parts:
        mine = part_units(units, part.label)
        first = units.index(mine[0])
        graphs, _ = part_files(root / "parts" / part.label)
        write_part_encodings([(unit, out / f"unit_{unit.label}.json") for unit in mine],
                             (units[first - 1], out / f"unit_{units[first - 1].label}.json") if first else None,
                             graphs["prompt"], graphs["token"], out / f"prompt_{part.label}.json",
                             out / f"token_{part.label}.json", kv_cache_tied=True)
    return out


@pytest.fixture(scope="module", params=hf_checkpoints.FAMILIES)
def model(request, tmp_path_factory):
    """``(family, root, checkpoint, plan, units)``: a 3-layer checkpoint exported whole (then split) and part by
    part, into [embedding] [layer 0, layer 1] [layer 2, head], the middle part calibrated as two units."""
    root = tmp_path_factory.mktemp(request.param)
    checkpoint = hf_checkpoints.make_checkpoint(root / "checkpoint", request.param, tied=True, layers=3,
                                                context=CONTEXT)
    plan = exported(root, checkpoint)
    return request.param, root, checkpoint, plan, one_piece_units(plan, plan.parts[1].label)


def exported(root: Path, checkpoint: Path):
    """The 3-layer checkpoint's plan ([embedding] [layer 0, layer 1] [layer 2, head]), its whole export split by it,
    and its parts exported part by part."""
    plan = plan_from_hf_config(checkpoint / "config.json", recipe="w4a16", ar=AR, context=CONTEXT, num_parts=3)
    assert [part.pieces for part in plan.parts] == [("embedding",), ("layer_0", "layer_1"), ("layer_2", "head")]
    export_checkpoint(checkpoint, root / "whole", ar=AR, context=CONTEXT)
    split_graphs({kind: root / "whole" / f"{kind}.onnx" for kind in ("prompt", "token")}, plan, root / "split")
    for part in plan.parts:
        export_part(checkpoint, part, root / "parts" / part.label, num_parts=3, ar=AR, context=CONTEXT)
    return plan


def whole_model_encodings(root: Path, checkpoint: Path, recipe: str, calibrator: str = "min-max"):
    prompt = root / "whole" / "prompt.onnx"
    shape = feed_shape(load_graph(prompt), prompt, checkpoint / "config.json")
    ids = text_token_ids(CORPUS, checkpoint / "tokenizer.json")
    encodings = calibrate_prompt(prompt, RECIPES[recipe], text_forward_pass(shape, ids, NUM_SAMPLES), calibrator)
    return copy_kv_input_encodings(encodings, read_graph_tensors(prompt).tensor_names)


def assert_part_equals_whole(root: Path, chain: Path, whole, label: str, case: tuple):
    """The chain's prompt encodings of part ``label`` equal whole-model calibration's slice of it, every activation
    and weight; returns them."""
    names, initializers = part_tensor_names(root / "split" / f"part_{label}" / "prompt.onnx")
    expected = slice_encodings(whole, names, initializers)
    actual = read_encodings(chain / f"prompt_{label}.json")
    assert actual.activations == expected.activations, (*case, label)
    assert actual.params == expected.params, (*case, label)
    return actual


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_the_chain_gives_every_encoding_whole_model_calibration_gives(model, recipe, record_property):
    family, root, checkpoint, plan, units = model
    assert len(units) == 4 and len(part_units(units, plan.parts[1].label)) == 2
    chain = run_chain(root, checkpoint, plan, units, recipe)
    whole = whole_model_encodings(root, checkpoint, recipe)
    compared = 0
    for part in plan.parts:
        actual = assert_part_equals_whole(root, chain, whole, part.label, (family, recipe))
        compared += len(actual.activations) + len(actual.params)
        token = read_encodings(chain / f"token_{part.label}.json")
        token_names = read_graph_tensors(part_files(root / "parts" / part.label)[0]["token"]).tensor_names
        assert token.activations == {n: e for n, e in actual.activations.items() if n in token_names}
    record_property("encodings_compared", compared)
    assert compared > 100
    # the part after the embedding takes its input at the table's encoding (AIMET leaves the Gather output
    # unencoded), not at the one its own unit's input quantizer found
    table = read_encodings(chain / f"prompt_{plan.parts[0].label}.json").of_initializer(EMBED_WEIGHT)
    embeds = read_encodings(chain / f"prompt_{plan.parts[1].label}.json").activations[EMBEDDING_BOUNDARY]
    assert embeds == dataclasses.replace(table, name=EMBEDDING_BOUNDARY) and table.kind == "per_tensor"
    assert read_encodings(chain / f"unit_{units[1].label}.json").activations[EMBEDDING_BOUNDARY] != embeds
    # each unit stored its stream for the next one, window by window; the last unit's output is the logits
    stream = np.load(chain / f"unit_{units[0].label}.npy")
    assert stream.shape == (NUM_SAMPLES, 1, AR, 64) and stream.dtype == np.float32
    assert np.load(chain / f"unit_{units[-1].label}.npy").size == 0
    # the plan made from config.json weighs every piece as these encodings store it
    graphs = {part.label: (part_files(root / "parts" / part.label)[0]["prompt"], chain / f"prompt_{part.label}.json")
              for part in plan.parts}
    recipe_plan = plan_from_hf_config(checkpoint / "config.json", recipe=recipe, ar=AR, context=CONTEXT, num_parts=3)
    measured = measured_pieces(recipe_plan, graphs)
    assert [piece.bytes for piece in measured] == [piece.bytes for piece in recipe_plan.pieces]
    assert check_plan(recipe_plan, measured, root / f"plan_check_{recipe}.json", "plan.json").same_parts


def test_a_plan_the_encodings_would_cut_elsewhere_is_refused(model, tmp_path):
    _, root, checkpoint, plan, units = model
    chain = root / "chain-w4a16-min-max"
    if not chain.exists():
        chain = run_chain(root, checkpoint, plan, units, "w4a16")
    graphs = {part.label: (part_files(root / "parts" / part.label)[0]["prompt"], chain / f"prompt_{part.label}.json")
              for part in plan.parts}
    measured = measured_pieces(plan, graphs)
    # a layer that weighs as much as the rest: the balanced split now cuts elsewhere
    heavy = [dataclasses.replace(p, bytes=p.bytes * 40) if p.name == "layer_0" else p for p in measured]
    with pytest.raises(GenieBuildError, match="other parts than the plan") as error:
        check_plan(plan, heavy, tmp_path / "check.json", "plan.json")
    assert "embedding | layer_0+layer_1 | layer_2+head" in str(error.value)
    assert not (tmp_path / "check.json").exists()


# --- the embedding read in place, the LM head in slices --------------------------------------------------------

HEAD_SLICES = 3


@pytest.fixture(scope="module")
def wide_head(tmp_path_factory):
    """``(root, checkpoint, plan, units)``: an untied 3-layer Qwen2 checkpoint whose LM head's first rows are 8 times
    the others (so the logits' extremes come from the first of its slices, not the last), its units one piece each,
    the head in :data:`HEAD_SLICES` slices of its vocabulary."""
    def widen(model) -> None:
        model.lm_head.weight[:8] *= 8

    root = tmp_path_factory.mktemp("wide_head")
    checkpoint = hf_checkpoints.make_checkpoint(root / "checkpoint", "qwen2", layers=3, context=CONTEXT, edit=widen)
    plan = exported(root, checkpoint)
    units = tuple(dataclasses.replace(unit, slices=HEAD_SLICES) if unit.pieces == ("head",) else unit
                  for unit in one_piece_units(plan, plan.parts[2].label))
    assert [unit.pieces for unit in units][0::len(units) - 1] == [("embedding",), ("head",)]
    return root, checkpoint, plan, units


@pytest.mark.parametrize("calibrator", ["min-max", "tf-enhanced", "percentile"])
@pytest.mark.parametrize("recipe", ["w4a16", "w8a16"])
def test_the_table_in_place_and_the_head_in_slices_give_whole_model_calibrations_encodings(wide_head, recipe,
                                                                                          calibrator, caplog):
    """The embedding's unit reads its table in place and the head's is calibrated a third of its vocabulary at a
    time; every part's encodings still equal whole-model calibration's, bit for bit, under every calibrator."""
    root, checkpoint, plan, units = wide_head
    with caplog.at_level("INFO", logger="genie_build.quantize.calibrate_unit"):
        chain = run_chain(root, checkpoint, plan, units, recipe, calibrator)
    assert f"LM head rows 0..{320 // HEAD_SLICES - 1} (slice 1 of {HEAD_SLICES})" in caplog.text
    whole = whole_model_encodings(root, checkpoint, recipe, calibrator)
    for part in plan.parts:
        assert_part_equals_whole(root, chain, whole, part.label, (recipe, calibrator))
    assert len(read_encodings(chain / f"prompt_{plan.parts[2].label}.json").params["lm_head.weight"].scale) == 320


# --- memory: a window, not the count ----------------------------------------------------------------------------

WIDE_AR, WIDE_CONTEXT, FEW, MANY = 128, 256, 8, 96


def peak_rss_mb(command: list[str]) -> float:
    """The peak RSS of ``command`` (its own process, measured by a wrapper that runs nothing else)."""
    wrapper = ("import resource, subprocess, sys; result = subprocess.run(sys.argv[1:]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(result.returncode)")
    result = subprocess.run([sys.executable, "-c", wrapper, *command], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    return int(result.stdout.split()[-1]) / 1024


def test_a_units_memory_does_not_grow_with_the_windows(tmp_path):
    """A layer's unit fed the stream of the unit before it and writing its own: 96 windows of 128 tokens of a
    1024-wide stream (48 MiB in, 48 MiB out) take no more memory than 8 (each stream read and written a window at a
    time; held whole, the two streams and their stack would add about 140 MiB)."""
    checkpoint = hf_checkpoints.make_checkpoint(tmp_path / "checkpoint", "qwen2", layers=1, hidden=1024,
                                                intermediate=1024, heads=8, kv_heads=2, context=WIDE_CONTEXT)
    plan = plan_from_hf_config(checkpoint / "config.json", recipe="w4a16", ar=WIDE_AR, context=WIDE_CONTEXT,
                               num_parts=2)
    for part in plan.parts:
        export_part(checkpoint, part, tmp_path / "parts" / part.label, num_parts=2, ar=WIDE_AR, context=WIDE_CONTEXT)
    units = one_piece_units(plan, plan.parts[1].label)
    layer = next(unit for unit in units if unit.pieces == ("layer_0",))
    tokens = corpus_tokens(tmp_path, checkpoint)
    peaks = {}
    for count in (FEW, MANY):
        stream = tmp_path / f"stream_{count}.npy"
        np.save(stream, np.random.default_rng(0).standard_normal((count, 1, WIDE_AR, 1024)).astype(np.float32))
        peaks[count] = peak_rss_mb([
            sys.executable, "-m", "genie_build", "calibrate-unit",
            "--part-graph", str(part_files(tmp_path / "parts" / layer.part)[0]["prompt"]),
            "--part-units-json", json.dumps([dataclasses.asdict(u) for u in part_units(units, layer.part)]),
            "--unit", layer.label, "--boundary-in", str(stream), "--hf-config", str(checkpoint / "config.json"),
            "--tokens", str(tokens), "--recipe", "w4a16", "--num-samples", str(count), "--ar", str(WIDE_AR),
            "--context", str(WIDE_CONTEXT), "--out-encodings", str(tmp_path / f"unit_{count}.json"),
            "--out-boundary", str(tmp_path / f"out_{count}.npy")])
        assert np.load(tmp_path / f"out_{count}.npy").shape == (count, 1, WIDE_AR, 1024)
    assert peaks[MANY] - peaks[FEW] < 30, peaks


# --- the units ---------------------------------------------------------------------------------------------------

def test_units_never_cross_a_part_and_fit_the_budget():
    """Qwen2.5-7B in 6 parts at 8,000 MB a unit: the embedding alone (its table read in place), two layers a unit,
    the head alone in two slices of its vocabulary; every unit's planned memory within the budget."""
    plan = plan_from_hf_config(REPO / "config" / "hf" / "qwen2_5_7b_instruct.json", recipe="w4a16", ar=128,
                               context=4096, num_parts=6)
    floats = piece_floats(REPO / "config" / "hf" / "qwen2_5_7b_instruct.json")
    units = calibration_units(plan, floats, 8000)
    assert [u.pieces for u in units][:2] == [("embedding",), ("layer_0", "layer_1")]
    assert len(units) == 17 and units[-1].pieces == ("head",) and units[-2].pieces == ("layer_26", "layer_27")
    assert units[-1].slices == 2 and all(unit.slices == 1 for unit in units[:-1])
    for unit in units:
        part = next(p for p in plan.parts if p.label == unit.part)
        assert set(unit.pieces) <= set(part.pieces)
        assert unit_peak_mb(unit) <= 8000
    assert all(b.input_boundary == a.output_boundary for a, b in zip(units, units[1:]))
    # a larger budget holds the head whole, a smaller one cuts it finer
    assert calibration_units(plan, floats, 10240)[-1].slices == 1
    assert calibration_units(plan, floats, 5000)[-1].slices == 3
    with pytest.raises(GenieBuildError, match="quantize.unit_memory_mb: 3500 MB cannot hold piece layer_0") as error:
        calibration_units(plan, floats, 3500)
    assert "set at least 4069" in str(error.value)


# --- the command -------------------------------------------------------------------------------------------------

def _command(model, tmp_path: Path, *extra: str, tokens: Path | None = None) -> subprocess.CompletedProcess:
    _, root, checkpoint, plan, units = model
    unit = units[1]
    return subprocess.run(
        [sys.executable, "-m", "genie_build", "calibrate-unit",
         "--part-graph", str(part_files(root / "parts" / unit.part)[0]["prompt"]),
         "--part-units-json", json.dumps([dataclasses.asdict(u) for u in part_units(units, unit.part)]),
         "--unit", unit.label, "--hf-config", str(checkpoint / "config.json"),
         "--tokens", str(tokens or corpus_tokens(root, checkpoint)), "--recipe", "w4a16",
         "--ar", str(AR), "--context", str(CONTEXT), "--out-encodings", str(tmp_path / "unit.json"),
         "--out-boundary", str(tmp_path / "unit.npy"), *extra], capture_output=True, text=True)


@pytest.mark.parametrize("model", ["qwen2"], indirect=True)   # the inputs are read alike for every family
def test_bad_inputs_are_one_line_and_write_nothing(model, tmp_path):
    short, stale = tmp_path / "short.npy", tmp_path / "stale.npy"
    np.save(short, np.arange(2 * AR - 1, dtype=np.int32))
    np.save(stale, np.zeros((2, 1, AR, 64), np.float32))
    for extra, tokens, message in (
            (["--num-samples", "2", "--boundary-in", str(stale)], short,
             f"holds {2 * AR - 1} token ids, {2 * AR} are needed"),
            (["--num-samples", "2", "--boundary-in", str(stale)], tmp_path / "missing.npy", "file not found"),
            (["--num-samples", "2", "--boundary-in", str(stale)], stale, "not int32 token ids"),
            (["--num-samples", "0", "--boundary-in", str(stale)], None, "at least 1"),
            (["--num-samples", "3", "--boundary-in", str(stale)], None, "stored for other calibration settings"),
            (["--num-samples", "2"], None, "takes the residual stream of the unit before it")):
        result = _command(model, tmp_path, *extra, tokens=tokens)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith("genie-build: error: ")
        assert message in result.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "unit.json").exists() and not (tmp_path / "unit.npy").exists()


@pytest.mark.parametrize("model", ["qwen2"], indirect=True)
def test_without_aimet_onnx_the_unit_names_what_is_missing_after_reading_its_inputs(model, tmp_path, monkeypatch):
    _, root, checkpoint, plan, units = model
    monkeypatch.setitem(sys.modules, "aimet_onnx.quantsim", None)   # import fails as if not installed
    unit = units[0]
    kwargs = dict(hf_config_path=checkpoint / "config.json", recipe="w4a16", num_samples=2, ar=AR, context=CONTEXT)
    graph = part_files(root / "parts" / unit.part)[0]["prompt"]
    with pytest.raises(GenieBuildError, match="^calibrate-unit: aimet needs aimet-onnx, which is not installed"):
        calibrate_unit(graph, part_units(units, unit.part), unit.label, tmp_path / "u.json", tmp_path / "u.npy",
                       tokens_path=corpus_tokens(root, checkpoint), **kwargs)
    short = tmp_path / "short.npy"
    np.save(short, np.arange(AR, dtype=np.int32))
    with pytest.raises(GenieBuildError, match="are needed"):   # too few calibration tokens are found first
        calibrate_unit(graph, part_units(units, unit.part), unit.label, tmp_path / "u.json", tmp_path / "u.npy",
                       tokens_path=short, **kwargs)
    assert not list(tmp_path.glob("u.*"))
