"""``plan.json``: the split plan's typed records (:class:`Plan`, :class:`PartPlan`, :class:`Piece`), its JSON
schema, and its writer and reader.

Apart from the planner (:mod:`genie_build.plan.plan`): the jobs that read a plan (split, the workflow's input
functions) need neither the planner's onnx and encodings modules, and the plan job, which writes one, does not
need jsonschema.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import jsonschema

from genie_build.errors import GenieBuildError
from genie_build.fileio import read_json, write_json

__all__ = ["PartPlan", "Piece", "PieceKind", "Plan", "PlanMode", "part_from_dict", "read_plan", "write_plan"]

PieceKind = Literal["embedding", "layer", "head"]
PlanMode = Literal["num_parts", "max_part_mb"]


@dataclass(frozen=True)
class Piece:
    """The smallest element of the model a plan places: the embedding, one decoder layer, or the head
    (final norm + LM head). ``bytes`` is its weight size after quantization (from shapes + encodings).
    ``output_boundary`` is the residual tensor it hands to the next piece (None for the head)."""

    name: str            # "embedding", "layer_0" .. "layer_{L-1}", "head"
    kind: PieceKind
    bytes: int
    layer: int | None = None
    output_boundary: str | None = None


@dataclass(frozen=True)
class PartPlan:
    """One part: 1-based ``index``; the pieces it holds; the tensors it takes and gives at its cuts."""

    index: int
    label: str                    # genie_build.conventions.part_label: "1_of_6", "01_of_11"
    pieces: tuple[str, ...]
    first_layer: int | None       # None for an embedding-only part
    last_layer: int | None
    input_boundary: str | None    # None for the first part (it takes input_ids)
    output_boundary: str | None   # None for the last part (it gives logits)
    estimated_bytes: int


@dataclass(frozen=True)
class Plan:
    num_parts: int
    parts: tuple[PartPlan, ...]
    num_layers: int
    boundaries: tuple[str, ...]   # residual-stream tensors: after embedding, after each layer 0..L-1
    embedding_alone: bool
    mode: PlanMode
    max_part_bytes: int | None = None   # the budget, in "max_part_mb" mode
    pieces: tuple[Piece, ...] = ()      # every piece with its estimated bytes
    graph_ar: dict[str, int] = field(default_factory=dict)  # tokens per call of each graph: prompt, token
    context_length: int | None = None   # the compiled context length CL, shared by both graphs
    # split.num_parts auto: which bound chose the count, for the memory plan. In memory only, not in plan.json: a
    # run given other memory that keeps the count rebuilds nothing
    chosen_by: str | None = field(default=None, compare=False)


_NAME = {"type": "string", "minLength": 1}
_OPTIONAL_NAME = {"type": ["string", "null"]}
_OPTIONAL_INT = {"type": ["integer", "null"]}
_COUNT = {"type": "integer", "minimum": 0}
PLAN_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["num_parts", "mode", "max_part_bytes", "num_layers", "embedding_alone", "boundaries",
                 "pieces", "parts"],
    "properties": {
        "num_parts": {"type": "integer", "minimum": 2},
        "mode": {"enum": list(get_args(PlanMode))},
        "max_part_bytes": _OPTIONAL_INT,
        "num_layers": {"type": "integer", "minimum": 1},
        "graph_ar": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1}},
        "context_length": {"type": ["integer", "null"], "minimum": 1},
        "embedding_alone": {"type": "boolean"},
        "boundaries": {"type": "array", "items": _NAME},
        "pieces": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["name", "kind", "bytes", "layer", "output_boundary"],
            "properties": {"name": _NAME, "kind": {"enum": list(get_args(PieceKind))}, "bytes": _COUNT,
                           "layer": _OPTIONAL_INT, "output_boundary": _OPTIONAL_NAME}}},
        "parts": {"type": "array", "minItems": 2, "items": {
            "type": "object", "additionalProperties": False,
            "required": ["index", "label", "pieces", "first_layer", "last_layer", "input_boundary",
                         "output_boundary", "estimated_bytes"],
            "properties": {"index": {"type": "integer", "minimum": 1}, "label": _NAME,
                           "pieces": {"type": "array", "minItems": 1, "items": _NAME},
                           "first_layer": _OPTIONAL_INT, "last_layer": _OPTIONAL_INT,
                           "input_boundary": _OPTIONAL_NAME, "output_boundary": _OPTIONAL_NAME,
                           "estimated_bytes": _COUNT}}},
    },
}


# Built once: jsonschema.validate() re-checks the schema itself on every call, and the workflow reads the plan
# in many input functions.
_PLAN_VALIDATOR = jsonschema.Draft202012Validator(PLAN_SCHEMA)


def write_plan(path: str | os.PathLike[str], plan: Plan, *, unless_same: bool = False) -> bool:
    """Write ``plan.json`` atomically; the same plan always gives the same bytes (``unless_same``:
    :func:`genie_build.fileio.write_json`)."""
    fields = dataclasses.asdict(plan)
    del fields["chosen_by"]
    return write_json(path, fields, unless_same=unless_same)


def read_plan(path: str | os.PathLike[str]) -> Plan:
    """Read ``plan.json`` written by :func:`write_plan`.

    Raises:
        GenieBuildError: the file is missing, not JSON, or not a plan (the message says which field).
    """
    data = read_json(path)
    error = jsonschema.exceptions.best_match(_PLAN_VALIDATOR.iter_errors(data))
    if error is not None:
        field = "/".join(str(key) for key in error.absolute_path) or "top level"
        raise GenieBuildError(path, f"not a valid plan: {field}: {error.message}")
    if len(data["parts"]) != data["num_parts"]:
        raise GenieBuildError(path, f"not a valid plan: num_parts is {data['num_parts']} but "
                                    f"{len(data['parts'])} parts are listed")
    parts = tuple(part_from_dict(part, path) for part in data["parts"])
    return Plan(**{**data, "parts": parts, "boundaries": tuple(data["boundaries"]),
                   "pieces": tuple(Piece(**piece) for piece in data["pieces"])})


def part_from_dict(data: Any, where: str | os.PathLike[str]) -> PartPlan:
    """A part from its fields (as ``plan.json`` lists it, or a rule passes one part); ``estimated_bytes`` may be
    left out (a part's export does not depend on it).

    Raises:
        GenieBuildError: not a part's fields.
    """
    try:
        return PartPlan(**{"estimated_bytes": 0, **data, "pieces": tuple(data["pieces"])})
    except (KeyError, TypeError) as exc:
        raise GenieBuildError(where, f"not a part of a plan: {exc}") from None
