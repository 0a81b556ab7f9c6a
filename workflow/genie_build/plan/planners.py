"""The split planners: the model's pieces (``embedding``, ``layer_0`` .. ``layer_{L-1}``, ``head``) cut into
contiguous parts, a number of parts or the fewest under a byte bound, balanced by bytes after quantization. As in AI
Hub Models' Genie exports, part 1 holds the embedding lookup alone by default, and the head always shares the last
part with the last layer(s).

Pure functions on names and sizes; the plan's records and its file are :mod:`genie_build.plan.plan_file`, the plan stage
that weighs a model's pieces :mod:`genie_build.plan.plan`, the choice of a part count by the load model
:mod:`genie_build.plan.auto_split`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

from genie_build.conventions import part_label
from genie_build.errors import GenieBuildError
from genie_build.plan.plan_file import PartPlan, Piece, Plan
from genie_build.units import MIB

__all__ = ["MAX_PART_KEY", "NUM_PARTS_KEY", "indivisible", "plan_by_max_part_bytes", "plan_by_num_parts"]

NUM_PARTS_KEY = "split.num_parts"
MAX_PART_KEY = "split.max_part_mb"


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


def indivisible(plan: Plan) -> set[tuple[str, ...]]:
    """The pieces of each part of ``plan`` that no split makes smaller: one of the planner's blocks."""
    fixed, blocks = _planning_blocks(plan.pieces, plan.embedding_alone)
    return {tuple(piece.name for piece in block) for block in (*fixed, *blocks)}


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
