"""The workflow end to end through the Snakemake CLI: a full build of the small demo with the default config's
toolchains (the reference and the qnn-htp bundle variant, the embedding as Genie's CPU table), its qnn-htp binaries
read back by the vendor's libQnnSystem, a no-op rerun, rebuild precision."""

from __future__ import annotations

import re
import shutil
import time

import pytest

from genie_build.run.run_bundle import PARTS_REFERENCE, TABLE_REFERENCE
from workflow_helpers import (SMALL_DEMO, TEST_VARIANTS, changed_since, copy_workflow, load_json, output_mtimes,
                              read_back_qnn_bundle, run_snakemake, scale_encoding, write_config)

pytestmark = pytest.mark.workflow


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One full build of the small demo, shared by the tests of this module (they restore what they change)."""
    workdir = copy_workflow(tmp_path_factory.mktemp("wf"))
    config_file = write_config(workdir, SMALL_DEMO)
    result = run_snakemake(workdir, config_file=config_file)
    (workdir / "first-run.log").write_text(result.stdout + result.stderr)
    return workdir, config_file


def test_independent_parts_run_in_parallel(built):
    """With 2 cores, Snakemake starts independent per-part jobs together ("Execute 2 jobs...")."""
    workdir, _ = built
    log = (workdir / "first-run.log").read_text()
    assert "Execute 2 jobs" in log or "Execute 3 jobs" in log or "Execute 4 jobs" in log


def test_report_holds_the_size_table_chart_and_memory_plan(built):
    workdir, config_file = built
    run_snakemake(workdir, "--report", "report.zip", config_file=config_file)
    import zipfile

    names = zipfile.ZipFile(workdir / "report.zip").namelist()
    for output in ("size_table.csv", "size_table.png", "memory_plan.md", "memory_plan.png"):
        assert any(name.endswith(output) for name in names), output


def test_host_run_of_the_twins_in_the_htp_simulation_gives_the_bundle_variants_graphs_tokens(built):
    """A weight-shared qnn-htp binary runs only on a device: the host run runs each part's twin (compiled without
    weight sharing) in the HTP simulation and compares with the QDQ graphs those binaries were compiled from."""
    workdir, _ = built
    out = workdir / "results" / "demo"
    host_run = load_json(out / "host_run.json")
    assert len(host_run["new_ids"]) == 16 and host_run["new_ids"] == host_run["reference_ids"]
    assert host_run["compared_with"] == PARTS_REFERENCE + TABLE_REFERENCE
    assert sorted(path.name for path in (out / "twin").iterdir()) == ["part_2_of_3", "part_3_of_3"]


def test_full_build_writes_every_contract_output(built):
    workdir, _ = built
    out = workdir / "results" / "demo"
    plan = load_json(out / "plan.json")
    assert plan["num_parts"] == 3
    labels = [part["label"] for part in plan["parts"]]
    assert labels == ["1_of_3", "2_of_3", "3_of_3"]
    for variant in TEST_VARIANTS:   # part 1, the embedding alone, is Genie's CPU table: no variant compiles it
        assert sorted(path.name for path in (out / "compiled" / variant).iterdir()) == [
            f"part_{label}.bin" for label in labels[1:]]
        for label in labels[1:]:
            assert (out / "compiled" / variant / f"part_{label}.bin").stat().st_size > 0
    for graph in ("prompt", "token"):
        assert load_json(out / "verify" / f"{graph}.json")["bit_exact"] is True
    import pandas as pd

    table = pd.read_csv(out / "size_table.csv")
    assert {"part", "variant", "bytes"} <= set(table.columns)
    assert sorted(zip(table["variant"], table["part"])) == sorted((v, p) for v in TEST_VARIANTS for p in (2, 3))
    assert [part["part"] for part in load_json(out / "memory_plan.json")["parts"]] == [2, 3]
    bundle = out / "genie_bundle"
    for name in ("genie_config.json", "htp_backend_ext_config.json", "tokenizer.json", "metadata.yaml",
                 "embedding_table.bin"):
        assert (bundle / name).is_file(), name
    # the bundle and nothing else (no Snakemake marker), every file listed in the manifest but the manifest
    listed = set(load_json(bundle / "manifest.json")["files"])
    assert {path.name for path in bundle.iterdir()} == listed | {"manifest.json"}
    assert load_json(out / "bundle_check.json")["errors"] == 0
    assert load_json(out / "bundle_check.json")["warnings"] == []
    contract = load_json(out / "contract_check.json")
    assert contract["violations"] == [] and contract["graphs"] == {"prompt": {"ar": 8, "cl": 64},
                                                                   "token": {"ar": 1, "cl": 64}}


def test_the_bundles_binaries_read_back_with_the_graphs_names_soc_and_encodings_they_were_built_with(built):
    """Each ctx-bin, read by the vendor's libQnnSystem: the part's prompt and token graphs under the bundle's names,
    compiled for SM8750 by QNN 2.51, every IO tensor's scale/offset the part's encodings' (read_back_qnn_bundle)."""
    workdir, _ = built
    assert read_back_qnn_bundle(workdir / "results" / "demo", "source") == {
        f"demo_part_{index}_of_3.bin": [f"prompt_ar8_cl64_{index}_of_3", f"token_ar1_cl64_{index}_of_3"]
        for index in (2, 3)}


