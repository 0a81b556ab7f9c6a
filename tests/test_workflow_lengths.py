"""Several context lengths as a user meets them: a build at one length, then the same build with a shorter length
added -- only the new graphs and the bundle's side run (nothing is regenerated, recalibrated or re-split), every
binary of the qnn-htp bundle (parts 2 and 3: part 1 is the CPU table) holds both lengths' graphs with its weights
stored once, and the host run looks tokens up in the table, starts on the short graphs, moves up when the cache
fills, and gives the single-length bundle's tokens. On the demo and on the user's own ONNX export."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import onnx
import pandas as pd
import pytest

from genie_build.conventions import PART_WEIGHTS_NAME
from genie_build.demo.demo import generate_demo
from demo_shapes import demo_shape
from workflow_helpers import SMALL_DEMO, copy_workflow, jobs_run, load_json, run_snakemake, write_config

pytestmark = pytest.mark.workflow

SHORT, LONG = 32, 64      # the small demo's AR is 8: its 21-token prompt runs at 32, the generation moves up to 64
# (not 16: Genie misreads a graph at twice its AR, which the config refuses). This module tests the lengths' builds
# and reruns, test_genie_run.py Genie's run of two lengths
DEMO = {**SMALL_DEMO, "bundle": {"genie_run": False}}
BUNDLE_VARIANT = "qnn-htp"
# what may run when a length is added: the new graphs, their parts, the check of their weights, and every part's
# binaries (and the bundle's twins) and what reads them; the new graphs' DLCs
LENGTH_SIDE = {"generate_demo_length", "split", "verify_split", "check_model", "convert_part_reference",
               "convert_part_qnn_htp", "convert_dlc", "compile_part", "compile_twin", "account", "size_table",
               "memory_plan", "bundle", "check_bundle", "run_bundle", "all"}


def _graph_names(binary: Path) -> list[str]:
    """The graphs of a qnn-htp context binary, as the vendor's libQnnSystem reads them."""
    from genie_build.qnn_wheel.system import read_context_binary

    return sorted(graph.info.name for graph in read_context_binary(binary).graphs)


def _both_lengths(index: int) -> list[str]:
    return sorted(f"{kind}_ar{ar}_cl{cl}_{index}_of_3" for kind, ar in (("prompt", 8), ("token", 1))
                  for cl in (SHORT, LONG))


