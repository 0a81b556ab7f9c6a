"""Part 1 as a lookup table (``bundle.embedding: lut``): what it computes for each token id, the encoding a table of it
is stored at, and the lookups the host run feeds the parts after it: the bundle's table as Genie reads it, and part
1's rows computed as the table must hold them (the host run's reference).

The table replaces part 1 -- the embedding alone, from ``input_ids`` to the residual stream layer 0 reads -- by one
row per token id, so its rows are what part 1 computes: its float graph, run by onnxruntime on every id. Whatever the
part does after its Gather is in the rows: a scale (Gemma's sqrt(hidden), MiniCPM's ``scale_emb``, Granite's
``embedding_multiplier``), a norm, a Cast. Part 1 is a table only when each token's row depends on the token alone:
it takes ``input_ids`` and nothing else, and a token's row does not change with the tokens beside it (checked on the
first ids, fed again in reverse order); a part that adds learned positions is neither.

The rows are quantized per tensor with the encoding of part 1's output; where the output is the Gather's own (through
Cast or Identity), with the first of those tensors' encodings, else the table initializer's own (qairt-dev's order,
``gen_ai_api/builders/embedding.py``). Float32 without any.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from genie_build.bundle.embedding_table import LUT_BITWIDTHS, TableEncoding, dequantize_rows, quantize_table
from genie_build.conventions import INPUTS_EMBEDS
from genie_build.encodings import Encodings, read_encodings
from genie_build.errors import GenieBuildError
from genie_build.fileio import resolve_inside
from genie_build.genie_config import GENIE_CONFIG_NAME
from genie_build.onnx_graph import check_external_data, graph_io, load_graph
from genie_build.ort_session import cpu_session_options
from genie_build.split.split import build_part, cut_graph
from genie_build.split.verify_split import find_token_input
from genie_build.toolchains.reference.container import ContainerGraph

__all__ = ["EmbeddingLookup", "EmbeddingPart", "PartLookup", "PartRows", "embedding_lookup", "graph_after_embedding",
           "read_embedding_part"]

# Ops whose output holds their input's values: a row that only passes through them is still the Gather's.
_SAME_VALUES = frozenset({"Cast", "Identity"})
_WEIGHT_SAME_VALUES = _SAME_VALUES | {"DequantizeLinear"}
# a token's row computed beside other tokens and computed again in reverse order agree to this relative error
_ROW_TOLERANCE = 1e-5


@dataclass(frozen=True)
class EmbeddingPart:
    """Part 1 of the prompt graph read as a lookup: its file, its token input (shape, AR and dtype), the table's shape,
    its output (the residual stream layer 0 reads) and the encoding the table is stored at."""

    path: Path
    token_input: str
    ids_shape: tuple[int, ...]
    ids_dtype: str
    n_vocab: int
    n_embd: int
    output: str
    encoding: TableEncoding

    @property
    def ar(self) -> int:
        """The ids one call of the part takes."""
        return int(np.prod(self.ids_shape))


def read_embedding_part(onnx_path: str | os.PathLike[str], encodings_path: str | os.PathLike[str]) -> EmbeddingPart:
    """Part 1 as a lookup (its structure and encodings; no weight is read).

    Raises:
        GenieBuildError: naming the part: no Gather of an embedding table by the token ids, an input besides them,
            not one output ``[1, AR, n_embd]``; naming the encodings: one the table cannot carry.
    """
    path = Path(onnx_path)
    model = load_graph(path)
    check_external_data(model, path)
    token_input, n_vocab = find_token_input(model)
    if n_vocab is None:
        raise GenieBuildError(path, f"no Gather of an embedding table by {token_input}: this part is not the "
                                    "embedding lookup (bundle.embedding: lut needs split.embedding_alone)")
    io = graph_io(model)
    others = [spec.name for spec in io.inputs if spec.name != token_input]
    if others:
        raise GenieBuildError(path, f"part 1 takes {others[0]!r} besides {token_input}: a table holds one row per "
                                    "token, and this part's rows depend on more than the token (use "
                                    "bundle.embedding: graph)")
    ids = next(spec for spec in io.inputs if spec.name == token_input)
    shapes = [spec.shape for spec in io.outputs]
    if len(shapes) != 1 or len(shapes[0]) != 3 or not all(isinstance(dim, int) for dim in (*ids.shape, *shapes[0])):
        raise GenieBuildError(path, f"part 1 gives {[spec.name for spec in io.outputs]} of shapes {shapes}; the "
                                    "embedding part gives one residual stream [1, AR, n_embd]")
    output = io.outputs[0].name
    encoding = _table_encoding(read_encodings(encodings_path), _value_sources(model, output, token_input),
                               encodings_path)
    return EmbeddingPart(path, token_input, tuple(ids.shape), ids.dtype, n_vocab, shapes[0][2], output, encoding)


class PartRows:
    """Part 1 run by onnxruntime: the rows it computes for token ids, a graph call of ``ar`` ids at a time.

    Raises:
        GenieBuildError: onnxruntime cannot load the part.
    """

    def __init__(self, part: EmbeddingPart) -> None:
        self.part = part
        try:
            self._session = ort.InferenceSession(os.fspath(part.path), cpu_session_options(),
                                                 providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's error types derive from Exception only and are not exported
            raise GenieBuildError(part.path, f"onnxruntime cannot load it: {exc}") from None

    def rows(self, ids: Sequence[int]) -> np.ndarray:
        """float32 ``[len(ids), n_embd]``: part 1's output for each id."""
        ar, rows = self.part.ar, []
        for start in range(0, len(ids), ar):
            chunk = list(ids[start:start + ar])
            feed = np.array(chunk + [0] * (ar - len(chunk)), dtype=self.part.ids_dtype).reshape(self.part.ids_shape)
            rows.append(self._session.run(None, {self.part.token_input: feed})[0][0, :len(chunk)])
        return np.concatenate(rows).astype(np.float32) if rows else np.zeros((0, self.part.n_embd), np.float32)

    def check_lookup(self) -> None:
        """Each token's row is the token's alone: the first ids' rows, computed again in reverse order, agree.

        Raises:
            GenieBuildError: naming the part and the first token whose row changed.
        """
        ids = list(range(min(self.part.ar, self.part.n_vocab)))
        forward, backward = self.rows(ids), self.rows(ids[::-1])[::-1]
        scale = max(float(np.max(np.abs(forward), initial=0.0)), 1e-30)
        changed = np.flatnonzero(np.any(np.abs(forward - backward) > _ROW_TOLERANCE * scale, axis=1))
        if changed.size:
            raise GenieBuildError(self.part.path, f"part 1 is not a lookup: token {int(changed[0])}'s row changes "
                                                  "with the tokens beside it, which a table cannot hold (use "
                                                  "bundle.embedding: graph)")


