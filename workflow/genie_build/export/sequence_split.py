"""A graph as the exporter writes it, made of ops AIMET and Genie's graphs carry: ``torch.chunk`` (Phi-3's
gate_up_proj halves) exports as a ``SplitToSequence`` read by ``SequenceAt``, a sequence type AIMET cannot quantize;
:func:`split_without_sequences` makes it one ``Split`` with an output per chunk, the same tensors. The export runs it
on every graph before the canonical names (:mod:`genie_build.export.canonical`), so a part and the split of the whole
export stay alike.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from genie_build.errors import GenieBuildError

__all__ = ["split_without_sequences"]


def split_without_sequences(graph: onnx.GraphProto) -> None:
    """Each ``SplitToSequence`` whose chunks are read by ``SequenceAt`` (what ``torch.chunk`` exports to, e.g.
    Phi-3's gate_up_proj halves) as one ``Split`` with an output per chunk: the same tensors, without a sequence
    type, which AIMET cannot quantize and Genie's graphs do not carry.

    Raises:
        GenieBuildError: a split whose size, input shape or readers are not static.
    """
    graph_nodes = list(graph.node)   # one Python object per node, so that id() names it
    constants = {node.output[0]: numpy_helper.to_array(node.attribute[0].t) for node in graph_nodes
                 if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value"}
    shapes = {value.name: [dim.dim_value if dim.HasField("dim_value") else None
                           for dim in value.type.tensor_type.shape.dim]
              for value in (*graph.value_info, *graph.input, *graph.output)}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph_nodes:
        for value in node.input:
            readers.setdefault(value, []).append(node)
    rewritten: dict[int, list[onnx.NodeProto]] = {}
    for node in graph_nodes:
        if node.op_type != "SplitToSequence":
            continue
        attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}
        size = constants.get(node.input[1]) if len(node.input) > 1 else None
        shape, axis = shapes.get(node.input[0]), attributes.get("axis", 0)
        users = readers.get(node.output[0], [])
        if (size is None or size.ndim != 0 or attributes.get("keepdims", 1) != 1 or not shape
                or shape[axis] is None or not all(user.op_type == "SequenceAt" and user.input[1] in constants
                                                  for user in users)):
            raise GenieBuildError(node.name, "the export cannot make this SplitToSequence a static Split")
        count = -(-shape[axis] // int(size))
        sizes = [int(size)] * (count - 1) + [shape[axis] - int(size) * (count - 1)]
        outputs = [f"{node.output[0]}_{index}" for index in range(count)]
        for user in users:   # the first reader of a chunk names it; another reads a copy
            index = int(constants[user.input[1]]) % count
            if outputs[index] == f"{node.output[0]}_{index}":
                outputs[index] = user.output[0]
                rewritten[id(user)] = []
            else:
                identity = onnx.helper.make_node("Identity", [outputs[index]], list(user.output))
                identity.metadata_props.extend(user.metadata_props)
                rewritten[id(user)] = [identity]
        nodes = [onnx.helper.make_node("Constant", [], [f"{node.output[0]}_split"],
                                       value=numpy_helper.from_array(np.array(sizes, dtype=np.int64))),
                 onnx.helper.make_node("Split", [node.input[0], f"{node.output[0]}_split"], outputs, axis=axis)]
        for made in nodes:
            made.metadata_props.extend(node.metadata_props)
        rewritten[id(node)] = nodes
    if not rewritten:
        return
    nodes = [onnx.NodeProto.FromString(made.SerializeToString())
             for node in graph_nodes for made in rewritten.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
