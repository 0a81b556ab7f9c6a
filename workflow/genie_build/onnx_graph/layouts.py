"""The names a graph's tensors use and the axes their consumers give its weights (AIMET's channel-axis
rules, which :mod:`genie_build.encodings.layout` applies)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import onnx

from genie_build.onnx_graph.model import load_graph
from genie_build.onnx_graph.tensors import graph_and_subgraphs

__all__ = ["GraphTensors", "WeightLayout", "consumer_layouts", "graph_tensors", "part_tensor_names",
           "read_graph_tensors"]

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