@dataclass(frozen=True)
class PartLookup:
    """``inputs_embeds`` computed from part 1 and quantized as the table stores them, token by token: what a bundle's
    table must give, found without reading the table (the host run's reference)."""

    rows: PartRows

    def vectors(self, tokens: Sequence[int]) -> np.ndarray:
        """``[1, len(tokens), n_embd]``: each token's row, stored and read back at the table's encoding."""
        encoding = self.rows.part.encoding
        return dequantize_rows(quantize_table(self.rows.rows(tokens), encoding), encoding)[np.newaxis]


@dataclass(frozen=True)
class EmbeddingLookup:
    """The bundle's embedding table (``dialog.embedding``, type lut) as Genie reads it: the stored codes, mmapped,
    and how to read them back."""

    codes: np.ndarray  # [n_vocab, n_embd]
    encoding: TableEncoding

    def vectors(self, tokens: Sequence[int]) -> np.ndarray:
        """``inputs_embeds`` ``[1, len(tokens), n_embd]``: each token's row, dequantized."""
        return dequantize_rows(self.codes[np.asarray(tokens, dtype=np.int64)], self.encoding)[np.newaxis]




def embedding_lookup(bundle: Path, dialog: dict) -> EmbeddingLookup | None:
    """The checked bundle's embedding table, mmapped (None when the embedding is part 1's graph).

    Raises:
        GenieBuildError: a table the host run does not read (a callback, or a datatype other than ufixed8/16 and
            float32).
    """
    block = dialog.get("embedding")
    if block is None:
        return None
    bits = {"float32": 32, "ufixed8": 8, "ufixed16": 16}.get(block.get("datatype"))
    if block.get("type") != "lut" or bits is None:
        raise GenieBuildError(bundle / GENIE_CONFIG_NAME,
                              f"the host run reads lut tables of float32, ufixed8 or ufixed16, not "
                              f"{block.get('type')!r} {block.get('datatype')!r}")
    quant = block.get("quant-param", {})
    encoding = TableEncoding(bits, float(quant.get("scale", 1.0)), int(quant.get("offset", 0)))
    path = resolve_inside(bundle / block["lut-path"], [bundle])
    codes = np.memmap(path, dtype=encoding.dtype, mode="r", shape=(dialog["context"]["n-vocab"], block["size"]))
    return EmbeddingLookup(codes, encoding)


