"""Canonical names for a graph torch's dynamo exporter wrote, so that one model exported whole or one part at a
time gives the same graph.

The exporter numbers values and nodes across the graph it exports (``val_120``, ``linear_15``, ``node_pow_3``),
and it makes a constant once and shares it between every layer that uses it, so a part exported alone names its
tensors and places its constants unlike the same part split out of the whole graph. This pass names every node
and every value by where it sits in the model instead:

- a node is ``/<module path>/<OpType>`` for the first of its op type in its module, then ``<OpType>_1``, ``_2`` …
  (node order), its outputs ``<node name>_output_<j>``; the module path is the innermost module of the node's
  ``pkg.torch.onnx.name_scopes``, with ``/`` between attribute names (``/model/layers.3/self_attn/q_proj``);
- every ``Constant`` is given once to each input it feeds, just before that node, as ``<node name>_input_<slot>``.

Graph inputs and outputs, initializers (the weights' HF names) and names in ``keep`` stay as they are. The
residual stream then has the names of the conventions by itself: the embedding's Gather output is
``/model/embed_tokens/Gather_output_0`` and a decoder layer's second Add (its MLP residual) is
``/model/layers.{i}/Add_1_output_0``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection

import onnx

__all__ = ["canonicalize", "module_path"]

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
# a '.' starts a new path element unless an index follows it: "model.layers.3.mlp" -> "model/layers.3/mlp"
_ATTRIBUTE_DOT = re.compile(r"\.(?!\d)")


def module_path(node: onnx.NodeProto) -> str:
    """The node's innermost module as a path, ``""`` for the exported wrapper itself."""
    scopes = next((prop.value for prop in node.metadata_props if prop.key == NAME_SCOPES_KEY), "")
    names = re.findall(r"'([^']*)'", scopes)
    module = names[-2] if len(names) >= 2 else ""   # the last entry is the FX node, not a module
    return "/" + _ATTRIBUTE_DOT.sub("/", module) if module else ""


def canonicalize(graph: onnx.GraphProto, keep: Collection[str] = ()) -> None:
    """Rename ``graph``'s nodes and values in place (see the module doc); value_info follows the renames."""
    fixed = {value.name for value in (*graph.input, *graph.output)} | {t.name for t in graph.initializer} | set(keep)
    constants = {node.output[0]: node for node in graph.node
                 if node.op_type == "Constant" and node.output[0] not in fixed}
    names: dict[str, str] = {}
    ordinals: Counter[tuple[str, str]] = Counter()
    nodes = []
    for node in graph.node:
        if node.output and node.output[0] in constants:
            continue
        path = module_path(node)
        ordinal = ordinals[(path, node.op_type)]
        ordinals[(path, node.op_type)] += 1
        node.name = f"{path}/{node.op_type}" + (f"_{ordinal}" if ordinal else "")
        for slot, value in enumerate(node.input):
            if value in constants:
                nodes.append(_constant_copy(constants[value], f"{node.name}_input_{slot}"))
                node.input[slot] = nodes[-1].output[0]
        for index, value in enumerate(node.output):
            if value and value not in fixed:
                names[value] = f"{node.name}_output_{index}"
        nodes.append(node)
    for node in nodes:
        node.input[:] = [names.get(value, value) for value in node.input]
        node.output[:] = [names.get(value, value) for value in node.output]
    value_info = [value for value in graph.value_info if value.name in names or value.name in fixed]
    for value in value_info:
        value.name = names.get(value.name, value.name)
    del graph.value_info[:]
    graph.value_info.extend(value_info)
    del graph.node[:]
    graph.node.extend(nodes)


def _constant_copy(constant: onnx.NodeProto, name: str) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(constant)
    copy.name = name
    copy.output[:] = [name]
    return copy
