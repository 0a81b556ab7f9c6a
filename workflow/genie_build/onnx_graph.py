"""Load and check ONNX graphs without their weights.

Everything here reads the graph protobuf only (``load_external_data=False``); weight bytes are touched
only to hash them, streamed in chunks, so memory stays bounded by the graph, not the model.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import stat
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import numpy as np
import onnx
from google.protobuf.message import Error as ProtobufError
from onnx import numpy_helper

from genie_build.conventions import graph_ar_cl
from genie_build.errors import GenieBuildError
from genie_build.fileio import HashingWriter, copy_range, open_regular, read_regular, resolve_inside, write_json

__all__ = ["Dim", "ExternalData", "FLOAT_TYPES", "GraphIO", "GraphTensors", "InitializerSpec", "Shape", "StoredTensor",
           "TensorSpec", "WeightLayout", "ar_and_context_length", "check_external_data", "check_model",
           "check_shared_initializers", "consumer_layouts", "external_data", "external_data_files", "graph_io",
           "graph_tensors", "initializer_specs", "load_graph", "model_folders", "model_tensors", "open_external_data",
           "part_tensor_names", "read_graph_tensors", "require_finite", "scan_tensor", "subgraphs", "tensor_sha256",
           "tensor_shapes"]

Dim = int | str | None   # a fixed size, a symbolic name, or unknown
Shape = tuple[Dim, ...]

# Types whose elements are packed two per byte in raw_data.
_FOUR_BIT_TYPES = frozenset({onnx.TensorProto.INT4, onnx.TensorProto.UINT4, onnx.TensorProto.FLOAT4E2M1})
_MAX_LISTED_DIFFERENCES = 3


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


# ------------------------------------------------------------------------------------------- loading

# The protobuf limit: an ONNX file larger than this cannot be a model (its weights must be external data).
MAX_GRAPH_BYTES = 2 * 1024**3


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

@dataclass(frozen=True)
class StoredTensor:
    """A tensor the model stores, with where it sits in the model (for messages): ``what`` reads like
    ``initializer 'w'`` or ``attribute 'value' of node 'c' (Constant)``, with the subgraph or function it is in."""

    what: str
    tensor: onnx.TensorProto
    sparse: bool = False        # the values or indices of a sparse tensor
    initializer: bool = False   # an initializer of the main graph (what a converter reads as a weight)


def model_tensors(model: onnx.ModelProto) -> Iterator[StoredTensor]:
    """Every tensor a model stores, in a fixed order: the initializers and sparse initializers of the main graph,
    then the tensors of each node's attributes (``Constant``'s ``value``, ``sparse_value``, ...) and of its
    subgraphs (If/Loop/Scan bodies, at any depth), then those of the nodes of model-local functions, then those of
    the training graphs (``training_info``, which inference never runs but a file can still point anywhere from).

    Everything that can hold bytes -- inline or in an external file -- is here: a check or a copy that walks this
    misses none of them.
    """
    yield from _graph_stored_tensors(model.graph, "", main=True)
    for function in model.functions:
        for node in function.node:
            yield from _node_stored_tensors(node, f" in function {function.name!r}")
    for index, training in enumerate(model.training_info):
        for field_name in ("initialization", "algorithm"):
            if training.HasField(field_name):
                yield from _graph_stored_tensors(getattr(training, field_name),
                                                 f" in training_info[{index}].{field_name}")


def _graph_stored_tensors(graph: onnx.GraphProto, scope: str, main: bool = False) -> Iterator[StoredTensor]:
    """A graph's initializers, sparse initializers and node tensors (recursing into subgraphs); ``scope`` says
    where the graph sits, ``main`` that it is the model's own graph."""
    for tensor in graph.initializer:
        yield StoredTensor(f"initializer {tensor.name!r}{scope}", tensor, initializer=main)
    for sparse in graph.sparse_initializer:
        yield from _sparse_parts(f"sparse initializer {sparse.values.name!r}{scope}", sparse)
    for node in graph.node:
        yield from _node_stored_tensors(node, scope)


