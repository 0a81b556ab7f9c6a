"""What every check of a bundle stands on: the finding it reports, and reading the bundle's files as the checker
reads them -- only regular files inside the bundle's folder (symlinks resolved: a link out of it is a finding, never
followed), each within a size bound (:func:`genie_build.fileio.open_regular`).

:mod:`genie_build.bundle.check_bundle` runs the checks; :mod:`genie_build.bundle.check_embedding` is one of them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from genie_build.errors import GenieBuildError
from genie_build.fileio import read_json, regular_file_size, resolve_inside
from genie_build.units import GIB, MIB

__all__ = ["Finding", "MAX_CTX_BIN_BYTES", "MAX_DOCUMENT_BYTES", "MAX_HASHED_BYTES", "Severity", "bundle_file_problem",
           "bundle_path", "config_value", "is_inside", "load_bundle_json"]

Severity = Literal["error", "warning"]

# Bounds of what the checker reads. The JSON and YAML documents of a bundle are kilobytes to a few megabytes (a
# many-part metadata.yaml); a ctx-bin an HTP session can map is under 4 GB (3.75 GB of a session's address space is
# usable), so a file larger than this is no ctx-bin; and all the hashing a manifest can ask for stays bounded.
MAX_DOCUMENT_BYTES = 16 * MIB
MAX_CTX_BIN_BYTES = 8 * GIB
MAX_HASHED_BYTES = 64 * GIB


@dataclass(frozen=True)
class Finding:
    """One violation: ``rule`` is a key of :data:`genie_build.bundle.check_bundle.RULES`."""

    rule: str
    severity: Severity
    message: str

    def __str__(self) -> str:
        return f"{self.severity} [{self.rule}] {self.message}"


def bundle_file_problem(bundle: Path, name: str, max_bytes: int) -> str | None:
    """Why ``name`` (a path a config or manifest gives) is not a regular file of at most ``max_bytes`` inside the
    bundle; None when it is. Nothing is opened for a name that is absolute or climbs out."""
    relative = bundle_path(name)
    if relative is None:
        return "must be a relative path inside the bundle"
    path = bundle / relative
    if not os.path.lexists(path):
        return "is not in the bundle"
    try:
        regular_file_size(path, inside=[bundle], max_bytes=max_bytes)
    except GenieBuildError as exc:
        return exc.problem
    return None


def is_inside(bundle: Path, path: Path) -> bool:
    """Whether ``path`` lies inside the bundle once symlinks are resolved."""
    try:
        resolve_inside(path, [bundle])
    except GenieBuildError:
        return False
    return True


def bundle_path(name: str) -> PurePosixPath | None:
    """A path the config gives, normalised, when it stays inside the bundle; None when absolute or climbing out."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        return None
    return path


def load_bundle_json(bundle: Path, name: str) -> tuple[Any, list[Finding]]:
    """A JSON document of the bundle: a regular file inside it of at most :data:`MAX_DOCUMENT_BYTES`, and JSON as
    the vendor's parsers read it (Python's reader takes ``NaN`` and ``Infinity``; Genie's and the HTP extensions'
    refuse the whole file: each is a finding, the document still returned for the other checks)."""
    try:
        document = read_json(bundle / name, inside=[bundle], max_bytes=MAX_DOCUMENT_BYTES)
    except GenieBuildError as exc:
        return None, [Finding("files", "error", f"{name}: {exc.problem}")]
    return document, [Finding("files", "error", f"{name}: {key} is {value!r}, which is not JSON (Genie's and the HTP "
                                                "backend's parsers refuse the file)")
                      for key, value in _non_finite(document, "")]


def _non_finite(document: Any, root: str) -> Iterator[tuple[str, float]]:
    """(dotted key, value) of every NaN or infinity in a parsed JSON document, in document order (a stack, not
    recursion: a document may nest as deep as the JSON reader allows)."""
    stack = [(root, document)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            yield key or "the document", value
        elif isinstance(value, dict):
            stack += reversed([(f"{key}.{name}" if key else str(name), item) for name, item in value.items()])
        elif isinstance(value, list):
            stack += reversed([(f"{key}[{index}]", item) for index, item in enumerate(value)])


def config_value(config: Any, dotted: str, kind: type | None = None) -> Any:
    """``config["a"]["b"]…`` for ``"a.b…"``, or None when a level is missing or not an object (or the value is
    not of ``kind``; bools never count as ints)."""
    value = config
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    if kind is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        return None
    return value
