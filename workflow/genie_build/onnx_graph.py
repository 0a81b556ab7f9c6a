"""Load and check ONNX graphs without their weights.

Everything here reads the graph protobuf only (``load_external_data=False``); weight bytes are touched
only to hash them, streamed in chunks, so memory stays bounded by the graph, not the model.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from google.protobuf.message import Error as ProtobufError
from onnx import numpy_helper

from genie_build.conventions import graph_ar_cl
from genie_build.errors import GenieBuildError
from genie_build.fileio import HashingWriter, copy_range, write_json

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

def load_graph(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Load an ONNX model's graph, leaving external weights on disk.

    Raises:
        GenieBuildError: the file is missing, unreadable, not a protobuf (truncated or corrupt), or holds
            no graph.
    """
    where = os.fspath(path)
    try:
        model = onnx.load(where, load_external_data=False)
    except FileNotFoundError:
        raise GenieBuildError(where, "file not found") from None
    except OSError as exc:
        raise GenieBuildError(where, f"cannot read: {exc.strerror or exc}") from None
    except (ProtobufError, ValueError, RuntimeError) as exc:
        raise GenieBuildError(where, f"not a valid ONNX model (truncated or corrupt file?): {exc}") from None
    if not model.graph.node:
        raise GenieBuildError(where, "not an ONNX model with a graph: it has no nodes (empty or truncated file?)")
    if not model.opset_import:
        raise GenieBuildError(where, "ONNX model has no opset_import (truncated file?)")
    return model


def check_external_data(model: onnx.ModelProto, path: str | os.PathLike[str]) -> None:
    """Check that every external initializer's bytes are where the graph says, with the right length.

    Args:
        model: the graph, loaded with :func:`load_graph`.
        path: the ``.onnx`` file it came from; data file locations are relative to its folder.

    Raises:
        GenieBuildError: a data file is missing or escapes the model's folder, or a tensor's
            offset + length runs past the end of its file, or its length does not match its shape.
    """
    base = Path(path).parent
    sizes: dict[Path, int] = {}
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = external_info(tensor, path)
        data_file = base / info["location"]
        if data_file not in sizes:
            if not data_file.is_file():
                raise GenieBuildError(path, f"initializer {tensor.name!r}: external data file {data_file} "
                                            "not found (copy it next to the .onnx file)")
            sizes[data_file] = data_file.stat().st_size
        file_size = sizes[data_file]
        offset = int(info.get("offset", 0))
        length = int(info.get("length", file_size - offset))
        if offset + length > file_size:
            raise GenieBuildError(path, f"initializer {tensor.name!r}: offset {offset} + length {length} runs "
                                        f"past the end of {data_file} ({file_size} bytes; truncated data file?)")
        expected = _stored_nbytes(tensor)
        if length != expected:
            raise GenieBuildError(path, f"initializer {tensor.name!r}: external length {length} in {data_file} "
                                        f"but shape {list(tensor.dims)} of "
                                        f"{onnx.TensorProto.DataType.Name(tensor.data_type)} needs {expected} bytes")


def external_data_files(model: onnx.ModelProto, path: str | os.PathLike[str]) -> list[Path]:
    """The external data files a graph's initializers live in (sorted, each once), for declaring them as
    inputs of the jobs that read the graph: a changed weight must rerun them even if the ``.onnx`` did not change.

    Raises:
        GenieBuildError: a location is absolute or escapes the model's folder.
    """
    base = Path(path).parent
    return sorted({base / external_info(tensor, path)["location"] for tensor in model.graph.initializer
                   if tensor.data_location == onnx.TensorProto.EXTERNAL})


def external_info(tensor: onnx.TensorProto, path: str | os.PathLike[str]) -> dict[str, str]:
    """An external initializer's ``location``/``offset``/``length`` entries, its location checked to be a file
    name relative to the model's folder (raises GenieBuildError otherwise)."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    if not location or os.path.isabs(location) or ".." in Path(location).parts:
        raise GenieBuildError(path, f"initializer {tensor.name!r}: external data location {location!r} must be "
                                    "a file name relative to the model's folder")
    return info


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
    graphs = list(graph_and_subgraphs(model.graph))
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


def graph_and_subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph in it, at any depth, parents first."""
    yield graph
    for node in graph.node:
        for subgraph in subgraphs(node):
            yield from graph_and_subgraphs(subgraph)


def stored_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Initializers and attribute tensors of a graph and of every subgraph in it, in a fixed order."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield attribute.t
            elif attribute.type == onnx.AttributeProto.TENSORS:
                yield from attribute.tensors
        for subgraph in subgraphs(node):
            yield from stored_tensors(subgraph)


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
                                         dtype=_dtype_name(tensor.data_type), nbytes=_stored_nbytes(tensor))
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


