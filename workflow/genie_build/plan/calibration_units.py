"""The calibration chain's units: consecutive pieces of one part that one calibration job holds.

aimet-onnx calibrates a graph with every activation observed in float and every weight fake-quantized from itself
(``compute_encodings``), so a unit fed the residual stream the unit before it produced in that mode gets the very
encodings it would get inside the whole model (docs/quantize.md). The chain runs the units in model order; each
stores its output boundary for the next, per calibration window.

A unit never crosses a part (a part's encodings are complete when its last unit ends, and its converts may start),
and it is as large as a memory budget allows (:func:`unit_peak_mb`, fitted to Qwen2.5-7B-shaped units,
docs/large-models.md): aimet-onnx holds a unit's float32 weights :data:`SIM_COPIES` times (its model, its session's
copy, the fake-quantized weights) and its largest weight once more (the transposed copy its MatMul reads), beside
the process (:data:`MEMORY_BASE_MB`). Two pieces are cheaper alone: the embedding reads its table in place, once,
and the head is calibrated in slices of its vocabulary, one sim (and the previous slice's weight, which aimet-onnx
leaves behind) at a time (:mod:`genie_build.quantize.calibrate_tables`). A piece that alone would exceed the budget is
an error naming the smallest budget that fits it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from genie_build.conventions import EMBEDDING_PIECE, HEAD_PIECE, UNIT_LABEL_PATTERN, unit_label
from genie_build.errors import GenieBuildError
from genie_build.fileio import read_json, write_json
from genie_build.plan.plan_file import Plan

__all__ = ["BUDGET_KEY", "CalibrationUnit", "PieceFloat", "calibration_units", "part_units", "read_units",
           "unit_before", "unit_named", "unit_peak_mb", "units_from_dicts", "write_units"]

BUDGET_KEY = "quantize.unit_memory_mb"
SIM_COPIES = 3
MEMORY_BASE_MB = 1000
MAX_HEAD_SLICES = 64
MB = 1_000_000


@dataclass(frozen=True)
class CalibrationUnit:
    """One link of the chain: its pieces, the part holding them, and the residual-stream tensors at its cuts."""

    label: str                    # "u03_of_17" (conventions.unit_label): never read as a part's label
    part: str                     # the part's label
    pieces: tuple[str, ...]
    input_boundary: str | None    # None: the first unit (it takes input_ids)
    output_boundary: str | None   # None: the last unit (it gives logits)
    float_bytes: int              # its weights in float32
    largest_bytes: int = 0        # its largest weight in float32
    slices: int = 1               # the head alone, calibrated this many slices of its vocabulary at a time


@dataclass(frozen=True)
class PieceFloat:
    """A piece's weights in float32: all of them, and the largest."""

    total: int
    largest: int


def unit_peak_mb(unit: CalibrationUnit) -> int:
    """The memory a unit's job is planned with (its ``mem_mb``): the embedding alone, its table read in place and
    the process; the head in slices, one slice in a sim and the slice before it; any other unit, its weights in one
    sim."""
    if unit.pieces == (EMBEDDING_PIECE,):
        return math.ceil(unit.float_bytes / MB + MEMORY_BASE_MB)
    held, largest = unit.float_bytes / unit.slices, unit.largest_bytes / unit.slices
    return math.ceil((SIM_COPIES * held + largest + (held if unit.slices > 1 else 0)) / MB + MEMORY_BASE_MB)


def _pieces_unit(pieces: list[str], weights: Mapping[str, PieceFloat]) -> CalibrationUnit:
    """A unit of ``pieces`` with its weights, unlabelled: what :func:`unit_peak_mb` weighs."""
    return CalibrationUnit("", "", tuple(pieces), None, None, sum(weights[name].total for name in pieces),
                           max(weights[name].largest for name in pieces))


def _head_slices(head: CalibrationUnit, memory_mb: int) -> int:
    """The fewest slices of the head's vocabulary (up to :data:`MAX_HEAD_SLICES`) whose sim fits ``memory_mb``."""
    return next((slices for slices in range(1, MAX_HEAD_SLICES + 1)
                 if unit_peak_mb(replace(head, slices=slices)) <= memory_mb), MAX_HEAD_SLICES)


