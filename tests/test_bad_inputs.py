"""The bad-input contract, end to end: every bad input gives one line naming the file (or config key) and the
problem, a non-zero exit, and no partial output that a later run would take as done.

The commands run as the workflow runs them (``python -m genie_build <command>`` in a subprocess: exit code 2,
stderr's last line ``genie-build: error: <file>: <problem>``); a few cases also run the whole workflow on a
user-model config. The readers' own unit tests (test_onnx_graph, test_encodings, test_genie_config, ...) cover
the messages in detail; this file checks the contract around them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from genie_build.conventions import PART_WEIGHTS_NAME
from genie_build.encodings import read_encodings
from genie_build.plan.plan_file import read_plan
from bundle_helpers import TINY_DEMO, VARIANT, ReferenceBuild
from workflow_helpers import copy_workflow, run_snakemake, write_config

SHARED_WEIGHT = "model.layers.0.mlp.up_proj.weight"
SOURCE_FILES = ("prompt.onnx", "prompt.onnx.data", "token.onnx", "token.onnx.data", "prompt.encodings.json",
                "token.encodings.json", "tokenizer.json", "config.json")


def genie_build(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "genie_build", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True)


def leftovers(directory: Path) -> list[Path]:
    """Temporary files or staging directories a writer left behind (fileio names them ``.<name>.*.tmp``)."""
    return sorted(path for path in directory.rglob(".*") if path.name.endswith((".tmp", ".old")))


def files_under(directory: Path) -> list[Path]:
    """Every file (hidden or not: a temporary, a split's ``.<graph>.*`` staging folder) under ``directory``."""
    return sorted(path for path in directory.rglob("*") if not path.is_dir())


# ------------------------------------------------------------------------------------------- bad inputs

def copy_source(build: ReferenceBuild, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in SOURCE_FILES:
        shutil.copy2(build.source / name, dest / name)
    return dest


def edit_encodings(path: Path, edit: Callable[[dict], None]) -> Path:
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))
    return path


def change_shared_weight(onnx_path: Path, change: Callable[[np.ndarray], np.ndarray]) -> None:
    """Rewrite one initializer of ``onnx_path`` (and its external data file) with ``change`` applied."""
    model = onnx.load(onnx_path)
    for init in model.graph.initializer:
        if init.name == SHARED_WEIGHT:
            init.CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(init)), init.name))
    onnx.save(model, onnx_path, save_as_external_data=True, location=f"{onnx_path.name}.data", size_threshold=0)


@dataclass(frozen=True)
class Case:
    """A command line with one bad input: the error must name ``where``, match ``problem``, and leave nothing
    at ``outputs`` (nor any other file in the output folder)."""

    args: tuple
    where: str
    problem: str
    outputs: tuple[Path, ...]


def plan_case(src: Path, out: Path, where: object, problem: str, *, prompt: Path | None = None,
              token: Path | None = None, encodings: Path | None = None, num_parts: int = 2) -> Case:
    args = ("plan", "--prompt", prompt or src / "prompt.onnx", "--token", token or src / "token.onnx",
            "--encodings-prompt", encodings or src / "prompt.encodings.json",
            "--num-parts", num_parts, "--out", out / "plan.json")
    return Case(args, str(where), problem, (out / "plan.json",))


def missing_onnx(build: ReferenceBuild, src: Path, out: Path) -> Case:
    return plan_case(src, out, src / "none.onnx", "file not found", prompt=src / "none.onnx")


def truncated_onnx(build: ReferenceBuild, src: Path, out: Path) -> Case:
    path = src / "prompt.onnx"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return plan_case(src, out, path, "not a valid ONNX model")


def corrupt_onnx(build: ReferenceBuild, src: Path, out: Path) -> Case:
    path = src / "token.onnx"
    path.write_bytes(b"\xff" * 64 + path.read_bytes()[64:])
    return plan_case(src, out, path, "not a valid ONNX model")


def missing_external_data(build: ReferenceBuild, src: Path, out: Path) -> Case:
    (src / "prompt.onnx.data").unlink()
    return plan_case(src, out, src / "prompt.onnx", r"external data file .*prompt\.onnx\.data not found")


def truncated_external_data(build: ReferenceBuild, src: Path, out: Path) -> Case:
    data = src / "token.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    return plan_case(src, out, src / "token.onnx", r"runs past the end of .*token\.onnx\.data")


def initializer_shapes_differ(build: ReferenceBuild, src: Path, out: Path) -> Case:
    change_shared_weight(src / "token.onnx", lambda array: array.T.copy())
    return plan_case(src, out, src / "token.onnx", rf"'{SHARED_WEIGHT}' has shape \[\d+, \d+\] in the prompt graph")


