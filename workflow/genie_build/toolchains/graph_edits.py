"""Edits of a part's graph that every converter makes: the graph and its encodings read and checked, tensors
stored outside the initializers moved in, the graph's IO encodings recorded, an initializer the shared graph
converted from the same bytes taken as it made it, initializers swapped for their converted form (each rebuilt just
before its first use), graph inputs renamed, exporter annotations dropped, the converted graph written."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import numpy_helper

from genie_build.encodings import Encodings, read_encodings, validate_against_model
from genie_build.errors import GenieBuildError
from genie_build.fileio import atomic_open
from genie_build.onnx_graph import (FLOAT_TYPES, GraphTensors, check_external_data, external_data, graph_io,
                                    load_graph, model_tensors, read_graph_tensors, require_finite, subgraphs,
                                    tensor_sha256)
from genie_build.toolchains.reference.onnx_io import (SharedWeights, load_external_bytes, metadata_json,
                                                      set_metadata_json)
from genie_build.units import GIB

__all__ = ["CONVERTED_FROM_KEY", "IO_ENCODINGS_KEY", "MAX_INLINE_BYTES", "ConvertInput", "ConvertedBefore",
           "converted_record", "drop_exporter_annotations", "inline_stored_tensors", "io_encodings", "made_from",
           "read_convert_input", "rename_inputs", "replace_weights", "write_converted"]

# The converted graph's metadata key of its IO encodings (:func:`io_encodings`), every converter's.
IO_ENCODINGS_KEY = "genie_build.io_encodings"
# The converted graph's metadata key of what each initializer's conversion read and became (:func:`made_from`).
CONVERTED_FROM_KEY = "genie_build.converted_from"
# The most bytes of attribute and subgraph tensors a converted graph holds inline (a protobuf is at most 2 GiB).
MAX_INLINE_BYTES = GIB


@dataclass(frozen=True)
class ConvertInput:
    """A part's graph as every converter reads it before converting its weights."""

    path: Path                      # the graph's file
    model: onnx.ModelProto          # its external data checked, no training graphs, its attribute tensors inline
    encodings: Encodings            # checked against the graph's tensors
    names: GraphTensors             # the graph's tensor names and its parameters' shapes and layouts
    recorded_io: dict[str, dict]    # the IO encodings the converted graph records (:func:`io_encodings`)
    shared: SharedWeights | None    # the converted graph whose stored tensors the new one refers to


def read_convert_input(onnx_path: Path, encodings_path: str | os.PathLike[str], out_path: Path,
                       share_weights_with: str | os.PathLike[str] | None = None) -> ConvertInput:
    """The graph at ``onnx_path`` and its encodings, read and checked for a convert writing ``out_path``, and the
    converted graph ``share_weights_with`` (in ``out_path``'s folder) whose stored tensors it may refer to.

    Raises:
        GenieBuildError: ``out_path`` is the input, ``share_weights_with`` lies in another folder, an unreadable
            model or encodings file, or encodings that do not fit the model.
    """
    if out_path.resolve() == onnx_path.resolve():
        raise GenieBuildError(out_path, "is the input model; write the converted model elsewhere")
    shared = None if share_weights_with is None else SharedWeights(share_weights_with)
    if shared is not None and shared.folder != os.path.dirname(os.path.abspath(out_path)):
        raise GenieBuildError(share_weights_with, f"shares weights only with a graph in the output's folder "
                                                  f"{out_path.parent}")
    model = load_graph(onnx_path)
    check_external_data(model, onnx_path)
    model.ClearField("training_info")  # inference only: a device binary holds no training graphs
    inline_stored_tensors(model, onnx_path)
    encodings = read_encodings(encodings_path)
    names = read_graph_tensors(onnx_path)
    validate_against_model(encodings, encodings_path, names.tensor_names, names.param_shapes, names.param_layouts)
    return ConvertInput(onnx_path, model, encodings, names, io_encodings(model, encodings, os.fspath(encodings_path)),
                        shared)


