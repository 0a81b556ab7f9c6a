"""Assemble the Genie bundle: ctx-bins in part order, the two configs, the tokenizer, ``metadata.yaml`` and
``manifest.json``.

The bundle is built in a staging directory, checked against Genie's load-time rules there
(:func:`genie_build.bundle.check_bundle.require_valid_bundle`) and only then renamed into place
(:func:`genie_build.fileio.atomic_directory`), so neither a half-built bundle nor one that fails its check ever sits
at the final path. Its bytes are deterministic: no timestamps, no absolute paths, sorted hashes — two runs on the
same inputs give identical manifests.

``metadata.yaml`` (per ctx-bin: graphs, IO tensors with shapes, dtypes and quantization, read back with the
toolchain's ``inspect``) has the format :mod:`genie_build.bundle.metadata` defines; ``manifest.json`` that of
:mod:`genie_build.bundle.manifest`.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from genie_build import __version__
from genie_build.bundle.check_bundle import require_valid_bundle
from genie_build.bundle.embedding_table import EMBEDDING_TABLE_NAME, dialog_embedding, read_table_file
from genie_build.bundle.manifest import MANIFEST_NAME, manifest_document
from genie_build.bundle.metadata import METADATA_NAME, dump_metadata
from genie_build.bundle_layout import BundleLayout
from genie_build.conventions import graph_ar_cl, part_label
from genie_build.errors import GenieBuildError
from genie_build.fileio import atomic_directory, write_json, write_text
from genie_build.genie_config import (GENIE_CONFIG_NAME, HTP_EXT_CONFIG_NAME, TOKENIZER_NAME, make_genie_config,
                                      make_htp_backend_ext_config)
from genie_build.hf_config import load_hf_config
from genie_build.toolchains import get_toolchain
from genie_build.toolchains.base import BinaryInfo

__all__ = ["assemble_bundle", "ctx_bin_name", "runtime_tool_versions", "withdraw_bundle"]

# Python packages whose versions shape the bundle's bytes (recorded in the manifest).
VERSIONED_PACKAGES = ("numpy", "onnx", "onnxruntime", "tokenizers", "pyyaml")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def ctx_bin_name(model_name: str, index: int, num_parts: int) -> str:
    """``ctx_bin_name("demo", 1, 6) == "demo_part_1_of_6.bin"``, zero-padded like every part label."""
    return f"{model_name}_part_{part_label(index, num_parts)}.bin"


def assemble_bundle(out_dir: str | os.PathLike[str], binaries: Sequence[str | os.PathLike[str]], toolchain: str,
                    hf_config_path: str | os.PathLike[str], tokenizer_path: str | os.PathLike[str], chipset: str,
                    context_size: int | None, config_used: Mapping[str, Any], tool_versions: Mapping[str, str], *,
                    model_name: str, share_resources: bool = False, graph_switching: bool | None = None,
                    embedding_table: str | os.PathLike[str] | None = None) -> Path:
    """Build the bundle at ``out_dir`` (replacing an old one only once the new one is complete).

    Args:
        out_dir: the bundle directory, e.g. ``results/demo/genie_bundle``.
        binaries: the compiled ctx-bins in part order.
        toolchain: the toolchain that compiled them (its ``inspect`` fills ``metadata.yaml``).
        hf_config_path: the model's HF ``config.json``.
        tokenizer_path: the model's ``tokenizer.json`` (copied into the bundle).
        chipset: target chipset name (``htp_backend_ext_config.json``).
        context_size: ``dialog.context.size``; None: the compiled context length (the largest CL).
        config_used: the workflow config, recorded in the manifest.
        share_resources: ``bundle.share_resources``: the extension config's ``groupContext`` and Genie's
            ``allow-async-init`` (:mod:`genie_build.htp_extensions`).
        graph_switching: ``bundle.graph_switching``: Genie's QnnHtp ``enable-graph-switching`` (None: not written).
        tool_versions: recorded in the manifest (see :func:`runtime_tool_versions`), with the version of the
            toolchain each ctx-bin says made it.
        model_name: prefix of the ctx-bin names.
        embedding_table: the embedding as a CPU table
            (:func:`genie_build.bundle.embedding_table.write_embedding_table`): copied as ``embedding_table.bin``
            and named in ``dialog.embedding``; ``binaries`` are then parts 2..N, their ctx-bins keeping their part
            numbers.

    Returns:
        ``out_dir`` as a Path.

    Raises:
        GenieBuildError: a missing input, an unreadable binary, or a bad HF config/tokenizer/chipset: nothing is
            left at ``out_dir`` then (an old bundle there stays as it was); or the new bundle fails its check (one
            line with every error): then an old bundle at ``out_dir`` is removed too, since these inputs no longer
            make it (and the workflow removes its manifest, the job's output, anyway).
    """
    if not _MODEL_NAME.match(model_name):
        raise GenieBuildError("model.name", f"{model_name!r} is not a safe file-name prefix "
                                            "(letters, digits, '_', '.', '-')")
    if not binaries:
        raise GenieBuildError(out_dir, "no ctx-bins to bundle")
    table = read_table_file(embedding_table) if embedding_table is not None else None
    first = BundleLayout("graph" if table is None else "lut").first_binary
    num_parts = len(binaries) + first - 1
    names = [ctx_bin_name(model_name, index, num_parts) for index in range(first, num_parts + 1)]
    infos = {name: _inspect(toolchain, Path(path)) for name, path in zip(names, binaries)}
    genie_config = make_genie_config(load_hf_config(hf_config_path), tokenizer_path, names,
                                     context_size or _compiled_context_length(infos), hf_config_path=hf_config_path,
                                     share_resources=share_resources, graph_switching=graph_switching,
                                     embedding=None if table is None else dialog_embedding(table.n_embd,
                                                                                           table.encoding),
                                     spill_fill_bufsize=max((graph.spill_fill_bytes or 0 for info in infos.values()
                                                             for graph in info.graphs), default=0))
    htp_config = make_htp_backend_ext_config(chipset, share_resources=share_resources)
    with atomic_directory(out_dir) as staging:
        for name, path in zip(names, binaries):
            shutil.copyfile(path, staging / name)
        shutil.copyfile(tokenizer_path, staging / TOKENIZER_NAME)
        if table is not None:
            shutil.copyfile(table.path, staging / EMBEDDING_TABLE_NAME)
        write_json(staging / GENIE_CONFIG_NAME, genie_config)
        write_json(staging / HTP_EXT_CONFIG_NAME, htp_config)
        write_text(staging / METADATA_NAME, dump_metadata(infos))
        versions = {**tool_versions, **{f"{info.toolchain} toolchain": info.tool_version for info in infos.values()},
                    **{"device runtime": info.device_runtime for info in infos.values() if info.device_runtime}}
        manifest = manifest_document(staging, versions, config_used)
        # keys sorted: the same config gives the same manifest whatever order its file lists keys in;
        # default=str: a YAML config may hold dates, which JSON has no type for
        write_text(staging / MANIFEST_NAME, json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")
        _require_valid(staging, Path(out_dir), hf_config_path, chipset)
    return Path(out_dir)


def _require_valid(staging: Path, out_dir: Path, hf_config_path: str | os.PathLike[str], chipset: str) -> None:
    """The staged bundle passes check-bundle's rules (its manifest was just made from the files, so it is not
    hashed again); otherwise any old bundle at ``out_dir`` goes as well, and nothing there looks finished.

    Raises:
        GenieBuildError: naming the staging directory (reported as ``out_dir``) and every error.
    """
    try:
        require_valid_bundle(staging, hf_config_path, chipset, manifest=False)
    except GenieBuildError:
        shutil.rmtree(out_dir, ignore_errors=True)
        raise


def withdraw_bundle(bundle_dir: str | os.PathLike[str]) -> Path:
    """Move a bundle that failed its check aside, to ``<bundle_dir>.rejected`` (replacing an older one), so that
    nothing at ``bundle_dir`` looks finished and the workflow, missing the bundle's manifest, builds it again.

    Returns:
        Where the bundle is now.

    Raises:
        GenieBuildError: it cannot be moved.
    """
    bundle = Path(bundle_dir)
    rejected = bundle.with_name(bundle.name + ".rejected")
    try:
        shutil.rmtree(rejected, ignore_errors=True)
        os.replace(bundle, rejected)
    except OSError as exc:
        raise GenieBuildError(bundle, f"cannot move the bundle aside to {rejected}: {exc.strerror or exc}") from None
    return rejected


def _compiled_context_length(infos: Mapping[str, BinaryInfo]) -> int:
    """The largest context length (CL) of the ctx-bins' graphs, as Genie derives it ("loaded max-CL").

    Raises:
        GenieBuildError: no graph has a readable CL.
    """
    lengths = [cl for info in infos.values() for graph in info.graphs
               for cl in [graph_ar_cl(graph.name, graph.inputs, graph.outputs)[1]] if cl is not None]
    if not lengths:
        raise GenieBuildError(next(iter(infos)), "no graph gives its context length (attention_mask or 'cl' in "
                                                 "its name); pass the context size explicitly")
    return max(lengths)


def runtime_tool_versions() -> dict[str, str]:
    """genie-build, Python and the packages in :data:`VERSIONED_PACKAGES`."""
    versions = {"genie-build": __version__, "python": platform.python_version()}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def _inspect(toolchain: str, path: Path) -> BinaryInfo:
    if not path.is_file():
        raise GenieBuildError(path, "ctx-bin not found")
    return get_toolchain(toolchain).inspect(path)