def _node_stored_tensors(node: onnx.NodeProto, scope: str) -> Iterator[StoredTensor]:
    """The tensors of a node's attributes, and of the subgraphs among them."""
    label = f"node {(node.name or (node.output[0] if node.output else ''))!r} ({node.op_type})"
    for attribute in node.attribute:
        where = f"attribute {attribute.name!r} of {label}{scope}"
        # by field, not by the declared type: a tensor filed under a wrong type is still stored
        if attribute.HasField("t"):
            yield StoredTensor(where, attribute.t)
        yield from (StoredTensor(f"{where}[{index}]", tensor) for index, tensor in enumerate(attribute.tensors))
        if attribute.HasField("sparse_tensor"):
            yield from _sparse_parts(where, attribute.sparse_tensor)
        for index, sparse in enumerate(attribute.sparse_tensors):
            yield from _sparse_parts(f"{where}[{index}]", sparse)
        if attribute.HasField("g"):
            yield from _graph_stored_tensors(attribute.g, f" in the body {attribute.name!r} of {label}{scope}")
        for index, graph in enumerate(attribute.graphs):
            yield from _graph_stored_tensors(graph, f" in the body {attribute.name!r}[{index}] of {label}{scope}")


def _sparse_parts(what: str, sparse: onnx.SparseTensorProto) -> Iterator[StoredTensor]:
    yield StoredTensor(f"{what} (values)", sparse.values, sparse=True)
    yield StoredTensor(f"{what} (indices)", sparse.indices, sparse=True)


# ------------------------------------------------------------------------------------------- external data

@dataclass(frozen=True)
class ExternalData:
    """Where an external tensor's bytes are: ``path`` as the model names it (its folder / ``location``),
    ``real_path`` with every symlink resolved (checked to be a regular file inside the model's folder), and the
    byte range."""

    location: str
    path: Path
    real_path: Path
    offset: int
    length: int


_DECIMAL = re.compile(r"[0-9]+")