def write_converted(model: onnx.ModelProto, source: ConvertInput, out_path: Path, *, graph_name: str,
                    input_names: Mapping[str, str] | None, metadata: Mapping[str, object]) -> None:
    """Finish and write ``source``'s converted graph (its weights already swapped in): exporter annotations dropped,
    inputs renamed (``input_names``, old -> new, in ``source.recorded_io`` too), the graph named, ``metadata`` (key ->
    JSON value, in order) recorded.

    Raises:
        GenieBuildError: an input to rename that the graph lacks (naming ``source.path``).
    """
    drop_exporter_annotations(model.graph)
    rename_inputs(model.graph, source.recorded_io, dict(input_names or {}), source.path)
    model.graph.name = graph_name
    for key, value in metadata.items():
        set_metadata_json(model, key, value)
    with atomic_open(out_path) as handle:
        handle.write(model.SerializeToString())


def inline_stored_tensors(model: onnx.ModelProto, onnx_path: Path) -> None:
    """Move every tensor the model stores outside its main graph's initializers (``Constant`` values and other node
    attributes, subgraphs, functions) into the graph, after checking that a float one is finite.

    The converted model's data file holds the main initializers only, so such a tensor would otherwise point at a
    file the compiled binary and the bundle do not have. Their total is bounded by :data:`MAX_INLINE_BYTES`.

    Raises:
        GenieBuildError: naming the model and the tensor: external data that cannot be read, a non-finite float,
            or more bytes than :data:`MAX_INLINE_BYTES`.
    """
    total = 0
    for stored in model_tensors(model):
        if stored.initializer or stored.sparse:
            continue
        if stored.tensor.data_location == onnx.TensorProto.EXTERNAL:
            total += external_data(stored, onnx_path).length
            if total > MAX_INLINE_BYTES:
                raise GenieBuildError(onnx_path, f"{stored.what}: tensors stored in node attributes and subgraphs "
                                                 f"hold more than {MAX_INLINE_BYTES} bytes, which the converted "
                                                 "graph holds inline; store such weights as initializers")
            load_external_bytes(stored, onnx_path)
        if stored.tensor.data_type in FLOAT_TYPES:
            require_finite(numpy_helper.to_array(stored.tensor), stored.what, onnx_path)



def io_encodings(model: onnx.ModelProto, encodings: Encodings, where: str) -> dict[str, dict]:
    """The activation encodings of the graph's inputs and outputs, as recorded in the converted model."""
    io = graph_io(model)
    recorded = {}
    for spec in (*io.inputs, *io.outputs):
        enc = encodings.activations.get(spec.name)
        if enc is None:
            continue
        if enc.dtype == "float":
            recorded[spec.name] = {"dtype": "float", "bitwidth": enc.bitwidth}
            continue
        if enc.kind != "per_tensor":
            raise GenieBuildError(where, f"activation encoding {spec.name!r}: a graph input or output needs a "
                                         f"per_tensor encoding, got {enc.kind}")
        recorded[spec.name] = {"dtype": "int", "bitwidth": enc.bitwidth, "scale": enc.scale[0],
                               "offset": enc.offset[0], "is_symmetric": enc.is_symmetric}
    return recorded



def replace_weights(graph: onnx.GraphProto, initializers: list[onnx.TensorProto],
                     rebuilds: list[tuple[str, list[onnx.NodeProto]]]) -> None:
    """Swap in the converted initializers, and put the nodes rebuilding each weight (``rebuilds``: weight name,
    nodes) just before the first node reading it; weights read only inside subgraphs go first. The nodes read
    initializers only, so the order stays topological. onnxruntime runs ready nodes in node order, so each weight
    is dequantized just before its use: rebuilt all at the start, a whole model's weights would be float at once."""
    old_names = {tensor.name for tensor in graph.initializer}
    # Old exporters list initializers as graph inputs too; the rebuilt weight is a node output now.
    inputs = [value for value in graph.input if value.name not in old_names]
    first_reader: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in node.input:
            first_reader.setdefault(name, index)
    before: dict[int, list[onnx.NodeProto]] = defaultdict(list)
    all_nodes = []
    for weight, nodes in rebuilds:
        if weight in first_reader:
            before[first_reader[weight]].extend(nodes)
        else:
            all_nodes.extend(nodes)
    for index, node in enumerate(graph.node):
        all_nodes += [*before[index], node]
    del graph.initializer[:], graph.node[:], graph.input[:]
    graph.initializer.extend(initializers)
    graph.node.extend(all_nodes)
    graph.input.extend(inputs)



