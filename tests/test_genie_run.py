"""The vendor's Genie (libGenie.so of the onnxruntime-qnn wheel) runs the demo's qnn-htp bundle on the build box
through its twins (docs/genie-run.md): its tokens for the host prompt are the host run's, with the embedding as the
table and with two context lengths; its perplexity is a row of the evaluation table beside the float model's; the
x86 changes to the config are exactly the ones recorded; a broken twin, a Genie refusal, a crash of the library,
tokens that differ and a missing wheel are one line each."""

from __future__ import annotations

import copy
import csv
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from genie_build.errors import GenieBuildError
from genie_build.evaluate.evaluation_table import GenieRow, write_quality_table
from genie_build.evaluate.genie_accuracy import genie_perplexity
from genie_build.qnn_wheel.dialog_run import CONFIG_NAME, DialogJob, run_dialog
from genie_build.run import genie_run as genie_run_module
from genie_build.run.genie_run import GENERATE_MAX_MB, SKIPPED, choose_mode, genie_run, twin_bundle, x86_config
from workflow_helpers import (SMALL_DEMO, copy_workflow, jobs_run, load_json, run_snakemake, without_qnn_wheel,
                              write_config)

pytestmark = pytest.mark.workflow

OUT = Path("results") / "demo"
TWINS = [OUT / "twin" / "part_2_of_3", OUT / "twin" / "part_3_of_3"]   # part 1 is the table


def require_wheel() -> None:
    """Genie's own runs need the wheel's libGenie.so; the rules of the run (below) do not."""
    pytest.importorskip("onnxruntime_qnn", reason="the onnxruntime-qnn wheel is not installed: Genie's run on the "
                                                  "build box needs its libGenie.so (pip install -r "
                                                  "envs/requirements-qnn.txt)")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The small demo built by the default target with the evaluation: the default config's variants (reference and
    qnn-htp, the bundle's), one context length, the embedding as the table (the default)."""
    require_wheel()
    workdir = copy_workflow(tmp_path_factory.mktemp("genie-run"))
    config_file = write_config(workdir, {**SMALL_DEMO, "evaluate": {"enabled": True}})
    run_snakemake(workdir, config_file=config_file)
    return workdir, config_file


def genie_cli(workdir: Path, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "genie_build", *map(str, args)], cwd=workdir, capture_output=True,
                          text=True, env=env)


def test_genie_answers_the_host_prompt_with_the_host_runs_tokens_through_the_table(built):
    workdir, _ = built
    run, host = load_json(workdir / OUT / "genie_run.json"), load_json(workdir / OUT / "host_run.json")
    assert run["mode"] == "generate" and run["why"].startswith("auto: the bundle's ctx-bins hold 0.5 MB")
    assert run["new_ids"] == run["host_run_ids"] == host["new_ids"] and len(run["new_ids"]) == 16
    assert run["equal_to_host_run"] is True and run["prompt_ids"] == host["prompt_ids"]
    assert run["graphs_loaded"] == [{"ar": 1, "cl": 64, "parts": 2}, {"ar": 8, "cl": 64, "parts": 2}]
    assert [twin["graphs"] for twin in run["twins"]] == [["prompt_ar8_cl64_2_of_3", "token_ar1_cl64_2_of_3"],
                                                        ["prompt_ar8_cl64_3_of_3", "token_ar1_cl64_3_of_3"]]
    # the only change: the vendor's default sampler made deterministic
    assert [(change["key"], change["bundle"], change["run"]) for change in run["config_changes"]] == [
        ("dialog.sampler.top-k", 40, 1)]
    assert len(run["float_ids"]) == 16 and run["equal_to_float"] == (run["float_ids"] == run["new_ids"])
    assert run["genie"].startswith("libGenie.so (Genie API 1.21.0; onnxruntime-qnn 2.7.0, QNN SDK 2.51.0)")