def calibration_units(plan: Plan, weights: Mapping[str, PieceFloat], memory_mb: int
                      ) -> tuple[CalibrationUnit, ...]:
    """The chain's units: each part's pieces, in order, grouped while a group's :func:`unit_peak_mb` fits
    ``memory_mb``; the embedding alone when it does not fit with the pieces after it, the head alone in as many
    slices of its vocabulary as the budget needs (docs/quantize.md, "The embedding and the LM head").

    Raises:
        GenieBuildError: a piece that alone does not fit (named, with the smallest budget that does).
    """
    boundaries = {piece.name: piece.output_boundary for piece in plan.pieces}
    groups: list[tuple[str, list[str], int]] = []
    for part in plan.parts:
        current: list[str] = []
        for piece in part.pieces:
            alone = _pieces_unit([piece], weights)
            if piece == HEAD_PIECE:
                alone = replace(alone, slices=_head_slices(alone, memory_mb))
            if unit_peak_mb(alone) > memory_mb:
                need = unit_peak_mb(alone)
                raise GenieBuildError(BUDGET_KEY, f"{memory_mb} MB cannot hold piece {piece} "
                                                  f"({weights[piece].total / MB:.0f} MB of float32 weights, about "
                                                  f"{need} MB to calibrate); set at least {need}")
            if current and unit_peak_mb(_pieces_unit([*current, piece], weights)) > memory_mb:
                groups.append((part.label, current, 1))
                current = []
            if alone.slices > 1:
                groups.append((part.label, [piece], alone.slices))
            else:
                current.append(piece)
        if current:
            groups.append((part.label, current, 1))
    units = []
    for index, (part, pieces, slices) in enumerate(groups, start=1):
        before = groups[index - 2][1][-1] if index > 1 else None
        units.append(replace(_pieces_unit(pieces, weights), label=unit_label(index, len(groups)), part=part,
                             input_boundary=boundaries[before] if before else None,
                             output_boundary=boundaries[pieces[-1]], slices=slices))
    return tuple(units)


def part_units(units: tuple[CalibrationUnit, ...], part: str) -> tuple[CalibrationUnit, ...]:
    """The units of one part, in chain order."""
    return tuple(unit for unit in units if unit.part == part)


def unit_named(units: tuple[CalibrationUnit, ...], label: str) -> CalibrationUnit:
    """The unit called ``label``.

    Raises:
        KeyError: no unit has that label.
    """
    for unit in units:
        if unit.label == label:
            return unit
    raise KeyError(label)


def unit_before(units: tuple[CalibrationUnit, ...], label: str) -> CalibrationUnit | None:
    """The unit before ``label`` in the chain, whose stored output boundary feeds it; None for the first."""
    index = units.index(unit_named(units, label))
    return units[index - 1] if index else None


def write_units(path: str | os.PathLike[str], units: tuple[CalibrationUnit, ...], *, unless_same: bool = False
                ) -> bool:
    """``unless_same``: as :func:`genie_build.fileio.write_json`."""
    return write_json(path, {"units": [asdict(unit) for unit in units]}, unless_same=unless_same)


def read_units(path: str | os.PathLike[str]) -> tuple[CalibrationUnit, ...]:
    """Raises: GenieBuildError: the file is not what :func:`write_units` writes."""
    data = read_json(path)
    return units_from_dicts(data.get("units") if isinstance(data, dict) else None, path)


def units_from_dicts(items: Any, where: str | os.PathLike[str]) -> tuple[CalibrationUnit, ...]:
    """Units from their fields (as :func:`write_units` writes each, or a rule passes the units of a part).

    Raises:
        GenieBuildError: not a list of units with exactly their fields.
    """
    try:
        units = tuple(CalibrationUnit(**{**item, "pieces": tuple(item["pieces"])}) for item in items)
    except (KeyError, TypeError) as exc:
        raise GenieBuildError(where, f"not a list of calibration units: {exc}") from None
    for unit in units:
        if not isinstance(unit.label, str) or not re.fullmatch(UNIT_LABEL_PATTERN, unit.label):
            raise GenieBuildError(where, f"calibration unit label {unit.label!r} is not of the form u01_of_N (a file "
                                         "written before units had their own labels: delete it to plan again)")
    return units