def _sizes(out: Path) -> dict[str, dict]:
    return {path.name: load_json(path) for path in sorted((out / "sizes" / BUNDLE_VARIANT).glob("*.json"))}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The small demo at one length, then with a second, shorter one added."""
    workdir = copy_workflow(tmp_path_factory.mktemp("wf"))
    out = workdir / "results" / "demo"
    run_snakemake(workdir, config_file=write_config(workdir, DEMO, name="one.yaml"))
    single = {"host_run": load_json(out / "host_run.json"), "sizes": _sizes(out),
              "encodings": (out / "source" / "prompt.encodings.json").stat().st_mtime_ns}
    two = {**DEMO, "demo": {**SMALL_DEMO["demo"], "context": [SHORT, LONG]}}
    added = run_snakemake(workdir, "-p", config_file=write_config(workdir, two, name="two.yaml"))
    return workdir, single, jobs_run(added)


def test_adding_a_length_regenerates_recalibrates_and_reconverts_nothing_but_its_graphs(demo):
    workdir, single, ran = demo
    assert {rule for rule, _ in ran} <= LENGTH_SIDE, ran
    # one split job writes every graph's parts; the graphs at the first length come out the same bytes, so only the
    # new length's graphs are converted
    assert [wildcards for rule, wildcards in ran if rule == "split"] == [""]
    assert {re.search(r"graph=(\w+)", wildcards)[1] for rule, wildcards in ran if rule.startswith("convert_part")} == {
        f"prompt_cl{SHORT}", f"token_cl{SHORT}"}
    assert (workdir / "results" / "demo" / "source" / "prompt.encodings.json").stat().st_mtime_ns == single["encodings"]
    # the second run is complete: a third has nothing to do
    again = run_snakemake(workdir, config_file=workdir / "two.yaml")
    assert "Nothing to be done" in again.stdout + again.stderr


def test_the_lengths_in_another_order_or_a_section_the_demo_does_not_read_rerun_nothing(demo):
    """The bundle's record of its config (and so the bundle's rerun) holds only what the bundle is made from: the
    lengths listed longest first, or an export section a demo build does not read, leave everything up to date."""
    workdir = demo[0]
    for name, change in (("reordered", {"demo": {**SMALL_DEMO["demo"], "context": [LONG, SHORT]}}),
                         ("export", {"demo": {**SMALL_DEMO["demo"], "context": [SHORT, LONG]},
                                     "export": {"ar": 16, "context": [128, 256]}})):
        config = write_config(workdir, {**DEMO, **change}, name=f"{name}.yaml")
        result = run_snakemake(workdir, "-n", config_file=config)
        assert "Nothing to be done" in result.stdout + result.stderr, (name, jobs_run(result))


def test_every_part_holds_both_lengths_with_its_weights_stored_once(demo):
    workdir, single, _ = demo
    out = workdir / "results" / "demo"
    bundle = out / "genie_bundle"
    dialog = load_json(bundle / "genie_config.json")["dialog"]
    assert dialog["context"]["size"] == LONG and dialog["embedding"]["type"] == "lut"
    binaries = dialog["engine"]["model"]["binary"]["ctx-bins"]
    assert binaries == ["demo_part_2_of_3.bin", "demo_part_3_of_3.bin"]
    # every graph of a part, at both lengths, reads the part's one weights file
    for index in (1, 2, 3):
        part = out / "parts" / f"part_{index}_of_3"
        keys = ("prompt", "token", f"prompt_cl{SHORT}", f"token_cl{SHORT}")
        assert sorted(path.name for path in part.iterdir()) == sorted([PART_WEIGHTS_NAME,
                                                                      *(f"{key}.onnx" for key in keys)])
    for index, name in enumerate(binaries, start=2):
        assert _graph_names(bundle / name) == _both_lengths(index)
    assert load_json(out / "bundle_check.json")["errors"] == 0
    records = _sizes(out)
    assert sorted(records) == ["part_2_of_3.json", "part_3_of_3.json"]
    for name, record in records.items():
        before = single["sizes"][name]
        # no weight stored twice: QNN's shared-weights buffer grows by a few 4 KiB pages per graph
        # (docs/qnn-htp.md), where a second copy of the weights would add their own bytes again
        added = record["weight_bytes"] - before["weight_bytes"]
        assert 0 <= added <= 8 * 4096 * (len(record["graphs"]) - len(before["graphs"])) < before["weight_bytes"], name
        assert len(record["graphs"]) == 2 * len(before["graphs"]) == 4
        assert record["bytes"] > before["bytes"]                           # the graphs themselves
    # and once on disk before the compile, by the reference converter (qnn-htp's QDQ graphs hold their own)
    folders = sorted((out / "converted").glob("*/reference-*/part_*"))
    assert [folder.name for folder in folders] == ["part_2_of_3", "part_3_of_3"]
    for folder in folders:
        data = {path.name: path.stat().st_size for path in folder.glob("*.onnx.data")}
        assert len(data) == 4 and data.pop("prompt.onnx.data") > 0 and set(data.values()) == {0}, (folder, data)
    table = pd.read_csv(out / "size_table.csv")
    assert set(table["graphs"]) == {4} and (table["graph_bytes"] > 0).all()
    assert "Graphs per context binary: 4" in (out / "size_table.md").read_text()
    memory = load_json(out / "memory_plan.json")
    assert memory["load"]["maps"] is True and [part["part"] for part in memory["parts"]] == [2, 3]


def test_the_host_run_switches_up_and_gives_the_single_length_tokens(demo):
    workdir, single, _ = demo
    run = load_json(workdir / "results" / "demo" / "host_run.json")
    assert run["new_ids"] == run["reference_ids"] == single["host_run"]["new_ids"]
    lengths = [graph["cl"] for graph in run["graph_runs"]]
    assert lengths[0] == SHORT and lengths[-1] == LONG and lengths == sorted(lengths), run["graph_runs"]


def test_the_users_onnx_graphs_one_per_length_make_the_same_bundle(demo, tmp_path_factory):
    workdir, single, _ = demo
    source = workdir / "results" / "demo" / "source"
    user = copy_workflow(tmp_path_factory.mktemp("wf"))
    (user / "exports").mkdir()
    for path in source.iterdir():
        shutil.copy2(path, user / "exports" / path.name)
    model = {"name": "mine",
             "prompt_onnx": [f"exports/prompt_cl{SHORT}.onnx", "exports/prompt.onnx"],
             "token_onnx": ["exports/token.onnx", f"exports/token_cl{SHORT}.onnx"],   # any order: read by their CL
             "encodings": {"prompt": "exports/prompt.encodings.json", "token": "exports/token.encodings.json"},
             "tokenizer": "exports/tokenizer.json", "hf_config": "exports/config.json"}
    run_snakemake(user, config_file=write_config(user, {"model": model, "split": {"num_parts": 3},
                                                        "bundle": DEMO["bundle"]}))
    out = user / "results" / "mine"
    assert load_json(out / "bundle_check.json")["errors"] == 0
    records = _sizes(out)
    assert records and all(len(record["graphs"]) == 4 for record in records.values())
    binaries = load_json(out / "genie_bundle" / "genie_config.json")["dialog"]["engine"]["model"]["binary"]["ctx-bins"]
    assert [_graph_names(out / "genie_bundle" / name) for name in binaries] == [_both_lengths(2), _both_lengths(3)]
    run = load_json(out / "host_run.json")   # the user's prompt, not the demo's
    assert run["new_ids"] == run["reference_ids"] and len(run["new_ids"]) == 16


def _fewer_layers(exports: Path, tmp_path: Path) -> None:
    """The short graphs of ``exports`` replaced by the demo's graphs of one layer fewer at that length, their weights
    read from the long graphs' data files (the same bytes for every weight they name)."""
    shape = demo_shape(SMALL_DEMO["demo"], layers=SMALL_DEMO["demo"]["layers"] - 1, context=SHORT)
    generate_demo(shape, tmp_path / "fewer")
    for kind in ("prompt", "token"):
        long = {t.name: t for t in onnx.load(exports / f"{kind}.onnx", load_external_data=False).graph.initializer}
        short = onnx.load(tmp_path / "fewer" / f"{kind}.onnx", load_external_data=False)
        for tensor in short.graph.initializer:
            if tensor.name in long and long[tensor.name].data_location == onnx.TensorProto.EXTERNAL:
                tensor.CopyFrom(long[tensor.name])
        onnx.save(short, exports / f"{kind}_cl{SHORT}.onnx")


