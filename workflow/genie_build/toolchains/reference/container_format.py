"""The reference container's layout and its reader of headers (``docs/reference-container.md``): what account,
bundle and check-bundle read, without numpy or onnx (:mod:`genie_build.toolchains.reference.container` writes
containers and decodes their weights)."""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

from genie_build.errors import GenieBuildError
from genie_build.toolchains.base import AppliedOptions, BinaryInfo, GraphInfo, QuantInfo, TensorInfo
from genie_build.toolchains.reference.records import WeightEntry

MAGIC = b"GBREFCTX"
FORMAT_VERSION = 1
WEIGHT_SECTION_ALIGNMENT = 64
TOOLCHAIN = "reference"
PREAMBLE = struct.Struct("<8sIIQ")


@dataclass(frozen=True)
class Layout:
    """Where a container's sections start, read from its preamble and header."""

    header: dict
    weights: tuple[WeightEntry, ...]    # the header's weight table
    graph_section_start: int
    weight_section_start: int
    file_bytes: int


def inspect_container(path: str | os.PathLike[str]) -> BinaryInfo:
    """What a container holds, read from its header: sizes, graphs with IO and quantization, options.

    Raises:
        GenieBuildError: the file is not a reference container, or is truncated or inconsistent.
    """
    layout = read_layout(path)
    header = layout.header

    def tensor(record: dict) -> TensorInfo:
        quant = record["quant"]
        return TensorInfo(name=record["name"], shape=tuple(record["shape"]), dtype=record["dtype"],
                          quant=None if quant is None else QuantInfo(**quant))

    graphs = tuple(GraphInfo(name=graph["name"], inputs=tuple(map(tensor, graph["inputs"])),
                             outputs=tuple(map(tensor, graph["outputs"]))) for graph in header["graphs"])
    return BinaryInfo(path=os.fspath(path), file_bytes=layout.file_bytes,
                      weight_bytes=header["weight_section"]["bytes"], graphs=graphs, toolchain=header["toolchain"],
                      tool_version=header["tool_version"],
                      applied_options=AppliedOptions.from_dict(header["applied_options"], os.fspath(path)))


def read_header(path: str | os.PathLike[str]) -> dict:
    """A container's JSON header (graphs, applied options, the weight table), checked against the file.

    Raises:
        GenieBuildError: the file is not a reference container, or is truncated or inconsistent.
    """
    return read_layout(path).header


def read_layout(path: str | os.PathLike[str]) -> Layout:
    try:
        with open(path, "rb") as handle:
            preamble = handle.read(PREAMBLE.size)
            if len(preamble) < PREAMBLE.size or not preamble.startswith(MAGIC):
                raise GenieBuildError(path, f"not a genie-build reference context binary: starts with "
                                            f"{preamble[:len(MAGIC)]!r}, expected {MAGIC!r}")
            _, version, _, header_length = PREAMBLE.unpack(preamble)
            if version != FORMAT_VERSION:
                raise GenieBuildError(path, f"reference container format version {version}; this genie-build "
                                            f"reads version {FORMAT_VERSION}")
            header = json.loads(handle.read(header_length))
            file_bytes = os.fstat(handle.fileno()).st_size
    except FileNotFoundError:
        raise GenieBuildError(path, "file not found") from None
    except OSError as exc:
        raise GenieBuildError(path, f"cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GenieBuildError(path, f"reference container header is not valid JSON (truncated?): {exc}") from None
    try:
        graph_section_bytes, weight_bytes = int(header["graph_section_bytes"]), int(header["weight_section"]["bytes"])
        weights = tuple(map(WeightEntry.from_dict, header["weights"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise GenieBuildError(path, f"reference container header lacks section sizes or a weight table: "
                                    f"{exc!r}") from None
    graph_section_start = PREAMBLE.size + header_length
    graph_section_end = graph_section_start + graph_section_bytes
    weight_section_start = graph_section_end + padding(graph_section_end, WEIGHT_SECTION_ALIGNMENT)
    expected = weight_section_start + weight_bytes
    if file_bytes != expected:
        raise GenieBuildError(path, f"is {file_bytes} bytes but its header describes {expected} "
                                    "(truncated or corrupt reference container)")
    return Layout(header=header, weights=weights, graph_section_start=graph_section_start,
                   weight_section_start=weight_section_start, file_bytes=file_bytes)


def padding(position: int, alignment: int) -> int:
    return -position % alignment