def initializer_values_differ(build: ReferenceBuild, src: Path, out: Path) -> Case:
    change_shared_weight(src / "token.onnx", lambda array: array + np.float32(1))
    return plan_case(src, out, src / "token.onnx", rf"'{SHARED_WEIGHT}' has the same shape .* but different values")


def malformed_encodings(build: ReferenceBuild, src: Path, out: Path) -> Case:
    path = src / "prompt.encodings.json"
    path.write_text(path.read_text()[:200])
    return plan_case(src, out, path, "not valid JSON")


def unsupported_bitwidth(build: ReferenceBuild, src: Path, out: Path) -> Case:
    path = edit_encodings(src / "prompt.encodings.json", lambda doc: doc["param_encodings"][0].update(bw=3))
    return plan_case(src, out, path, r"param encoding '.*': bw 3 is not supported for int")


def non_positive_scale(build: ReferenceBuild, src: Path, out: Path) -> Case:
    def zero_scale(doc: dict) -> None:
        doc["activation_encodings"][0]["scale"][0] = 0.0
    path = edit_encodings(src / "prompt.encodings.json", zero_scale)
    return plan_case(src, out, path, r"activation encoding '.*': scale\[0\] 0\.0 is not a positive finite number")


def impossible_split(build: ReferenceBuild, src: Path, out: Path) -> Case:
    return plan_case(src, out, "split.num_parts", r"99 parts requested.*feasible: 2\.\.3", num_parts=99)


def part_labels(build: ReferenceBuild) -> list[str]:
    return [part.label for part in read_plan(build.root / "plan.json").parts]


def slice_case(build: ReferenceBuild, src: Path, out: Path, where: object, problem: str) -> Case:
    encodings = src / "prompt.encodings.json"
    return Case(("slice-graph-encodings", "--graph", "prompt", "--model", src / "prompt.onnx", "--encodings", encodings,
                 "--parts-dir", build.root / "parts", "--out-dir", out / "encodings"),
                str(where), problem,
                tuple(out / "encodings" / f"part_{label}" / "prompt.encodings.json" for label in part_labels(build)))


def encodings_name_unknown_tensors(build: ReferenceBuild, src: Path, out: Path) -> Case:
    def add_unknown(doc: dict) -> None:
        doc["activation_encodings"].append(dict(doc["activation_encodings"][0], name="no_such_tensor"))
    path = edit_encodings(src / "prompt.encodings.json", add_unknown)
    return slice_case(build, src, out, path, "1 encodings name tensors the model does not have: "
                                             "activation 'no_such_tensor'")


def split_case(build: ReferenceBuild, src: Path, out: Path, where: object, problem: str) -> Case:
    return Case(("split", "--plan", build.root / "plan.json", "--graph", f"prompt={src / 'prompt.onnx'}",
                 f"token={src / 'token.onnx'}", "--parts-dir", out / "parts"), str(where), problem,
                tuple(out / "parts" / f"part_{label}" / name for label in part_labels(build)
                      for name in ("prompt.onnx", "token.onnx", PART_WEIGHTS_NAME)))


def split_with_truncated_data(build: ReferenceBuild, src: Path, out: Path) -> Case:
    data = src / "token.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    return split_case(build, src, out, src / "token.onnx", r"runs past the end of .*token\.onnx\.data")


def compile_case(build: ReferenceBuild, out: Path, where: object, problem: str, chipset: str = "SM8750") -> Case:
    graphs = [item for kind, ar in (("prompt", TINY_DEMO["ar"]), ("token", 1))
              for item in ("--graph", f"{kind}_ar{ar}_cl{TINY_DEMO['context']}_1_of_3="
                                      f"{build.root / 'converted' / kind / 'part_1_of_3.onnx'}")]
    return Case(("compile", "--toolchain", "reference", *graphs, "--variant-json", json.dumps(VARIANT),
                 "--chipset", chipset, "--out", out / "part.bin"), str(where), problem, (out / "part.bin",))


def compile_for_unknown_chipset(build: ReferenceBuild, src: Path, out: Path) -> Case:
    return compile_case(build, out, "target.chipset", "unknown chipset 'SM0000'; known: SM8550", chipset="SM0000")


def bundle_case(build: ReferenceBuild, src: Path, out: Path, where: object, problem: str, *,
                tokenizer: Path | None = None, chipset: str = "SM8750") -> Case:
    return Case(("bundle", "--binaries", *build.binaries, "--toolchain", "reference", "--model-name", "demo",
                 "--hf-config", src / "config.json", "--tokenizer", tokenizer or src / "tokenizer.json",
                 "--chipset", chipset, "--out-dir", out / "genie_bundle"),
                str(where), problem, (out / "genie_bundle",))


