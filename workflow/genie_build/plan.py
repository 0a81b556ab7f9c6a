"""Split planning: choose contiguous layer ranges per part, balanced by bytes after quantization.

The model is a sequence of *pieces*: ``embedding``, ``layer_0`` .. ``layer_{L-1}``, ``head`` (final norm +
LM head). Parts are contiguous runs of pieces. As in AI Hub Models' Genie exports, part 1 holds the
embedding lookup alone by default, and the head always shares the last part with the last layer(s).

Pure functions on names and sizes; the plan's records and its file are :mod:`genie_build.plan_file`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence

import onnx

from genie_build.boundaries import CONFIG_KEY as BOUNDARIES_KEY
from genie_build.boundaries import find_boundaries
from genie_build.chipsets import HTP_LOAD, LoadParams
from genie_build.conventions import part_label, piece_names
from genie_build.encodings import Encodings, TensorEncoding, read_encodings
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import (InitializerSpec, ar_and_context_length, check_external_data,
                                    check_shared_initializers, initializer_specs, load_graph)
from genie_build.plan_file import PartPlan, Piece, Plan, write_plan

__all__ = ["MIB", "NUM_PARTS_KEY", "initializer_pieces", "model_pieces", "plan_by_max_part_bytes", "plan_by_num_parts",
           "plan_graphs", "plan_split", "quantized_bytes", "weighed_pieces"]

FP16_FALLBACK_BYTES = 2          # float weights without an encoding are kept as fp16
log = logging.getLogger(__name__)

SCALE_OFFSET_PAIR_BYTES = 4      # estimate for one stored scale/offset pair
PER_BLOCK_INT_SCALE_BYTES = 1    # estimate for one LPBQ per-block integer scale
NUM_PARTS_KEY = "split.num_parts"
MAX_PART_KEY = "split.max_part_mb"
MIB = 1024 * 1024

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
    if (num_parts is None) == (max_part_bytes is None) and num_parts != "auto":
        raise GenieBuildError("plan", "give exactly one of num_parts and max_part_bytes")
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
    if num_parts == "auto":
        # imported here: auto_split plans with this module's planners
        from genie_build.auto_split import auto_plan, io_dims_from_graph
        dims = io_dims_from_graph(prompt, activation_bits, prompt_path, other_lengths)
        plan = auto_plan(pieces, embedding_alone, dims, load, max_part_bytes, embedding)
    else:
        plan = (plan_by_num_parts(pieces, num_parts, embedding_alone) if num_parts is not None
                else plan_by_max_part_bytes(pieces, max_part_bytes, embedding_alone))
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


# ------------------------------------------------------------------------------------------- planning

def plan_by_num_parts(pieces: Sequence[Piece], num_parts: int, embedding_alone: bool = True) -> Plan:
    """Split the pieces into ``num_parts`` contiguous parts, minimising the largest part.

    Invariants of the result: parts are contiguous and cover every piece once, in order; with
    ``embedding_alone`` part 1 is exactly the embedding, else the embedding shares part 1 with layer 0;
    the head is in the last part together with at least the last layer; no other arrangement with the
    same constraints has a smaller largest part (among the layer parts; the embedding part is fixed),
    and none with that largest part is more even (see :func:`_balanced_groups`).

    Raises:
        GenieBuildError: ``num_parts`` is outside the feasible range (stated in the message).
    """
    fixed, blocks = _planning_blocks(pieces, embedding_alone)
    most = len(fixed) + len(blocks)
    if not 2 <= num_parts <= most:
        alone = "with the embedding alone in part 1" if embedding_alone else "with the embedding joining layer 0"
        feasible = f"feasible: 2..{most}" if most >= 2 else "no split is possible: it needs 2 parts"
        raise GenieBuildError(NUM_PARTS_KEY, f"{num_parts} parts requested, but this model of {len(pieces) - 2} "
                                             f"layer(s) {alone} has {most} indivisible block(s); {feasible}")
    groups = _balanced_groups([_block_bytes(block) for block in blocks], num_parts - len(fixed))
    parts = [*fixed, *(tuple(piece for index in group for piece in blocks[index]) for group in groups)]
    return _make_plan(pieces, parts, embedding_alone, mode="num_parts", max_part_bytes=None)


def plan_by_max_part_bytes(pieces: Sequence[Piece], max_bytes: int, embedding_alone: bool = True) -> Plan:
    """The fewest parts (at least 2) whose largest part is at most ``max_bytes``, balanced like
    :func:`plan_by_num_parts`.

    Raises:
        GenieBuildError: ``max_bytes`` is below the largest indivisible block (named, with its size and the
            smallest feasible budget), or the model cannot be split in 2.
    """
    fixed, blocks = _planning_blocks(pieces, embedding_alone)
    largest = max((*fixed, *blocks), key=_block_bytes)
    if _block_bytes(largest) > max_bytes:
        raise GenieBuildError(MAX_PART_KEY, f"a part limit of {_size_text(max_bytes)} is below the largest "
                                            f"indivisible block, {'+'.join(p.name for p in largest)} "
                                            f"({_size_text(_block_bytes(largest))}); feasible: "
                                            f"{MAX_PART_KEY} >= {math.ceil(_block_bytes(largest) / MIB * 100) / 100}")
    num_parts = max(2, len(fixed) + _greedy_group_count([_block_bytes(block) for block in blocks], max_bytes))
    plan = plan_by_num_parts(pieces, num_parts, embedding_alone)
    return dataclasses.replace(plan, mode="max_part_mb", max_part_bytes=max_bytes)


def _planning_blocks(pieces: Sequence[Piece], embedding_alone: bool
                    ) -> tuple[list[tuple[Piece, ...]], list[tuple[Piece, ...]]]:
    """(parts fixed in advance, blocks to balance). A block never splits: the head joins the last layer,
    and without ``embedding_alone`` the embedding joins layer 0."""
    _check_pieces(pieces)
    embedding, layers, head = pieces[0], list(pieces[1:-1]), pieces[-1]
    blocks: list[tuple[Piece, ...]] = [(layer,) for layer in layers]
    blocks[-1] = (*blocks[-1], head)
    if embedding_alone:
        return [(embedding,)], blocks
    blocks[0] = (embedding, *blocks[0])
    return [], blocks


def _check_pieces(pieces: Sequence[Piece]) -> None:
    kinds = [piece.kind for piece in pieces]
    if len(pieces) < 3 or kinds[0] != "embedding" or kinds[-1] != "head" or set(kinds[1:-1]) != {"layer"}:
        raise ValueError(f"pieces must be embedding, layer_0 .. layer_(L-1), head; got {[p.name for p in pieces]}")
    if [piece.layer for piece in pieces[1:-1]] != list(range(len(pieces) - 2)):
        raise ValueError(f"layer pieces out of order: {[p.name for p in pieces[1:-1]]}")
    if any(piece.bytes < 0 for piece in pieces):
        raise ValueError(f"negative piece size in {pieces}")


def _block_bytes(block: Sequence[Piece]) -> int:
    return sum(piece.bytes for piece in block)


def _balanced_groups(sizes: Sequence[int], num_groups: int) -> list[list[int]]:
    """Split ``sizes`` into ``num_groups`` contiguous non-empty groups: the largest group sum as small as
    possible, then the groups as even as possible.

    Requires ``1 <= num_groups <= len(sizes)`` and sizes >= 0.
    1. The optimal bound B is the least integer for which greedy packing (optimal for a fixed bound)
       needs at most ``num_groups`` groups; binary search over ``[max(sizes), sum(sizes)]`` finds it.
       Splitting a group never raises a sum, so exactly ``num_groups`` groups within B exist too.
    2. Among the splits with every group <= B, dynamic programming over prefixes picks the one with the
       least sum of squared group sums (the most even); ties go to the split whose earlier groups are fuller.

    Returns:
        The indices (into ``sizes``) of each group.
    """
    low, high = max(sizes), sum(sizes)
    while low < high:
        middle = (low + high) // 2
        if _greedy_group_count(sizes, middle) <= num_groups:
            high = middle
        else:
            low = middle + 1
    count = len(sizes)
    prefix = [0, *itertools.accumulate(sizes)]
    # cost[j][i]: least sum of squares splitting sizes[:i] into j groups within the bound;
    # start[j][i]: where the j-th group begins in that split.
    cost: list[list[int | None]] = [[None] * (count + 1) for _ in range(num_groups + 1)]
    start: list[list[int]] = [[0] * (count + 1) for _ in range(num_groups + 1)]
    cost[0][0] = 0
    for groups in range(1, num_groups + 1):
        for end in range(groups, count - (num_groups - groups) + 1):
            for begin in range(end - 1, groups - 2, -1):   # latest start first: ties keep earlier groups fuller
                group = prefix[end] - prefix[begin]
                if group > low:
                    break
                before = cost[groups - 1][begin]
                if before is not None and (cost[groups][end] is None or before + group * group < cost[groups][end]):
                    cost[groups][end], start[groups][end] = before + group * group, begin
    result = []
    end = count
    for groups in range(num_groups, 0, -1):
        result.append(list(range(start[groups][end], end)))
        end = start[groups][end]
    return result[::-1]


def _greedy_group_count(sizes: Sequence[int], bound: int) -> int:
    """How many contiguous groups of sum <= ``bound`` greedy packing makes (each size must be <= bound)."""
    count, total = 1, 0
    for size in sizes:
        if total + size > bound:
            count, total = count + 1, 0
        total += size
    return count


def _make_plan(pieces: Sequence[Piece], parts: Sequence[tuple[Piece, ...]], embedding_alone: bool,
               mode: str, max_part_bytes: int | None) -> Plan:
    part_plans = []
    for index, part in enumerate(parts, start=1):
        layers = [piece.layer for piece in part if piece.layer is not None]
        part_plans.append(PartPlan(
            index=index, label=part_label(index, len(parts)), pieces=tuple(piece.name for piece in part),
            first_layer=min(layers, default=None), last_layer=max(layers, default=None),
            input_boundary=parts[index - 2][-1].output_boundary if index > 1 else None,
            output_boundary=part[-1].output_boundary, estimated_bytes=_block_bytes(part)))
    return Plan(num_parts=len(parts), parts=tuple(part_plans), num_layers=len(pieces) - 2,
                boundaries=tuple(piece.output_boundary for piece in pieces[:-1]), embedding_alone=embedding_alone,
                mode=mode, max_part_bytes=max_part_bytes, pieces=tuple(pieces))


def _size_text(size: int) -> str:
    return f"{size} bytes ({size / MIB:.2f} MiB)"