def model_folders(model_path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """The folders a model's external data may lie in: the folder the model is named in, and the folder its
    file really is in (when it is a symlink, as in a Hugging Face hub cache or Snakemake's output cache) --
    the rule onnxruntime applies too."""
    named = Path(model_path).parent
    return named, Path(os.path.realpath(model_path)).parent


def external_data(stored: StoredTensor, model_path: str | os.PathLike[str]) -> ExternalData:
    """Resolve an external tensor's bytes: the one place a ``location``/``offset``/``length`` is read.

    ``location`` must be a relative path inside the model's folder (:func:`model_folders`) once symlinks are
    resolved, naming a regular file; ``offset`` and ``length`` non-negative decimal integers (as onnx's
    ``ExternalDataInfo`` requires) whose range lies within the file and holds exactly the bytes the tensor's
    shape and type need.

    Raises:
        GenieBuildError: naming the model file, the tensor and the problem.
    """
    where = os.fspath(model_path)
    info = {entry.key: entry.value for entry in stored.tensor.external_data}
    location = info.get("location", "")
    parts = PurePosixPath(location).parts
    if not location or "\0" in location or PurePosixPath(location).is_absolute() or ".." in parts:
        raise GenieBuildError(where, f"{stored.what}: external data location {location!r} must be a file name "
                                     "relative to the model's folder")
    numbers = {}
    for key in ("offset", "length"):
        if key in info and not _DECIMAL.fullmatch(info[key]):
            raise GenieBuildError(where, f"{stored.what}: external data {key} {info[key]!r} is not a non-negative "
                                         "integer")
        numbers[key] = int(info[key]) if key in info else None
    path = Path(where).parent / location
    real = _resolve_data_file(stored, where, path, location)
    size = real.stat().st_size
    offset = numbers["offset"] or 0
    length = size - offset if numbers["length"] is None else numbers["length"]
    if offset + max(length, 0) > size or length < 0:
        raise GenieBuildError(where, f"{stored.what}: offset {offset} + length {length} runs past the end of "
                                     f"{path} ({size} bytes; truncated data file?)")
    expected = _stored_nbytes(stored.tensor, where, stored.what)
    if length != expected:
        type_name = onnx.TensorProto.DataType.Name(stored.tensor.data_type)
        raise GenieBuildError(where, f"{stored.what}: external length {length} in {path} but shape "
                                     f"{list(stored.tensor.dims)} of {type_name} needs {expected} bytes")
    return ExternalData(location=location, path=path, real_path=real, offset=offset, length=length)


def _resolve_data_file(stored: StoredTensor, where: str, path: Path, location: str) -> Path:
    """The real path of a data file, checked to be inside the model's folder and a regular file."""
    try:
        real = resolve_inside(path, model_folders(where))
    except GenieBuildError as exc:
        raise GenieBuildError(where, f"{stored.what}: external data file {location!r} {exc.problem}") from None
    try:
        status = real.stat()
    except FileNotFoundError:
        raise GenieBuildError(where, f"{stored.what}: external data file {path} not found (copy it next to the "
                                     ".onnx file)") from None
    except OSError as exc:
        raise GenieBuildError(where, f"{stored.what}: external data file {path}: cannot read: "
                                     f"{exc.strerror or exc}") from None
    if not stat.S_ISREG(status.st_mode):
        raise GenieBuildError(where, f"{stored.what}: external data file {path} is not a regular file")
    return real


@contextlib.contextmanager
def open_external_data(stored: StoredTensor, model_path: str | os.PathLike[str]
                       ) -> Iterator[tuple[BinaryIO, ExternalData]]:
    """Open an external tensor's data file (:func:`external_data`, then
    :func:`genie_build.fileio.open_regular` inside the model's folder), positioned at the tensor's first byte.

    Raises:
        GenieBuildError: as :func:`external_data`, or the file cannot be opened.
    """
    ref = external_data(stored, model_path)
    with open_regular(ref.path, inside=model_folders(model_path)) as handle:
        handle.seek(ref.offset)
        yield handle, ref


def check_external_data(model: onnx.ModelProto, path: str | os.PathLike[str]) -> list[Path]:
    """Check every tensor the model stores (:func:`model_tensors`: initializers, node attributes, subgraphs,
    functions) before anything reads it: external data as :func:`external_data` resolves it, inline data holding
    what its shape needs, no initializer name defined twice in one graph, and no sparse initializer (a split
    part could not carry it).

    Args:
        model: the graph, loaded with :func:`load_graph`.
        path: the ``.onnx`` file it came from; data file locations are relative to its folder.

    Returns:
        The external data files, sorted, each once, as the model names them (the inputs of a job reading the
        model's weights: a changed weight must rerun it even if the ``.onnx`` did not change).

    Raises:
        GenieBuildError: naming ``path`` and the tensor: a data file that is missing, not a regular file or
            outside the model's folder, an offset or length that is not a non-negative integer or runs past the
            file's end, a length or inline size that does not match the shape, a duplicate initializer, or a
            sparse initializer.
    """
    where = os.fspath(path)
    _check_unique_initializers(model, where)
    files = set()
    for stored in model_tensors(model):
        if stored.sparse and stored.what.startswith("sparse initializer"):
            raise GenieBuildError(where, f"{stored.what}: sparse initializers are not supported (a split part "
                                         "could not carry it); store the tensor dense")
        if stored.tensor.data_location == onnx.TensorProto.EXTERNAL:
            files.add(external_data(stored, where).path)
        else:
            _check_inline_size(stored, where)
    return sorted(files)


def external_data_files(model: onnx.ModelProto, path: str | os.PathLike[str]) -> list[Path]:
    """The external data files a model's tensors live in (:func:`check_external_data`, which checks them)."""
    return check_external_data(model, path)


def _check_unique_initializers(model: onnx.ModelProto, where: str) -> None:
    for graph in _graph_and_subgraphs(model.graph):
        counts = Counter(tensor.name for tensor in graph.initializer)
        counts.update(sparse.values.name for sparse in graph.sparse_initializer)
        repeated = sorted(name for name, count in counts.items() if count > 1)
        if repeated:
            scope = "" if graph is model.graph else f" in subgraph {graph.name!r}"
            raise GenieBuildError(where, f"initializer {repeated[0]!r}{scope} is defined {counts[repeated[0]]} "
                                         f"times{f' (and {len(repeated) - 1} more names)' if len(repeated) > 1 else ''}"
                                         "; every initializer needs its own name")


def _check_inline_size(stored: StoredTensor, where: str) -> None:
    """An inline tensor holds as many values as its shape says (raw bytes, or elements of its typed field)."""
    tensor = stored.tensor
    if tensor.data_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING):
        return
    if tensor.HasField("raw_data"):
        found, expected, unit = len(tensor.raw_data), _stored_nbytes(tensor, where, stored.what), "bytes"
    else:
        field_name = onnx.helper.tensor_dtype_to_field(tensor.data_type)
        count = math.prod(tensor.dims)
        per_value = 2 if tensor.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128) else 1
        expected = (count + 1) // 2 if tensor.data_type in _FOUR_BIT_TYPES else count * per_value
        found, unit = len(getattr(tensor, field_name)), f"{field_name} values"
    if found != expected:
        raise GenieBuildError(where, f"{stored.what}: holds {found} {unit} but shape {list(tensor.dims)} of "
                                     f"{onnx.TensorProto.DataType.Name(tensor.data_type)} needs {expected}")


