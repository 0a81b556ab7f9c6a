"""The load model: page rounding and alignment, placement into sessions on hand-made sizes, the field report's two
observations from the estimate and the parameter ranges docs/memory-plan.md states, split auto, the remedies."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from genie_build import cli
from genie_build.chipsets import HTP_CONTEXT_BYTES, HTP_LOAD, CHIPSETS, LoadParams, load_params
from genie_build.errors import GenieBuildError
from genie_build.plan.auto_split import auto_plan, io_dims_from_graph, io_dims_from_hf_config
from genie_build.plan.load_model import (ASSUMPTIONS, PAGE, Buffer, ContextLoad, alignment_of, estimated_contexts,
                                         page_round, place_contexts)
from genie_build.plan.precision import read_precision
from genie_build.plan.shape_plan import plan_checkpoint
from genie_build.sizes.estimate import estimate
from genie_build.sizes.memory_plan import measured_contexts
from genie_build.sizes.sizes import AccountRecord, GraphCount
from genie_build.toolchains.base import AppliedOptions

MIB = 1024 ** 2
REPO = Path(__file__).resolve().parents[1]
QWEN_7B = REPO / "config" / "hf" / "qwen2_5_7b_instruct.json"
# small hand-made sessions: 64 MiB usable, budget 60 MiB, two of them
SMALL = LoadParams(usable_bytes=64 * MIB, sessions=2, budget_bytes=60 * MIB, alignment="power_of_two", source="test")


def weights(part: int, mib: float) -> ContextLoad:
    return ContextLoad(part, (Buffer("shared weights", int(mib * MIB), "measured"),))


def placed(plan) -> list[tuple[int, int | None, int | None, bool]]:
    """(part, session, weights offset in MiB, maps) per context."""
    return [(c.part, c.session, None if c.weights is None else c.weights.offset // MIB, c.maps) for c in plan.contexts]


@pytest.mark.parametrize("size_mib, boundary_mib", [(1, 2), (2, 2), (3, 4), (334.15, 256), (336, 256), (512, 512),
                                                     (522, 512), (1023, 1024), (1025, 1024), (2045, 1024)])
def test_a_mapping_is_placed_on_the_largest_power_of_two_not_above_its_pages(size_mib, boundary_mib):
    assert alignment_of(page_round(int(size_mib * MIB)), "power_of_two") == boundary_mib * MIB
    assert alignment_of(page_round(int(size_mib * MIB)), "page") == PAGE


def test_the_field_reports_failing_mapping_is_336_mib_of_pages():
    assert page_round(int(334.15 * MIB)) == 352_321_536


def test_contexts_that_fill_a_session_exactly_map():
    """16 + 16 + 32 MiB end exactly at the 64 MiB usable: all map in session 0."""
    plan = place_contexts([weights(1, 16), weights(2, 16), weights(3, 32)],
                          dataclasses.replace(SMALL, budget_bytes=64 * MIB))
    assert placed(plan) == [(1, 0, 0, True), (2, 0, 16, True), (3, 0, 32, True)]
    assert plan.maps and plan.sessions_used == 1


def test_one_page_more_than_a_session_holds_does_not_map_where_the_budget_keeps_it():
    """The third context's 34 MiB go on a 32 MiB boundary: no hole below 64 MiB, and the loader stays (budget)."""
    plan = place_contexts([weights(1, 16), weights(2, 16), weights(3, 34)],
                          dataclasses.replace(SMALL, budget_bytes=100 * MIB))
    assert placed(plan) == [(1, 0, 0, True), (2, 0, 16, True), (3, 0, None, False)]
    assert "no 32 MiB-aligned hole of 34 MiB for its shared weights below 64 MiB in session 0" in plan.failing[0].reason


def test_the_loader_moves_to_the_next_session_when_the_budget_is_spent():
    plan = place_contexts([weights(1, 30), weights(2, 30), weights(3, 30)], SMALL)  # 60 MiB is at the budget
    assert placed(plan) == [(1, 0, 0, True), (2, 0, 32, True), (3, 1, 0, True)]
    assert plan.sessions_used == 2