def test_genies_perplexity_is_a_row_of_the_evaluation_table_beside_the_float_models(built):
    workdir, _ = built
    report = load_json(workdir / OUT / "evaluation" / "genie_accuracy.json")
    # the evaluation's 16 windows of 8 tokens: Genie's windows of CL - AR = 56 scored tokens, three of them
    assert (report["windows"], report["positions"], report["skipped"]) == (3, 168, None)
    assert len(report["window_perplexities"]) == 3
    assert abs(report["perplexity"] / report["float_perplexity"] - 1) < 0.05, report
    table = (workdir / OUT / "evaluation.md").read_text()
    assert f"| qnn-htp | 0.5 | | | | {report['float_perplexity']:,.2f} | {report['perplexity']:,.2f} |" in table
    row = next(line for line in (workdir / OUT / "evaluation.csv").read_text().splitlines()
               if line.startswith("qnn-htp,"))
    assert f",{report['float_perplexity']:.6g},{report['perplexity']:.6g}," in row


def test_the_report_holds_genies_run(built):
    workdir, config_file = built
    run_snakemake(workdir, "--report", "report.zip", config_file=config_file)
    assert any(name.endswith("genie_run.json") for name in zipfile.ZipFile(workdir / "report.zip").namelist())


def test_two_context_lengths_load_all_four_graphs_and_give_the_host_runs_tokens(tmp_path):
    require_wheel()
    workdir = copy_workflow(tmp_path)
    config = write_config(workdir, {**SMALL_DEMO, "demo": {**SMALL_DEMO["demo"], "context": [32, 64]}})
    run_snakemake(workdir, str(OUT / "genie_run.json"), config_file=config)
    run, host = load_json(workdir / OUT / "genie_run.json"), load_json(workdir / OUT / "host_run.json")
    assert [(graph["ar"], graph["cl"]) for graph in run["graphs_loaded"]] == [(1, 32), (1, 64), (8, 32), (8, 64)]
    assert {graph_run["cl"] for graph_run in host["graph_runs"]} == {32, 64}  # the run crosses from one to the other
    assert run["new_ids"] == host["new_ids"] and run["equal_to_host_run"] is True


def test_asking_for_a_load_check_reruns_genies_run_and_not_the_bundle(built):
    workdir, _ = built
    config = write_config(workdir, {**SMALL_DEMO, "evaluate": {"enabled": True}, "bundle": {"genie_run": "load"}},
                          name="load.yaml")
    result = run_snakemake(workdir, "-n", config_file=config)
    rules = {rule for rule, _ in jobs_run(result)}
    assert {"genie_run", "genie_accuracy"} <= rules and not rules & {"bundle", "check_bundle", "run_bundle"}, rules


def test_tokens_that_differ_from_the_host_runs_are_a_warning_and_with_strict_one_line_with_both_lists(built,
                                                                                                     tmp_path):
    """A host run that does not run the bundle as Genie does (here: its last token changed): Genie's run says so in
    a warning and its report; with --strict (report.strict) it fails in one line and writes nothing."""
    workdir, _ = built
    host = load_json(workdir / OUT / "host_run.json")
    edited = tmp_path / "host_run.json"
    other = [*host["new_ids"][:-1], host["new_ids"][-1] + 1]
    edited.write_text(json.dumps({**host, "new_ids": other}))
    difference = (f"Genie's tokens {host['new_ids']} differ from the host run's {other} from new token 15 on: the "
                  "host run does not run the bundle as Genie does (docs/genie-run.md)")
    command = ("genie-run", OUT / "genie_bundle", "--twin", *TWINS, "--prompt", OUT / "host_prompt.json",
               "--host-run", edited)
    warned = genie_cli(workdir, *command, "--out", tmp_path / "warned.json")
    assert warned.returncode == 0 and difference in warned.stderr, warned.stderr[-3000:]
    report = load_json(tmp_path / "warned.json")
    assert report["equal_to_host_run"] is False and report["difference"] == difference
    done = genie_cli(workdir, *command, "--strict", "--out", tmp_path / "genie_run.json")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-3000:]
    assert done.stderr.strip() == f"genie-build: error: {OUT / 'genie_bundle'}: {difference}"
    assert not (tmp_path / "genie_run.json").exists()


def test_a_weight_shared_binary_as_a_twin_crashes_genie_in_one_line_naming_the_bundle(built, tmp_path):
    """The shipped binaries hold the twins' graphs and IO, so they pass the IO check; Genie on x86 then crashes."""
    workdir, _ = built
    twins = []
    for twin in TWINS:
        copied = shutil.copytree(workdir / twin, tmp_path / twin.name)
        shutil.copyfile(workdir / OUT / "genie_bundle" / f"demo_{twin.name}.bin", copied / "context.bin")
        twins.append(copied)
    done = genie_cli(workdir, "genie-run", OUT / "genie_bundle", "--twin", *twins, "--mode", "load")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-3000:]
    assert done.stderr.startswith(f"genie-build: error: {OUT / 'genie_bundle'}: Genie crashed (SIGSEGV) while "
                                  "loading the bundle; Genie's last error: "), done.stderr


