"""Host run of a bundle whose parts hold their graphs at several context lengths: each step runs on the graph Genie's
KV manager picks (up a length one step before the cache fills one, back down when a smaller one holds it again), the
cache carried over on a switch, and the tokens are those of the same model compiled at the largest length alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bundle_helpers import TINY_DEMO, VARIANT, ReferenceBuild
from demo_shapes import demo_shape
from genie_build.cli import main
from genie_build.conventions import graph_name, part_encodings_path, part_graph_path, part_label
from genie_build.demo.demo import generate_demo
from genie_build.errors import GenieBuildError
from genie_build.run.genie_runtime import Step, genie_steps
from genie_build.run.run_bundle import (GraphRun, generate, host_run, load_bundle, make_runner, run_bundle,
                                        unsplit_tokens)
from genie_build.toolchains.reference.container import read_graphs

LENGTHS = (TINY_DEMO["context"], 2 * TINY_DEMO["context"])
AR = TINY_DEMO["ar"]
NUM_PARTS = 3
PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman and his wife"


def _cli(*args: object) -> None:
    assert main([str(arg) for arg in args]) == 0, f"genie-build {args[0]} failed"


def _converted_graphs(root: Path, cl: int, encodings: Path, plan: Path) -> dict[int, list[str]]:
    """The demo at context length ``cl`` (the same weights at every length), split by ``plan`` and converted with
    ``encodings`` (one calibration for every length, so that the lengths differ in CL only): ``--graph`` arguments
    of each part."""
    source = root / f"cl{cl}"
    generate_demo(demo_shape(TINY_DEMO, context=cl), source)
    graphs: dict[int, list[str]] = {index: [] for index in range(1, NUM_PARTS + 1)}
    parts, sliced = source / "parts", source / "encodings"
    _cli("split", "--plan", plan, "--graph", *(f"{kind}={source / f'{kind}.onnx'}" for kind in ("prompt", "token")),
         "--parts-dir", parts)
    for kind, ar in (("prompt", AR), ("token", 1)):
        _cli("slice-graph-encodings", "--graph", kind, "--model", source / f"{kind}.onnx",
             "--encodings", encodings.with_name(f"{kind}.encodings.json"), "--parts-dir", parts, "--out-dir", sliced)
        for index in graphs:
            label, name = part_label(index, NUM_PARTS), graph_name(kind, ar, cl, index, NUM_PARTS)
            converted = source / "converted" / kind / f"part_{label}.onnx"
            _cli("convert", "--toolchain", "reference", "--onnx", part_graph_path(parts, label, kind),
                 "--encodings", part_encodings_path(sliced, label, kind), "--graph-name", name,
                 "--float-bitwidth", VARIANT["float_bitwidth"], "--out", converted)
            graphs[index] += ["--graph", f"{name}={converted}"]
    return graphs


def _bundle(root: Path, name: str, graphs: dict[int, list[str]], build: ReferenceBuild, hf_config: Path) -> Path:
    binaries = []
    for index, arguments in graphs.items():
        binaries.append(root / name / f"part_{part_label(index, NUM_PARTS)}.bin")
        _cli("compile", "--toolchain", "reference", *arguments, "--variant-json", json.dumps(VARIANT),
             "--chipset", "SM8750", "--out", binaries[-1])
    _cli("bundle", "--binaries", *binaries, "--toolchain", "reference", "--model-name", "demo",
         "--hf-config", hf_config, "--tokenizer", build.source / "tokenizer.json", "--chipset", "SM8750",
         "--out-dir", root / name / "genie_bundle")
    return root / name / "genie_bundle"


@pytest.fixture(scope="module")
def bundles(build: ReferenceBuild, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``lengths``: every part's ctx-bin holds the prompt and token graphs at CL 64 and 128; ``largest``: the same
    model compiled at CL 128 alone."""
    root = tmp_path_factory.mktemp("lengths")
    top = root / f"cl{LENGTHS[-1]}"
    generate_demo(demo_shape(TINY_DEMO, context=LENGTHS[-1]), top)
    encodings = root / "encodings" / "prompt.encodings.json"
    _cli("calibrate", "--model-dir", top, "--out-prompt", encodings, "--out-token",
         encodings.with_name("token.encodings.json"), "--num-samples", 1)
    _cli("plan", "--prompt", top / "prompt.onnx", "--token", top / "token.onnx", "--encodings-prompt", encodings,
         "--num-parts", NUM_PARTS, "--out", root / "plan.json")
    converted = {cl: _converted_graphs(root, cl, encodings, root / "plan.json") for cl in LENGTHS}
    together = {index: [item for cl in LENGTHS for item in converted[cl][index]] for index in range(1, NUM_PARTS + 1)}
    hf_config = top / "config.json"
    return {"lengths": _bundle(root, "lengths", together, build, hf_config),
            "largest": _bundle(root, "largest", converted[LENGTHS[-1]], build, hf_config),
            "unsplit": _unsplit(top, encodings.parent, root / "unsplit")}