def test_every_qnn_htp_graph_has_its_dlc_the_vendors_reader_opens_under_its_graph_name(built):
    """convert.dlc (default true): each converted graph of the qnn-htp converter, as the DLC QNN's IR library makes
    of it, kept beside it; the other converters write none."""
    from genie_build.qnn_wheel.system import read_dlc

    workdir, config_file = built
    converted = workdir / "results" / "demo" / "converted" / "source"
    dlcs = sorted(path.relative_to(converted).as_posix() for path in converted.rglob("*.dlc"))
    assert dlcs == [f"qnn-htp-fp16/part_{index}_of_3/{kind}.dlc" for index in (2, 3) for kind in ("prompt", "token")]
    for path in dlcs:
        index, kind = path.split("/")[1][5], path.rsplit("/", 1)[1].removesuffix(".dlc")
        ar = 8 if kind == "prompt" else 1
        assert [graph.name for graph in read_dlc(converted / path).graphs] == [f"{kind}_ar{ar}_cl64_{index}_of_3"]
    # one DLC gone: made again, and only it; with convert.dlc false nothing is asked for
    gone = converted / dlcs[0]
    kept = gone.with_suffix(".kept")
    gone.rename(kept)
    try:
        jobs = run_snakemake(workdir, "-n", config_file=config_file).stdout
        assert set(re.findall(r"^\s*(?:local)?rule (\w+):", jobs, re.M)) == {"convert_dlc", "all"}, jobs[-3000:]
        without = write_config(workdir, {**SMALL_DEMO, "convert": {"dlc": False}}, name="no-dlc.yaml")
        assert "Nothing to be done" in run_snakemake(workdir, "-n", config_file=without).stdout
    finally:
        shutil.copy2(kept, gone)
        kept.unlink()


def test_second_run_does_nothing(built):
    workdir, config_file = built
    result = run_snakemake(workdir, config_file=config_file)
    assert "Nothing to be done" in result.stdout + result.stderr


def test_one_weight_encoding_change_rebuilds_only_its_part(built):
    workdir, config_file = built
    out = workdir / "results" / "demo"
    plan = load_json(out / "plan.json")
    holder = next(p for p in plan["parts"] if p["first_layer"] is not None and p["first_layer"] <= 1 <= p["last_layer"])
    tensor = "model.layers.1.mlp.down_proj.weight"
    originals = {g: (out / "source" / f"{g}.encodings.json").read_text() for g in ("prompt", "token")}
    before = output_mtimes(workdir)
    time.sleep(1.1)
    try:
        for graph in ("prompt", "token"):  # one tensor, identical in both graphs as Genie requires
            scale_encoding(out / "source" / f"{graph}.encodings.json", tensor, 1.5)
        run_snakemake(workdir, config_file=config_file)
        changed = changed_since(before, output_mtimes(workdir))
    finally:
        for graph, text in originals.items():
            (out / "source" / f"{graph}.encodings.json").write_text(text)
        run_snakemake(workdir, config_file=config_file)

    label = holder["label"]
    per_part = {path for path in changed if "/part_" in path and not path.startswith(("parts/", "encodings/"))}
    assert per_part and all(re.search(f"part_{label}[./]", path) for path in per_part), sorted(per_part)
    expected = {f"compiled/{v}/part_{label}.bin" for v in TEST_VARIANTS} | {
        f"sizes/{v}/part_{label}.json" for v in TEST_VARIANTS} | {f"twin/part_{label}/context.bin"}
    assert expected <= per_part
    assert "size_table.csv" in changed and "genie_bundle/genie_config.json" in changed
    assert not any(path.startswith("verify/") for path in changed), "the split did not change"


