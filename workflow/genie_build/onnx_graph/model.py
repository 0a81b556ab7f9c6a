"""An ONNX graph without its weights: loading it, its inputs and outputs, its initializers' specs and the
shapes it knows."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import onnx
from google.protobuf.message import Error as ProtobufError

from genie_build.conventions import graph_ar_cl
from genie_build.errors import GenieBuildError
from genie_build.fileio import read_regular
from genie_build.units import GIB

__all__ = ["Dim", "EmbeddingGather", "FOUR_BIT_TYPES", "GraphIO", "InitializerSpec", "MAX_GRAPH_BYTES", "Shape",
           "TensorSpec", "ar_and_context_length", "dtype_name", "embedding_gather", "graph_io", "initializer_specs",
           "load_graph", "stored_nbytes", "tensor_shapes"]

Dim = int | str | None   # a fixed size, a symbolic name, or unknown
Shape = tuple[Dim, ...]

# Types whose elements are packed two per byte in raw_data.
FOUR_BIT_TYPES = frozenset({onnx.TensorProto.INT4, onnx.TensorProto.UINT4, onnx.TensorProto.FLOAT4E2M1})


@dataclass(frozen=True)
class InitializerSpec:
    """An initializer as the graph declares it; ``nbytes`` is the size of its data as stored."""

    name: str
    shape: tuple[int, ...]
    dtype: str            # numpy name: "float32", "int64", "int4", ...
    nbytes: int


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output."""

    name: str
    shape: Shape
    dtype: str


@dataclass(frozen=True)
class GraphIO:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class EmbeddingGather:
    """The token embedding's lookup: the graph input holding token ids, the Gather of the table by them, and the
    table (a 2-D initializer, the Gather's data directly or through a Cast or Identity) and its rows."""

    token_input: str
    output: str
    table: str
    rows: int


# Ops that pass token ids through unchanged on their way to the embedding Gather.
_ID_PRESERVING_OPS = frozenset({"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten"})

# The protobuf limit: an ONNX file larger than this cannot be a model (its weights must be external data).
MAX_GRAPH_BYTES = 2 * GIB


def load_graph(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Load an ONNX model's graph, leaving external weights on disk.

    The file is read through :func:`genie_build.fileio.read_regular`: a FIFO, a device or a file larger than the
    protobuf limit is refused before anything is read.

    Raises:
        GenieBuildError: the file is missing, unreadable, not a regular file, not a protobuf (truncated or
            corrupt), or holds no graph.
    """
    where = os.fspath(path)
    data = read_regular(where, max_bytes=MAX_GRAPH_BYTES)
    try:
        model = onnx.load_model_from_string(data)
    except (ProtobufError, ValueError, RuntimeError) as exc:
        raise GenieBuildError(where, f"not a valid ONNX model (truncated or corrupt file?): {exc}") from None
    if not model.graph.node:
        raise GenieBuildError(where, "not an ONNX model with a graph: it has no nodes (empty or truncated file?)")
    if not model.opset_import:
        raise GenieBuildError(where, "ONNX model has no opset_import (truncated file?)")
    return model


# ------------------------------------------------------------------------------------------- stored tensors
def initializer_specs(model: onnx.ModelProto) -> dict[str, InitializerSpec]:
    """Name, shape, dtype and stored size of every initializer, read from the graph only."""
    return {tensor.name: InitializerSpec(name=tensor.name, shape=tuple(tensor.dims),
                                         dtype=dtype_name(tensor.data_type),
                                         nbytes=0 if tensor.data_type == onnx.TensorProto.STRING
                                         else stored_nbytes(tensor))
            for tensor in model.graph.initializer}


def graph_io(model: onnx.ModelProto) -> GraphIO:
    """The graph's real inputs (initializers listed as inputs by old exporters are left out) and outputs."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = tuple(_tensor_spec(value) for value in model.graph.input if value.name not in initializers)
    return GraphIO(inputs=inputs, outputs=tuple(_tensor_spec(value) for value in model.graph.output))


def tensor_shapes(model: onnx.ModelProto) -> dict[str, Shape]:
    """Shapes of every tensor the graph knows: inputs, outputs, value_info and initializers.

    When some node output has no shape recorded, shape inference runs on the weight-less graph (cheap:
    it reads initializer dims, never their data).
    """
    graph = model.graph
    known = {value.name for value in (*graph.input, *graph.output, *graph.value_info)}
    if any(output and output not in known for node in graph.node for output in node.output):
        graph = onnx.shape_inference.infer_shapes(model).graph
    shapes = {value.name: _tensor_spec(value).shape for value in (*graph.input, *graph.output, *graph.value_info)
              if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape")}
    shapes.update((tensor.name, tuple(tensor.dims)) for tensor in graph.initializer)
    return shapes


def _tensor_spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor_type = value.type.tensor_type
    shape = tuple(_dim(dim) for dim in tensor_type.shape.dim)
    return TensorSpec(name=value.name, shape=shape, dtype=dtype_name(tensor_type.elem_type))


def _dim(dim: onnx.TensorShapeProto.Dimension) -> Dim:
    if dim.HasField("dim_value"):
        return dim.dim_value
    return dim.dim_param or None


def dtype_name(data_type: int) -> str:
    if data_type == onnx.TensorProto.UNDEFINED:
        return "undefined"
    return onnx.helper.tensor_dtype_to_np_dtype(data_type).name


def stored_nbytes(tensor: onnx.TensorProto, where: str | os.PathLike[str] = "", what: str = "") -> int:
    """Bytes of a tensor's data as stored (4-bit types packed two per byte).

    Raises:
        GenieBuildError: (naming ``where`` and ``what``) a type without a fixed element size (string, undefined).
    """
    count = math.prod(tensor.dims)
    if tensor.data_type in FOUR_BIT_TYPES:
        return (count + 1) // 2
    if tensor.data_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING):
        raise GenieBuildError(where, f"{what or repr(tensor.name)}: a tensor of type "
                                     f"{onnx.TensorProto.DataType.Name(tensor.data_type)} has no fixed size to store")
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize




def embedding_gather(model: onnx.ModelProto) -> EmbeddingGather | None:
    """The first Gather whose data is a 2-D initializer (possibly through a Cast: fp16-stored weights) and whose
    indices a graph input reaches through id-preserving ops only (Cast, Reshape, ...); None without one."""
    graph = model.graph
    rows = {tensor.name: tensor.dims[0] for tensor in graph.initializer if len(tensor.dims) == 2}
    tables = {name: name for name in rows}  # a tensor holding a table's values -> the table
    for node in graph.node:
        if node.op_type in ("Cast", "Identity") and node.input[0] in tables:
            tables[node.output[0]] = tables[node.input[0]]
    for value in graph_io(model).inputs:
        reached = {value.name}
        for node in graph.node:  # nodes are topologically sorted, so one pass follows every chain
            if node.op_type == "Gather" and node.input[1] in reached and node.input[0] in tables:
                table = tables[node.input[0]]
                return EmbeddingGather(value.name, node.output[0], table, rows[table])
            if node.op_type in _ID_PRESERVING_OPS and node.input and node.input[0] in reached:
                reached.update(node.output)
    return None


def ar_and_context_length(model: onnx.ModelProto) -> tuple[int, int] | None:
    """(AR, CL) as Genie reads them from the graph's tensors (:func:`genie_build.conventions.graph_ar_cl`).

    Returns None when Genie could not read either of them from the tensors.
    """
    io = graph_io(model)
    ar, context_length = graph_ar_cl("", io.inputs, io.outputs)
    return (ar, context_length) if ar and context_length else None