def test_a_users_graph_at_a_length_with_fewer_layers_is_refused_when_the_workflow_is_parsed(demo, tmp_path):
    """The short graphs hold one layer fewer, every weight they name the long graphs' own: one line naming the
    user's file and the first weight it lacks, before any job (not a convert failing on a file under results/)."""
    workdir, _, _ = demo
    user = copy_workflow(tmp_path)
    shutil.copytree(workdir / "results" / "demo" / "source", user / "exports")
    _fewer_layers(user / "exports", tmp_path)
    model = {"name": "mine", "prompt_onnx": [f"exports/prompt_cl{SHORT}.onnx", "exports/prompt.onnx"],
             "token_onnx": ["exports/token.onnx", f"exports/token_cl{SHORT}.onnx"],
             "encodings": {"prompt": "exports/prompt.encodings.json", "token": "exports/token.encodings.json"},
             "tokenizer": "exports/tokenizer.json", "hf_config": "exports/config.json"}
    result = run_snakemake(user, config_file=write_config(user, {"model": model, "split": {"num_parts": 3}}),
                           check=False)
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "lacks" in line]
    assert lines == [f"config model.prompt_onnx: exports/prompt_cl{SHORT}.onnx: lacks 7 weight(s) of "
                     "exports/prompt.onnx, e.g. 'model.layers.3.mlp.down_proj.weight': the graphs at every context "
                     "length must hold the same weights"], result.stdout + result.stderr
    assert not (user / "results").exists()

