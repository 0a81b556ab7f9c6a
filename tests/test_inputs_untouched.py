"""Inputs untouched: a build reads the user's files and never writes them -- not their bytes, not their mtimes
(a rewrite with the same bytes would still make Snakemake rebuild), not their modes -- whether it succeeds or fails.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from bundle_helpers import build_reference_bundle
from workflow_helpers import copy_workflow, run_snakemake, write_config

pytestmark = pytest.mark.workflow

SOURCE_FILES = ("prompt.onnx", "prompt.onnx.data", "token.onnx", "token.onnx.data", "prompt.encodings.json",
                "token.encodings.json", "tokenizer.json", "config.json")
USER_MODEL = {"prompt_onnx": "exports/prompt.onnx", "token_onnx": "exports/token.onnx",
              "encodings": {"prompt": "exports/prompt.encodings.json", "token": "exports/token.encodings.json"},
              "tokenizer": "exports/tokenizer.json", "hf_config": "exports/config.json"}


def fingerprints(paths: list[Path]) -> dict[str, tuple[str, int, int]]:
    """path -> (sha256, mtime_ns, mode) of each file."""
    return {str(path): (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns, path.stat().st_mode)
            for path in paths}


@pytest.fixture(scope="module")
def workflow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workflow copy with the tiny demo's files as a user export in exports/, and a corrupted copy of one."""
    source = build_reference_bundle(tmp_path_factory.mktemp("demo")).source
    workdir = copy_workflow(tmp_path_factory.mktemp("wf"))
    (workdir / "exports").mkdir()
    for name in SOURCE_FILES:
        shutil.copy2(source / name, workdir / "exports" / name)
    corrupt = (source / "prompt.encodings.json").read_bytes()[:300]  # truncated JSON
    (workdir / "exports" / "corrupt.encodings.json").write_bytes(corrupt)
    return workdir


def user_inputs(workdir: Path) -> list[Path]:
    """Every file a user hands the build: the export, the config files, the tokenizer corpus."""
    return sorted([*(workdir / "exports").iterdir(), *workdir.glob("*.yaml"), workdir / "config" / "config.yaml",
                   *(workdir / "resources").rglob("*")])


def config_for(workdir: Path, name: str, model: dict | None = None, **sections: dict) -> Path:
    """A config building the export as results/<name>/, with ``model`` keys and whole ``sections`` replaced."""
    overrides = {"model": {"name": name, **USER_MODEL, **(model or {})}, "split": {"num_parts": 2}, **sections}
    return write_config(workdir, overrides, name=f"{name}.yaml")


def test_a_full_build_leaves_every_input_as_it_was(workflow: Path) -> None:
    config = config_for(workflow, "full")
    before = fingerprints(user_inputs(workflow))
    run_snakemake(workflow, config_file=config)
    assert (workflow / "results" / "full" / "genie_bundle" / "manifest.json").is_file()
    assert fingerprints(user_inputs(workflow)) == before


@pytest.mark.parametrize("name, model, sections", [
    ("chipset", {}, {"target": {"chipset": "SM0000"}}),
    ("corrupt", {"encodings": {"prompt": "exports/corrupt.encodings.json",
                               "token": "exports/token.encodings.json"}}, {}),
])
def test_a_failed_build_leaves_every_input_as_it_was(workflow: Path, name: str, model: dict, sections: dict) -> None:
    config = config_for(workflow, name, model, **sections)
    before = fingerprints(user_inputs(workflow))
    result = run_snakemake(workflow, config_file=config, check=False)
    assert result.returncode != 0
    assert fingerprints(user_inputs(workflow)) == before
