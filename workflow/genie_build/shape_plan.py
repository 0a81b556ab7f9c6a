"""Plans made from shapes, before any calibration: of a Hugging Face checkpoint from its ``config.json`` alone
(before anything is exported), and of float graphs brought without encodings.

The pieces (embedding, each decoder layer, the head) are weighed as the calibrated encodings will store them
(:func:`genie_build.recipes.precision_of`, AIMET's rule per weight) and balanced into parts by the same planner
as a split (:mod:`genie_build.plan`). A checkpoint's part labels are therefore known when the workflow is parsed,
and every part is exported, calibrated and converted as its own job. With the plan come the calibration chain's
units (:mod:`genie_build.calibration_units`); :mod:`genie_build.check_plan` re-plans from the real encodings after
calibration and refuses a plan that they would cut differently.

Also here, for the workflow's input functions: which checkpoint tensors each part reads
(:func:`part_tensor_names`) and so which safetensors files it depends on (:func:`part_weight_files`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any
from pathlib import Path

from genie_build.auto_split import JobMemory, io_dims_from_hf_config, plan_request
from genie_build.calibration_units import CalibrationUnit, PieceFloat, calibration_units, part_units, write_units
from genie_build.chipsets import HTP_LOAD, LoadParams
from genie_build.conventions import piece_names
from genie_build.errors import GenieBuildError
from genie_build.hf_checkpoint import FP8_SCALE_SUFFIX, INDEX_NAME, Checkpoint, stored_name
from genie_build.hf_config import ModelShape, shape_of
from genie_build.job_memory import RunMemory, part_job_mb
from genie_build.plan import plan_graphs, weighed_pieces
from genie_build.plan_file import PartPlan, Piece, Plan, write_plan
from genie_build.precision import weight_encoding
from genie_build.recipes import precision_of, recipe_named
from genie_build.split_request import SplitRequest
from genie_build.units import MIB
from genie_build.weight_inventory import ModelWeights, weights_from_hf_config, weights_from_onnx

__all__ = ["part_jobs", "part_tensor_names", "part_weight_files", "piece_floats", "plan_checkpoint", "plan_from_hf_config",
           "write_float_graphs_plan", "write_plan_checkpoint"]

log = logging.getLogger(__name__)


def plan_from_hf_config(config_path: str | os.PathLike[str] | ModelShape, *, recipe: str, ar: int,
                        context: int | Sequence[int], num_parts: int | str | None = None,
                        max_part_bytes: int | None = None,
                        embedding_alone: bool = True, load: LoadParams = HTP_LOAD, embedding: str = "graph",
                        memory: RunMemory | None = None, evaluate: bool = False) -> Plan:
    """The plan of the checkpoint whose ``config.json`` is ``config_path``, quantized by the named ``recipe`` and
    exported with prompt AR ``ar`` and context ``context``, one length or several (``num_parts`` "auto": the fewest
    parts that map under ``load`` in the ``embedding`` layout, with the IO of every length's graphs, and with
    ``memory`` whose export, verification and, with ``evaluate``, evaluation jobs each fit what a job of the run may
    take); the plan's context length is the largest. ``config_path``: the file, or its shape as read once.

    Raises:
        GenieBuildError: the config is not one the export reads, or the split request is infeasible (naming the
            config key).
    """
    request = SplitRequest(num_parts, max_part_bytes, embedding_alone)
    shape = shape_of(config_path)
    model = weights_from_hf_config(shape)
    pieces = _weighed(model, recipe)
    dims = io_dims_from_hf_config(shape, precision_of(recipe_named(recipe)).activations, ar, context)
    plan = plan_request(pieces, request, dims=dims, load=load, embedding=embedding,
                        jobs=None if memory is None else part_jobs(_piece_floats(model), memory, evaluate))
    return dataclasses.replace(plan, graph_ar={"prompt": ar, "token": 1}, context_length=dims.context_length)


def _weighed(model: ModelWeights, recipe: str) -> list[Piece]:
    precision = precision_of(recipe_named(recipe))
    specs = {weight.spec.name: weight.spec for weight in model.weights}
    owners = {weight.spec.name: weight.pieces for weight in model.weights}
    encodings = {weight.spec.name: weight_encoding(weight, precision) for weight in model.weights}
    return weighed_pieces(specs, owners, encodings, model.boundaries)


def piece_floats(config_path: str | os.PathLike[str] | ModelShape) -> dict[str, PieceFloat]:
    """Piece name -> the float32 bytes of its weights and of the largest (what an export or a calibration holds)."""
    return _piece_floats(weights_from_hf_config(config_path))


def part_jobs(floats: Mapping[str, PieceFloat], memory: RunMemory, evaluate: bool) -> JobMemory:
    """What a job of the run may take, and what the largest job holding a part takes: its export, its
    verification, its evaluation with ``evaluate`` (:mod:`genie_build.job_memory`)."""
    def part_mb(part: PartPlan) -> int:
        return part_job_mb(sum(floats[name].total for name in part.pieces) / 1e6,
                           max(floats[name].largest for name in part.pieces) / 1e6, evaluate=evaluate)

    return JobMemory(memory.job_limit_mb, memory.given_mb, memory.source, part_mb)


def _piece_floats(model: ModelWeights) -> dict[str, PieceFloat]:
    """Piece name -> the float32 bytes of its weights and of the largest (what a calibration unit holds)."""
    totals, largest = [0] * (model.num_layers + 2), [0] * (model.num_layers + 2)
    for weight in model.weights:
        for piece in weight.pieces:
            totals[piece] += 4 * math.prod(weight.spec.shape)
            largest[piece] = max(largest[piece], 4 * math.prod(weight.spec.shape))
    return {name: PieceFloat(total, most) for name, total, most in zip(piece_names(model.num_layers), totals, largest)}


def part_tensor_names(config_path: str | os.PathLike[str] | ModelShape, part: PartPlan,
                      stored: Collection[str] = ()) -> list[str]:
    """The checkpoint tensors a part's export reads: its pieces' weights, for the LM head of a tied checkpoint the
    embedding table unless ``stored`` (the checkpoint's tensor names) holds its own ``lm_head.weight``
    (:func:`genie_build.hf_checkpoint.stored_name`)."""
    shape = shape_of(config_path)
    model, tied = weights_from_hf_config(shape), shape.tied
    pieces = {name: index for index, name in enumerate(piece_names(model.num_layers))}
    wanted = {pieces[name] for name in part.pieces}
    names = [weight.spec.name for weight in model.weights if weight.pieces & wanted]
    return list(dict.fromkeys(stored_name(name, tied, stored) for name in names))


def part_weight_files(checkpoint: Checkpoint, part: PartPlan) -> list[Path]:
    """The weights files a part's export depends on beside what its graphs take of ``config.json``
    (:mod:`genie_build.graph_config`): the shard index (if any) and the safetensors files holding the part's
    tensors, so a changed shard re-exports only the parts it feeds. ``checkpoint``: as read once, headers included
    (:func:`genie_build.hf_checkpoint.check_checkpoint`).

    Raises:
        GenieBuildError: the checkpoint lacks one of the part's tensors (naming it and the file looked in).
    """
    holders = checkpoint.tensor_files
    files = []
    read = checkpoint.weight_files
    for name in part_tensor_names(checkpoint.shape, part, holders):
        if name not in holders:
            raise GenieBuildError(read[0], f"has no tensor {name!r}, which part {part.label} needs")
        files.append(holders[name])
        if name + FP8_SCALE_SUFFIX in holders:   # an FP8 weight's block scales
            files.append(holders[name + FP8_SCALE_SUFFIX])
    index = [read[0]] if read[0].name == INDEX_NAME else []
    return [*index, *sorted(set(files))]


def plan_checkpoint(config_path: str | os.PathLike[str] | ModelShape, split: Mapping[str, Any], *, recipe: str,
                    ar: int, context: int | Sequence[int], unit_memory_mb: int, load: LoadParams = HTP_LOAD,
                    embedding: str = "graph", memory: RunMemory | None = None, evaluate: bool = False
                    ) -> tuple[Plan, tuple[CalibrationUnit, ...]]:
    """The plan and the calibration chain's units of a checkpoint, from the config's ``split`` section, the named
    recipe, the export's AR and context, the calibration budget and (for ``num_parts`` "auto") the run's
    ``memory``: what the workflow computes when it is parsed (from the checkpoint's shape as read once), and what
    the ``plan-hf`` command writes down.

    Raises:
        GenieBuildError: as :func:`plan_from_hf_config` and :func:`genie_build.calibration_units.
            calibration_units`; ``split.boundaries`` (the export names its own).
    """
    if split.get("boundaries"):
        raise GenieBuildError("split.boundaries", "the export names the residual stream itself; unset it")
    max_mb = split.get("max_part_mb")
    plan = plan_from_hf_config(config_path, recipe=recipe, ar=ar, context=context,
                               num_parts=split.get("num_parts"),
                               max_part_bytes=None if max_mb is None else int(max_mb * MIB),
                               embedding_alone=split.get("embedding_alone", True), load=load, embedding=embedding,
                               memory=memory, evaluate=evaluate)
    return plan, calibration_units(plan, piece_floats(config_path), unit_memory_mb)


def write_plan_checkpoint(config_path: str | os.PathLike[str], split: Mapping[str, Any],
                          out_plan: str | os.PathLike[str], out_units: str | os.PathLike[str],
                          **settings: Any) -> tuple[Plan, tuple[CalibrationUnit, ...]]:
    """The ``plan-hf`` command: :func:`plan_checkpoint`, written to ``plan.json`` and the units' file."""
    plan, units = plan_checkpoint(config_path, split, **settings)
    _write(plan, units, out_plan, out_units)
    return plan, units


def _write(plan: Plan, units: tuple[CalibrationUnit, ...], out_plan: str | os.PathLike[str],
           out_units: str | os.PathLike[str]) -> None:
    write_plan(out_plan, plan)
    write_units(out_units, units)
    for part in plan.parts:
        log.info("part %s: %s, %.2f MiB; units %s", part.label, "+".join(part.pieces), part.estimated_bytes / MIB,
                 ", ".join(f"{unit.label} ({'+'.join(unit.pieces)})" for unit in part_units(units, part.label)))


def write_float_graphs_plan(prompt_path: str | os.PathLike[str], token_path: str | os.PathLike[str],
                            split: Mapping[str, Any], out_plan: str | os.PathLike[str],
                            out_units: str | os.PathLike[str], *, recipe: str, unit_memory_mb: int,
                            check_weights: bool = True, load: LoadParams = HTP_LOAD,
                            other_lengths: Sequence[int] = (), embedding: str = "graph"
                            ) -> tuple[Plan, tuple[CalibrationUnit, ...]]:
    """The ``plan`` command for float graphs without encodings: the pair's plan, its pieces weighed by the named
    recipe's rule from the prompt graph's weight shapes (:func:`genie_build.weight_inventory.weights_from_onnx`),
    and the calibration chain's units; both written.

    Raises:
        GenieBuildError: as :func:`genie_build.plan.plan_graphs` and :func:`genie_build.calibration_units.
            calibration_units`.
    """
    weighed: dict[str, ModelWeights] = {}

    def weigh(_model: Any, found: tuple[str, ...]) -> list[Piece]:
        weighed["model"] = weights_from_onnx(prompt_path, found)
        return _weighed(weighed["model"], recipe)

    max_mb = split.get("max_part_mb")
    plan = plan_graphs(prompt_path, token_path, weigh, num_parts=split.get("num_parts"),
                       max_part_bytes=None if max_mb is None else int(max_mb * MIB),
                       embedding_alone=split.get("embedding_alone", True), boundaries=split.get("boundaries"),
                       check_weights=check_weights, load=load, other_lengths=other_lengths, embedding=embedding,
                       activation_bits=precision_of(recipe_named(recipe)).activations)
    units = calibration_units(plan, _piece_floats(weighed["model"]), unit_memory_mb)
    _write(plan, units, out_plan, out_units)
    return plan, units