def test_alignment_leaves_holes_that_smaller_mappings_fill():
    """8 MiB on a 4 MiB boundary leaves nothing; a 20 MiB on 16 MiB after it starts at 16; 2 MiB of IO fill 8-10."""
    context = ContextLoad(2, (Buffer("shared weights", 20 * MIB, "measured"), Buffer("IO", 2 * MIB, "measured")))
    plan = place_contexts([weights(1, 8), context], SMALL)
    assert [(p.buffer.kind, p.offset // MIB) for p in plan.contexts[1].placed] == [("shared weights", 16), ("IO", 8)]


def test_a_context_larger_than_a_session_is_refused_in_one_line():
    plan = place_contexts([weights(1, 10), weights(2, 65)], SMALL)
    refused = plan.contexts[1]
    assert not refused.maps and refused.session is None
    assert "\n" not in refused.reason
    assert refused.reason == ("needs 66 MiB mapped, more than the 64 MiB usable in one session; a context cannot "
                              "span sessions: split it")


def test_no_session_left():
    plan = place_contexts([weights(part, 40) for part in (1, 2, 3)], SMALL)
    assert [c.maps for c in plan.contexts] == [True, True, False]
    assert plan.failing[0].reason.startswith("no session left: all 2 sessions'")


def test_a_failed_context_charges_nothing():
    """Part 2 does not fit session 0's holes; part 3 is still charged against the same budget as if 2 never was."""
    plan = place_contexts([weights(1, 40), weights(2, 40), weights(3, 10)],
                          dataclasses.replace(SMALL, sessions=1, budget_bytes=200 * MIB))
    assert [c.maps for c in plan.contexts] == [True, False, True]


def test_measured_contexts_read_the_records_weights_and_io():
    record = AccountRecord(1, "packed", "reference", 100 * MIB, 90 * MIB, {}, AppliedOptions(),
                           graphs=(GraphCount("prompt", 5, 5, io_bytes=10 * MIB, kv_bytes=6 * MIB),
                                   GraphCount("token", 5, 5, io_bytes=8 * MIB, kv_bytes=7 * MIB)))
    unknown = AccountRecord(2, "packed", "qnn-cli", 50 * MIB, 0, {}, AppliedOptions())
    first, second = measured_contexts([unknown, record])
    assert [(b.kind, b.bytes // MIB, b.basis) for b in first.buffers] == [
        ("shared weights", 90, "measured"), ("KV cache", 7, "measured"), ("IO", 5, "measured"),
        ("spill-fill", 0, "not known"), ("op data", 0, "not known")]
    assert second.buffers[0] == Buffer("shared weights (file size)", 50 * MIB, "measured")
    assert second.buffers[1].basis == "not known"


def test_every_assumption_has_a_source_and_a_mark():
    assert {a.mark for a in ASSUMPTIONS} == {"documented", "measured by a third party", "inferred"}
    assert all(a.source and a.text for a in ASSUMPTIONS)
    assert all(chip.load.source for chip in CHIPSETS.values())


def test_report_load_overrides_the_chipsets_parameters():
    params = load_params("sm8750", {"usable_mb": 100, "sessions": None, "alignment": "page"})
    assert (params.usable_bytes, params.sessions, params.alignment) == (100 * MIB, HTP_LOAD.sessions, "page")
    with pytest.raises(GenieBuildError, match="unknown key 'usable'"):
        load_params("SM8750", {"usable": 1})
    with pytest.raises(GenieBuildError, match="sessions is 0; expected a positive number"):
        load_params("SM8750", {"sessions": 0})


# ------------------------------------------------------------------------------------------- the field report

def _qwen_contexts(num_parts: int):
    precision = read_precision(REPO / "config" / "qwen2_5_7b_11parts.yaml")
    from genie_build.plan.weight_inventory import weights_from_hf_config

    result = estimate(weights_from_hf_config(QWEN_7B), precision, num_parts=num_parts)
    dims = io_dims_from_hf_config(QWEN_7B, precision.activations, 128, 4096)
    return estimated_contexts(result.plan.parts, [p.weight_bytes for p in result.parts if p.variant == "packed"],
                              dims)


@pytest.fixture(scope="module")
def qwen():
    return {num_parts: _qwen_contexts(num_parts) for num_parts in (11, 6)}


def observations(qwen, params: LoadParams) -> tuple[bool, bool]:
    """(the 11-part plan maps contexts 1-7 and not 8-10, the 6-part plan maps all)."""
    eleven = [c.maps for c in place_contexts(qwen[11], params).contexts]
    return all(eleven[:7]) and not any(eleven[7:10]), place_contexts(qwen[6], params).maps


def test_the_chosen_parameters_reproduce_both_observations(qwen):
    eleven = place_contexts(qwen[11], HTP_LOAD)
    assert [c.part for c in eleven.failing] == [8, 9, 10]
    assert [c.session for c in eleven.contexts] == [0] * 10 + [1]
    assert place_contexts(qwen[6], HTP_LOAD).maps


@pytest.mark.parametrize("field, low, high", [("budget_bytes", 3032, 3569), ("usable_bytes", 3742, 4175)])
def test_the_ranges_docs_state_are_where_both_observations_hold(qwen, field, low, high):
    """docs/memory-plan.md, "What the two observations bound": inside the range both hold, a MiB outside not."""
    def holds(mib: int) -> bool:
        return observations(qwen, dataclasses.replace(HTP_LOAD, **{field: mib * MIB})) == (True, True)

    assert holds(low) and holds(high) and holds((low + high) // 2)
    assert not holds(low - 1) and not holds(high + 1)


def test_one_session_or_page_alignment_cannot_explain_the_report(qwen):
    assert observations(qwen, dataclasses.replace(HTP_LOAD, sessions=1)) == (True, False)
    assert observations(qwen, dataclasses.replace(HTP_LOAD, alignment="page")) == (False, True)


def test_the_estimated_io_of_the_six_part_bundle_is_near_what_genie_allocated(qwen):
    """The field report's 6-part run: "Allocated total size = 162038272 across 12 buffers"."""
    io = sum(b.bytes for c in qwen[6] for b in c.buffers if b.kind in ("KV cache", "IO"))
    assert sum(1 for c in qwen[6] for b in c.buffers if b.kind in ("KV cache", "IO")) == 12
    assert io == pytest.approx(162_038_272, rel=0.10)


# ------------------------------------------------------------------------------------------- auto

def test_auto_on_qwen_7b_picks_the_fewest_parts_that_map_under_3_gib():
    from genie_build.plan.shape_plan import plan_from_hf_config

    plan = plan_from_hf_config(QWEN_7B, recipe="w4a16", ar=128, context=4096, num_parts="auto")
    assert plan.num_parts == 3
    two = plan_from_hf_config(QWEN_7B, recipe="w4a16", ar=128, context=4096, num_parts=2)
    assert max(part.estimated_bytes for part in two.parts) > HTP_CONTEXT_BYTES
    bounded = plan_from_hf_config(QWEN_7B, recipe="w4a16", ar=128, context=4096, num_parts="auto",
                                  max_part_bytes=1100 * MIB)
    fewest = plan_from_hf_config(QWEN_7B, recipe="w4a16", ar=128, context=4096, max_part_bytes=1100 * MIB)
    assert bounded.num_parts == fewest.num_parts > 3
    assert max(part.estimated_bytes for part in bounded.parts) <= 1100 * MIB


@pytest.mark.parametrize("given_mb, parts, bound", [(24_000, 9, "the build box"), (25_276, 6, "the build box"),
                                                     (64_000, 3, "the device")])
def test_auto_on_qwen_7b_keeps_every_part_job_within_a_third_of_the_run_memory(given_mb, parts, bound):
    """On a 24 GB box (as --resources mem_mb, or its 25,276 MB as the machine's) no job holding a part takes more
    than a third of it: the build box, not the device, chose the count; on 64 GB the device's 3 parts fit."""
    from genie_build.job_memory import RunMemory
    from genie_build.plan.auto_split import part_jobs
    from genie_build.plan.shape_plan import piece_floats, plan_from_hf_config

    memory = RunMemory(given_mb, "the run is given")
    plan = plan_from_hf_config(QWEN_7B, recipe="w4a16", ar=128, context=4096, num_parts="auto", memory=memory)
    jobs = part_jobs(piece_floats(QWEN_7B), memory, evaluate=False)
    assert plan.num_parts == parts
    assert max(map(jobs.part_mb, plan.parts)) <= given_mb // 3
    assert f"{bound} chose the count" in plan.chosen_by
    if bound == "the build box":   # the device's own choice would have held a job above the limit
        device = plan_from_hf_config(QWEN_7B, recipe="w4a16", ar=128, context=4096, num_parts="auto")
        assert max(map(jobs.part_mb, device.parts)) > given_mb // 3
    evaluated = part_jobs(piece_floats(QWEN_7B), memory, evaluate=True)
    assert all(evaluated.part_mb(part) >= jobs.part_mb(part) for part in plan.parts)


LENGTHS = [512, 1024, 2048, 4096]


def test_auto_weighs_the_htp_compile_of_every_graph_a_binary_holds():
    """The HTP backend holds every graph of a binary until it writes it: on 64 GB, Qwen2.5-7B at one length takes
    the device's 3 parts with qnn-htp too, at four lengths (8 graphs a binary) more parts, each compile within a
    third; the plan says the compile chose; the reference toolchain alone changes nothing; the table (lut) is not
    compiled."""
    from genie_build.job_memory import RunMemory, compile_mb
    from genie_build.plan.auto_split import binary_compile, part_jobs
    from genie_build.plan.shape_plan import piece_floats, plan_from_hf_config

    memory = RunMemory(64_000, "the run is given")

    def plan(context, toolchains):
        return plan_from_hf_config(QWEN_7B, recipe="w4a16", ar=128, context=context, num_parts="auto",
                                   memory=memory, embedding="lut", toolchains=toolchains)

    assert plan([4096], ["qnn-htp"]).num_parts == plan([4096], []).num_parts == 3
    assert plan(LENGTHS, ["reference"]).num_parts == 3
    four = plan(LENGTHS, ["reference", "qnn-htp"])
    assert four.num_parts > 3 and "the build box chose the count" in four.chosen_by
    assert re.search(r"part 3_of_3's compile would take [\d,]+ MB", four.chosen_by)
    jobs = part_jobs(piece_floats(QWEN_7B), memory, False, binary_compile(["qnn-htp"], LENGTHS), "lut")
    assert "compile" not in jobs.jobs_of(four.parts[0])      # the table, read by Genie on the CPU
    for part in four.parts[1:]:
        assert jobs.jobs_of(part)["compile"] == compile_mb(part.estimated_bytes / 1e6, graphs=8, toolchain="qnn-htp")
        assert jobs.part_mb(part) <= memory.job_limit_mb


def test_auto_lets_only_a_part_cut_no_further_take_more_than_a_third_and_runs_it_alone():
    """On 24 GB at four lengths the compile of the part holding the LM head (the last layer and the head, a block no
    split makes smaller) takes more than a third at any count: auto cuts every other part until its jobs fit a third,
    lets that compile take what the run is given (Snakemake runs it alone), and says so; given less than that compile
    takes, one line naming it and what helps."""
    from genie_build.job_memory import RunMemory
    from genie_build.plan.auto_split import binary_compile, part_jobs
    from genie_build.plan.shape_plan import piece_floats, plan_from_hf_config

    memory = RunMemory(24_000, "the run is given")
    plan = plan_from_hf_config(QWEN_7B, recipe="w4a16", ar=128, context=LENGTHS, num_parts="auto", memory=memory,
                               embedding="lut", toolchains=["qnn-htp"])
    jobs = part_jobs(piece_floats(QWEN_7B), memory, False, binary_compile(["qnn-htp"], LENGTHS), "lut")
    last = plan.parts[-1]
    assert last.pieces == ("layer_27", "head") and 8_000 < jobs.part_mb(last) <= 24_000
    assert all(jobs.part_mb(part) <= 8_000 for part in plan.parts[:-1])
    assert jobs.alone(plan) == [last]
    assert (f"part {last.label}'s compile ({jobs.part_mb(last):,} MB) takes more, as no split makes its part "
            "smaller: Snakemake runs it alone within the 24,000 MB") in plan.chosen_by
    fewer = plan_from_hf_config(QWEN_7B, recipe="w4a16", ar=128, context=LENGTHS, num_parts=plan.num_parts - 1)
    assert not jobs.fits(fewer)   # the fewest: one part fewer holds two layers somewhere, above a third

    with pytest.raises(GenieBuildError) as error:
        plan_from_hf_config(QWEN_7B, recipe="w4a16", ar=128, context=LENGTHS, num_parts="auto",
                            memory=RunMemory(16_000, "the run is given"), embedding="lut", toolchains=["qnn-htp"])
    message = str(error.value)
    assert "\n" not in message and message.startswith("split.num_parts: auto: 3 parts map on the device")
    assert re.search(r"part \d+_of_\d+'s compile, [\d,]+ MB, at \d+: more than all 16,000 MB the run is given, as "
                     r"its part is cut no further", message)
    assert "fewer context lengths (export.context" in message and "--resources mem_mb" in message


def small_config(tmp_path: Path, model_type: str) -> Path:
    """A checkpoint's config.json (the plan reads nothing else): Qwen2.5-7B's keys at a toy size."""
    config = {**json.loads(QWEN_7B.read_text()), "model_type": model_type, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}
    path = tmp_path / "ckpt" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    return path


def test_auto_refuses_when_no_part_count_maps_naming_a_part_too_large_alone(tmp_path):
    """The embedding alone needs more than the session: no count, nor a fixed one, holds it, and the message says so
    (not "give num_parts")."""
    config = small_config(tmp_path, "qwen2")
    tiny = LoadParams(usable_bytes=2 * MIB, sessions=1, budget_bytes=2 * MIB, alignment="page", source="test")
    with pytest.raises(GenieBuildError, match=r"^split\.num_parts: auto: part 1 of the 3-part split holds embedding "
                                              r"alone, whose context needs \d+ MiB, more than the 2 MiB of an HTP "
                                              r"session: no part count holds it, and a fixed num_parts would build a "
                                              r"part that does not map"):
        plan_checkpoint(config, {"num_parts": "auto"}, recipe="w4a16", ar=8, context=64, unit_memory_mb=2000,
                        load=tiny)


def test_auto_refuses_when_the_parts_do_not_map_together_naming_those_that_do_not():
    """Every part maps alone, but one 40 MiB session holds only some: the split into the most parts names the rest."""
    from genie_build.plan.plan_file import Piece

    pieces = [Piece("embedding", "embedding", 4 * MIB, output_boundary="b0"),
              *(Piece(f"layer_{i}", "layer", 8 * MIB, layer=i, output_boundary=f"b{i + 1}") for i in range(8)),
              Piece("head", "head", 4 * MIB)]
    params = LoadParams(usable_bytes=40 * MIB, sessions=1, budget_bytes=40 * MIB, alignment="page", source="test")
    with pytest.raises(GenieBuildError, match=r"auto: no part count maps in 1 session of 40 MiB under the load model: "
                                              r"at 9 parts, the most this model is cut into, \d+ of 9 contexts do "
                                              r"not \(parts [\d, ]+\); a fixed num_parts would build contexts"):
        auto_plan(pieces, True, io_dims_from_hf_config(QWEN_7B, 16, 1, 2), params)


def test_auto_on_a_checkpoint_is_the_plan_of_the_count_it_names(tmp_path):
    config = small_config(tmp_path, "llama")
    auto, _ = plan_checkpoint(config, {"num_parts": "auto"}, recipe="w4a16", ar=8, context=64, unit_memory_mb=2000)
    fixed, _ = plan_checkpoint(config, {"num_parts": auto.num_parts}, recipe="w4a16", ar=8, context=64,
                               unit_memory_mb=2000)
    assert auto.num_parts == 2 and auto.parts == fixed.parts


def test_auto_plan_takes_one_more_part_when_a_session_is_too_small_for_fewer():
    """4 layers on two 40 MiB sessions: 2 parts do not map (the layers' 32 MiB sit on a 32 MiB boundary), 3 do."""
    from genie_build.plan.plan_file import Piece

    pieces = [Piece("embedding", "embedding", 4 * MIB, output_boundary="b0"),
              *(Piece(f"layer_{i}", "layer", 8 * MIB, layer=i, output_boundary=f"b{i + 1}") for i in range(4)),
              Piece("head", "head", 4 * MIB)]
    dims = io_dims_from_hf_config(QWEN_7B, 16, 1, 2)  # IO of a few KiB: weights decide
    params = LoadParams(usable_bytes=40 * MIB, sessions=2, budget_bytes=40 * MIB, alignment="power_of_two",
                        source="test")
    plan = auto_plan(pieces, True, dims, params)
    contexts = estimated_contexts(plan.parts, [p.estimated_bytes for p in plan.parts], dims)
    assert place_contexts(contexts, params).maps
    for fewer in range(2, plan.num_parts):
        from genie_build.plan.planners import plan_by_num_parts
        smaller = plan_by_num_parts(pieces, fewer, True)
        assert not place_contexts(estimated_contexts(smaller.parts, [p.estimated_bytes for p in smaller.parts], dims),
                                  params).maps


def test_auto_with_the_embedding_as_a_table_places_the_parts_after_it_only():
    """bundle.embedding: lut takes part 1 off the HTP: a 20 MiB embedding that leaves no part count mapping in two
    40 MiB sessions as a context maps as a table, with the layers in 2 contexts (3 parts)."""
    from genie_build.plan.plan_file import Piece

    pieces = [Piece("embedding", "embedding", 20 * MIB, output_boundary="b0"),
              *(Piece(f"layer_{i}", "layer", 8 * MIB, layer=i, output_boundary=f"b{i + 1}") for i in range(4)),
              Piece("head", "head", 4 * MIB)]
    dims = io_dims_from_hf_config(QWEN_7B, 16, 1, 2)  # IO of a few KiB: weights decide
    params = LoadParams(usable_bytes=40 * MIB, sessions=2, budget_bytes=40 * MIB, alignment="power_of_two",
                        source="test")
    with pytest.raises(GenieBuildError, match="auto: no part count"):
        auto_plan(pieces, True, dims, params)
    plan = auto_plan(pieces, True, dims, params, embedding="lut")
    held = plan.parts[1:]
    assert plan.num_parts == 3 and place_contexts(
        estimated_contexts(held, [p.estimated_bytes for p in held], dims), params).maps


def test_auto_on_whole_graphs_counts_the_io_of_every_context_length_beside_them(small_demo):
    """Graphs given whole (the demo's, a user's) at several lengths: each part's binary maps every length's IO, as a
    checkpoint's estimate counts it (io_dims_from_hf_config with several lengths)."""
    from demo_shapes import SMALL
    from genie_build.onnx_graph import load_graph
    from genie_build.plan.planners import plan_by_num_parts

    path = small_demo / "prompt.onnx"
    alone = io_dims_from_graph(load_graph(path), 16, path)
    both = io_dims_from_graph(load_graph(path), 16, path, [SMALL.context // 4])
    assert (alone.context_lengths, both.context_lengths) == ((SMALL.context,), (SMALL.context // 4, SMALL.context))
    from genie_build.plan.plan_file import Piece

    pieces = [Piece("embedding", "embedding", MIB, output_boundary="b0"),
              *(Piece(f"layer_{i}", "layer", MIB, layer=i, output_boundary=f"b{i + 1}") for i in range(SMALL.layers)),
              Piece("head", "head", MIB)]
    plan = plan_by_num_parts(pieces, 3, True)
    io = {name: sum(b.bytes for c in estimated_contexts(plan.parts, [MIB] * 3, dims) for b in c.buffers
                    if b.kind in ("IO", "KV cache"))
          for name, dims in (("alone", alone), ("both", both))}
    assert io["both"] > io["alone"]


# ------------------------------------------------------------------------------------------- the commands

def _record(tmp_path: Path, part: int, mib: int) -> str:
    path = tmp_path / f"part_{part}.json"
    path.write_text(json.dumps({"part": part, "variant": "packed", "toolchain": "reference", "bytes": mib * MIB,
                                "weight_bytes": mib * MIB, "requested": {}, "applied": {}}))
    return str(path)


def _memory_plan(tmp_path: Path, *extra: str) -> int:
    records = [_record(tmp_path, part, mib) for part, mib in ((1, 30), (2, 30), (3, 30))]
    return cli.main(["memory-plan", "--records", *records, "--variant", "packed", "--json",
                     str(tmp_path / "m.json"), "--md", str(tmp_path / "m.md"), "--png", str(tmp_path / "m.png"),
                     "--load-json", json.dumps({"usable_mb": 64, "budget_mb": 60, "sessions": 1}), *extra])


def test_memory_plan_command_tables_and_draws_a_failing_context(tmp_path, caplog):
    assert _memory_plan(tmp_path) == 0
    markdown = (tmp_path / "m.md").read_text()
    assert "**1 of 3 contexts will not map** (parts 3)" in markdown
    assert "| 2 | 0 | 32 | 30 on 16 | 0 | 30 | yes | maps in session 0, ending at 62 MiB |" in markdown
    assert "| 3 | - | - | - | - | 30 | **no** | no session left" in markdown
    assert "**part count**" not in markdown and "**bundle.embedding: lut**: the embedding as the table" in markdown
    assert "not built" not in markdown
    assert "part 3 will not map: no session left" in caplog.text
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["load"]["maps"] is False and [c["maps"] for c in data["load"]["contexts"]] == [True, True, False]
    assert (tmp_path / "m.png").read_bytes().startswith(b"\x89PNG")


def test_the_table_is_named_as_a_remedy_only_of_a_plan_without_it(tmp_path):
    """bundle.embedding: lut is built: the remedy names the key (never "not built"), and a plan that has the table
    does not offer it again."""
    table = tmp_path / "embedding_table.bin"
    table.write_bytes(bytes(64 * 8 * 2))
    table.with_name(table.name + ".json").write_text(json.dumps({"n_vocab": 64, "n_embd": 8, "datatype": "ufixed16",
                                                                 "bitwidth": 16, "scale": 1e-4, "offset": 0}))
    assert _memory_plan(tmp_path, "--embedding-table", str(table)) == 0
    markdown = (tmp_path / "m.md").read_text()
    assert "will not map" in markdown and "### Remedies" in markdown
    assert "**bundle.embedding: lut**" not in markdown and "not built" not in markdown


def test_the_labels_of_six_small_contexts_are_drawn_apart(tmp_path):
    """The demo's six parts fill a few hundred KiB of a 3,840 MiB session: memory_plan.png draws their labels one
    above the other, none over another."""
    from genie_build.sizes.load_report import load_plan_figure
    from genie_build.sizes.memory_plan import MemoryLimits, plan_measured_memory

    records = []
    for part in range(1, 7):
        path = tmp_path / f"part_{part}.json"
        path.write_text(json.dumps({"part": part, "variant": "packed", "toolchain": "reference", "bytes": 300_000,
                                    "weight_bytes": 250_000, "requested": {}, "applied": {}}))
        records.append(str(path))
    plan = plan_measured_memory(records, "packed", MemoryLimits(), tmp_path / "m.json", tmp_path / "m.md",
                                tmp_path / "m.png")
    assert (tmp_path / "m.png").read_bytes().startswith(b"\x89PNG") and plan.load.maps
    figure = load_plan_figure(plan.load, "packed")
    renderer = figure.canvas.get_renderer()
    boxes = [text.get_window_extent(renderer) for text in figure.axes[0].texts if "part" in text.get_text()]
    assert len(boxes) == 6
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]


def test_memory_plan_command_with_strict_fails_on_a_context_that_will_not_map(tmp_path, capsys):
    assert _memory_plan(tmp_path, "--strict", "true") != 0
    assert "report.strict: part 3 of 'packed' will not map (no session left" in capsys.readouterr().err


def test_size_table_flags_the_parts_the_memory_plan_says_will_not_map(tmp_path, capsys):
    assert _memory_plan(tmp_path) == 0
    records = [str(tmp_path / f"part_{part}.json") for part in (1, 2, 3)]
    out = {suffix: str(tmp_path / f"t.{suffix}") for suffix in ("csv", "md", "png")}
    args = ["size-table", "--records", *records, "--baseline", "packed", "--memory-plan", str(tmp_path / "m.json"),
            "--csv", out["csv"], "--md", out["md"], "--png", out["png"]]
    assert cli.main(args) == 0
    assert "part 3, `packed`: will not map on the device (memory plan): no session left" in Path(out["md"]).read_text()
    assert cli.main([*args, "--strict", "true"]) != 0
    assert "will not map on the device" in capsys.readouterr().err


def test_accounting_counts_each_graphs_io_bytes_and_says_when_it_cannot(caplog):
    from genie_build.sizes.sizes import account_binary
    from genie_build.toolchains.base import BinaryInfo, GraphInfo, QuantInfo, TensorInfo

    kv = TensorInfo("past_key_0_in", (1, 2, 16, 56), "float32", QuantInfo("uint8", bitwidth=8))
    hidden = TensorInfo("hidden", (1, 8, 64), "float16")
    odd = TensorInfo("odd", (4,), "QNN_DATATYPE_STRING")
    info = BinaryInfo("p.bin", 10, 5, (GraphInfo("prompt", (kv, hidden), (hidden,)), GraphInfo("token", (odd,), ())),
                      "reference", "1")
    prompt, token = account_binary(info, 1, "packed", {}).graphs
    assert (prompt.io_bytes, prompt.kv_bytes) == (2 * 16 * 56 + 2 * 2 * 8 * 64, 2 * 16 * 56)
    assert (token.io_bytes, token.kv_bytes) == (0, 0)
    assert "graph token: IO tensors of unknown dtype (odd)" in caplog.text


def test_the_vendors_context_limit_is_written_in_gib_wherever_a_user_reads_it():
    """auto's limit is HTP_CONTEXT_BYTES, 3 GiB, as its messages say; the texts a user reads say so too (the
    manual's own "3 GB" only in quotes)."""
    assert HTP_CONTEXT_BYTES == 3 * 1024**3
    repo = Path(__file__).resolve().parents[1]
    for path in ("README.md", "config/config.yaml", "workflow/genie_build/schema/config.schema.yaml",
                 "docs/memory-plan.md", "workflow/genie_build/plan/auto_split.py"):
        text = (repo / path).read_text()
        assert not re.findall(r'(?<!")\b3 GB\b(?!")', text), path
