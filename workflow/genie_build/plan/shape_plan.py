"""The plan of a Hugging Face checkpoint from its ``config.json`` alone, before anything is exported or calibrated.

The pieces (embedding, each decoder layer, the head) are weighed as the calibrated encodings will store them
(:func:`genie_build.plan.recipes.precision_of`, AIMET's rule per weight) and planned by the same path as a graph's
(:mod:`genie_build.plan.plan`). A checkpoint's part labels are therefore known when the workflow is parsed, and every
part is exported, calibrated and converted as its own job. With the plan come the calibration chain's units
(:mod:`genie_build.plan.calibration_units`); :mod:`genie_build.quantize.check_plan` re-plans from the real encodings
after calibration and refuses a plan that they would cut differently.

Also here, for the workflow's input functions: which checkpoint tensors each part reads
(:func:`part_tensor_names`) and so which safetensors files it depends on (:func:`part_weight_files`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from genie_build.chipsets import HTP_LOAD, LoadParams
from genie_build.conventions import piece_names
from genie_build.errors import GenieBuildError
from genie_build.hf_checkpoint import FP8_SCALE_SUFFIX, INDEX_NAME, Checkpoint, stored_name
from genie_build.hf_config import ModelShape, shape_of
from genie_build.job_memory import RunMemory
from genie_build.plan.auto_split import binary_compile, io_dims_from_hf_config, part_jobs, plan_request
from genie_build.plan.calibration_units import CalibrationUnit, PieceFloat, calibration_units
from genie_build.plan.plan import by_precision, weighed_pieces, write_plan_and_units
from genie_build.plan.plan_file import PartPlan, Plan
from genie_build.plan.recipes import precision_of, recipe_named
from genie_build.plan.weight_inventory import weights_from_hf_config
from genie_build.split_request import SplitRequest

__all__ = ["part_tensor_names", "part_weight_files", "piece_floats", "plan_checkpoint", "plan_from_hf_config",
           "write_plan_checkpoint"]


def plan_from_hf_config(config_path: str | os.PathLike[str] | ModelShape, *, recipe: str, ar: int,
                        context: int | Sequence[int], num_parts: int | str | None = None,
                        max_part_bytes: int | None = None,
                        embedding_alone: bool = True, load: LoadParams = HTP_LOAD, embedding: str = "graph",
                        memory: RunMemory | None = None, evaluate: bool = False,
                        toolchains: Sequence[str] = ()) -> Plan:
    """The plan of the checkpoint whose ``config.json`` is ``config_path``, quantized by the named ``recipe`` and
    exported with prompt AR ``ar`` and context ``context``, one length or several (``num_parts`` "auto": the fewest
    parts that map under ``load`` in the ``embedding`` layout, with the IO of every length's graphs, and with
    ``memory`` whose export, verification, with ``evaluate`` evaluation, and with ``toolchains`` (the variants')
    compile jobs each fit what a job of the run may take); the plan's context length is the largest.
    ``config_path``: the file, or its shape as read once.

    Raises:
        GenieBuildError: the config is not one the export reads, or the split request is infeasible (naming the
            config key).
    """
    request = SplitRequest(num_parts, max_part_bytes, embedding_alone)
    shape = shape_of(config_path)
    model = weights_from_hf_config(shape)
    precision = precision_of(recipe_named(recipe))
    pieces = weighed_pieces(model, by_precision(precision))
    dims = io_dims_from_hf_config(shape, precision.activations, ar, context)
    jobs = None if memory is None else part_jobs(model.piece_floats(), memory, evaluate,
                                                 binary_compile(toolchains, dims.context_lengths), embedding)
    plan = plan_request(pieces, request, dims=dims, load=load, embedding=embedding, jobs=jobs)
    return dataclasses.replace(plan, graph_ar={"prompt": ar, "token": 1}, context_length=dims.context_length)


def piece_floats(config_path: str | os.PathLike[str] | ModelShape) -> dict[str, PieceFloat]:
    """Piece name -> the float32 bytes of its weights and of the largest (what an export or a calibration holds)."""
    return weights_from_hf_config(config_path).piece_floats()


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
    (:mod:`genie_build.export.graph_config`): the shard index (if any) and the safetensors files holding the part's
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
                    embedding: str = "graph", memory: RunMemory | None = None, evaluate: bool = False,
                    toolchains: Sequence[str] = ()) -> tuple[Plan, tuple[CalibrationUnit, ...]]:
    """The plan and the calibration chain's units of a checkpoint, from the config's ``split`` section, the named
    recipe, the export's AR and context, the calibration budget and (for ``num_parts`` "auto") the run's
    ``memory``: what the workflow computes when it is parsed (from the checkpoint's shape as read once), and what
    the ``plan-hf`` command writes down.

    Raises:
        GenieBuildError: as :func:`plan_from_hf_config` and :func:`genie_build.plan.calibration_units.
            calibration_units`; ``split.boundaries`` (the export names its own).
    """
    if split.get("boundaries"):
        raise GenieBuildError("split.boundaries", "the export names the residual stream itself; unset it")
    request = SplitRequest.from_section(split)
    plan = plan_from_hf_config(config_path, recipe=recipe, ar=ar, context=context, num_parts=request.num_parts,
                               max_part_bytes=request.max_part_bytes, embedding_alone=request.embedding_alone,
                               load=load, embedding=embedding, memory=memory, evaluate=evaluate,
                               toolchains=toolchains)
    return plan, calibration_units(plan, piece_floats(config_path), unit_memory_mb)


def write_plan_checkpoint(config_path: str | os.PathLike[str], split: Mapping[str, Any],
                          out_plan: str | os.PathLike[str], out_units: str | os.PathLike[str],
                          **settings: Any) -> tuple[Plan, tuple[CalibrationUnit, ...]]:
    """The ``plan-hf`` command: :func:`plan_checkpoint`, written to ``plan.json`` and the units' file."""
    plan, units = plan_checkpoint(config_path, split, **settings)
    write_plan_and_units(plan, units, out_plan, out_units)
    return plan, units
