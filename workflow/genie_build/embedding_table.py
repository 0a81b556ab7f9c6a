"""The token embedding as a CPU lookup table (``bundle.embedding: lut``): the file Genie reads and its config block.

Genie's ``dialog.embedding`` (``type: lut``) names a headerless, row-major ``[n_vocab][n_embd]`` table that the
library mmaps; the row stride is ``n_embd`` times the ``datatype``'s width, and nothing in the file says either, so
a table of the wrong size or datatype gives plausible garbage (check-bundle checks both:
:mod:`genie_build.check_embedding`). The table is made as qairt-dev's LLM builder makes it
(``gen_ai_api/builders/embedding.py``, ``dump_embedding_table``): the float table of the embedding Gather, quantized
per tensor with the Gather output's encoding, else the table's own, to ``ufixed{bw}`` codes
``clip(round_half_away(x / scale - offset), 0, 2**bw - 1)``; Genie reads a code back as ``(q + offset) * scale``.
Without either encoding the table stays float32. tests/qairt_api checks the bytes and the config block against
qairt-dev's own code.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from genie_build.conventions import INPUT_IDS
from genie_build.encodings import Encodings, TensorEncoding, read_encodings
from genie_build.errors import GenieBuildError
from genie_build.fileio import atomic_open, read_json, write_json
from genie_build.onnx_graph import check_external_data, load_graph

__all__ = ["EMBEDDING_TABLE_NAME", "LUT_BITWIDTHS", "TableEncoding", "TableFile", "dequantize_rows",
           "dialog_embedding", "embedding_gather", "quantize_table", "read_table_file", "table_bytes",
           "table_encoding", "write_embedding_table"]

EMBEDDING_TABLE_NAME = "embedding_table.bin"
LUT_BITWIDTHS = (8, 16)  # ufixed8 / ufixed16: the widths an HTP graph input takes the codes at
_FLOAT32 = "float32"
_ROWS_PER_CHUNK = 4096  # quantized a chunk of rows at a time: a 7B table is 2.2 GB in float32


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


def embedding_gather(model: onnx.ModelProto, where: str | os.PathLike[str]) -> tuple[str, str]:
    """``(table, output)``: the initializer and output names of the Gather that reads ``input_ids``.

    Raises:
        GenieBuildError: no Gather of an initializer by ``input_ids``.
    """
    initializers = {tensor.name for tensor in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == INPUT_IDS \
                and node.input[0] in initializers:
            return node.input[0], node.output[0]
    raise GenieBuildError(where, f"no Gather of an embedding table by {INPUT_IDS}: this part is not the embedding "
                                 "lookup (bundle.embedding: lut needs split.embedding_alone)")


def table_encoding(encodings: Encodings, table: str, output: str, where: str | os.PathLike[str]) -> TableEncoding:
    """The Gather output's encoding, else the table's (qairt-dev's order), as one per-tensor ``ufixed`` encoding;
    float32 when neither is an integer encoding.

    Raises:
        GenieBuildError: a per-channel or per-block encoding (one scale for the whole table is all Genie takes),
            or a bitwidth other than 8 or 16.
    """
    encoding: TensorEncoding | None = encodings.activations.get(output) or encodings.of_initializer(table)
    if encoding is None or encoding.dtype != "int":
        return TableEncoding(32)
    name = output if output in encodings.activations else table
    if encoding.kind != "per_tensor" or len(encoding.scale) != 1:
        raise GenieBuildError(where, f"encoding of {name!r} is {encoding.kind} with {len(encoding.scale)} scales; "
                                     "Genie's embedding table takes one scale and offset (give the embedding output "
                                     "a per-tensor encoding)")
    if encoding.bitwidth not in LUT_BITWIDTHS:
        raise GenieBuildError(where, f"encoding of {name!r} has {encoding.bitwidth} bits; the table is stored at "
                                     f"{' or '.join(map(str, LUT_BITWIDTHS))}")
    return TableEncoding(encoding.bitwidth, float(encoding.scale[0]), int(encoding.offset[0]))


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
    """Write the table of part 1's embedding Gather to ``out_path`` (atomically) and its description beside it
    (``<out>.json``: ``n_vocab``, ``n_embd``, ``datatype``, ``bitwidth``, ``scale``, ``offset``).

    Raises:
        GenieBuildError: the part is not an embedding lookup, the table is not 2-D float, or its encoding is not one
            Genie's table can carry.
    """
    onnx_path, out_path = Path(onnx_path), Path(out_path)
    model = load_graph(onnx_path)
    check_external_data(model, onnx_path)
    table_name, output = embedding_gather(model, onnx_path)
    encoding = table_encoding(read_encodings(encodings_path), table_name, output, encodings_path)
    table = _read_table(model, table_name, onnx_path)
    n_vocab, n_embd = table.shape
    with atomic_open(out_path) as handle:
        for codes in _quantized_chunks(table, encoding):
            handle.write(codes.tobytes(order="C"))
    write_json(out_path.with_name(out_path.name + ".json"),
               {"n_vocab": n_vocab, "n_embd": n_embd, "datatype": encoding.datatype, "bitwidth": encoding.bitwidth,
                "scale": encoding.scale, "offset": encoding.offset})
    return TableFile(out_path, n_vocab, n_embd, encoding)


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


def _read_table(model: onnx.ModelProto, name: str, onnx_path: Path) -> np.ndarray:
    # imported here: the reference toolchain's reader, which the commands that only check a bundle need not load
    from genie_build.toolchains.reference.onnx_io import read_initializer

    tensor = next(tensor for tensor in model.graph.initializer if tensor.name == name)
    table = read_initializer(tensor, onnx_path)
    if table.ndim != 2 or not np.issubdtype(table.dtype, np.floating):
        raise GenieBuildError(onnx_path, f"embedding table {name!r} is {table.dtype} {list(table.shape)}; a "
                                         "lookup table is a float [n_vocab, n_embd]")
    return table


def _quantized_chunks(table: np.ndarray, encoding: TableEncoding) -> Iterator[np.ndarray]:
    for start in range(0, table.shape[0], _ROWS_PER_CHUNK):
        yield np.ascontiguousarray(quantize_table(table[start:start + _ROWS_PER_CHUNK], encoding))
