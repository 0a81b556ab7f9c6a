"""Hostile and inconsistent inputs, where a user meets them: a workflow run on a model folder someone else made.

Every case is refused in one line naming the user's file, before the job that would have read or built it wrong,
with nothing read from outside the model's folder; the one layout that is valid (a weight stored as a Constant
node's value, as ``onnx.save(..., convert_attribute=True)`` writes it) builds a bundle that holds all it needs.
The commands' own tests cover each reader in detail (test_onnx_graph, test_encodings, test_consistency,
test_check_bundle, test_config); this file checks the workflow around them.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from bundle_helpers import ReferenceBuild, write_tokenizer
from genie_build.onnx_graph import model_tensors
from genie_build.toolchains.reference.container import read_graphs
from rebuild_helpers import clone_workdir
from test_bad_inputs import SHARED_WEIGHT, copy_source, failed_job_logs, leftovers
from workflow_helpers import copy_workflow, load_json, run_snakemake, write_config

pytestmark = pytest.mark.workflow

GRAPHS = ("prompt", "token")
UNQUANTIZED = "model.layers.0.input_layernorm.weight"  # a float weight without an integer encoding
VARIANT = {"toolchain": "reference", "weights_packing": True}


@pytest.fixture(scope="module")
def workflow(build: ReferenceBuild, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the workflow with the tiny demo's files as a user's export in exports/."""
    workdir = copy_workflow(tmp_path_factory.mktemp("hostile"))
    copy_source(build, workdir / "exports")
    return workdir


def model_folder(workdir: Path, name: str, edit: Callable[[Path], None] | None = None) -> Path:
    """A copy of exports/ as folder ``name``, changed by ``edit``."""
    folder = workdir / name
    shutil.copytree(workdir / "exports", folder)
    if edit is not None:
        edit(folder)
    return folder


def config_for(workdir: Path, name: str, folder: Path | None = None, **sections: dict) -> Path:
    """A config building the files of ``folder`` (default exports/) as model ``name``: one packed variant of the
    reference toolchain, whose containers the tests read back, with the embedding in the graph."""
    files = (folder or workdir / "exports").relative_to(workdir)
    model = {"name": name, "prompt_onnx": f"{files}/prompt.onnx", "token_onnx": f"{files}/token.onnx",
             "encodings": {graph: f"{files}/{graph}.encodings.json" for graph in GRAPHS},
             "tokenizer": f"{files}/tokenizer.json", "hf_config": f"{files}/config.json"}
    overrides = {"model": model, "split": {"num_parts": 3}, "variants": {"packed": VARIANT},
                 "bundle": {"variant": "packed", "embedding": "graph"}, "report": {"baseline_variant": "packed"},
                 **sections}
    return write_config(workdir, overrides, name=f"{name}.yaml")


def edit_graphs(folder: Path, edit: Callable[[onnx.ModelProto], None], *, convert_attribute: bool = False) -> None:
    """Load both graphs with their weights, ``edit`` each, save them again with every tensor of 1 KiB or more
    external (``convert_attribute``: attribute tensors too, as onnx.save writes them then)."""
    for graph in GRAPHS:
        path = folder / f"{graph}.onnx"
        model = onnx.load(path)
        edit(model)
        (folder / f"{graph}.onnx.data").unlink()
        onnx.save(model, path, save_as_external_data=True, location=f"{graph}.onnx.data", size_threshold=1024,
                  convert_attribute=convert_attribute)


def edit_encodings(folder: Path, edit: Callable[[dict], None]) -> None:
    for graph in GRAPHS:
        path = folder / f"{graph}.encodings.json"
        document = json.loads(path.read_text())
        edit(document)
        path.write_text(json.dumps(document))


def weight_as_constant(model: onnx.ModelProto) -> None:
    """The shared weight becomes a Constant node's value (a node attribute), no longer an initializer."""
    tensor = next(t for t in model.graph.initializer if t.name == SHARED_WEIGHT)
    model.graph.initializer.remove(tensor)
    model.graph.node.insert(0, helper.make_node("Constant", [], [SHARED_WEIGHT], name="weight_constant", value=tensor))


def constant_folder(workdir: Path, name: str) -> Path:
    """The export with the shared weight as a Constant's value, its bytes in the folder's data file: no longer a
    parameter, so it has no param encoding (AIMET quantizes a Constant's output as an activation, if at all)."""
    def convert(folder: Path) -> None:
        edit_graphs(folder, weight_as_constant, convert_attribute=True)
        edit_encodings(folder, lambda document: document.update(param_encodings=[
            entry for entry in document["param_encodings"] if entry["name"] != SHARED_WEIGHT]))
    return model_folder(workdir, name, convert)


