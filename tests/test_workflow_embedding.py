"""bundle.embedding: lut as a user meets it: a build with the embedding in the graph, then the same build with the
embedding as a CPU table -- only the bundle's side reruns (no new demo, split or encodings), part 1 leaves the bundle,
the table and dialog.embedding come in, and the host run gives its reference's tokens. On the demo and on the
user's own ONNX export; an export whose part 1 scales the Gather's rows gets those rows scaled in the table, and a
table that is not what part 1 computes fails the host run; a dry run lists the table's jobs for every source.

The switches and the host runs against the unsplit model build the reference toolchain (REFERENCE_BUILD): the demo's
8-bit per-channel embedding has no HTP form, so its qnn-htp bundle has no graph layout to switch from
(tests/test_workflow.py builds the default qnn-htp bundle with the table; tests/test_qnn_htp.py checks the refusal
of part 1)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from bundle_helpers import build_reference_bundle
from genie_build.bundle.embedding_table import quantize_table, read_table_file
from genie_build.toolchains.reference.onnx_io import read_initializer
from scaled_embedding import scaled_export
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


def test_the_table_replaces_part_1_and_each_layouts_tokens_are_its_references(demo):
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
    # each layout's tokens are its reference's; the two layouts quantize the embedding differently (the graph's
    # Gather at 8 bits per channel, the table at 16), so their tokens may part where the model nearly ties
    assert lut_run["new_ids"] == lut_run["reference_ids"] and graph_run["new_ids"] == graph_run["reference_ids"]
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


def _table_of_part_1(out: Path, factor: float = 1.0) -> np.ndarray:
    """The codes of part 1's Gather table times ``factor``, at the built table's encoding."""
    part = out / "parts" / "part_1_of_3" / "prompt.onnx"
    table = next(t for t in onnx.load(part, load_external_data=False).graph.initializer
                 if t.name == "model.embed_tokens.weight")
    return quantize_table(read_initializer(table, part) * np.float32(factor),
                          read_table_file(out / "embedding" / "embedding_table.bin").encoding)


def _run_bundle(bundle: Path, out: Path, reference: list[str]) -> subprocess.CompletedProcess:
    part = ["--embedding-part", str(out / "parts" / "part_1_of_3" / "prompt.onnx"),
            str(out / "encodings" / "source" / "part_1_of_3" / "prompt.encodings.json")]
    return subprocess.run([sys.executable, "-m", "genie_build", "run-bundle", str(bundle), "--prompt",
                           "What is 2+3? Explain briefly.", *reference, *part], capture_output=True, text=True,
                          check=False)


def test_a_scaled_embedding_is_in_the_table_and_a_table_without_the_scale_fails_the_host_run(demo, tmp_path):
    """Part 1 multiplies the Gather's rows by sqrt(hidden) (as Gemma's does): the table holds the scaled rows, the
    host run passes; the same bundle with the Gather's rows alone in its table fails the host run against the
    unsplit model and against the parts, each in one line."""
    workdir = copy_workflow(tmp_path)
    factor = scaled_export(demo[0] / "results" / "demo" / "source", workdir / "exports", SMALL_DEMO["demo"]["hidden"])
    run_snakemake(workdir, config_file=write_config(workdir, {"model": {"name": "mine", **USER_MODEL},
                                                              "split": {"num_parts": 3}, **REFERENCE_BUILD,
                                                              "bundle": {**REFERENCE_BUILD["bundle"],
                                                                         "embedding": "lut"}}))
    out = workdir / "results" / "mine"
    table = read_table_file(out / "embedding" / "embedding_table.bin")
    codes = np.fromfile(table.path, dtype=table.encoding.dtype).reshape(table.n_vocab, table.n_embd)
    assert np.array_equal(codes, _table_of_part_1(out, factor))
    host_run = load_json(out / "host_run.json")
    assert host_run["new_ids"] == host_run["reference_ids"] and "part 1's rows" in host_run["compared_with"]

    unscaled = shutil.copytree(out / "genie_bundle", tmp_path / "unscaled_bundle")
    (unscaled / "embedding_table.bin").write_bytes(_table_of_part_1(out).tobytes())
    manifest = load_json(unscaled / "manifest.json")
    manifest["files"]["embedding_table.bin"]["sha256"] = hashlib.sha256(
        (unscaled / "embedding_table.bin").read_bytes()).hexdigest()
    (unscaled / "manifest.json").write_text(json.dumps(manifest))
    converted = sorted(str(path) for path in (out / "converted").glob("*/*/part_[23]_of_3/*.onnx"))
    for reference in (["--compare-with", str(out / "unsplit" / "model.bin")], ["--compare-with-parts", *converted]):
        assert _run_bundle(out / "genie_bundle", out, reference).returncode == 0
        failed = _run_bundle(unscaled, out, reference)
        lines = failed.stderr.strip().splitlines()
        assert failed.returncode == 2 and len(lines) == 1 and "differ from those of" in lines[0], failed.stderr


def _dry_run_jobs(workdir: Path, overrides: dict) -> set[str]:
    lut = {**overrides, "bundle": {**overrides.get("bundle", {}), "embedding": "lut"}}
    return {rule for rule, _ in jobs_run(run_snakemake(workdir, "-n", config_file=write_config(workdir, lut)))}


def test_a_dry_run_with_the_table_lists_its_jobs_for_the_demo_and_a_users_export(demo, tmp_path):
    workdir = copy_workflow(tmp_path)
    assert {"embedding_table", "bundle", "run_bundle"} <= _dry_run_jobs(workdir, SMALL_DEMO)
    (tmp_path / "user").mkdir()
    workdir = copy_workflow(tmp_path / "user")
    shutil.copytree(demo[0] / "results" / "demo" / "source", workdir / "exports")
    assert {"embedding_table", "bundle", "run_bundle"} <= _dry_run_jobs(
        workdir, {"model": {"name": "mine", **USER_MODEL}, "split": {"num_parts": 3}})


def test_a_dry_run_with_the_table_lists_its_jobs_for_a_checkpoint(tmp_path):
    pytest.importorskip("transformers", reason="the checkpoint is written by transformers")
    import hf_checkpoints

    workdir = copy_workflow(tmp_path)
    hf_checkpoints.make_checkpoint(workdir / "checkpoint", "qwen2", layers=2)
    jobs = _dry_run_jobs(workdir, {"model": {"name": "hf", "hf_checkpoint": "checkpoint"},
                                   "export": {"ar": 8, "context": 64}, "split": {"num_parts": 3}})
    assert {"export_part", "embedding_table", "bundle", "run_bundle"} <= jobs


def test_a_correct_table_passes_where_the_graph_layouts_tokens_differ(tmp_path):
    """The small demo of seed 5: its table (the float rows at the 16-bit output encoding) and its graph layout (the
    table at 8 bits per channel) give different tokens. The host run holds the table to a reference that quantizes
    it as the table does, so the correct bundle passes (against the unsplit model converted as the graph layout, it
    failed)."""
    workdir = copy_workflow(tmp_path)
    seeded = {**SMALL_DEMO, **REFERENCE_BUILD, "demo": {**SMALL_DEMO["demo"], "seed": 5}}
    graph_run, lut_run, _ = _both_layouts(workdir, seeded, "demo")
    assert lut_run["new_ids"] == lut_run["reference_ids"] and "part 1's rows" in lut_run["compared_with"]
    assert lut_run["new_ids"] != graph_run["new_ids"]