def test_dry_run_lists_jobs_and_uses_the_default_profile(tmp_path):
    """The default profile (max-checksum-file-size and friends) must be in force: without it, parts over 1 MB
    get no checksum and every part rebuilds after any checkpoint reruns."""
    workdir = copy_workflow(tmp_path)
    result = run_snakemake(workdir, "-n", config_file=write_config(workdir, SMALL_DEMO))
    text = result.stdout + result.stderr
    assert "generate_demo" in text and "plan" in text
    assert "Using workflow specific profile profiles/default" in text


@pytest.mark.parametrize("override, message", [
    ({"bogus_key": 1}, "config bogus_key: unknown key"),
    ({"target": {"chipset": "SM0000"}}, "unknown chipset"),
    ({"model": {"name": "../escape"}}, "does not match"),
    ({"bundle": {"variant": "nope"}}, "is not one of the variants"),
    ({"split": {"num_parts": None}}, "set exactly one of num_parts and max_part_mb"),
    ({"demo": {"context": 256.0}}, "config demo.context: 256.0 is not an integer (write 256)"),
    ({"demo": {"context": [128.0, 256]}}, "config demo.context[0]: 128.0 is not an integer (write 128)"),
    ({"export": {"context": [32, 64.0]}}, "config export.context[1]: 64.0 is not an integer (write 64)"),
    # Genie takes a graph whose cache inputs and outputs have one shape (CL = 2 x AR) for one that updates its cache
    # itself, and answers wrongly (measured: docs/genie-run.md)
    ({"demo": {"context": [64, 256]}}, "config demo.context: 64 is twice demo.ar 32: at that length its cache inputs "
                                       "(CL - AR = 32 entries) and outputs (32) have one shape, which Genie takes for "
                                       "a graph that updates its cache itself"),
    ({"demo": {"context": [100000000]}}, "config demo.context: 100000000: one layer's KV cache at this length is "
                                         "23.8 GiB (keys and values, 128 wide, 1 byte a value), more than the 3,840 "
                                         "MiB of an HTP session under the load model of SM8750"),
])
def test_bad_config_is_rejected_before_any_job(tmp_path, override, message):
    workdir = copy_workflow(tmp_path)
    result = run_snakemake(workdir, "-n", config_file=write_config(workdir, override), check=False)
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    assert not (workdir / "results").exists()


def test_a_host_prompt_the_context_cannot_hold_stops_the_build_before_any_convert(tmp_path):
    """The host run's prompt and its 16 new tokens must fit the context: checked as soon as the tokenizer is there,
    in one line naming the key, not after every other job."""
    workdir = copy_workflow(tmp_path)
    prompt = "And Moses said unto the LORD " * 8
    config = write_config(workdir, {**SMALL_DEMO, "bundle": {"host_prompt": prompt}})
    result = run_snakemake(workdir, config_file=config, check=False)
    assert result.returncode != 0
    log = (workdir / "results" / "demo" / "logs" / "check_host_prompt.log").read_text().strip().splitlines()
    assert len(log) == 1 and log[0].startswith(f"genie-build: error: config bundle.host_prompt: {prompt!r} is ")
    assert "with the host run's 16 new tokens it must fit the context size 64" in log[0]
    assert not (workdir / "results" / "demo" / "converted").exists()
    assert not (workdir / "results" / "demo" / "compiled").exists()
