"""Helpers for the rebuild, cache and cluster tests: a user-model build made from the small demo's files, in-place
edits of one weight or one encoding as a user would make them, and copies of a built working directory."""

from __future__ import annotations

import shutil
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import onnx
import yaml

from workflow_helpers import SMALL_DEMO, copy_workflow, run_snakemake, write_config

USER_MODEL = "user"
EXPORTS = "exports"
SOURCE_FILES = ("prompt.onnx", "prompt.onnx.data", "token.onnx", "token.onnx.data",
                "prompt.encodings.json", "token.encodings.json", "tokenizer.json", "config.json")


def export_small_demo(workdir: Path) -> Path:
    """Build only the small demo's source files and move them to ``workdir/exports``, where a user's export would be.

    Returns:
        The exports directory.
    """
    source = Path("results") / "demo" / "source"
    config_file = write_config(workdir, SMALL_DEMO, name="demo-config.yaml")
    run_snakemake(workdir, *(str(source / name) for name in SOURCE_FILES), config_file=config_file)
    exports = workdir / EXPORTS
    exports.mkdir()
    for name in SOURCE_FILES:
        shutil.move(workdir / source / name, exports / name)
    shutil.rmtree(workdir / "results")
    return exports


def user_model_checkout(workdir: Path, exports: Path) -> Path:
    """A new working directory ``workdir`` holding the workflow and a copy of ``exports``."""
    workdir.mkdir(parents=True)
    copy_workflow(workdir)
    shutil.copytree(exports, workdir / EXPORTS)
    return workdir


def user_model_config(workdir: Path, overrides: dict | None = None, name: str = "user-config.yaml") -> Path:
    """A config file building the files under ``exports/`` as a user's model (``model.name`` = USER_MODEL), split like
    SMALL_DEMO, with ``overrides`` merged in (one level deep)."""
    model = {
        "name": USER_MODEL,
        "prompt_onnx": f"{EXPORTS}/prompt.onnx",
        "token_onnx": f"{EXPORTS}/token.onnx",
        "encodings": {graph: f"{EXPORTS}/{graph}.encodings.json" for graph in ("prompt", "token")},
        "tokenizer": f"{EXPORTS}/tokenizer.json",
        "hf_config": f"{EXPORTS}/config.json",
    }
    return write_config(workdir, {**SMALL_DEMO, "model": model, **(overrides or {})}, name=name)


def variant_options(workdir: Path, variant: str) -> dict:
    """A variant's options as the default config gives them (the schema fills in the rest)."""
    return yaml.safe_load((workdir / "config" / "config.yaml").read_text())["variants"][variant]


def scale_initializer(model_path: Path, name: str, factor: float | np.ndarray) -> None:
    """Multiply one external initializer's values by ``factor`` in place, in the data file the graph names (an array
    broadcasts against the tensor's shape: one factor per channel of its last axis, say)."""
    model = onnx.load(str(model_path), load_external_data=False)
    tensor = next((t for t in model.graph.initializer if t.name == name), None)
    if tensor is None or tensor.data_location != onnx.TensorProto.EXTERNAL:
        raise ValueError(f"{model_path}: no external initializer {name!r}")
    info = {entry.key: entry.value for entry in tensor.external_data}
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    offset, length = int(info.get("offset", 0)), int(info["length"])
    with open(model_path.parent / info["location"], "r+b") as data:
        data.seek(offset)
        values = np.frombuffer(data.read(length), dtype=dtype).reshape(tuple(tensor.dims))
        data.seek(offset)
        data.write((values * np.asarray(factor, dtype=dtype)).astype(dtype).tobytes())


def clone_workdir(source: Path, dest: Path) -> Path:
    """Copy a built working directory with its Snakemake state (.snakemake/) and every file's mtime, so the copy
    is as up to date as the original: a test can change it without touching the original."""
    shutil.copytree(source, dest, symlinks=True)
    return dest


def matching(paths: set[str], *patterns: str) -> set[str]:
    """The paths matching any of the fnmatch ``patterns`` ('*' also matches '/')."""
    return {path for path in paths if any(fnmatch(path, pattern) for pattern in patterns)}