# ------------------------------------------------------------------------------------------- walking

@dataclass(frozen=True)
class WeightLayout:
    """The axes of a weight an encoding runs along: one scale per index of ``channel_axis``; blocks of
    ``block_size`` along ``block_axis`` (None for a 1-D tensor). Both non-negative."""

    channel_axis: int
    block_axis: int | None


@dataclass(frozen=True)
class GraphTensors:
    """The names an ONNX graph (with its subgraphs) uses, read without its external data.

    ``tensor_names``: graph inputs and outputs, node inputs and outputs, initializers.
    ``param_shapes``: initializer name -> shape.
    ``param_layouts``: initializer name -> the axes its consumer gives it (:func:`consumer_layouts`).
    """

    tensor_names: frozenset[str]
    param_shapes: dict[str, tuple[int, ...]]
    param_layouts: dict[str, WeightLayout] = field(default_factory=dict)


def read_graph_tensors(onnx_path: str | os.PathLike[str]) -> GraphTensors:
    """Read the tensor names and initializer shapes of an ONNX model, never loading its weights.

    Raises:
        GenieBuildError: the file is missing, not an ONNX model, or has no nodes.
    """
    return graph_tensors(load_graph(onnx_path))


def graph_tensors(model: onnx.ModelProto) -> GraphTensors:
    """:func:`read_graph_tensors` of a model already loaded."""
    graphs = list(_graph_and_subgraphs(model.graph))
    param_shapes = {tensor.name: tuple(tensor.dims) for graph in graphs for tensor in graph.initializer}
    param_shapes.update({sparse.values.name: tuple(sparse.dims)
                         for graph in graphs for sparse in graph.sparse_initializer})
    tensor_names = {name for graph in graphs for name in _graph_tensor_names(graph)}
    return GraphTensors(tensor_names=frozenset(tensor_names | set(param_shapes)), param_shapes=param_shapes,
                        param_layouts=consumer_layouts(graphs, param_shapes))


def part_tensor_names(onnx_path: str | os.PathLike[str]) -> tuple[set[str], set[str]]:
    """The tensors a part touches and the initializers it holds: ``(tensor_names, initializer_names)``."""
    tensors = read_graph_tensors(onnx_path)
    return set(tensors.tensor_names), set(tensors.param_shapes)


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The bodies of a node (If, Loop, Scan), not recursing into them."""
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            yield attribute.g
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            yield from attribute.graphs


def _graph_and_subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph in it, at any depth, parents first."""
    yield graph
    for node in graph.node:
        for subgraph in subgraphs(node):
            yield from _graph_and_subgraphs(subgraph)


def _graph_tensor_names(graph: onnx.GraphProto) -> Iterator[str]:
    yield from (value.name for value in (*graph.input, *graph.output))
    for node in graph.node:
        yield from (name for name in (*node.input, *node.output) if name)  # "" marks an omitted optional input


# Ops a weight passes through unchanged on its way to its consumer: AIMET follows Identity
# (``ir_utils.get_constant_value``); a Cast is how a float16-stored weight reaches a float32 op.
_PASS_THROUGH_OPS = ("Identity", "Cast")


def consumer_layouts(graphs: list[onnx.GraphProto], param_shapes: Mapping[str, tuple[int, ...]]
                     ) -> dict[str, WeightLayout]:
    """The channel and block axes of each initializer, from the first op that consumes it, as aimet-onnx
    decides them (``QuantizationSimModel._get_quantization_axes``, ``ir_utils.get_weight_value``):

    - MatMul weight (input 1): ``[.., in, out]`` -> last axis, blocks along the one before; reached through
      a Transpose (``[out, in]``, what torch.onnx writes for ``nn.Linear``) -> axis 0, blocks along axis 1;
    - Gemm weight: ``transB=1`` -> axis 0, blocks along 1; else axis 1, blocks along 0;
    - Conv weight ``[out, in, kh, kw]`` -> axis 0, blocks along 1; ConvTranspose -> axis 1, blocks along 0;
    - Gather table ``[vocab, hidden]`` -> axis 0 (one scale per row), blocks along 1;
    - any 1-D initializer (a bias) -> axis 0.

    Initializers of rank >= 2 that reach none of these have no entry: a per-channel encoding on them is an
    error, never a guess.
    """
    layouts = {name: WeightLayout(0, None) for name, shape in param_shapes.items() if len(shape) == 1}
    for graph in graphs:
        sources = _initializer_sources(graph, param_shapes)
        for node in graph.node:
            for name, axes in _consumer_axes(node, sources):
                shape = param_shapes[name]
                if name in layouts or len(shape) < 2:
                    continue
                channel, block = (axis % len(shape) for axis in axes)
                layouts[name] = WeightLayout(channel, block)
    return layouts