def constant_reference(folder: Path, graph: str = "prompt") -> dict[str, str]:
    model = onnx.load(folder / f"{graph}.onnx", load_external_data=False)
    stored = next(s for s in model_tensors(model) if s.tensor.name == SHARED_WEIGHT)
    return {entry.key: entry.value for entry in stored.tensor.external_data}


def set_constant_reference(folder: Path, **changes: str) -> None:
    """Point the Constant's external data elsewhere in both graphs (the data files stay as they are)."""
    for graph in GRAPHS:
        path = folder / f"{graph}.onnx"
        model = onnx.load(path, load_external_data=False)
        stored = next(s for s in model_tensors(model) if s.tensor.name == SHARED_WEIGHT)
        for entry in stored.tensor.external_data:
            entry.value = changes.get(entry.key, entry.value)
        onnx.save(model, path)


def last_log_lines(workdir: Path, result) -> dict[str, str]:
    """Rule -> the last line of its log, for every job Snakemake reports as failed."""
    return {rule: (workdir / log).read_text().strip().splitlines()[-1]
            for rule, log in failed_job_logs(result.stdout + result.stderr).items()}


# ------------------------------------------------------------------------------------------- attribute tensors

@pytest.fixture(scope="module")
def built_constant(build: ReferenceBuild, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A whole build of the export whose shared weight is a Constant's value, in a working directory of its own."""
    workdir = copy_workflow(tmp_path_factory.mktemp("constant-build"))
    copy_source(build, workdir / "exports")
    folder = constant_folder(workdir, "const")
    config = config_for(workdir, "const", folder)
    run_snakemake(workdir, config_file=config)
    return workdir, config


def test_a_constant_weight_builds_a_bundle_that_holds_all_it_needs_and_runs_as_the_unsplit_model(
        built_constant: tuple[Path, Path]) -> None:
    """What was accepted and built wrong: the binaries referred to a .data file that is not in the bundle."""
    workdir, _ = built_constant
    out = workdir / "results" / "const"
    assert load_json(out / "bundle_check.json")["errors"] == 0
    host_run = load_json(out / "host_run.json")
    assert host_run["new_ids"] == host_run["reference_ids"]
    bundle_files = {path.name for path in (out / "genie_bundle").iterdir()}
    assert not any(name.endswith(".data") for name in bundle_files)
    for ctx_bin in sorted((out / "genie_bundle").glob("*.bin")):
        for graph in read_graphs(ctx_bin).values():
            assert [s.what for s in model_tensors(graph.model)
                    if s.tensor.data_location == onnx.TensorProto.EXTERNAL] == []
    constants = [s for graph in read_graphs(out / "genie_bundle" / "const_part_2_of_3.bin").values()
                 for s in model_tensors(graph.model) if s.tensor.name == SHARED_WEIGHT]
    assert constants and all(s.tensor.raw_data for s in constants)


def test_the_data_file_of_a_constant_is_an_input_of_the_jobs_that_read_it(built_constant: tuple[Path, Path],
                                                                          tmp_path: Path) -> None:
    workdir = clone_workdir(built_constant[0], tmp_path / "w")
    data = workdir / "const" / "prompt.onnx.data"
    reference = constant_reference(workdir / "const")
    with open(data, "r+b") as handle:  # the Constant's first value, changed in place: the .onnx is untouched
        handle.seek(int(reference.get("offset", 0)))
        handle.write(np.float32(0.5).tobytes())
    result = run_snakemake(workdir, "-n", config_file=built_constant[1])
    assert "split" in result.stdout and "check_model" in result.stdout


@pytest.mark.parametrize("where", ["absolute", "parent", "link"])
def test_attribute_data_outside_the_model_folder_is_refused_before_any_job(workflow: Path, where: str) -> None:
    """Bytes from outside the model folder ended up in the parts; now nothing there is read at all."""
    name = f"outside-{where}"
    folder = constant_folder(workflow, name)
    secret = workflow / f"{name}.secret"
    shutil.copy(folder / "prompt.onnx.data", secret)
    location = {"absolute": str(secret), "parent": f"../{secret.name}", "link": "link.data"}[where]
    if where == "link":
        (folder / "link.data").symlink_to(secret)
    set_constant_reference(folder, location=location)
    result = run_snakemake(workflow, config_file=config_for(workflow, name, folder), check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert (f"config model.prompt_onnx: {name}/prompt.onnx: attribute 'value' of node 'weight_constant' (Constant): "
            in output)
    assert ("must be a file name relative to the model's folder" if where != "link"
            else f"resolves to {secret}, outside {workflow / name}") in output
    assert not (workflow / "results" / name).exists()


@pytest.mark.parametrize(("offset", "problem"), [
    ("abc", "external data offset 'abc' is not a non-negative integer"),
    ("-64", "external data offset '-64' is not a non-negative integer"),
    (str(2**40), "runs past the end of"),
])
def test_a_malformed_offset_is_refused_before_any_job_naming_the_users_file(workflow: Path, offset: str,
                                                                            problem: str) -> None:
    name = f"offset-{len(offset)}-{offset[0] == '-'}"
    folder = constant_folder(workflow, name)
    set_constant_reference(folder, offset=offset)
    result = run_snakemake(workflow, config_file=config_for(workflow, name, folder), check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and f"config model.prompt_onnx: {name}/prompt.onnx: " in output
    assert problem in output and "Traceback (most recent call last)" not in result.stderr.split("WorkflowError")[-1]
    assert not (workflow / "results" / name).exists()


@pytest.mark.parametrize("fault", ["duplicate", "shape"])
def test_a_duplicate_initializer_and_a_wrong_weight_shape_name_the_users_file(workflow: Path, fault: str) -> None:
    """Both were blamed on the output part (part_2_of_3.onnx) after the split."""
    def break_graph(model: onnx.ModelProto) -> None:
        tensor = next(t for t in model.graph.initializer if t.name == SHARED_WEIGHT)
        if fault == "duplicate":
            model.graph.initializer.append(tensor)
        else:  # one input row too many for its MatMul: the encodings' output channels still fit
            values = numpy_helper.to_array(tensor)
            tensor.CopyFrom(numpy_helper.from_array(np.zeros((values.shape[0] + 1, values.shape[1]), values.dtype),
                                                    SHARED_WEIGHT))

    name = f"graph-{fault}"
    folder = model_folder(workflow, name, lambda path: edit_graphs(path, break_graph))
    result = run_snakemake(workflow, config_file=config_for(workflow, name, folder), check=False)
    assert result.returncode != 0
    if fault == "duplicate":  # the user's graph is checked before any job
        assert (f"config model.prompt_onnx: {name}/prompt.onnx: initializer '{SHARED_WEIGHT}' is defined 2 times"
                in result.stdout + result.stderr)
        assert not (workflow / "results" / name).exists()
        return
    lines = last_log_lines(workflow, result)
    assert lines and all(line.startswith(f"genie-build: error: {name}/") for line in lines.values()), lines
    assert any("cut from it is not a valid ONNX model" in line for line in lines.values()), lines
    assert not any(path.is_file() for path in (workflow / "results" / name / "parts").rglob("*")), "a part was kept"


# ------------------------------------------------------------------------------------------- values as stored

@pytest.mark.parametrize(("scale", "state"), [(1e-300, "is 0 in float32"), (1e300, "is inf in float32")])
def test_a_scale_that_vanishes_in_float32_stops_the_job_reading_it(workflow: Path, scale: float, state: str) -> None:
    def set_scale(document: dict) -> None:
        entry = next(e for e in document["param_encodings"] if e["name"] == SHARED_WEIGHT)
        entry["scale"][0] = scale

    name = f"scale-{scale:.0e}".replace("+", "")
    folder = model_folder(workflow, name, lambda path: edit_encodings(path, set_scale))
    result = run_snakemake(workflow, config_file=config_for(workflow, name, folder), check=False)
    lines = last_log_lines(workflow, result)
    assert result.returncode != 0 and lines
    for line in lines.values():
        assert line.startswith(f"genie-build: error: {name}/") and f"param encoding '{SHARED_WEIGHT}'" in line
        assert f"scale[0] {scale!r} {state}" in line
    assert not (workflow / "results" / name / "converted").exists()
    assert not (workflow / "results" / name / "genie_bundle").exists()


def test_is_sym_with_offset_zero_on_a_weight_with_negative_values_stops_its_convert(workflow: Path) -> None:
    """Every negative weight would have become 0, and the host run compared the bundle with an unsplit model
    quantized the same wrong way: exit 0."""
    def zero_offsets(document: dict) -> None:
        entry = next(e for e in document["param_encodings"] if e["name"] == SHARED_WEIGHT)
        entry["offset"] = [0] * len(entry["offset"])

    name = "sym-offset-0"
    folder = model_folder(workflow, name, lambda path: edit_encodings(path, zero_offsets))
    result = run_snakemake(workflow, config_file=config_for(workflow, name, folder), check=False)
    lines = last_log_lines(workflow, result)
    assert result.returncode != 0 and lines
    assert any(f"param encoding '{SHARED_WEIGHT}': the weight's value -" in line and "is negative, but the "
               "encoding's grid (offset 0) holds no negative value" in line for line in lines.values()), lines
    assert not (workflow / "results" / name / "genie_bundle").exists()


def test_a_nan_in_an_unquantized_float_weight_stops_the_build_naming_file_tensor_and_value(workflow: Path) -> None:
    def poison(model: onnx.ModelProto) -> None:
        tensor = next(t for t in model.graph.initializer if t.name == UNQUANTIZED)
        values = numpy_helper.to_array(tensor).copy()
        values[3] = np.nan
        tensor.CopyFrom(numpy_helper.from_array(values, UNQUANTIZED))

    name = "nan-weight"
    folder = model_folder(workflow, name, lambda path: edit_graphs(path, poison))
    result = run_snakemake(workflow, config_file=config_for(workflow, name, folder), check=False)
    lines = last_log_lines(workflow, result)
    assert result.returncode != 0 and lines
    assert any(f"initializer '{UNQUANTIZED}' holds nan at index [3]" in line and "every float weight must be finite"
               in line for line in lines.values()), lines
    assert not (workflow / "results" / name / "genie_bundle").exists()


# ------------------------------------------------------------------------------------------- model, tokenizer, config

@pytest.mark.parametrize("disagreement", ["tokenizer", "config"])
def test_a_tokenizer_or_config_that_disagrees_with_the_model_stops_before_any_split(
        workflow: Path, build: ReferenceBuild, disagreement: str) -> None:
    """Errors about them came only after every convert and compile, or not at all (n-vocab 4096 for 2048
    logits shipped with a warning)."""
    vocab = json.loads((build.source / "config.json").read_text())["vocab_size"]

    def disagree(folder: Path) -> None:
        if disagreement == "tokenizer":
            write_tokenizer(folder / "tokenizer.json", vocab + 8)
        else:
            config = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 2 * vocab}))

    name = f"disagree-{disagreement}"
    folder = model_folder(workflow, name, disagree)
    result = run_snakemake(workflow, config_file=config_for(workflow, name, folder), check=False)
    lines = last_log_lines(workflow, result)
    assert result.returncode != 0 and set(lines) == {"check_contract"}, lines
    problem = (f"has id {vocab + 7}, beyond the model's {vocab} logits" if disagreement == "tokenizer"
               else f"vocab_size is {2 * vocab} but the prompt graph's logits have {vocab} entries")
    file = "tokenizer.json" if disagreement == "tokenizer" else "config.json"
    assert lines["check_contract"].startswith(f"genie-build: error: {name}/{file}: ") and problem in lines[
        "check_contract"]
    out = workflow / "results" / name
    assert not (out / "plan.json").exists() and not (out / "parts").exists() and leftovers(out) == []