def test_a_twin_of_other_graphs_is_one_line_naming_it(built):
    workdir, _ = built
    done = genie_cli(workdir, "genie-run", OUT / "genie_bundle", "--twin", *reversed(TWINS), "--mode", "load")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(f"genie-build: error: {TWINS[1]}: holds graphs")


def test_genie_refuses_graph_switching_on_x86_in_one_line_so_the_run_leaves_it_out(built, monkeypatch):
    """What x86_config removes, given back: GenieDialog_create's status and Genie's own errors in one line."""
    workdir, _ = built
    monkeypatch.chdir(workdir)
    with twin_bundle(OUT / "genie_bundle", TWINS) as twin:
        config = json.loads((twin.folder / CONFIG_NAME).read_text())
        config["dialog"]["engine"]["backend"]["QnnHtp"]["enable-graph-switching"] = True
        (twin.folder / CONFIG_NAME).write_text(json.dumps(config))
        with pytest.raises(GenieBuildError) as refused:
            run_dialog(DialogJob(str(twin.folder)), timeout=300)
    message = str(refused.value)
    assert "\n" not in message and "Genie failed loading the bundle: GenieDialog_create returned status -1" in message
    assert "Memory Limit Hint is not supported" in message
    assert x86_config(config)[1][-1].key == "dialog.engine.backend.QnnHtp.enable-graph-switching"


def test_a_load_check_lists_the_graphs_without_generating(built, tmp_path):
    workdir, _ = built
    done = genie_cli(workdir, "genie-run", OUT / "genie_bundle", "--twin", *TWINS, "--mode", "load",
                     "--out", tmp_path / "load.json")
    assert done.returncode == 0, done.stderr[-3000:]
    run = load_json(tmp_path / "load.json")
    assert (run["mode"], run["graphs_loaded"]) == ("load", [{"ar": 1, "cl": 64, "parts": 2},
                                                            {"ar": 8, "cl": 64, "parts": 2}])
    assert "new_ids" not in run and run["load_seconds"] > 0


def test_auto_on_a_bundle_too_large_for_the_simulation_records_why_and_runs_nothing(built, monkeypatch):
    """The demo's 0.5 MB of ctx-bins over a limit set below it: the run and the perplexity say why not, without
    loading a twin (the twins given do not exist)."""
    workdir, _ = built
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(genie_run_module, "GENERATE_MAX_MB", 0.1)
    missing = [Path("no-twin-here")] * len(TWINS)
    run = genie_run(OUT / "genie_bundle", missing, prompt=OUT / "host_prompt.json", host_run=OUT / "host_run.json")
    assert (run.mode, run.twins, run.graphs_loaded, run.generation) == (SKIPPED, (), (), {})
    assert run.why == ("auto: the bundle's ctx-bins hold 0.5 MB, more than the 0.1 MB Genie generates from in minutes "
                       "in the HTP simulation, and Genie would map every twin at once: not run (bundle.genie_run: load "
                       "for a load check, generate for the token query)")
    accuracy = genie_perplexity(OUT / "genie_bundle", missing, variant="qnn-htp",
                                tokens_path=OUT / "tokens" / "evaluation.npy", float_parts=[], max_windows=16)
    assert (accuracy.perplexity, accuracy.skipped) == (None, run.why)


def dry_run_jobs(workdir: Path, bundle: dict) -> str:
    result = run_snakemake(workdir, "-n", config_file=write_config(workdir, {**SMALL_DEMO, "bundle": bundle}))
    return result.stdout + result.stderr


@pytest.mark.parametrize("bundle, runs", [
    ({"variant": "qnn-htp"}, True),                                   # the default: auto beside the host run
    ({"variant": "qnn-htp", "host_run": False}, False),               # auto follows the host run
    ({"variant": "qnn-htp", "host_run": False, "genie_run": "load"}, True),   # asked for
    ({"variant": "qnn-htp", "genie_run": False}, False),
    ({"variant": "reference", "genie_run": "generate"}, False),       # genie-build's own container: no QNN binary
])
def test_which_builds_run_genie(tmp_path, bundle, runs):
    text = dry_run_jobs(copy_workflow(tmp_path), bundle)
    assert ("genie_run" in text) is runs, text[-3000:]


