"""The calibration chain's units: consecutive pieces of one part that one calibration job holds.

aimet-onnx calibrates a graph with every activation observed in float and every weight fake-quantized from itself
(``compute_encodings``), so a unit fed the residual stream the unit before it produced in that mode gets the very
encodings it would get inside the whole model (docs/quantize.md). The chain runs the units in model order; each
stores its output boundary for the next, per calibration window.

A unit never crosses a part (a part's encodings are complete when its last unit ends, and its converts may start),
and it is as large as a memory budget allows: aimet-onnx holds a unit's float32 weights about
:data:`MEMORY_PER_WEIGHT_BYTE` times over (its model, its session's copy, the fake-quantized weights) plus the
process (:data:`MEMORY_BASE_MB`), measured on Qwen2.5-7B-shaped units (docs/large-models.md). A piece that alone
would exceed the budget is an error naming the smallest budget that fits it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from genie_build.conventions import UNIT_LABEL_PATTERN, unit_label
from genie_build.errors import GenieBuildError
from genie_build.fileio import read_json, write_json
from genie_build.plan_file import Plan

__all__ = ["BUDGET_KEY", "CalibrationUnit", "calibration_units", "part_units", "predicted_peak_mb", "read_units",
           "unit_before", "unit_named", "units_from_dicts", "write_units"]

BUDGET_KEY = "quantize.unit_memory_mb"
MEMORY_PER_WEIGHT_BYTE = 4.0
MEMORY_BASE_MB = 1000
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


def predicted_peak_mb(float_bytes: int) -> int:
    """The memory a calibration job holding ``float_bytes`` of float32 weights is planned with (its ``mem_mb``)."""
    return math.ceil(MEMORY_PER_WEIGHT_BYTE * float_bytes / MB + MEMORY_BASE_MB)


def calibration_units(plan: Plan, float_bytes: Mapping[str, int], memory_mb: int) -> tuple[CalibrationUnit, ...]:
    """The chain's units: each part's pieces, in order, grouped while a group's :func:`predicted_peak_mb` fits
    ``memory_mb``.

    Raises:
        GenieBuildError: a piece that alone does not fit (named, with the smallest budget that does).
    """
    boundaries = {piece.name: piece.output_boundary for piece in plan.pieces}
    groups: list[tuple[str, list[str]]] = []
    for part in plan.parts:
        current: list[str] = []
        for piece in part.pieces:
            if predicted_peak_mb(float_bytes[piece]) > memory_mb:
                raise GenieBuildError(BUDGET_KEY, f"{memory_mb} MB cannot hold piece {piece} "
                                                  f"({float_bytes[piece] / MB:.0f} MB of float32 weights, about "
                                                  f"{predicted_peak_mb(float_bytes[piece])} MB to calibrate); set "
                                                  f"at least {predicted_peak_mb(float_bytes[piece])}")
            if current and predicted_peak_mb(sum(float_bytes[name] for name in [*current, piece])) > memory_mb:
                groups.append((part.label, current))
                current = []
            current.append(piece)
        groups.append((part.label, current))
    units = []
    for index, (part, pieces) in enumerate(groups, start=1):
        before = groups[index - 2][1][-1] if index > 1 else None
        units.append(CalibrationUnit(
            label=unit_label(index, len(groups)), part=part, pieces=tuple(pieces),
            input_boundary=boundaries[before] if before else None, output_boundary=boundaries[pieces[-1]],
            float_bytes=sum(float_bytes[name] for name in pieces)))
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
