"""The two pieces whose weight is a vocabulary-sized table, calibrated without aimet-onnx holding the table about four
times over (its model, its session, the fake-quantized weight and its transpose): the graphs it is given instead,
and how their encodings make the whole piece's (docs/quantize.md, "The embedding and the LM head").

- **The LM head in slices of its vocabulary** (:func:`head_slice_graph`): the head's unit with only rows ``a..b`` of
  its ``[vocab, hidden]`` weight, its ``logits`` those rows' columns. Every encoding but two is the same in every
  slice, computed from the same values (the final norm's input, weight and output); the weight's per-channel
  encoding is one channel per row, each from its own row alone; the logits' encoding needs every column of a window
  at once, so the slices' logits are kept, window by window, and the logits' own quantizer is fed each whole window
  in order, as it would be inside the whole head (:func:`merge_head_slices` takes the rest).
- **The embedding's table read in place** (:func:`embedding_table`): a unit of the embedding alone is one Gather of
  the table by ``input_ids``. In calibration aimet-onnx passes the table through unchanged, so the unit's output is
  the table's rows, and its one encoding is the table's, its quantizer fed the whole table once per window; a sim
  of the same graph with a one-row table (:func:`one_row_graph`) gives that quantizer, fed the table mapped from
  the part's data file.

This module builds the graphs and merges the encodings; :mod:`genie_build.quantize.calibrate_unit` runs aimet-onnx on
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from genie_build.conventions import INPUT_IDS, LOGITS
from genie_build.encodings import Encodings, TensorEncoding
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import ExternalData, StoredTensor, external_data

__all__ = ["Table", "embedding_table", "head_slice_graph", "head_slices", "merge_head_slices", "one_row_graph"]


@dataclass(frozen=True)
class Table:
    """A ``[rows, width]`` float32 initializer stored in a part's data file."""

    name: str
    rows: int
    width: int
    data: ExternalData

    def read(self, first: int = 0, last: int | None = None) -> np.ndarray:
        """Rows ``first .. last - 1`` (all by default), read from the data file (a new array)."""
        last = self.rows if last is None else last
        with open(self.data.real_path, "rb") as handle:
            handle.seek(self.data.offset + first * self.width * 4)
            return np.fromfile(handle, np.float32, (last - first) * self.width).reshape(last - first, self.width)

    def mapped(self) -> np.ndarray:
        """The whole table, mapped read-only from the data file (its pages are read as they are used)."""
        return np.memmap(self.data.real_path, np.float32, "r", self.data.offset, (self.rows, self.width))


def _table(model: onnx.ModelProto, name: str, where: Path) -> Table:
    """The external float32 2-D initializer ``name``.

    Raises:
        GenieBuildError: it is not one.
    """
    tensor = next((tensor for tensor in model.graph.initializer if tensor.name == name), None)
    if (tensor is None or tensor.data_type != onnx.TensorProto.FLOAT or len(tensor.dims) != 2
            or tensor.data_location != onnx.TensorProto.EXTERNAL):
        raise GenieBuildError(where, f"{name!r} is not a 2-D float32 weight in the part's data file: the piece "
                                     "cannot be calibrated in slices (raise quantize.unit_memory_mb)")
    return Table(name, tensor.dims[0], tensor.dims[1], external_data(StoredTensor(f"initializer {name!r}", tensor),
                                                                     where))


def _output_dims(model: onnx.ModelProto, name: str) -> list[onnx.TensorShapeProto.Dimension]:
    return next(output.type.tensor_type.shape.dim for output in model.graph.output if output.name == name)


