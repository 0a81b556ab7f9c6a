"""Split boundaries: the residual-stream tensors after the embedding and after each decoder layer.

A decoder with L layers has L + 1 boundaries ``[1, AR, hidden]``: index 0 is the embedding output and
index i + 1 the output of layer i (the last one feeds the final norm and LM head). They come from the
config (``split.boundaries``) or are found from node scopes:

- a node's layer is ``i`` in ``layers.{i}`` / ``layers_{i}`` of its name (TorchScript, Genie-named graphs)
  or of its ``pkg.torch.onnx.name_scopes`` metadata (dynamo exports);
- a node without a layer is *pre-layer* when it depends on no layer node (embedding, RoPE, mask) and
  *post-layer* otherwise (final norm, LM head);
- the boundary after layer i is the tensor produced at scope <= i and consumed at scope > i. Exporters
  share RoPE tensors and constants across layers too, so candidates are filtered to rank 3 with the
  hidden size as last dim; exactly one must remain.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import onnx

from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import InitializerSpec, Shape, initializer_specs, tensor_shapes

__all__ = ["CONFIG_KEY", "discover_boundaries", "embedding_table", "find_boundaries", "node_layer"]

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
PRE_LAYER = -1
# Ops between a weight and its consumer that keep its values and shape: float16 weights are Cast to
# float32, quantized ones dequantized, some exporters add an Identity.
VALUE_PRESERVING_OPS = frozenset({"Cast", "DequantizeLinear", "Identity"})
CONFIG_KEY = "split.boundaries"

_LAYER_SCOPE = re.compile(r"(?<![A-Za-z0-9])layers[._](\d+)(?!\d)")
_MAX_LISTED = 8


def find_boundaries(model: onnx.ModelProto, path: str | os.PathLike[str],
                    explicit: Sequence[str] | None = None) -> tuple[str, ...]:
    """The L + 1 boundary tensors in graph order: explicit names when given, else found from node scopes.

    Args:
        model: the graph (loaded without weights).
        path: its file, for error messages.
        explicit: ``split.boundaries`` from the config, or None to discover them.

    Raises:
        GenieBuildError: an explicit name is missing, not rank 3 or out of order; or discovery does not
            find exactly one candidate per boundary (the message lists the candidates).
    """
    if explicit:
        return _check_boundaries(model, path, explicit)
    return discover_boundaries(model, path)


def _check_boundaries(model: onnx.ModelProto, path: str | os.PathLike[str],
                      names: Sequence[str]) -> tuple[str, ...]:
    """Validate explicit boundary names: at least two, distinct, produced by nodes in this order, rank 3."""
    if len(names) < 2:
        raise GenieBuildError(path, f"{CONFIG_KEY} has {len(names)} tensor(s); it needs L + 1 >= 2: the "
                                    "embedding output, then the output of each decoder layer")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise GenieBuildError(path, f"{CONFIG_KEY} lists {duplicates} more than once")
    producer_index = {output: index for index, node in enumerate(model.graph.node) for output in node.output}
    missing = [name for name in names if name not in producer_index]
    if missing:
        raise GenieBuildError(path, f"{CONFIG_KEY}: no node produces {missing}")
    shapes = tensor_shapes(model)
    for name in names:
        shape = shapes.get(name)
        if shape is None or len(shape) != 3:
            raise GenieBuildError(path, f"{CONFIG_KEY}: tensor {name!r} has shape {_shape_text(shape)}; a "
                                        "boundary must be the rank-3 residual stream [batch, AR, hidden]")
    for before, after in zip(names, names[1:]):
        if producer_index[after] <= producer_index[before]:
            raise GenieBuildError(path, f"{CONFIG_KEY}: {after!r} comes before {before!r} in the graph; "
                                        "list the boundaries in graph order")
    return tuple(names)


def discover_boundaries(model: onnx.ModelProto, path: str | os.PathLike[str]) -> tuple[str, ...]:
    """Find the L + 1 boundaries from node scopes (see the module docstring).

    Raises:
        GenieBuildError: no layer scopes, a missing layer, or not exactly one residual candidate at a cut.
    """
    nodes = model.graph.node
    layers = [node_layer(node) for node in nodes]
    num_layers = _count_layers(layers, path)
    scopes = _node_scopes(nodes, layers, num_layers)
    hidden = embedding_table(model, path).shape[1]
    shapes = tensor_shapes(model)

    crossing: list[list[str]] = [[] for _ in range(num_layers + 1)]   # index k + 1: tensors crossing cut k
    for tensor, (produced, last_consumed) in _scope_spans(nodes, scopes).items():
        for cut in range(produced, last_consumed):
            crossing[cut + 1].append(tensor)

    boundaries = []
    for cut, candidates in enumerate(crossing):
        residual = [name for name in candidates if _is_residual(shapes.get(name), hidden)]
        if len(residual) != 1:
            raise _ambiguous_cut(path, cut - 1, hidden, residual, candidates, shapes)
        boundaries.append(residual[0])
    return tuple(boundaries)


def node_layer(node: onnx.NodeProto) -> int | None:
    """The decoder layer a node belongs to, from ``layers.{i}`` in its name or its torch name-scope metadata."""
    match = _LAYER_SCOPE.search(node.name)
    if match is None:
        scopes = next((prop.value for prop in node.metadata_props if prop.key == NAME_SCOPES_KEY), "")
        match = _LAYER_SCOPE.search(scopes)
    return int(match.group(1)) if match else None


def _node_scopes(nodes: Sequence[onnx.NodeProto], layers: Sequence[int | None], num_layers: int) -> list[int]:
    """Each node's scope: its layer; ``PRE_LAYER`` (-1) for unscoped nodes that depend on no layer node;
    ``num_layers`` for unscoped nodes after the layers. Relies on ONNX's topological node order."""
    after_layers: set[str] = set()
    scopes = []
    for node, layer in zip(nodes, layers):
        depends_on_layers = layer is not None or any(name in after_layers for name in node.input)
        if depends_on_layers:
            after_layers.update(node.output)
        scopes.append(layer if layer is not None else num_layers if depends_on_layers else PRE_LAYER)
    return scopes