def _initializer_sources(graph: onnx.GraphProto, param_shapes: Mapping[str, tuple[int, ...]]
                         ) -> dict[str, tuple[str, bool]]:
    """Tensor -> ``(initializer, transposed)`` for every initializer and every tensor made from one by
    :data:`_PASS_THROUGH_OPS` or a 2-D Transpose."""
    sources = {name: (name, False) for name in param_shapes}
    for node in graph.node:
        if not node.input or node.input[0] not in sources:
            continue
        initializer, transposed = sources[node.input[0]]
        if node.op_type in _PASS_THROUGH_OPS:
            sources[node.output[0]] = (initializer, transposed)
        elif node.op_type == "Transpose" and len(param_shapes[initializer]) == 2 and not transposed:
            sources[node.output[0]] = (initializer, True)
    return sources


def _consumer_axes(node: onnx.NodeProto, sources: Mapping[str, tuple[str, bool]]
                   ) -> Iterator[tuple[str, tuple[int, int]]]:
    """``(initializer, (channel axis, block axis))`` for the weight ``node`` consumes, if it has an AIMET rule."""
    def source(index: int) -> tuple[str, bool] | None:
        return sources.get(node.input[index]) if len(node.input) > index else None

    if node.op_type in ("MatMul", "Gemm") and (weight := source(1)) is not None:
        name, transposed = weight
        if node.op_type == "Gemm":
            transposed = transposed or any(a.name == "transB" and a.i for a in node.attribute)
        yield name, ((-2, -1) if transposed else (-1, -2)) if node.op_type == "MatMul" else \
            ((0, 1) if transposed else (1, 0))
    elif node.op_type in ("Conv", "ConvTranspose") and (weight := source(1)) is not None and not weight[1]:
        yield weight[0], (0, 1) if node.op_type == "Conv" else (1, 0)
    elif node.op_type == "Gather" and (table := source(0)) is not None and not table[1]:
        yield table[0], (0, 1)


# ------------------------------------------------------------------------------------------- inspecting

def initializer_specs(model: onnx.ModelProto) -> dict[str, InitializerSpec]:
    """Name, shape, dtype and stored size of every initializer, read from the graph only."""
    return {tensor.name: InitializerSpec(name=tensor.name, shape=tuple(tensor.dims),
                                         dtype=_dtype_name(tensor.data_type),
                                         nbytes=0 if tensor.data_type == onnx.TensorProto.STRING
                                         else _stored_nbytes(tensor))
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
    return TensorSpec(name=value.name, shape=shape, dtype=_dtype_name(tensor_type.elem_type))


def _dim(dim: onnx.TensorShapeProto.Dimension) -> Dim:
    if dim.HasField("dim_value"):
        return dim.dim_value
    return dim.dim_param or None


def _dtype_name(data_type: int) -> str:
    if data_type == onnx.TensorProto.UNDEFINED:
        return "undefined"
    return onnx.helper.tensor_dtype_to_np_dtype(data_type).name


def _stored_nbytes(tensor: onnx.TensorProto, where: str | os.PathLike[str] = "", what: str = "") -> int:
    """Bytes of a tensor's data as stored (4-bit types packed two per byte).

    Raises:
        GenieBuildError: (naming ``where`` and ``what``) a type without a fixed element size (string, undefined).
    """
    count = math.prod(tensor.dims)
    if tensor.data_type in _FOUR_BIT_TYPES:
        return (count + 1) // 2
    if tensor.data_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING):
        raise GenieBuildError(where, f"{what or repr(tensor.name)}: a tensor of type "
                                     f"{onnx.TensorProto.DataType.Name(tensor.data_type)} has no fixed size to store")
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


# ------------------------------------------------------------------------------------------- sharing