def head_slices(vocab: int, count: int) -> list[tuple[int, int]]:
    """``count`` consecutive row ranges ``(first, last)`` covering ``vocab`` rows, as even as they can be."""
    return [(vocab * index // count, vocab * (index + 1) // count) for index in range(count)]


def head_slice_graph(model: onnx.ModelProto, weight: str, rows: tuple[int, int], where: Path) -> onnx.ModelProto:
    """The head's unit ``model`` (its weights still in the part's data file) with rows ``rows`` of the LM head's
    ``weight`` alone, read into the graph, and ``logits`` cut to those columns; the other weights stay external.

    Raises:
        GenieBuildError: the weight is not a ``[vocab, hidden]`` float32 weight in the data file whose rows are the
            logits' columns (through a Transpose), so slices of it would not be slices of the logits.
    """
    table = _table(model, weight, where)
    logits = _output_dims(model, LOGITS)
    producers = {output: node for node in model.graph.node for output in node.output}
    transposed = any(node.op_type == "Transpose" and node.input[0] == weight for node in model.graph.node)
    if not transposed or not logits or logits[-1].dim_value != table.rows or LOGITS not in producers:
        raise GenieBuildError(where, f"the LM head {weight!r} {[table.rows, table.width]} does not reach "
                                     f"{LOGITS!r} through a Transpose with its rows as the vocabulary: it cannot be "
                                     "calibrated in slices (raise quantize.unit_memory_mb)")
    first, last = rows
    sliced = onnx.ModelProto()
    sliced.CopyFrom(model)
    tensor = next(tensor for tensor in sliced.graph.initializer if tensor.name == weight)
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT
    tensor.dims[0] = last - first
    tensor.raw_data = table.read(first, last).tobytes()
    _output_dims(sliced, LOGITS)[-1].dim_value = last - first
    # shapes inferred for the whole vocabulary (the transposed weight's) would contradict the slice
    kept = [value for value in sliced.graph.value_info
            if table.rows not in [dim.dim_value for dim in value.type.tensor_type.shape.dim]]
    del sliced.graph.value_info[:]
    sliced.graph.value_info.extend(kept)
    return sliced


def merge_head_slices(slices: Sequence[Encodings], weight: str, where: Path) -> Encodings:
    """The head's encodings from its slices' (in row order): the LM head weight's channels joined; every other
    encoding the last slice's, whose ``logits`` encoding the whole windows gave.

    Raises:
        GenieBuildError: an encoding other than the weight's and the logits' differs between two slices (they were
            computed from other values), or the weight's is not per channel.
    """
    last = slices[-1]
    for index, encodings in enumerate(slices):
        for section, mine, theirs in (("activation", encodings.activations, last.activations),
                                      ("param", encodings.params, last.params)):
            differing = sorted(name for name in mine.keys() | theirs.keys()
                               if name not in (weight, LOGITS) and mine.get(name) != theirs.get(name))
            if differing:
                raise GenieBuildError(where, f"slice {index + 1} of the LM head has another {section} encoding of "
                                             f"{differing[0]!r} than the last slice: its slices did not see the same "
                                             "values")
    parts = [encodings.params.get(weight) for encodings in slices]
    if any(part is None or part.kind != "per_channel" for part in parts):
        raise GenieBuildError(where, f"the LM head {weight!r} has no per-channel encoding in every slice")
    whole: TensorEncoding = replace(parts[0], scale=tuple(value for part in parts for value in part.scale),
                                    offset=tuple(value for part in parts for value in part.offset))
    return replace(last, params={**last.params, weight: whole}, entries={})


def embedding_table(model: onnx.ModelProto, where: Path) -> Table:
    """The table of a unit that is one Gather of it by ``input_ids``, giving the unit's only output.

    Raises:
        GenieBuildError: the unit is anything else, or its table is not a float32 weight in the data file.
    """
    nodes = [node for node in model.graph.node if node.op_type != "Constant"]
    outputs = [output.name for output in model.graph.output]
    if (len(nodes) != 1 or nodes[0].op_type != "Gather" or list(nodes[0].output) != outputs
            or nodes[0].input[1] != INPUT_IDS):
        raise GenieBuildError(where, "the embedding's unit is not one Gather of its table by input_ids: its table "
                                     "cannot be read in place (raise quantize.unit_memory_mb)")
    return _table(model, nodes[0].input[0], where)


def one_row_graph(model: onnx.ModelProto, table: Table) -> onnx.ModelProto:
    """The embedding's unit with the table's first row as its table: a sim of it has the table's quantizer, set up
    as the whole table's, without the table."""
    small = onnx.ModelProto()
    small.CopyFrom(model)
    tensor = next(tensor for tensor in small.graph.initializer if tensor.name == table.name)
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT
    tensor.dims[0] = 1
    tensor.raw_data = table.read(0, 1).tobytes()
    return small
