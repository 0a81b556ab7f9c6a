"""The plan stage: a prompt/token graph pair checked, cut into *pieces* (``embedding``, ``layer_0`` ..
``layer_{L-1}``, ``head``: final norm + LM head) at its boundaries, each piece weighed by its bytes after
quantization, and the pieces planned into parts (:mod:`genie_build.planners`, or with ``auto``
:mod:`genie_build.auto_split`).

The plan's records and its file are :mod:`genie_build.plan_file`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence

import onnx

from genie_build.boundaries import CONFIG_KEY as BOUNDARIES_KEY
from genie_build.boundaries import find_boundaries
from genie_build.chipsets import HTP_LOAD, LoadParams
from genie_build.auto_split import io_dims_from_graph, plan_request
from genie_build.conventions import piece_names
from genie_build.encodings import Encodings, TensorEncoding, read_encodings
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import (InitializerSpec, ar_and_context_length, check_external_data,
                                    check_shared_initializers, initializer_specs, load_graph)
from genie_build.plan_file import Piece, Plan, write_plan
from genie_build.split_request import SplitRequest
from genie_build.units import MIB

__all__ = ["initializer_pieces", "model_pieces", "plan_graphs", "plan_split", "quantized_bytes", "weighed_pieces"]

FP16_FALLBACK_BYTES = 2          # float weights without an encoding are kept as fp16
log = logging.getLogger(__name__)

SCALE_OFFSET_PAIR_BYTES = 4      # estimate for one stored scale/offset pair
PER_BLOCK_INT_SCALE_BYTES = 1    # estimate for one LPBQ per-block integer scale

_FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})


# ------------------------------------------------------------------------------------------- pieces

def plan_split(prompt_path: str, token_path: str, encodings_path: str, out: str | os.PathLike[str], *,
               num_parts: int | str | None = None, max_part_bytes: int | None = None, embedding_alone: bool = True,
               boundaries: Sequence[str] | None = None, check_weights: bool = True,
               load: LoadParams = HTP_LOAD, other_lengths: Sequence[int] = (), embedding: str = "graph") -> Plan:
    """The plan stage: check the two graphs, find their boundaries, weigh the pieces with the prompt graph's
    encodings, choose the parts (``num_parts``, the fewest of at most ``max_part_bytes``, or with ``num_parts``
    "auto" the fewest that map under ``load``) and write ``out``.

    The graphs' encodings are checked against each other by the encodings stage
    (:func:`genie_build.encodings.check_graphs_consistent`), not here.

    Args:
        boundaries: the L + 1 residual tensors; default: found from node scopes.
        check_weights: compare the graphs' shared weights (the workflow's ``check_model`` job does that once per
            model change, not once per encodings change).
        other_lengths: the context lengths of the graphs each part's binary holds beside these (for "auto").
        embedding: ``bundle.embedding`` (for "auto": with "lut", part 1 is a table on the CPU, not a context).

    Raises:
        GenieBuildError: a graph's data is missing, the graphs' weights or boundaries differ, AR or CL cannot be
            read, or the request is infeasible.
    """
    plan = plan_graphs(prompt_path, token_path,
                       lambda model, found: model_pieces(model, read_encodings(encodings_path), found),
                       num_parts=num_parts, max_part_bytes=max_part_bytes, embedding_alone=embedding_alone,
                       boundaries=boundaries, check_weights=check_weights, load=load, other_lengths=other_lengths,
                       embedding=embedding)
    write_plan(out, plan)
    for part in plan.parts:
        log.info("part %s: %s, %.2f MiB", part.label, "+".join(part.pieces), part.estimated_bytes / MIB)
    return plan


def plan_graphs(prompt_path: str | os.PathLike[str], token_path: str | os.PathLike[str],
                weigh: Callable[[onnx.ModelProto, tuple[str, ...]], list[Piece]], *,
                num_parts: int | str | None = None, max_part_bytes: int | None = None, embedding_alone: bool = True,
                boundaries: Sequence[str] | None = None, check_weights: bool = True,
                load: LoadParams = HTP_LOAD, activation_bits: int = 16, other_lengths: Sequence[int] = (),
                embedding: str = "graph") -> Plan:
    """The plan of a prompt/token graph pair whose pieces ``weigh`` weighs (given the prompt graph, loaded without
    its weights, and its boundaries): the checks and planning of :func:`plan_split`, however the bytes are known.
    ``num_parts`` "auto" (with ``max_part_bytes`` as a bound) is :func:`genie_build.auto_split.auto_plan` under
    ``load`` in the ``embedding`` layout, the graph's IO at ``activation_bits`` and at every context length of
    ``other_lengths`` beside its own.

    Raises:
        GenieBuildError: as :func:`plan_split`.
    """
    request = SplitRequest(num_parts, max_part_bytes, embedding_alone)
    prompt, token = load_graph(prompt_path), load_graph(token_path)
    check_external_data(prompt, prompt_path)
    check_external_data(token, token_path)
    if check_weights:
        check_shared_initializers(prompt_path, token_path)
    found = find_boundaries(prompt, prompt_path, boundaries)
    token_boundaries = find_boundaries(token, token_path, boundaries)
    if token_boundaries != found:
        raise GenieBuildError(token_path, f"the token graph's boundaries {list(token_boundaries)} differ from the "
                                          f"prompt graph's {list(found)}; set {BOUNDARIES_KEY}")
    pieces = weigh(prompt, found)
    dims = io_dims_from_graph(prompt, activation_bits, prompt_path, other_lengths) if request.auto else None
    plan = plan_request(pieces, request, dims=dims, load=load, embedding=embedding)
    return dataclasses.replace(plan, **_graph_shapes({"prompt": (prompt, prompt_path), "token": (token, token_path)}))


def _graph_shapes(graphs: dict[str, tuple[onnx.ModelProto, str]]) -> dict:
    """AR of each graph and their common context length, as Genie reads them, for the graph names.

    Raises:
        GenieBuildError: a graph lacks static ``input_ids``/``attention_mask`` inputs, or the graphs' context
            lengths differ.
    """
    graph_ar, lengths = {}, {}
    for kind, (model, path) in graphs.items():
        dims = ar_and_context_length(model)
        if dims is None:
            raise GenieBuildError(path, "cannot read AR and context length: Genie needs statically shaped inputs "
                                        "input_ids [1, AR] and attention_mask [..., CL]")
        graph_ar[kind], lengths[path] = dims
    if len(set(lengths.values())) != 1:
        raise GenieBuildError(next(iter(lengths)), f"context lengths differ between the graphs: {lengths}")
    return {"graph_ar": graph_ar, "context_length": next(iter(lengths.values()))}


def model_pieces(model: onnx.ModelProto, encodings: Encodings, boundaries: Sequence[str]) -> list[Piece]:
    """The model's pieces with their weight bytes after quantization, computed without loading weights:
    :func:`weighed_pieces` of the graph's initializers and the pieces consuming each.

    Args:
        model: the prompt graph, loaded without weights.
        encodings: its AIMET encodings: each initializer's (:meth:`Encodings.of_initializer`).
        boundaries: the L + 1 boundary tensors (:func:`genie_build.boundaries.find_boundaries`).

    Raises:
        GenieBuildError: the boundaries do not cut the residual stream in order (:func:`initializer_pieces`).
    """
    specs = initializer_specs(model)
    # an initializer is stored with its param encoding, else an activation encoding AIMET gives it (the table)
    stored_with = {name: encodings.of_initializer(name) for name in specs}
    return weighed_pieces(specs, initializer_pieces(model, boundaries), stored_with, boundaries)


def weighed_pieces(specs: Mapping[str, InitializerSpec], owners: Mapping[str, frozenset[int]],
                   encodings: Mapping[str, TensorEncoding | None], boundaries: Sequence[str]) -> list[Piece]:
    """The pieces of a model of ``len(boundaries) - 1`` layers, each weighing the :func:`quantized_bytes` of
    the initializers it owns.

    An initializer counts towards every piece that owns it (a tied embedding/LM-head table is in the
    first and the last part, as the split will duplicate it).

    Args:
        specs: initializer name -> its declared shape and type (no values needed).
        owners: initializer name -> the pieces using it (0 = embedding, i + 1 = layer i, L + 1 = head), as
            :func:`initializer_pieces` gives; initializers not listed weigh nothing.
        encodings: initializer name -> the encoding it is stored with; missing or None: none.
        boundaries: the L + 1 boundary tensors.
    """
    totals = [0] * (len(boundaries) + 1)
    for name, piece_indices in owners.items():
        size = quantized_bytes(specs[name], encodings.get(name))
        for index in piece_indices:
            totals[index] += size
    names = piece_names(len(boundaries) - 1)
    return [Piece(names[0], "embedding", totals[0], output_boundary=boundaries[0]),
            *(Piece(names[layer + 1], "layer", totals[layer + 1], layer, boundaries[layer + 1])
              for layer in range(len(boundaries) - 1)),
            Piece(names[-1], "head", totals[-1])]


def initializer_pieces(model: onnx.ModelProto, boundaries: Sequence[str]) -> dict[str, frozenset[int]]:
    """Which pieces consume each initializer: 0 = embedding, i + 1 = layer i, L + 1 = head.

    A node's piece is the number of boundaries upstream of it: data from graph inputs starts in piece 0
    and crossing boundary k moves it to piece k + 1. Nodes fed only by constants (weight Transposes,
    Constant nodes) belong to the pieces of their consumers. Unused initializers are left out.
    Relies on ONNX's topological node order; subgraph bodies (If/Loop) are not looked into.

    Raises:
        GenieBuildError: a boundary does not depend on the one before it (the boundaries do not cut the
            residual stream in order), or is not computed from the graph inputs.
    """
    graph = model.graph
    consumers: dict[str, list[int]] = {}
    for index, node in enumerate(graph.node):
        for name in node.input:
            consumers.setdefault(name, []).append(index)
    data_pieces = _data_flow_pieces(graph, boundaries)
    node_pieces: list[frozenset[int]] = [frozenset()] * len(graph.node)
    for index in reversed(range(len(graph.node))):
        piece = data_pieces[index]
        node_pieces[index] = frozenset({piece}) if piece is not None else frozenset().union(
            *(node_pieces[consumer] for output in graph.node[index].output for consumer in consumers.get(output, ())))
    return {tensor.name: frozenset().union(*(node_pieces[consumer] for consumer in consumers[tensor.name]))
            for tensor in graph.initializer if tensor.name in consumers}


def _data_flow_pieces(graph: onnx.GraphProto, boundaries: Sequence[str]) -> list[int | None]:
    """Each node's piece from the graph inputs downstream (None for nodes fed by constants only)."""
    cut_index = {name: index for index, name in enumerate(boundaries)}
    initializers = {tensor.name for tensor in graph.initializer}
    tensor_piece = {value.name: 0 for value in graph.input if value.name not in initializers}
    pieces: list[int | None] = []
    for node in graph.node:
        upstream = [tensor_piece[name] for name in node.input if name in tensor_piece]
        piece = max(upstream) if upstream else None
        pieces.append(piece)
        for output in node.output if piece is not None else ():
            if output in cut_index:
                _check_cut_order(output, cut_index[output], piece, boundaries)
                tensor_piece[output] = cut_index[output] + 1
            else:
                tensor_piece[output] = piece
    unreached = [name for name in boundaries if name not in tensor_piece]
    if unreached:
        raise GenieBuildError(BOUNDARIES_KEY, f"{unreached} are not computed from the graph inputs (missing or "
                                              "constant); the boundaries must be the residual stream")
    return pieces