def hf_config_with_both_rope_styles(build: ReferenceBuild, src: Path, out: Path) -> Case:
    path = src / "config.json"
    config = json.loads(path.read_text())
    config["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192}
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": config["rope_theta"]}
    path.write_text(json.dumps(config))
    return bundle_case(build, src, out, path, "states both rope styles: rope_scaling says 'llama3', "
                                              "rope_parameters says 'default'; keep one")


def hf_config_without_bos(build: ReferenceBuild, src: Path, out: Path) -> Case:
    path = src / "config.json"
    config = json.loads(path.read_text())
    del config["bos_token_id"]
    path.write_text(json.dumps(config))
    return bundle_case(build, src, out, path, "bos_token_id must be an integer token id, got None")


def missing_tokenizer(build: ReferenceBuild, src: Path, out: Path) -> Case:
    return bundle_case(build, src, out, src / "none.json", "tokenizer not found", tokenizer=src / "none.json")


def bundle_for_unknown_chipset(build: ReferenceBuild, src: Path, out: Path) -> Case:
    return bundle_case(build, src, out, "target.chipset", "unknown chipset 'QX1'", chipset="QX1")


CASES = [missing_onnx, truncated_onnx, corrupt_onnx, missing_external_data, truncated_external_data,
         initializer_shapes_differ, initializer_values_differ, malformed_encodings, unsupported_bitwidth,
         non_positive_scale, impossible_split, encodings_name_unknown_tensors, split_with_truncated_data,
         compile_for_unknown_chipset, hf_config_with_both_rope_styles, hf_config_without_bos, missing_tokenizer,
         bundle_for_unknown_chipset]


@pytest.mark.parametrize("make_case", CASES, ids=[case.__name__ for case in CASES])
def test_command_fails_with_one_line_and_no_output(build: ReferenceBuild, tmp_path: Path,
                                                  make_case: Callable[..., Case]) -> None:
    src, out = copy_source(build, tmp_path / "src"), tmp_path / "out"
    case = make_case(build, src, out)
    before = {path: path.read_bytes() for path in src.iterdir()}
    result = genie_build(*case.args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"genie-build: error: {case.where}: "), last
    assert re.search(case.problem, last.removeprefix(f"genie-build: error: {case.where}: ")), last
    assert [line for line in result.stderr.splitlines() if "error" in line.lower()] == [last]
    assert not any(path.exists() for path in case.outputs)
    assert not out.exists() or files_under(out) == [], "a failed command left a file in the output folder"
    assert leftovers(tmp_path) == []
    assert {path: path.read_bytes() for path in src.iterdir()} == before, "an input was modified"


def test_the_unchanged_inputs_pass_every_command_above(build: ReferenceBuild, tmp_path: Path) -> None:
    """Without the one bad input, the same command lines succeed: each case fails for its own reason."""
    src, out = copy_source(build, tmp_path / "src"), tmp_path / "out"
    good = [plan_case(src, out, "", ""), slice_case(build, src, out, "", ""), split_case(build, src, out, "", ""),
            compile_case(build, out, "", ""), bundle_case(build, src, out, "", "")]
    for case in good:
        result = genie_build(*case.args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        assert all(path.exists() for path in case.outputs)


# ------------------------------------------------------------------------------------------- the workflow

@pytest.fixture(scope="module")
def workflow(build: ReferenceBuild, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the workflow with the tiny demo's files as a user export in exports/."""
    workdir = copy_workflow(tmp_path_factory.mktemp("wf"))
    copy_source(build, workdir / "exports")
    return workdir


USER_MODEL = {"prompt_onnx": "exports/prompt.onnx", "token_onnx": "exports/token.onnx",
              "encodings": {"prompt": "exports/prompt.encodings.json", "token": "exports/token.encodings.json"},
              "tokenizer": "exports/tokenizer.json", "hf_config": "exports/config.json"}


def visible_entries(directory: Path) -> set[str]:
    """Names in ``directory`` except Snakemake's and the caches' hidden folders."""
    return {path.name for path in directory.iterdir() if not path.name.startswith(".")}


def user_config(workdir: Path, name: str, model: dict | None = None, **sections: dict) -> Path:
    """A config for the export in exports/ with ``model`` keys and whole ``sections`` replaced."""
    overrides = {"model": {"name": name, **USER_MODEL, **(model or {})}, "split": {"num_parts": 2}, **sections}
    return write_config(workdir, overrides, name=f"{name}.yaml")


@pytest.mark.workflow
@pytest.mark.parametrize("name", ["../x", "/abs", "a/b", "-rf"])
def test_model_name_cannot_write_outside_results(workflow: Path, name: str) -> None:
    config = user_config(workflow, "escape", model={"name": name})
    before = visible_entries(workflow)
    result = run_snakemake(workflow, config_file=config, check=False)
    assert result.returncode != 0
    assert f"config model.name: {name!r} does not match" in result.stdout + result.stderr
    assert visible_entries(workflow) == before  # nothing new beside results/, e.g. no x/ from "../x"
    assert not (workflow / "results").exists()


@pytest.mark.workflow
def test_missing_user_file_is_named_before_any_job(workflow: Path) -> None:
    config = user_config(workflow, "notok", model={"tokenizer": "exports/none.json"})
    result = run_snakemake(workflow, config_file=config, check=False)
    assert result.returncode != 0
    assert "exports/none.json" in result.stdout + result.stderr
    assert not (workflow / "results" / "notok").exists()


def failed_job_logs(snakemake_output: str) -> dict[str, str]:
    """Rule -> log file of every job Snakemake reports as failed ("Error in rule X:" ... "log: <path> (check")."""
    blocks = snakemake_output.split("Error in rule ")[1:]
    return {block.split(":", 1)[0]: re.search(r"\n\s+log: (\S+) \(check", block).group(1) for block in blocks}


@pytest.mark.workflow
@pytest.mark.parametrize("edit, message, absent", [
    (lambda text: text[:200], "exports/bad.encodings.json: not valid JSON", ("plan.json",)),
    (lambda text: text.replace('"name": "attention_mask"', '"name": "no_such_tensor"', 1),
     "exports/bad.encodings.json: 1 encodings name tensors the model does not have",
     ("encodings/source", "unsplit/prompt.onnx")),
], ids=["malformed", "unknown-tensor"])
def test_bad_encodings_fail_the_jobs_reading_them_with_the_one_line_in_their_logs(
        workflow: Path, edit: Callable[[str], str], message: str, absent: tuple[str, ...]) -> None:
    text = (workflow / "exports" / "prompt.encodings.json").read_text()
    (workflow / "exports" / "bad.encodings.json").write_text(edit(text))
    name = f"bad-encodings-{len(absent)}"
    encodings = {"prompt": "exports/bad.encodings.json", "token": "exports/token.encodings.json"}
    result = run_snakemake(workflow, config_file=user_config(workflow, name, model={"encodings": encodings}),
                           check=False)
    out = workflow / "results" / name
    assert result.returncode != 0
    failed = failed_job_logs(result.stdout + result.stderr)
    assert failed, "no job failed"
    for rule, log in failed.items():  # which reader fails first depends on the job order
        last = (workflow / log).read_text().strip().splitlines()[-1]
        assert last.startswith(f"genie-build: error: {message}"), f"{rule}: {last}"
    assert not any((out / path).exists() for path in absent) and not (out / "genie_bundle").exists()
    assert leftovers(out) == []


@pytest.mark.workflow
def test_graphs_calibrated_one_by_one_stop_the_build_unless_the_token_graph_shares_the_prompts(
        workflow: Path) -> None:
    """Calibrated separately, the graphs' shared tensors differ (an activation, and a weight whose scale AIMET
    adjusted to the activations): the build stops naming the tensor and encodings.share_from; with
    share_from: prompt the token graph's slices take the prompt graph's encodings."""
    token = json.loads((workflow / "exports" / "token.encodings.json").read_text())
    activation = next(e for e in token["activation_encodings"] if e["name"] == "attention_mask")
    activation["scale"] = [activation["scale"][0] * 1.5]
    weight = token["param_encodings"][0]
    weight["scale"] = [value * 1.5 for value in weight["scale"]]
    (workflow / "exports" / "alone.encodings.json").write_text(json.dumps(token))
    encodings = {"prompt": "exports/prompt.encodings.json", "token": "exports/alone.encodings.json"}
    for name, share in (("alone-default", "none"), ("alone-shared", "prompt")):
        config = user_config(workflow, name, model={"encodings": encodings}, encodings={"share_from": share})
        result = run_snakemake(workflow, "-p", f"results/{name}/encodings/source", config_file=config,
                               check=share == "prompt")
        if share == "none":
            assert result.returncode != 0
            logs = failed_job_logs(result.stdout + result.stderr)
            assert logs, result.stdout[-3000:] + result.stderr[-3000:]
            for rule, log in logs.items():   # the plan (weights) or the slice job (any tensor) stops first
                last = (workflow / log).read_text().strip().splitlines()[-1]
                assert last.startswith("genie-build: error: ") and "share_from: prompt" in last, f"{rule}: {last}"
            continue
        prompt = read_encodings(workflow / "exports" / "prompt.encodings.json")
        sliced = workflow / "results" / name / "encodings" / "source"
        slices = [read_encodings(path) for path in sliced.glob("part_*/token.encodings.json")]
        assert slices
        for part in slices:
            for section, expected in ((part.activations, prompt.activations), (part.params, prompt.params)):
                assert all(encoding == expected.get(tensor, encoding) for tensor, encoding in section.items())
        assert any(weight["name"] in part.params for part in slices)
