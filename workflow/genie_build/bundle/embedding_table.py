"""The token embedding as a CPU lookup table (``bundle.embedding: lut``): the file Genie reads and its config block.

Genie's ``dialog.embedding`` (``type: lut``) names a headerless, row-major ``[n_vocab][n_embd]`` table that the
library mmaps; the row stride is ``n_embd`` times the ``datatype``'s width, and nothing in the file says either, so
a table of the wrong size or datatype gives plausible garbage (check-bundle checks both:
:mod:`genie_build.bundle.check_embedding`). Its rows are what part 1 computes for each token id, quantized per tensor at
the encoding of part 1's output (:mod:`genie_build.bundle.embedding_part`), to ``ufixed{bw}`` codes
``clip(round_half_away(x / scale - offset), 0, 2**bw - 1)``; Genie reads a code back as ``(q + offset) * scale``.
Without an encoding the table stays float32. For part 1 the Gather alone, this is the table qairt-dev's LLM builder
writes (``gen_ai_api/builders/embedding.py``, ``dump_embedding_table``): tests/qairt_api checks the bytes and the
config block against qairt-dev's own code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from genie_build.errors import GenieBuildError
from genie_build.fileio import atomic_open, read_json, write_json

__all__ = ["EMBEDDING_TABLE_NAME", "LUT_BITWIDTHS", "TableEncoding", "TableFile", "dequantize_rows",
           "dialog_embedding", "quantize_table", "read_table_file", "table_bytes", "write_embedding_table"]

EMBEDDING_TABLE_NAME = "embedding_table.bin"
LUT_BITWIDTHS = (8, 16)  # ufixed8 / ufixed16: the widths an HTP graph input takes the codes at
_FLOAT32 = "float32"
_ROWS_PER_CHUNK = 4096  # computed and quantized a chunk of rows at a time: a 7B table is 2.2 GB in float32


@dataclass(frozen=True)
class TableEncoding:
    """How the table's values are stored: ``bitwidth`` 32 is float32 (no scale or offset)."""

    bitwidth: int
    scale: float = 1.0
    offset: int = 0

    @property
    def datatype(self) -> str:
        """Genie's ``dialog.embedding.datatype``."""
        return _FLOAT32 if self.bitwidth == 32 else f"ufixed{self.bitwidth}"

    @property
    def dtype(self) -> np.dtype:
        return np.dtype({8: np.uint8, 16: np.uint16, 32: np.float32}[self.bitwidth])


@dataclass(frozen=True)
class TableFile:
    """A written table: its path, shape and encoding (what ``dialog.embedding`` says of it)."""

    path: Path
    n_vocab: int
    n_embd: int
    encoding: TableEncoding


def table_bytes(n_vocab: int, n_embd: int, bitwidth: int) -> int:
    """Bytes of a ``[n_vocab][n_embd]`` table at ``bitwidth`` bits per entry (what Genie's row stride implies)."""
    return n_vocab * n_embd * bitwidth // 8


def quantize_table(values: np.ndarray, encoding: TableEncoding) -> np.ndarray:
    """The stored codes of ``values`` (float32 arithmetic and rounding half away from zero, as qairt-dev's
    ``_quantize_array``); float32 values unchanged for a float32 table."""
    values = np.asarray(values, dtype=np.float32)
    if encoding.bitwidth == 32:
        return values
    scaled = values / np.float32(encoding.scale) - np.float32(encoding.offset)
    rounded = np.floor(np.abs(scaled) + np.float32(0.5)) * np.where(scaled < 0, np.float32(-1), np.float32(1))
    return np.clip(rounded, 0, 2**encoding.bitwidth - 1).astype(encoding.dtype)


def dequantize_rows(codes: np.ndarray, encoding: TableEncoding) -> np.ndarray:
    """The float values Genie reads from stored codes: ``(q + offset) * scale``."""
    if encoding.bitwidth == 32:
        return np.asarray(codes, dtype=np.float32)
    return ((codes.astype(np.float32) + np.float32(encoding.offset)) * np.float32(encoding.scale)).astype(np.float32)


def dialog_embedding(n_embd: int, encoding: TableEncoding, lut_path: str = EMBEDDING_TABLE_NAME) -> dict:
    """Genie's ``dialog.embedding`` block for the table (the keys qairt-dev's ``DialogEmbedding`` model writes)."""
    block: dict = {"version": 1, "type": "lut", "lut-path": lut_path, "size": n_embd, "datatype": encoding.datatype}
    if encoding.bitwidth != 32:
        block["quant-param"] = {"scale": encoding.scale, "offset": encoding.offset}
    return block


def write_embedding_table(onnx_path: str | os.PathLike[str], encodings_path: str | os.PathLike[str],
                          out_path: str | os.PathLike[str]) -> TableFile:
    """Write the table of part 1 (its rows for every token id, :mod:`genie_build.bundle.embedding_part`) to ``out_path``
    (atomically), a chunk of rows at a time, and its description beside it (``<out>.json``: ``n_vocab``, ``n_embd``,
    ``datatype``, ``bitwidth``, ``scale``, ``offset``).

    Raises:
        GenieBuildError: part 1 is not a lookup of the token alone, or its output's encoding is not one Genie's
            table can carry.
    """
    # imported here: onnxruntime, which the commands that only check or bundle a table need not load
    from genie_build.bundle.embedding_part import PartRows, read_embedding_part

    out_path = Path(out_path)
    part = read_embedding_part(onnx_path, encodings_path)
    rows = PartRows(part)
    rows.check_lookup()
    with atomic_open(out_path) as handle:
        for start in range(0, part.n_vocab, _ROWS_PER_CHUNK):
            ids = range(start, min(start + _ROWS_PER_CHUNK, part.n_vocab))
            handle.write(np.ascontiguousarray(quantize_table(rows.rows(ids), part.encoding)).tobytes(order="C"))
    write_json(out_path.with_name(out_path.name + ".json"),
               {"n_vocab": part.n_vocab, "n_embd": part.n_embd, "datatype": part.encoding.datatype,
                "bitwidth": part.encoding.bitwidth, "scale": part.encoding.scale, "offset": part.encoding.offset})
    return TableFile(out_path, part.n_vocab, part.n_embd, part.encoding)


def read_table_file(path: str | os.PathLike[str]) -> TableFile:
    """A table :func:`write_embedding_table` wrote, with its description (``<path>.json``).

    Raises:
        GenieBuildError: the table or its description is missing or malformed, or their sizes disagree.
    """
    path = Path(path)
    described = read_json(path.with_name(path.name + ".json"))
    try:
        encoding = TableEncoding(int(described["bitwidth"]), float(described["scale"]), int(described["offset"]))
        n_vocab, n_embd = int(described["n_vocab"]), int(described["n_embd"])
    except (KeyError, TypeError, ValueError) as exc:
        raise GenieBuildError(path, f"its description {path.name}.json is malformed: {exc}") from None
    if not path.is_file() or path.stat().st_size != table_bytes(n_vocab, n_embd, encoding.bitwidth):
        raise GenieBuildError(path, f"is not the {n_vocab} x {n_embd} {encoding.datatype} table its description says")
    return TableFile(path, n_vocab, n_embd, encoding)
