"""The plan check: a plan made before calibration, from shapes (:mod:`genie_build.plan.shape_plan`), against the pieces
weighed from the encodings the calibration wrote.

Each part's prompt graph and encodings give the bytes of the pieces it holds (the plan stage's own weighing,
:func:`genie_build.plan.plan.piece_bytes` of :func:`genie_build.plan.weight_inventory.weights_from_graph`, cut at the
part's internal boundaries); the planner then runs again with the plan's settings. Parts that would differ are an
error: the binaries would then not be the ones the plan promised, and the next build from the same config would cut
the model elsewhere.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from genie_build.encodings import read_encodings
from genie_build.errors import GenieBuildError
from genie_build.fileio import write_json
from genie_build.onnx_graph import load_graph
from genie_build.plan.plan import by_encodings, piece_bytes
from genie_build.plan.plan_file import PartPlan, Piece, Plan
from genie_build.plan.planners import plan_by_max_part_bytes, plan_by_num_parts
from genie_build.plan.weight_inventory import weights_from_graph
from genie_build.units import MIB

__all__ = ["PlanCheck", "check_plan", "measured_pieces"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanCheck:
    """The plan against one made from the calibrated encodings: the parts' pieces, and each piece's bytes."""

    planned: tuple[tuple[str, ...], ...]
    from_encodings: tuple[tuple[str, ...], ...]
    piece_bytes: Mapping[str, tuple[int, int]]   # piece -> (planned, from the encodings)

    @property
    def same_parts(self) -> bool:
        return self.planned == self.from_encodings

    def to_dict(self) -> dict:
        return {"same_parts": self.same_parts, "planned": [list(p) for p in self.planned],
                "from_encodings": [list(p) for p in self.from_encodings],
                "pieces": {name: {"planned": a, "from_encodings": b} for name, (a, b) in self.piece_bytes.items()}}


def measured_pieces(plan: Plan, parts: Mapping[str, tuple[Path, Path]]) -> list[Piece]:
    """The plan's pieces weighed from each part's prompt graph and its encodings (``parts``: label -> (graph,
    encodings)).

    Raises:
        GenieBuildError: a part is missing, or a graph or encodings file cannot be read.
    """
    pieces = {piece.name: piece for piece in plan.pieces}
    weighed = {}
    for part in plan.parts:
        if part.label not in parts:
            raise GenieBuildError(part.label, "no graph and encodings given for this part")
        graph_path, encodings_path = parts[part.label]
        weighed.update(_part_piece_bytes(part, [pieces[name] for name in part.pieces], graph_path, encodings_path))
    return [dataclasses.replace(piece, bytes=weighed[piece.name]) for piece in plan.pieces]


def _part_piece_bytes(part: PartPlan, pieces: Sequence[Piece], graph_path: Path, encodings_path: Path
                      ) -> dict[str, int]:
    model = load_graph(graph_path)
    encodings = read_encodings(encodings_path)
    cuts = [piece.output_boundary for piece in pieces[:-1]]
    totals = piece_bytes(weights_from_graph(model, cuts), by_encodings(encodings))
    return {piece.name: total for piece, total in zip(pieces, totals, strict=True)}


def check_plan(plan: Plan, measured: Sequence[Piece], out: str | os.PathLike[str],
               where: str | os.PathLike[str]) -> PlanCheck:
    """Re-plan with ``measured`` pieces and the plan's own settings; write the comparison to ``out``.

    Raises:
        GenieBuildError: the encodings would cut the model into other parts than the plan's (both listed); nothing
            is written.
    """
    replanned = (plan_by_num_parts(measured, plan.num_parts, plan.embedding_alone) if plan.mode == "num_parts"
                 else plan_by_max_part_bytes(measured, plan.max_part_bytes, plan.embedding_alone))
    check = PlanCheck(tuple(part.pieces for part in plan.parts), tuple(part.pieces for part in replanned.parts),
                      {a.name: (a.bytes, b.bytes) for a, b in zip(plan.pieces, measured)})
    differing = [name for name, (a, b) in check.piece_bytes.items() if a != b]
    log.info("plan check: %d of %d pieces weigh what the plan said%s", len(check.piece_bytes) - len(differing),
             len(check.piece_bytes), f" (differing: {', '.join(differing[:5])})" if differing else "")
    if not check.same_parts:
        raise GenieBuildError(where, "the calibrated encodings cut the model into other parts than the plan: "
                                     f"planned {_parts_text(check.planned)}, the encodings give "
                                     f"{_parts_text(check.from_encodings)} (largest part "
                                     f"{max(p.estimated_bytes for p in replanned.parts) / MIB:.1f} MiB); the plan's "
                                     "weight model does not describe this model")
    write_json(out, check.to_dict())
    return check


def _parts_text(parts: Sequence[Sequence[str]]) -> str:
    return " | ".join("+".join(part) for part in parts)
