"""A bundle's ``manifest.json``: the sha256 and size of every other file of the bundle, the tool versions and the
workflow config that made it. :mod:`genie_build.bundle.bundle` writes it, :mod:`genie_build.bundle.check_bundle`
checks it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from genie_build.fileio import sha256_file

__all__ = ["MANIFEST_FORMAT", "MANIFEST_NAME", "manifest_document"]

MANIFEST_FORMAT = "genie-build-manifest/1"
MANIFEST_NAME = "manifest.json"


def manifest_document(bundle_dir: Path, tool_versions: Mapping[str, str],
                      config_used: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest: sha256 of every file in ``bundle_dir`` (but the manifest), tool versions, the config."""
    files = sorted(p for p in bundle_dir.iterdir() if p.is_file() and p.name != MANIFEST_NAME)
    return {"format": MANIFEST_FORMAT,
            "files": {p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in files},
            "tool_versions": dict(tool_versions),
            "config_used": dict(config_used)}