def check_model(prompt_path: str, token_path: str, out: str | os.PathLike[str]) -> dict:
    """The check-model stage: both graphs' weights are all there (:func:`check_external_data`), every float weight
    is finite, and the shared ones agree (:func:`check_shared_initializers`, one pass over the weights for
    both); writes and returns a summary of what they share.

    Raises:
        GenieBuildError: a weight file is missing or short, a float weight holds NaN or infinity (naming the
            graph file, the tensor and the value), or a shared weight differs.
    """
    graphs = {"prompt": load_graph(prompt_path), "token": load_graph(token_path)}
    check_external_data(graphs["prompt"], prompt_path)
    check_external_data(graphs["token"], token_path)
    check_shared_initializers(prompt_path, token_path, check_values=True)
    for kind, path in (("prompt", prompt_path), ("token", token_path)):
        for stored in model_tensors(graphs[kind]):
            if not stored.initializer and not stored.sparse:
                scan_tensor(stored, path, finite=True)
    specs = {kind: initializer_specs(model) for kind, model in graphs.items()}
    shared = sorted(set(specs["prompt"]) & set(specs["token"]))
    summary = {"prompt": prompt_path, "token": token_path, "shared_initializers": len(shared),
               "shared_bytes": sum(specs["prompt"][name].nbytes for name in shared)}
    write_json(out, summary)
    return summary


def check_shared_initializers(prompt_path: str | os.PathLike[str], token_path: str | os.PathLike[str], *,
                              check_values: bool = False) -> None:
    """Check that initializers with the same name in both graphs are the same tensor: shape, dtype and value.

    Weight sharing between the prompt and token graphs keys on names, and some exporters reuse a name for
    different constants in the two graphs; values are compared by a streamed sha256 of each tensor's
    bytes, so memory stays bounded by one copy chunk. Run :func:`check_external_data` on both first.

    Args:
        check_values: also require every float initializer of both graphs to be finite, in the same pass.

    Raises:
        GenieBuildError: naming both files, the tensor(s) and what differs; or (``check_values``) naming the
            graph file, the first non-finite weight and its value.
    """
    prompt, token = load_graph(prompt_path), load_graph(token_path)
    shared = {t.name for t in prompt.graph.initializer} & {t.name for t in token.graph.initializer}
    digests = {kind: {tensor.name: digest for tensor in model.graph.initializer
                      if (digest := scan_tensor(tensor, path, digest=tensor.name in shared,
                                                finite=check_values)) is not None}
               for kind, model, path in (("prompt", prompt, prompt_path), ("token", token, token_path))}
    prompt_tensors = {tensor.name: tensor for tensor in prompt.graph.initializer}
    differences = []
    for tensor in token.graph.initializer:
        other = prompt_tensors.get(tensor.name)
        if other is None:
            continue
        difference = _tensor_difference(other, tensor, digests["prompt"].get(tensor.name),
                                        digests["token"].get(tensor.name))
        if difference:
            differences.append(f"{tensor.name!r} {difference}")
    if differences:
        listed = "; ".join(differences[:_MAX_LISTED_DIFFERENCES])
        more = len(differences) - _MAX_LISTED_DIFFERENCES
        raise GenieBuildError(token_path, f"{len(differences)} initializer(s) named like ones in {prompt_path} hold "
                                          f"different data: {listed}{f'; and {more} more' if more > 0 else ''}. "
                                          "The prompt and token graphs must share identical weights "
                                          "(export both with the same exporter settings)")


def _tensor_difference(prompt: onnx.TensorProto, token: onnx.TensorProto, prompt_digest: str | None,
                       token_digest: str | None) -> str | None:
    """How two same-named tensors differ (prompt value first), or None when they are identical."""
    if list(prompt.dims) != list(token.dims):
        return f"has shape {list(prompt.dims)} in the prompt graph but {list(token.dims)} in the token graph"
    if prompt.data_type != token.data_type:
        return (f"has dtype {_dtype_name(prompt.data_type)} in the prompt graph "
                f"but {_dtype_name(token.data_type)} in the token graph")
    if prompt_digest != token_digest:
        return f"has the same shape {list(prompt.dims)} and dtype but different values"
    return None


# Float element types a weight may hold NaN or infinity in.
FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                         onnx.TensorProto.BFLOAT16})


def tensor_sha256(tensor: onnx.TensorProto, model_path: str | os.PathLike[str]) -> str:
    """sha256 of a tensor's little-endian element bytes, wherever they are stored (:func:`scan_tensor`)."""
    return scan_tensor(tensor, model_path, digest=True)