def embedding_table(model: onnx.ModelProto, path: str | os.PathLike[str]) -> InitializerSpec:
    """The token embedding table: the rank-2 initializer a Gather reads, directly or through
    :data:`VALUE_PRESERVING_OPS` (a float16 table is Cast to float32 first); when several are, the one
    indexed directly by a graph input (the token ids).

    Raises:
        GenieBuildError: no such Gather, or no way to tell one table from the others.
    """
    specs = initializer_specs(model)
    source = _initializer_sources(model, specs)
    lookups = [(node.input[1], source[node.input[0]]) for node in model.graph.node
               if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in source
               and len(specs[source[node.input[0]]].shape) == 2]
    tables = {table for _, table in lookups}
    if len(tables) > 1:
        graph_inputs = {value.name for value in model.graph.input}
        tables = {table for index, table in lookups if index in graph_inputs} or tables
    if len(tables) != 1:
        found = f"found {sorted(tables)}" if tables else "found none"
        raise GenieBuildError(path, f"cannot tell the embedding table (a Gather of a [vocab, hidden] initializer "
                                    f"by the token ids): {found}; set {CONFIG_KEY}")
    return specs[tables.pop()]


def _initializer_sources(model: onnx.ModelProto, specs: dict[str, InitializerSpec]) -> dict[str, str]:
    """Tensor name -> the initializer it carries: each initializer itself, and the output of a
    :data:`VALUE_PRESERVING_OPS` node fed by one (chains too; relies on ONNX's topological node order)."""
    source = {name: name for name in specs}
    for node in model.graph.node:
        if node.op_type in VALUE_PRESERVING_OPS and node.input and node.input[0] in source and len(node.output) == 1:
            source[node.output[0]] = source[node.input[0]]
    return source


def _count_layers(layers: Sequence[int | None], path: str | os.PathLike[str]) -> int:
    found = {layer for layer in layers if layer is not None}
    if not found:
        raise GenieBuildError(path, "no node carries a decoder-layer scope ('layers.{i}' in its name or in "
                                    f"{NAME_SCOPES_KEY} metadata); set {CONFIG_KEY} to the L + 1 residual tensors")
    num_layers = max(found) + 1
    missing = sorted(set(range(num_layers)) - found)
    if missing:
        raise GenieBuildError(path, f"node scopes name layers up to {num_layers - 1} but no node of layer(s) "
                                    f"{missing}; set {CONFIG_KEY}")
    return num_layers


def _scope_spans(nodes: Sequence[onnx.NodeProto], scopes: Sequence[int]) -> dict[str, tuple[int, int]]:
    """For each node output: (scope of its producer, highest scope among its consumers); a tensor crosses
    the cut after layer k when ``produced <= k < last_consumed``."""
    produced = {output: scope for node, scope in zip(nodes, scopes) for output in node.output if output}
    spans = {}
    for node, scope in zip(nodes, scopes):
        for name in node.input:
            if name in produced:
                start, end = spans.get(name, (produced[name], produced[name]))
                spans[name] = (start, max(end, scope))
    return spans


def _is_residual(shape: Shape | None, hidden: int) -> bool:
    return shape is not None and len(shape) == 3 and shape[-1] == hidden


def _ambiguous_cut(path: str | os.PathLike[str], after_layer: int, hidden: int, residual: list[str],
                   candidates: list[str], shapes: dict[str, Shape]) -> GenieBuildError:
    where = "the embedding" if after_layer == PRE_LAYER else f"layer {after_layer}"
    listed = residual if residual else candidates
    shown = ", ".join(f"{name} {_shape_text(shapes.get(name))}" for name in listed[:_MAX_LISTED])
    if len(listed) > _MAX_LISTED:
        shown += f", and {len(listed) - _MAX_LISTED} more"
    kind = f"{len(residual)} rank-3 tensors with last dim {hidden}" if residual else (
        f"no rank-3 tensor with last dim {hidden} among {len(candidates)} crossing tensor(s)")
    return GenieBuildError(path, f"cannot find the one residual-stream tensor after {where}: {kind} "
                                 f"({shown or 'none'}); set {CONFIG_KEY} to the L + 1 boundary tensor names")


def _shape_text(shape: Shape | None) -> str:
    return "unknown" if shape is None else "[" + ", ".join("?" if dim is None else str(dim) for dim in shape) + "]"
