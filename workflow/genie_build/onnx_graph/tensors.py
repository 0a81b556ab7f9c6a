"""Every tensor an ONNX model stores, wherever it sits (initializers, node attributes, subgraphs, functions,
training graphs), and the walk over a graph's subgraphs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import onnx

__all__ = ["StoredTensor", "graph_and_subgraphs", "model_tensors", "subgraphs"]

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