def test_without_the_wheel_the_run_is_one_line_naming_it(built, tmp_path):
    """The wheel hidden from a fresh interpreter."""
    workdir, _ = built
    done = genie_cli(workdir, "genie-run", OUT / "genie_bundle", "--twin", *TWINS, "--mode", "load",
                     env=without_qnn_wheel(tmp_path / "hide"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-3000:]
    assert done.stderr.strip().endswith(f"the onnxruntime-qnn wheel is not installed for {sys.executable}: "
                                        "pip install -r envs/requirements-qnn.txt")


# --- the rules of the run, without Genie -------------------------------------------------------------------------

CONFIG = {"dialog": {"version": 1, "type": "basic",
                     "sampler": {"version": 1, "seed": 42, "temp": 0.8, "top-k": 40, "top-p": 0.95},
                     "engine": {"backend": {"type": "QnnHtp", "QnnHtp": {"version": 1, "poll": True}}}}}


@pytest.mark.parametrize("sampler, changed", [
    ({"top-k": 40, "temp": 0.8}, [("dialog.sampler.top-k", 40, 1)]),
    ({"top-k": 40, "temp": 0.8, "greedy": True}, [("dialog.sampler.top-k", 40, 1)]),
    ({"top-k": 1, "temp": 0.8}, []),
    ({"top-k": 40, "temp": 0}, [("dialog.sampler.top-k", 40, 1)]),
    (None, [("dialog.sampler", None, {"version": 1, "top-k": 1})]),
])
def test_the_run_sets_top_k_1_the_only_sampler_genie_picks_the_most_likely_token_with(sampler, changed):
    config = copy.deepcopy(CONFIG)
    if sampler is None:
        del config["dialog"]["sampler"]
    else:
        config["dialog"]["sampler"] = sampler
    run, changes = x86_config(config)
    assert [(change.key, change.bundle, change.run) for change in changes] == changed
    expected = copy.deepcopy(config)
    for key, _, value in changed:
        if key == "dialog.sampler":
            expected["dialog"]["sampler"] = value
        else:
            expected["dialog"]["sampler"]["top-k"] = value
    assert run == expected  # nothing else changed, and the bundle's own config is left alone
    assert config["dialog"].get("sampler") == sampler


@pytest.mark.parametrize("switching", [True, False])
def test_graph_switching_goes_only_when_it_is_on(switching):
    config = copy.deepcopy(CONFIG)
    config["dialog"]["engine"]["backend"]["QnnHtp"]["enable-graph-switching"] = switching
    run, changes = x86_config(config)
    assert ("enable-graph-switching" in run["dialog"]["engine"]["backend"]["QnnHtp"]) is not switching
    assert [change.key for change in changes][1:] == (
        ["dialog.engine.backend.QnnHtp.enable-graph-switching"] if switching else [])


def test_auto_generates_up_to_the_size_the_simulation_takes_in_minutes_and_skips_beyond():
    limit = int(GENERATE_MAX_MB * 1e6)
    assert choose_mode("auto", limit)[0] == "generate"
    assert choose_mode("auto", limit + 1)[0] == SKIPPED
    assert choose_mode("generate", 10 * limit) == ("generate", "bundle.genie_run: generate")
    assert choose_mode("load", 1) == ("load", "bundle.genie_run: load")


def test_a_bundle_too_large_for_the_simulation_says_so_in_the_evaluation_table(tmp_path):
    genie = GenieRow("qnn-htp", 4_000_000_000, None, None, 0, 0, choose_mode("auto", 4_000_000_000)[1])
    write_quality_table([], tmp_path / "e.md", tmp_path / "e.csv", tmp_path / "e.png", genie=genie)
    table = (tmp_path / "e.md").read_text()
    assert "| qnn-htp | 4,000.0 | | | | | not computed | | | | |" in table and genie.skipped in table
    header, row = csv.reader((tmp_path / "e.csv").read_text().splitlines())
    assert dict(zip(header, row)) == {**dict.fromkeys(header, ""), "variant": "qnn-htp", "bytes": "4000000000",
                                      "flag": genie.skipped}