def graph_after_embedding(graph: ContainerGraph, boundary: str, where: str | os.PathLike[str]) -> ContainerGraph:
    """A whole model's graph from part 1's output ``boundary`` on, taking it as ``inputs_embeds``: the unsplit model
    fed as a bundle's parts after its table are.

    Raises:
        GenieBuildError: naming ``where``: the boundary is not a tensor that cuts the graph in two.
    """
    model = graph.model
    rest = build_part(model, cut_graph(model, ["1", "2"], [boundary], Path(where))[1], model.graph.name)
    for value in rest.graph.input:
        if value.name == boundary:
            value.name = INPUTS_EMBEDS
    for node in rest.graph.node:
        node.input[:] = [INPUTS_EMBEDS if name == boundary else name for name in node.input]
    kept = {tensor.name for tensor in rest.graph.initializer}
    return ContainerGraph(model=rest, weights={name: array for name, array in graph.weights.items() if name in kept})


def _value_sources(model: onnx.ModelProto, output: str, token_input: str) -> list[str]:
    """The tensors whose encoding may store the table, in order: the output, then -- back through ops that keep the
    values -- the Gather's output and the table initializer it reads; the output alone when part 1 computes more
    than the Gather."""
    producers = {name: node for node in model.graph.node for name in node.output}
    initializers = {tensor.name for tensor in model.graph.initializer}
    chain, name = [output], output
    while (node := producers.get(name)) is not None and node.op_type in _SAME_VALUES:
        name = node.input[0]
        chain.append(name)
    node = producers.get(name)
    if node is None or node.op_type != "Gather" or len(node.input) != 2 or not _reads(node.input[1], token_input,
                                                                                      producers):
        return [output]
    table = node.input[0]
    while (source := producers.get(table)) is not None and source.op_type in _WEIGHT_SAME_VALUES:
        table = source.input[0]
    return chain + ([table] if table in initializers else [])


def _reads(name: str, token_input: str, producers: dict[str, onnx.NodeProto]) -> bool:
    """Whether ``name`` is the token input, through Casts and the like."""
    while name != token_input and (node := producers.get(name)) is not None and node.input:
        name = node.input[0]
    return name == token_input


def _table_encoding(encodings: Encodings, sources: Sequence[str], where: str | os.PathLike[str]) -> TableEncoding:
    """The first of ``sources`` with an encoding (an activation's, or the initializer's own), as one
    per-tensor ``ufixed`` encoding; float32 when that is not an integer encoding or none has one.

    Raises:
        GenieBuildError: a per-channel or per-block encoding (one scale for the whole table is all Genie takes),
            or a bitwidth other than 8 or 16.
    """
    found = next(((name, encoding) for name in sources if (encoding := encodings.of_initializer(name)) is not None),
                 None)
    if found is None or found[1].dtype != "int":
        return TableEncoding(32)
    name, encoding = found
    if encoding.kind != "per_tensor" or len(encoding.scale) != 1:
        raise GenieBuildError(where, f"encoding of {name!r} is {encoding.kind} with {len(encoding.scale)} scales; "
                                     "Genie's embedding table takes one scale and offset (give the embedding output "
                                     "a per-tensor encoding)")
    if encoding.bitwidth not in LUT_BITWIDTHS:
        raise GenieBuildError(where, f"encoding of {name!r} has {encoding.bitwidth} bits; the table is stored at "
                                     f"{' or '.join(map(str, LUT_BITWIDTHS))}")
    return TableEncoding(encoding.bitwidth, float(encoding.scale[0]), int(encoding.offset[0]))