def scan_tensor(tensor: onnx.TensorProto | StoredTensor, model_path: str | os.PathLike[str], *,
                digest: bool = False, finite: bool = False) -> str | None:
    """Stream a tensor's element bytes once: hash them, and/or require a float tensor to be finite.

    External data is streamed from its file in chunks (:func:`open_external_data`); inline data is read from
    the protobuf. Memory stays bounded by one copy chunk.

    Returns:
        The sha256 of the bytes when ``digest``, else None.

    Raises:
        GenieBuildError: (``finite``) naming ``model_path``, the tensor, the first non-finite value and its index;
            or the external data cannot be read.
    """
    stored = tensor if isinstance(tensor, StoredTensor) else StoredTensor(f"initializer {tensor.name!r}", tensor)
    tensor = stored.tensor
    checker = _FiniteChecker(tensor) if finite and tensor.data_type in FLOAT_TYPES else None
    if not digest and checker is None:
        return None
    sink = HashingWriter(hashlib.sha256(), checker)
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        with open_external_data(stored, model_path) as (source, ref):
            copy_range(source, sink, ref.offset, ref.length)
    elif tensor.HasField("raw_data"):
        sink.write(tensor.raw_data)
    else:
        # Typed fields (float_data, int64_data, ...) decode to the same bytes raw_data would hold.
        sink.write(numpy_helper.to_array(tensor).tobytes())
    if checker is not None:
        checker.require_finite(model_path, stored.what)
    return sink.digest.hexdigest() if digest else None


class _FiniteChecker:
    """A write-only sink that reads the float values streaming through it and remembers the first that is NaN or
    infinite (chunks may end inside a value: the rest is carried to the next write)."""

    def __init__(self, tensor: onnx.TensorProto) -> None:
        self.tensor = tensor
        self.dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
        self.carry = b""
        self.seen = 0
        self.first: tuple[int, float] | None = None

    def write(self, data: bytes) -> int:
        """Look at the whole values in ``data`` (with what the last write left over); always takes all of it."""
        if self.first is None:
            buffer = memoryview(self.carry + bytes(data) if self.carry else data).cast("B")
            usable = len(buffer) - len(buffer) % self.dtype.itemsize
            values = np.frombuffer(buffer[:usable], dtype=self.dtype)
            bad = np.flatnonzero(~np.isfinite(values))
            if bad.size:
                self.first = (self.seen + int(bad[0]), float(values[bad[0]]))
            self.seen += values.size
            self.carry = bytes(buffer[usable:])
        return len(data)

    def require_finite(self, model_path: str | os.PathLike[str], what: str) -> None:
        if self.first is not None:
            raise GenieBuildError(model_path, _nonfinite_problem(what, *self.first, tuple(self.tensor.dims)))


FINITE_CHECK_CHUNK = 1 << 22


def require_finite(values: np.ndarray, what: str, where: str | os.PathLike[str]) -> None:
    """Require a float array to hold no NaN or infinity (other arrays pass).

    Raises:
        GenieBuildError: naming ``where``, ``what`` (the tensor), the first bad value and its index.
    """
    if not (np.issubdtype(values.dtype, np.floating) or values.dtype.kind == "V"):
        return
    flat = values.reshape(-1)
    for start in range(0, flat.size, FINITE_CHECK_CHUNK):  # a chunk at a time: a whole-table mask is GBs for a 7B model
        finite = np.isfinite(flat[start:start + FINITE_CHECK_CHUNK])
        if not finite.all():
            index = start + int(np.argmin(finite))
            raise GenieBuildError(where, _nonfinite_problem(what, index, float(flat[index]), values.shape))


def _nonfinite_problem(what: str, index: int, value: float, shape: tuple[int, ...]) -> str:
    position = [int(i) for i in np.unravel_index(index, shape)] if shape else []
    return (f"{what} holds {value} at index {position} (shape {[int(d) for d in shape]}): every float weight "
            "must be finite")


def ar_and_context_length(model: onnx.ModelProto) -> tuple[int, int] | None:
    """(AR, CL) as Genie reads them from the graph's tensors (:func:`genie_build.conventions.graph_ar_cl`).

    Returns None when Genie could not read either of them from the tensors.
    """
    io = graph_io(model)
    ar, context_length = graph_ar_cl("", io.inputs, io.outputs)
    return (ar, context_length) if ar and context_length else None
