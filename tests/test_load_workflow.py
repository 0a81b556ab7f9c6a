"""The load model where a user meets it: the field report's two Qwen2.5-7B plans through the 'estimate' target, a
demo build whose plan will not map (a warning and a flag; with report.strict no bundle), and split.num_parts auto
on the demo and on a checkpoint."""

from __future__ import annotations

import pytest
import yaml

from workflow_helpers import (REFERENCE_BUILD, SMALL_DEMO, TEST_VARIANTS, copy_workflow, load_json, run_snakemake,
                              write_config)

pytestmark = pytest.mark.workflow



def load_json_yaml(path):
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def estimated(tmp_path_factory):
    workdir = copy_workflow(tmp_path_factory.mktemp("field_report"))
    for num_parts in (11, 6):
        run_snakemake(workdir, "estimate", "--configfile", f"config/qwen2_5_7b_{num_parts}parts.yaml")
    return workdir


@pytest.mark.parametrize("num_parts, failing", [(11, [8, 9, 10]), (6, [])])
def test_the_field_reports_plans_through_the_estimate_target(estimated, num_parts, failing):
    """11 parts: contexts 1-7 map, 8-10 do not (the field report's log); 6 parts of the same total: all map."""
    predicted = estimated / "results" / f"qwen2_5_7b_{num_parts}parts" / "predicted"
    load = load_json(predicted / "memory_plan.json")["load"]
    assert [context["part"] for context in load["contexts"] if not context["maps"]] == failing
    assert load["maps"] is (not failing)
    markdown = (predicted / "memory_plan.md").read_text()
    table = (predicted / "size_table.md").read_text()
    log = (estimated / "results" / f"qwen2_5_7b_{num_parts}parts" / "logs" / "estimate_sizes.log").read_text()
    for part in failing:
        assert f"| {part} | 0 | - | - | - |" in markdown
        assert f"part {part} will not map: no 256 MiB-aligned hole of 336 MiB for its shared weights" in log
        assert f"part {part}, `packed`: will not map on the device (memory plan)" in table
    if failing:
        # the remedy the model can compute: the fewest parts that map
        assert "- **part count**: 3 parts map under the same model" in markdown
    else:
        assert "will not map" not in log and "### Remedies" not in markdown
    assert (predicted / "memory_plan.png").read_bytes().startswith(b"\x89PNG")


def _demo(workdir, name: str, **sections) -> object:
    return write_config(workdir, {**SMALL_DEMO, "model": {"name": "demo"}, **sections}, name=name)


def test_a_build_whose_plan_will_not_map_warns_and_with_strict_publishes_no_bundle(tmp_path):
    """One session of 14 MiB: the demo's contexts (parts 2 and 3 of its qnn-htp bundle: part 1 is the CPU table)
    take a 2 MiB page for each buffer they map (each part's weights, KV cache, IO, spill-fill and op data as
    libQnnSystem reads them back), 8 + 8 MiB, so the second finds no session left."""
    workdir = copy_workflow(tmp_path)
    tiny = {"usable_mb": 14, "sessions": 1, "budget_mb": 14}
    out = workdir / "results" / "demo"

    strict = run_snakemake(workdir, config_file=_demo(workdir, "strict.yaml", report={"strict": True, "load": tiny}),
                           check=False)
    assert strict.returncode != 0
    assert "report.strict: part 3 of 'qnn-htp' will not map (no session left" in (out / "logs" / "memory_plan.log").read_text()
    assert not (out / "genie_bundle").exists()

    run_snakemake(workdir, config_file=_demo(workdir, "warn.yaml", report={"load": tiny}))
    log = (out / "logs" / "memory_plan.log").read_text()
    assert "WARNING" in log and "part 3 will not map: no session left" in log
    assert "part 3, `qnn-htp`: will not map on the device (memory plan)" in (out / "size_table.md").read_text()
    assert "**1 of 2 contexts will not map** (parts 3)" in (out / "memory_plan.md").read_text()
    assert (out / "genie_bundle" / "manifest.json").is_file()


def test_auto_on_the_demo_splits_into_the_fewest_parts_that_map(tmp_path):
    """The small demo's contexts are a few pages: 2 parts map, in the build's plan and the estimate's alike; on a
    device of one 8 MiB session no count does, and the plan says so in one line."""
    workdir = copy_workflow(tmp_path)
    config = _demo(workdir, "auto.yaml", split={"num_parts": "auto"})
    # targets before --configfile, which takes every path after it
    run_snakemake(workdir, "results/demo/plan.json", "estimate", "--configfile", str(config))
    assert load_json(workdir / "results" / "demo" / "plan.json")["num_parts"] == 2
    assert load_json(workdir / "results" / "demo" / "predicted" / "plan.json")["num_parts"] == 2
    assert load_json(workdir / "results" / "demo" / "predicted" / "memory_plan.json")["load"]["maps"] is True

    # the embedding in the graph: every part a context of at least 8 MiB (a 2 MiB page per buffer), so no count fits
    # them in one session of 8 MiB (with the table, 2 parts are one context, which does)
    narrow = _demo(workdir, "narrow.yaml", split={"num_parts": "auto"}, bundle={"embedding": "graph"},
                   report={"load": {"usable_mb": 8, "sessions": 1, "budget_mb": 8}})
    result = run_snakemake(workdir, "results/demo/plan.json", "--configfile", str(narrow), check=False)
    assert result.returncode != 0
    assert ("split.num_parts: auto: no part count maps in 1 session of 8 MiB under the load model: at 5 parts, the "
            "most this model is cut into, 4 of 5 contexts do not (parts 2, 3, 4, 5)") in (
        workdir / "results" / "demo" / "logs" / "plan.log").read_text()