def _unsplit(source: Path, encodings: Path, out: Path) -> Path:
    """The whole model at the largest length only, converted with the whole encodings, as one container."""
    graphs = []
    for kind, ar in (("prompt", AR), ("token", 1)):
        name, converted = f"{kind}_ar{ar}_cl{LENGTHS[-1]}", out / f"{kind}.onnx"
        _cli("convert", "--toolchain", "reference", "--onnx", source / f"{kind}.onnx",
             "--encodings", encodings / f"{kind}.encodings.json", "--graph-name", name,
             "--float-bitwidth", VARIANT["float_bitwidth"], "--out", converted)
        graphs += ["--graph", f"{name}={converted}"]
    _cli("compile", "--toolchain", "reference", *graphs, "--variant-json", json.dumps(VARIANT),
         "--chipset", "SM8750", "--out", out / "model.bin")
    return out / "model.bin"


def test_every_part_offers_both_lengths(bundles: dict[str, Path]) -> None:
    loaded = load_bundle(bundles["lengths"])
    expected = {(ar, cl) for ar in (1, AR) for cl in LENGTHS}
    assert all(set(part) == expected for part in loaded.runner.graphs)
    assert loaded.runner.context_length == loaded.context_size == LENGTHS[-1]


def test_a_long_generation_moves_up_a_length_one_step_early_and_gives_the_largest_lengths_tokens(
        bundles: dict[str, Path]) -> None:
    loaded = load_bundle(bundles["lengths"])
    prompt_ids = loaded.query_ids(PROMPT)
    assert 2 * AR < len(prompt_ids) < LENGTHS[0] - AR and len(prompt_ids) % AR  # chunks, the last padded, in CL 64
    new = LENGTHS[0] + AR - len(prompt_ids)  # the generation goes past CL 64
    result = run_bundle(bundles["lengths"], PROMPT, new)
    assert list(result.prompt_ids) == prompt_ids
    # AR 1 at CL 64 holds the tokens until the cache holds 63 (Genie keeps one slot free), the rest run at CL 128
    assert result.graph_runs == (GraphRun(AR, LENGTHS[0], -(-len(prompt_ids) // AR)),
                                 GraphRun(1, LENGTHS[0], LENGTHS[0] - 1 - len(prompt_ids)),
                                 GraphRun(1, LENGTHS[1], len(prompt_ids) + new - LENGTHS[0]))
    assert list(result.new_ids) == generate(load_bundle(bundles["largest"]).runner, prompt_ids, new)
    assert host_run(bundles["lengths"], PROMPT, new).to_dict()["graph_runs"] == [
        {"ar": run.ar, "cl": run.cl, "steps": run.steps} for run in result.graph_runs]


def test_a_prompt_that_moves_up_a_length_comes_back_down_for_the_tokens(bundles: dict[str, Path]) -> None:
    """Genie moves its last chunk up to CL 128 (the cache after it might not leave room for another chunk at CL 64),
    then runs the first tokens back at CL 64, which still holds the cache."""
    loaded = load_bundle(bundles["lengths"])
    words = (PROMPT.split() * 8)
    prompt = " ".join(words[:next(count for count in range(len(words))
                                  if len(loaded.query_ids(" ".join(words[:count]))) > LENGTHS[0] - AR)])
    prompt_ids = loaded.query_ids(prompt)
    assert LENGTHS[0] - AR < len(prompt_ids) <= LENGTHS[0] - 4  # a chunk at cache 56, three tokens at CL 64
    result = run_bundle(bundles["lengths"], prompt, 4)
    assert result.graph_runs == (GraphRun(AR, LENGTHS[0], LENGTHS[0] // AR - 1), GraphRun(AR, LENGTHS[1], 1),
                                 GraphRun(1, LENGTHS[0], 3))
    assert list(result.new_ids) == generate(load_bundle(bundles["largest"]).runner, prompt_ids, 4)


def test_a_short_generation_stays_on_the_smallest_length(bundles: dict[str, Path]) -> None:
    prompt = "Once upon a time"
    result = run_bundle(bundles["lengths"], prompt, 6)
    assert result.graph_runs == (GraphRun(AR, LENGTHS[0], -(-len(result.prompt_ids) // AR)),
                                 GraphRun(1, LENGTHS[0], 5))
    assert list(result.new_ids) == generate(load_bundle(bundles["largest"]).runner, result.prompt_ids, 6)


def test_the_unsplit_reference_may_hold_only_the_largest_length(bundles: dict[str, Path]) -> None:
    prompt_ids = load_bundle(bundles["lengths"]).query_ids(PROMPT)
    new = LENGTHS[0] + AR - len(prompt_ids)
    assert unsplit_tokens(bundles["lengths"], bundles["unsplit"], prompt_ids, new) == \
        generate(load_bundle(bundles["lengths"]).runner, prompt_ids, new)
    result = host_run(bundles["lengths"], PROMPT, new, compare_with=bundles["unsplit"])
    assert result.reference_ids == result.generation.new_ids
    assert [run.cl for run in result.generation.graph_runs][-1] == LENGTHS[1]


def test_parts_offering_different_lengths_are_refused(bundles: dict[str, Path]) -> None:
    config = json.loads((bundles["lengths"] / "genie_config.json").read_text())
    names = config["dialog"]["engine"]["model"]["binary"]["ctx-bins"]
    parts = [read_graphs(bundles["lengths"] / name) for name in names]
    parts[1] = {name: graph for name, graph in parts[1].items() if f"_cl{LENGTHS[0]}_" not in name}
    both, largest = ([(ar, cl) for ar in (1, AR) for cl in lengths] for lengths in (LENGTHS, LENGTHS[1:]))
    with pytest.raises(GenieBuildError) as error:
        make_runner(parts, head_dim=8, rope_theta=10000.0)
    assert str(error.value) == (f"bundle: parts offer different graphs (AR, CL): part 1 {sorted(both)}, "
                                f"part 2 {sorted(largest)}")


def test_a_part_with_two_graphs_of_one_ar_and_cl_is_refused(bundles: dict[str, Path]) -> None:
    config = json.loads((bundles["lengths"] / "genie_config.json").read_text())
    ctx_bin = bundles["lengths"] / config["dialog"]["engine"]["model"]["binary"]["ctx-bins"][1]
    twin = read_graphs(ctx_bin)[graph_name("token", 1, LENGTHS[0], 2, NUM_PARTS)]
    with pytest.raises(GenieBuildError, match=rf"^twin: part 1 has two graphs with AR 1 and CL {LENGTHS[0]}$"):
        make_runner([{**read_graphs(ctx_bin), "twin": twin}], head_dim=8, rope_theta=10000.0)


OFFERED = {(ar, cl) for ar in (1, 32) for cl in (128, 256)}


@pytest.mark.parametrize(("valid", "count", "expected"), [
    (0, 15, [Step(32, 128, 15)]),                       # the start: the smallest CL, the narrowest AR taking all
    (0, 1, [Step(1, 128, 1)]),                          # one token: the token graph
    (0, 100, [Step(32, 128, 32)] * 3 + [Step(32, 256, 4)]),  # the fourth chunk might not leave room at CL 128
    (126, 1, [Step(1, 128, 1)]),
    (127, 1, [Step(1, 256, 1)]),                        # one slot kept free: Genie moves up a step early
    (100, 1, [Step(1, 128, 1)]),                        # back down once the smaller length holds the cache
    (128, 1, [Step(1, 256, 1)]),
    (255, 1, [Step(1, 256, 1)]),                        # the largest length is filled to the last slot
    (96, 32, [Step(32, 256, 32)]),                      # 96 + 32 fits 128, but Genie moves up first
    (10, 40, [Step(32, 128, 32), Step(32, 128, 8)]),    # no AR takes 40 at once: the widest, twice
])
def test_the_steps_genie_picks(valid: int, count: int, expected: list[Step]) -> None:
    assert genie_steps(OFFERED, valid, count) == expected


def test_the_steps_take_each_lengths_own_ars() -> None:
    offered = {(1, 128), (16, 128), (1, 256), (64, 256)}
    assert genie_steps(offered, 0, 10) == [Step(16, 128, 10)]
    assert genie_steps(offered, 120, 5) == [Step(64, 256, 5)]
    assert genie_steps(offered, 120, 1) == [Step(1, 128, 1)]


def test_a_step_no_length_holds_is_refused() -> None:
    with pytest.raises(GenieBuildError, match=r"^prompt: 1 tokens after 256 exceed the largest context length 256$"):
        genie_steps({(1, 128), (1, 256)}, 256, 1)
    with pytest.raises(GenieBuildError, match=r"^prompt: the cache's 240 entries do not fit the 224 past slots"):
        genie_steps(OFFERED, 240, 5)