def test_a_variant_named_like_an_option_is_refused_before_any_job(workflow: Path) -> None:
    config = config_for(workflow, "option-variant", variants={"-v": VARIANT}, bundle={"variant": "-v"},
                        report={"baseline_variant": "-v"})
    result = run_snakemake(workflow, config_file=config, check=False)
    assert result.returncode != 0
    assert "config variants: '-v' does not match" in result.stdout + result.stderr
    assert not (workflow / "results" / "option-variant").exists()


# ------------------------------------------------------------------------------------------- a failed bundle check

def test_a_bundle_that_fails_its_check_is_moved_aside_and_a_rerun_builds_it_again(built_constant: tuple[Path, Path],
                                                                                  tmp_path: Path) -> None:
    workdir = clone_workdir(built_constant[0], tmp_path / "w")
    config = built_constant[1]
    out = workdir / "results" / "const"
    ctx_bin = out / "genie_bundle" / "const_part_2_of_3.bin"
    ctx_bin.write_bytes(ctx_bin.read_bytes()[:-1] + b"\x00")  # changed after the build: the manifest disagrees
    result = run_snakemake(workdir, "--forcerun", "check_bundle", config_file=config, check=False)
    assert result.returncode != 0
    assert "const_part_2_of_3.bin does not match its sha256 in manifest.json" in (
        out / "logs" / "check_bundle.log").read_text()
    assert not (out / "genie_bundle").exists() and (out / "genie_bundle.rejected" / "manifest.json").exists()
    assert not (out / "bundle_check.json").exists()
    run_snakemake(workdir, config_file=config)
    assert load_json(out / "bundle_check.json")["errors"] == 0
    assert (out / "genie_bundle" / "manifest.json").exists() and ctx_bin.read_bytes() == (
        out / "compiled" / "packed" / "part_2_of_3.bin").read_bytes()
    assert os.path.isdir(out / "genie_bundle.rejected")  # kept for a look at what failed, never read by the build