def _stored_nbytes(tensor: onnx.TensorProto) -> int:
    count = math.prod(tensor.dims)
    if tensor.data_type in _FOUR_BIT_TYPES:
        return (count + 1) // 2
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


# ------------------------------------------------------------------------------------------- sharing

def check_model(prompt_path: str, token_path: str, out: str | os.PathLike[str]) -> dict:
    """The check-model stage: both graphs' weights are all there (:func:`check_external_data`) and the shared
    ones agree (:func:`check_shared_initializers`); writes and returns a summary of what they share.

    Raises:
        GenieBuildError: a weight file is missing or short, or a shared weight differs.
    """
    graphs = {"prompt": load_graph(prompt_path), "token": load_graph(token_path)}
    check_external_data(graphs["prompt"], prompt_path)
    check_external_data(graphs["token"], token_path)
    check_shared_initializers(prompt_path, token_path)
    specs = {kind: initializer_specs(model) for kind, model in graphs.items()}
    shared = sorted(set(specs["prompt"]) & set(specs["token"]))
    summary = {"prompt": prompt_path, "token": token_path, "shared_initializers": len(shared),
               "shared_bytes": sum(specs["prompt"][name].nbytes for name in shared)}
    write_json(out, summary)
    return summary



def check_shared_initializers(prompt_path: str | os.PathLike[str], token_path: str | os.PathLike[str]) -> None:
    """Check that initializers with the same name in both graphs are the same tensor: shape, dtype and value.

    Weight sharing between the prompt and token graphs keys on names, and some exporters reuse a name for
    different constants in the two graphs; values are compared by a streamed sha256 of each tensor's
    bytes, so memory stays bounded by one copy chunk. Run :func:`check_external_data` on both first.

    Raises:
        GenieBuildError: naming both files, the tensor(s) and what differs.
    """
    prompt, token = load_graph(prompt_path), load_graph(token_path)
    prompt_tensors = {tensor.name: tensor for tensor in prompt.graph.initializer}
    differences = []
    for tensor in token.graph.initializer:
        other = prompt_tensors.get(tensor.name)
        if other is None:
            continue
        difference = _tensor_difference(other, prompt_path, tensor, token_path)
        if difference:
            differences.append(f"{tensor.name!r} {difference}")
    if differences:
        listed = "; ".join(differences[:_MAX_LISTED_DIFFERENCES])
        more = len(differences) - _MAX_LISTED_DIFFERENCES
        raise GenieBuildError(token_path, f"{len(differences)} initializer(s) named like ones in {prompt_path} hold "
                                          f"different data: {listed}{f'; and {more} more' if more > 0 else ''}. "
                                          "The prompt and token graphs must share identical weights "
                                          "(export both with the same exporter settings)")


def _tensor_difference(prompt: onnx.TensorProto, prompt_path: str | os.PathLike[str],
                       token: onnx.TensorProto, token_path: str | os.PathLike[str]) -> str | None:
    """How two same-named tensors differ (prompt value first), or None when they are identical."""
    if list(prompt.dims) != list(token.dims):
        return f"has shape {list(prompt.dims)} in the prompt graph but {list(token.dims)} in the token graph"
    if prompt.data_type != token.data_type:
        return (f"has dtype {_dtype_name(prompt.data_type)} in the prompt graph "
                f"but {_dtype_name(token.data_type)} in the token graph")
    if tensor_sha256(prompt, prompt_path) != tensor_sha256(token, token_path):
        return f"has the same shape {list(prompt.dims)} and dtype but different values"
    return None


def tensor_sha256(tensor: onnx.TensorProto, model_path: str | os.PathLike[str]) -> str:
    """sha256 of a tensor's little-endian element bytes, wherever they are stored.

    External data is streamed from its file in chunks; inline data is hashed from the protobuf.
    """
    sink = HashingWriter(hashlib.sha256())
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = external_info(tensor, model_path)
        with open(Path(model_path).parent / info["location"], "rb") as source:
            copy_range(source, sink, int(info.get("offset", 0)), int(info.get("length", _stored_nbytes(tensor))))
    elif tensor.HasField("raw_data"):
        sink.write(tensor.raw_data)
    else:
        # Typed fields (float_data, int64_data, ...) decode to the same bytes raw_data would hold.
        sink.write(numpy_helper.to_array(tensor).tobytes())
    return sink.digest.hexdigest()


def ar_and_context_length(model: onnx.ModelProto) -> tuple[int, int] | None:
    """(AR, CL) as Genie reads them from the graph's tensors (:func:`genie_build.conventions.graph_ar_cl`).

    Returns None when Genie could not read either of them from the tensors.
    """
    io = graph_io(model)
    ar, context_length = graph_ar_cl("", io.inputs, io.outputs)
    return (ar, context_length) if ar and context_length else None
