"""The reference container's layout and its reader of headers (``docs/reference-container.md``): what account,
bundle and check-bundle read, without numpy or onnx (:mod:`genie_build.toolchains.reference.container` writes
containers and decodes their weights)."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from genie_build.errors import GenieBuildError
from genie_build.fileio import open_regular
from genie_build.toolchains.base import AppliedOptions, BinaryInfo, GraphInfo, QuantInfo, TensorInfo
from genie_build.toolchains.reference.records import WeightEntry
from genie_build.units import MIB

__all__ = ["FORMAT_VERSION", "Layout", "MAGIC", "PREAMBLE", "TOOLCHAIN", "WEIGHT_SECTION_ALIGNMENT",
           "inspect_container", "padding", "read_header", "read_layout"]

MAGIC = b"GBREFCTX"
FORMAT_VERSION = 1
WEIGHT_SECTION_ALIGNMENT = 64
TOOLCHAIN = "reference"
PREAMBLE = struct.Struct("<8sIIQ")
# A header lists graphs' IO and the weight table: megabytes for a 7B model. A length beyond this (or beyond the
# file) is a corrupt or hostile file, refused before anything is allocated for it.
MAX_HEADER_BYTES = 256 * MIB


@dataclass(frozen=True)
class Layout:
    """Where a container's sections start, read from its preamble and header."""

    header: dict
    weights: tuple[WeightEntry, ...]    # the header's weight table
    graph_section_start: int
    weight_section_start: int
    file_bytes: int


def inspect_container(path: str | os.PathLike[str], *, inside: Iterable[str | os.PathLike[str]] | None = None
                      ) -> BinaryInfo:
    """What a container holds, read from its header: sizes, graphs with IO and quantization, options.

    Args:
        inside: read the file only if it lies inside one of these folders (a bundle's), symlinks resolved.

    Raises:
        GenieBuildError: the file is not a reference container, or is truncated or inconsistent.
    """
    layout = read_layout(path, inside=inside)
    header = layout.header

    def tensor(record: dict) -> TensorInfo:
        quant = record["quant"]
        return TensorInfo(name=record["name"], shape=tuple(record["shape"]), dtype=record["dtype"],
                          quant=None if quant is None else QuantInfo(**quant))

    try:
        graphs = tuple(GraphInfo(name=graph["name"], inputs=tuple(map(tensor, graph["inputs"])),
                                 outputs=tuple(map(tensor, graph["outputs"]))) for graph in header["graphs"])
        return BinaryInfo(path=os.fspath(path), file_bytes=layout.file_bytes,
                          weight_bytes=header["weight_section"]["bytes"], graphs=graphs,
                          toolchain=header["toolchain"], tool_version=header["tool_version"],
                          applied_options=AppliedOptions.from_dict(header["applied_options"], os.fspath(path)))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise GenieBuildError(path, f"reference container header does not describe its graphs: {exc!r}") from None


def read_header(path: str | os.PathLike[str]) -> dict:
    """A container's JSON header (graphs, applied options, the weight table), checked against the file.

    Raises:
        GenieBuildError: the file is not a reference container, or is truncated or inconsistent.
    """
    return read_layout(path).header


def read_layout(path: str | os.PathLike[str], *, inside: Iterable[str | os.PathLike[str]] | None = None) -> Layout:
    """A container's sections, from its preamble and header (:func:`genie_build.fileio.open_regular`: a regular
    file, inside ``inside`` when given; the header's length is checked against the file before it is read).

    Raises:
        GenieBuildError: the file is not a reference container, or is truncated or inconsistent.
    """
    try:
        with open_regular(path, inside=inside) as handle:
            preamble = handle.read(PREAMBLE.size)
            if len(preamble) < PREAMBLE.size or not preamble.startswith(MAGIC):
                raise GenieBuildError(path, f"not a genie-build reference context binary: starts with "
                                            f"{preamble[:len(MAGIC)]!r}, expected {MAGIC!r}")
            _, version, _, header_length = PREAMBLE.unpack(preamble)
            if version != FORMAT_VERSION:
                raise GenieBuildError(path, f"reference container format version {version}; this genie-build "
                                            f"reads version {FORMAT_VERSION}")
            file_bytes = os.fstat(handle.fileno()).st_size
            if header_length > min(MAX_HEADER_BYTES, file_bytes - PREAMBLE.size):
                raise GenieBuildError(path, f"its header length {header_length} is more than the file holds "
                                            f"({file_bytes} bytes) or than a header may have ({MAX_HEADER_BYTES})")
            header = json.loads(handle.read(header_length))
    except OSError as exc:
        raise GenieBuildError(path, f"cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise GenieBuildError(path, f"reference container header is not valid JSON (truncated?): {exc}") from None
    try:
        graph_section_bytes, weight_bytes = int(header["graph_section_bytes"]), int(header["weight_section"]["bytes"])
        weights = tuple(map(WeightEntry.from_dict, header["weights"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise GenieBuildError(path, f"reference container header lacks section sizes or a weight table: "
                                    f"{exc!r}") from None
    graph_section_start = PREAMBLE.size + header_length
    graph_section_end = graph_section_start + graph_section_bytes
    weight_section_start = graph_section_end + padding(graph_section_end, WEIGHT_SECTION_ALIGNMENT)
    expected = weight_section_start + weight_bytes
    if file_bytes != expected or graph_section_bytes < 0 or weight_bytes < 0:
        raise GenieBuildError(path, f"is {file_bytes} bytes but its header describes {expected} "
                                    "(truncated or corrupt reference container)")
    _require_within(path, "graph", [(graph.get("structure_offset"), graph.get("structure_length"))
                                     for graph in _records(path, header.get("graphs"))], graph_section_bytes)
    _require_within(path, "weight", [(entry.offset, entry.length) for entry in weights], weight_bytes)
    return Layout(header=header, weights=weights, graph_section_start=graph_section_start,
                   weight_section_start=weight_section_start, file_bytes=file_bytes)


def _records(path: str | os.PathLike[str], graphs: object) -> list[dict]:
    if not (isinstance(graphs, list) and all(isinstance(graph, dict) for graph in graphs)):
        raise GenieBuildError(path, "reference container header has no list of graphs")
    return graphs


def _require_within(path: str | os.PathLike[str], what: str, ranges: list[tuple[object, object]],
                    section_bytes: int) -> None:
    """Every ``(offset, length)`` of the header lies inside its section, so no reader is asked to read (or
    allocate) more than the file holds."""
    for offset, length in ranges:
        if not (type(offset) is int and type(length) is int and 0 <= offset and 0 <= length
                and offset + length <= section_bytes):
            raise GenieBuildError(path, f"a {what} record at offset {offset!r}, length {length!r} lies outside its "
                                        f"section of {section_bytes} bytes (corrupt reference container)")


def padding(position: int, alignment: int) -> int:
    return -position % alignment