@pytest.mark.hf
def test_auto_is_the_default_split_of_a_checkpoint(tmp_path):
    pytest.importorskip("torch", reason="the checkpoint is written with torch")
    import hf_checkpoints

    workdir = copy_workflow(tmp_path)
    hf_checkpoints.make_checkpoint(workdir / "checkpoint", "qwen2", layers=3)
    config = write_config(workdir, {"model": {"name": "ckpt", "hf_checkpoint": "checkpoint"},
                                    "export": {"ar": 8, "context": 64}})
    assert "num_parts" not in load_json_yaml(config)["split"]  # the default config leaves it unset
    result = run_snakemake(workdir, "-n", config_file=config)
    assert "part=1_of_2" in result.stdout and "part=2_of_2" in result.stdout and "_of_3" not in result.stdout


@pytest.mark.parametrize("given_mb, lengths, parts, bound", [(24_000, [4096], 9, "the build box"),
                                                             (64_000, [4096], 3, "the device"),
                                                             (64_000, [512, 1024, 2048, 4096], 9, "the build box"),
                                                             (24_000, [512, 1024, 2048, 4096], 29, "the build box")])
def test_auto_weighs_the_memory_the_run_is_given(tmp_path, given_mb, lengths, parts, bound):
    """Qwen2.5-7B with split.num_parts auto through the 'estimate' target: given 24 GB (--resources mem_mb), the
    fewest parts that map and whose every export and verification fits a third of it; given 64 GB, the device's
    3, unless four lengths make the qnn-htp variant's compile of 8 graphs a binary the largest job; on 24 GB at four
    lengths the LM head's part, cut no further, compiles alone. The memory plan says which bound chose the count, by
    which job, and which job runs alone."""
    from genie_build.job_memory import RunMemory
    from genie_build.plan.auto_split import binary_compile, part_jobs
    from genie_build.plan.plan_file import read_plan
    from genie_build.plan.shape_plan import piece_floats

    workdir = copy_workflow(tmp_path)
    config = write_config(workdir, {"model": {"name": "qwen7b", "hf_config": "config/hf/qwen2_5_7b_instruct.json"},
                                    "split": {"num_parts": "auto"}, "export": {"context": lengths}}, name="auto.yaml")
    run_snakemake(workdir, "estimate", "--resources", f"mem_mb={given_mb}", "--configfile", str(config))
    predicted = workdir / "results" / "qwen7b" / "predicted"
    plan = read_plan(predicted / "plan.json")
    jobs = part_jobs(piece_floats(workdir / "config" / "hf" / "qwen2_5_7b_instruct.json"),
                     RunMemory(given_mb, ""), evaluate=False, compile=binary_compile(TEST_VARIANTS, lengths),
                     embedding="lut")
    assert plan.num_parts == parts and jobs.fits(plan)
    alone = jobs.alone(plan)
    assert [part.pieces for part in alone] == ([("layer_27", "head")] if parts == 29 else [])
    line = next(line for line in (predicted / "memory_plan.md").read_text().splitlines()
                if line.startswith("**Part count**"))
    assert f"{bound} chose the count" in line and f"a third of the {given_mb:,} MB the run is given" in line
    assert ("'s compile would take" in line) == (len(lengths) > 1)
    assert ("Snakemake runs it alone" in line) == bool(alone)
    assert load_json(predicted / "memory_plan.json")["part_count"] == line.removeprefix("**Part count**: ")[:-1]


@pytest.mark.hf
def test_auto_on_a_checkpoint_takes_more_parts_when_the_run_is_given_less_memory(tmp_path):
    """A run given just less than three times the largest job of the device's own count: auto takes more parts,
    each of whose jobs fits, and writes down that the build box chose (the memory plan's input). The reference
    toolchain's variants: at this size the HTP backend's own process (a compile's floor) would be the largest job
    at every count."""
    pytest.importorskip("torch", reason="the checkpoint is written with torch")
    import hf_checkpoints
    from genie_build.job_memory import RunMemory
    from genie_build.plan.auto_split import part_jobs
    from genie_build.plan.shape_plan import piece_floats, plan_from_hf_config

    workdir = copy_workflow(tmp_path)
    checkpoint = hf_checkpoints.make_checkpoint(workdir / "checkpoint", "qwen2", layers=4, hidden=256,
                                                intermediate=1024)
    config = write_config(workdir, {"model": {"name": "ckpt", "hf_checkpoint": "checkpoint"},
                                    "export": {"ar": 8, "context": 64}, **REFERENCE_BUILD})
    device = plan_from_hf_config(checkpoint / "config.json", recipe="w4a16", ar=8, context=64, num_parts="auto")
    jobs = part_jobs(piece_floats(checkpoint / "config.json"), RunMemory(1, ""), evaluate=False)
    given = 3 * (max(map(jobs.part_mb, device.parts)) - 1)
    run_snakemake(workdir, "-n", "--resources", f"mem_mb={given}", config_file=config)
    plan = load_json(workdir / "results" / "ckpt" / "plan.json")
    assert plan["num_parts"] > device.num_parts
    choice = load_json(workdir / "results" / "ckpt" / "split_choice.json")["chosen_by"]
    assert "the build box chose the count" in choice and f"a third of the {given:,} MB" in choice
