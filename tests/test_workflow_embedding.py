"""bundle.embedding: lut as a user meets it: a build with the embedding in the graph, then the same build with the
embedding as a CPU table -- only the bundle's side reruns (no new demo, split or encodings), part 1 leaves the bundle,
the table and dialog.embedding come in, and the host run's tokens are the graph layout's. On the demo and on the
user's own ONNX export, with the reference toolchain: the demo's 8-bit per-channel embedding has no HTP form, so
its qnn-htp bundle has no graph layout to switch from (tests/test_workflow.py builds the default qnn-htp bundle with
the table; tests/test_qnn_htp.py checks the refusal of part 1)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bundle_helpers import build_reference_bundle
from workflow_helpers import (REFERENCE_BUILD, SMALL_DEMO, copy_workflow, jobs_run, load_json, run_snakemake,
                              write_config)

pytestmark = pytest.mark.workflow

# what may rerun when only bundle.embedding changes: the part after the table (renamed input) and the bundle's side
BUNDLE_SIDE = {"convert_part_reference", "compile_part", "account", "size_table", "memory_plan",
               "embedding_table", "bundle", "check_bundle", "run_bundle", "all"}
USER_MODEL = {"prompt_onnx": "exports/prompt.onnx", "token_onnx": "exports/token.onnx",
              "encodings": {"prompt": "exports/prompt.encodings.json", "token": "exports/token.encodings.json"},
              "tokenizer": "exports/tokenizer.json", "hf_config": "exports/config.json"}


def _both_layouts(workdir: Path, overrides: dict, model: str) -> tuple[dict, dict, list[tuple[str, str]]]:
    """Build with the graph layout, then switch to the table: both host runs and the jobs the switch ran."""
    run_snakemake(workdir, config_file=write_config(workdir, overrides, name="graph.yaml"))
    graph_run = load_json(workdir / "results" / model / "host_run.json")
    lut = {**overrides, "bundle": {**overrides.get("bundle", {}), "embedding": "lut"}}
    switched = run_snakemake(workdir, "-p", config_file=write_config(workdir, lut, name="lut.yaml"))
    return graph_run, load_json(workdir / "results" / model / "host_run.json"), jobs_run(switched)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    workdir = copy_workflow(tmp_path_factory.mktemp("wf"))
    return workdir, *_both_layouts(workdir, {**SMALL_DEMO, **REFERENCE_BUILD}, "demo")


def test_switching_to_the_table_reruns_only_the_bundle_side(demo):
    _, _, _, ran = demo
    assert {rule for rule, _ in ran} <= BUNDLE_SIDE, ran
    # part 1 is neither converted nor compiled again; part 2 is, once per graph, for its renamed input
    converted = sorted(wildcards for rule, wildcards in ran if rule == "convert_part_reference")
    assert len(converted) == 2 and all("part=2_of_3" in wildcards for wildcards in converted), converted


def test_the_table_replaces_part_1_and_the_tokens_are_the_graph_layouts(demo):
    workdir, graph_run, lut_run, _ = demo
    bundle = workdir / "results" / "demo" / "genie_bundle"
    dialog = load_json(bundle / "genie_config.json")["dialog"]
    assert dialog["engine"]["model"]["binary"]["ctx-bins"] == ["demo_part_2_of_3.bin", "demo_part_3_of_3.bin"]
    assert not (bundle / "demo_part_1_of_3.bin").exists()
    hidden, vocab = SMALL_DEMO["demo"]["hidden"], SMALL_DEMO["demo"]["vocab"]
    assert dialog["embedding"]["size"] == hidden and dialog["embedding"]["datatype"] == "ufixed16"
    assert (bundle / "embedding_table.bin").stat().st_size == vocab * hidden * 2
    metadata = (bundle / "metadata.yaml").read_text()
    assert "inputs_embeds" in metadata and "input_ids" not in metadata
    assert load_json(workdir / "results" / "demo" / "bundle_check.json")["errors"] == 0
    memory = load_json(workdir / "results" / "demo" / "memory_plan.json")  # the bundle's contexts, the table beside
    assert [part["part"] for part in memory["parts"]] == [2, 3]
    assert memory["embedding"] == {"layout": "lut", "cpu_table_bytes": vocab * hidden * 2}
    assert lut_run["new_ids"] == graph_run["new_ids"] == lut_run["reference_ids"]
    assert len(lut_run["new_ids"]) == 16


def test_check_bundle_says_in_one_line_when_the_table_is_not_the_size_the_config_says(demo, tmp_path):
    workdir = demo[0]
    bundle = shutil.copytree(workdir / "results" / "demo" / "genie_bundle", tmp_path / "bundle")
    with open(bundle / "embedding_table.bin", "r+b") as table:
        table.truncate(table.seek(0, 2) - 128)
    result = subprocess.run([sys.executable, "-m", "genie_build", "check-bundle", str(bundle)], capture_output=True,
                            text=True, check=False)
    assert result.returncode != 0
    line = [line for line in result.stdout.splitlines() + result.stderr.splitlines() if "embedding-table" in line]
    assert len(line) == 1 and "wrong stride" in line[0], result.stdout + result.stderr


def test_the_users_onnx_export_gives_the_same_tokens_with_the_table(tmp_path_factory):
    source = build_reference_bundle(tmp_path_factory.mktemp("demo")).source
    workdir = copy_workflow(tmp_path_factory.mktemp("wf"))
    (workdir / "exports").mkdir()
    for path in source.iterdir():
        if path.is_file():
            shutil.copy2(path, workdir / "exports" / path.name)
    graph_run, lut_run, ran = _both_layouts(workdir, {"model": {"name": "mine", **USER_MODEL},
                                                      "split": {"num_parts": 3}, **REFERENCE_BUILD}, "mine")
    assert {rule for rule, _ in ran} <= BUNDLE_SIDE, ran
    assert lut_run["new_ids"] == graph_run["new_ids"] == lut_run["reference_ids"]


def test_the_evaluation_runs_the_parts_after_the_embedding_from_part_1s_vectors(demo):
    """``snakemake evaluate`` chains each variant's binaries; part 2 takes inputs_embeds, fed from part 1's graph."""
    workdir = demo[0]
    run_snakemake(workdir, "evaluate", config_file=workdir / "lut.yaml")
    for variant in ("unpacked", "packed"):
        report = load_json(workdir / "results" / "demo" / "evaluation" / f"{variant}.json")
        assert 0 < report["top1_agreement"] <= 1, report