def _check_cut_order(name: str, index: int, producer_piece: int, boundaries: Sequence[str]) -> None:
    if producer_piece != index:
        previous = f"boundary {index - 1} {boundaries[index - 1]!r}" if index else "the graph inputs"
        raise GenieBuildError(BOUNDARIES_KEY, f"boundary {index} {name!r} does not follow {previous} in the data "
                                              "flow; the boundaries must be the residual stream after the "
                                              "embedding and after each layer, in order")


def quantized_bytes(spec: InitializerSpec, encoding: TensorEncoding | None) -> int:
    """Estimated stored size of one initializer after conversion.

    Integer encodings: ``count * bits / 8`` (LPBQ stores ``compressed_bitwidth`` bits) plus 4 bytes per
    scale/offset pair and 1 byte per LPBQ block scale. Float encodings: ``count * bitwidth / 8``.
    Float tensors without an encoding fall back to fp16; other tensors keep their size.
    """
    count = math.prod(spec.shape)
    if encoding is None:
        return count * FP16_FALLBACK_BYTES if spec.dtype in _FLOAT_DTYPES else spec.nbytes
    if encoding.dtype == "float":
        return math.ceil(count * encoding.bitwidth / 8)
    stored_bits = encoding.compressed_bitwidth or encoding.bitwidth
    return (math.ceil(count * stored_bits / 8) + SCALE_OFFSET_PAIR_BYTES * max(1, len(encoding.scale))
            + PER_BLOCK_INT_SCALE_BYTES * len(encoding.per_block_int_scale or ()))