def rename_inputs(graph: onnx.GraphProto, io_encodings: dict[str, dict], renames: dict[str, str],
                   onnx_path: Path) -> None:
    """Rename graph inputs (and their uses and IO encodings) in place.

    Raises:
        GenieBuildError: an old name that is not a graph input, or a new name already in the graph.
    """
    if not renames:
        return
    inputs = {value.name for value in graph.input}
    taken = inputs | {output for node in graph.node for output in node.output} | {t.name for t in graph.initializer}
    for old, new in renames.items():
        if old not in inputs:
            raise GenieBuildError(onnx_path, f"cannot rename input {old!r} to {new!r}: the graph has no such input "
                                             f"(inputs: {', '.join(sorted(inputs))})")
        if new in taken:
            raise GenieBuildError(onnx_path, f"cannot rename input {old!r} to {new!r}: {new!r} is already a tensor")
    for value in [*graph.input, *graph.value_info]:
        value.name = renames.get(value.name, value.name)
    _rename_uses(graph, renames)
    for old, new in renames.items():
        if old in io_encodings:
            io_encodings[new] = io_encodings.pop(old)



def _rename_uses(graph: onnx.GraphProto, renames: Mapping[str, str]) -> None:
    """Every node input named in ``renames``, subgraphs included (they may read an outer tensor by name)."""
    for node in graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
        for subgraph in subgraphs(node):
            _rename_uses(subgraph, renames)



def drop_exporter_annotations(graph: onnx.GraphProto) -> None:
    """Clear each node's ``doc_string`` and ``metadata_props``: torch.onnx (dynamo) annotates every node with
    its Python stack trace (hundreds of kB on a small model), which a device binary does not hold and the size
    table must not count."""
    for node in graph.node:
        node.doc_string = ""
        node.ClearField("metadata_props")


def made_from(tensor: onnx.TensorProto, onnx_path: Path, **read: object) -> str | None:
    """A digest of everything an external initializer's conversion reads: the sha256 of its stored bytes (read
    again, so a weight changed in place at the same size is converted again), its dtype and shape, and ``read``
    (the converter's other inputs: the encoding, layout, ...; dataclasses and JSON values). None for an inline
    tensor: it is small, and converted again."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    record = {"sha256": tensor_sha256(tensor, onnx_path), "dtype": tensor.data_type, "dims": list(tensor.dims),
              **{key: dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
                 for key, value in read.items()}}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def converted_record(made: str, tensors: list[onnx.TensorProto], nodes: tuple[onnx.NodeProto, ...] | list) -> dict:
    """An initializer's entry in :data:`CONVERTED_FROM_KEY`: its :func:`made_from` digest, what it became."""
    return {"from": made, "tensors": [tensor.name for tensor in tensors], "nodes": [node.name for node in nodes]}


class ConvertedBefore:
    """The initializers the shared graph converted from the same bytes and the same other inputs
    (:data:`CONVERTED_FROM_KEY`): what each became, taken as it is, not converted again (a part's graphs at every
    length and its token graph hold the prompt graph's weights)."""

    def __init__(self, shared: SharedWeights | None) -> None:
        model = onnx.ModelProto() if shared is None else shared.model
        self.model = model
        self._records = metadata_json(model, CONVERTED_FROM_KEY, {})
        self._tensors = {tensor.name: tensor for tensor in model.graph.initializer}
        self._nodes = {node.name: node for node in model.graph.node}
        self.taken = 0

    def take(self, name: str, made: str | None) -> tuple[list[onnx.TensorProto], tuple[onnx.NodeProto, ...]] | None:
        """Copies of the tensors and nodes ``name`` became, if the shared graph made them from what ``made``
        digests; None otherwise."""
        record = self._records.get(name)
        if made is None or record is None or record["from"] != made:
            return None
        tensors = [self._tensors.get(tensor) for tensor in record["tensors"]]
        nodes = [self._nodes.get(node) for node in record["nodes"]]
        if not tensors or None in tensors or None in nodes:
            return None
        self.taken += 1
        return [_copied(tensor) for tensor in tensors], tuple(_copied(node) for node in nodes)


def _copied(proto: onnx.TensorProto | onnx.NodeProto) -> onnx.TensorProto | onnx.NodeProto:
    copy = type(proto)()
    copy.CopyFrom(proto)
    return copy
