"""The part-encodings stage of the calibration chain: a part's units' encodings merged into the part's prompt and
token encodings, as the split's slices would be of a whole-model calibration.

Each tensor's encoding comes from the unit that computes it. Units overlap only where one starts: a unit's
residual-stream input gets a quantizer of its own (aimet-onnx quantizes graph inputs), so a boundary takes the
encoding of the unit that produced it, here or in the previous part (the embedding's output: its table's encoding,
:mod:`genie_build.quantize.embedding_encoding`), and none when that unit gave it none. Every other tensor
two units both encode (the mask, the RoPE tables and what is computed from them alone, copied into every unit)
must have one encoding in both, which is checked. Then, as for a whole-model calibration: each ``past_*_out``
takes its ``past_*_in``'s encoding, the token graph takes the prompt graph's encoding for every tensor it has,
and both are checked against their graphs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from genie_build.encodings import (Encodings, TensorEncoding, check_kv_cache_tied, read_encodings,
                                   validate_against_model, write_encodings)
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import read_graph_tensors
from genie_build.plan.calibration_units import CalibrationUnit
from genie_build.quantize.calibrate_unit import copy_kv_input_encodings, shared_token_tensors, token_encodings

__all__ = ["merge_unit_encodings", "write_part_encodings"]

log = logging.getLogger(__name__)


def merge_unit_encodings(units: Sequence[tuple[CalibrationUnit, Encodings]],
                         previous: tuple[CalibrationUnit, Encodings] | None) -> Encodings:
    """One part's encodings from its units' (in chain order); ``previous``: the unit before the part's first,
    whose output is the part's input.

    Raises:
        GenieBuildError: two units encode a tensor that neither takes from the other differently, a weight is
            encoded by two units, or the units were calibrated with different quantizer settings.
    """
    first_unit, first = units[0]
    produced_by = {unit.output_boundary: encodings for unit, encodings in ([previous] if previous else [])
                   if unit.output_boundary}
    produced_by.update({unit.output_boundary: encodings for unit, encodings in units if unit.output_boundary})
    boundaries = {unit.input_boundary for unit, _ in units} - {None}
    activations: dict[str, TensorEncoding] = {}
    params: dict[str, TensorEncoding] = {}
    sources: dict[str, Encodings] = {}   # which unit's file each kept encoding is from, for its entry as read
    for unit, encodings in units:
        if (encodings.quantizer_args, encodings.version) != (first.quantizer_args, first.version):
            raise GenieBuildError(f"unit {unit.label}", f"calibrated with other quantizer settings than unit "
                                                        f"{first_unit.label}: {encodings.quantizer_args}")
        for name, encoding in encodings.activations.items():
            if name in boundaries:
                continue
            _put(activations, name, encoding, unit)
            sources.setdefault(name, encodings)
        for name, encoding in encodings.params.items():
            if name in params:
                raise GenieBuildError(f"unit {unit.label}", f"weight {name!r} is encoded by two units")
            params[name] = encoding
            sources[name] = encodings
    for name in boundaries:
        if name in produced_by and name in produced_by[name].activations:
            activations[name] = produced_by[name].activations[name]
            sources[name] = produced_by[name]
    entries = {key: entry for name, encodings in sources.items() for key, entry in encodings.entries.items()
               if key[1] == name}
    return Encodings(activations=dict(sorted(activations.items())), params=dict(sorted(params.items())),
                     quantizer_args=dict(first.quantizer_args), header=first.header, version=first.version,
                     entries=entries)


def _put(activations: dict[str, TensorEncoding], name: str, encoding: TensorEncoding, unit: CalibrationUnit) -> None:
    if name in activations and activations[name] != encoding:
        raise GenieBuildError(f"unit {unit.label}", f"tensor {name!r} has another encoding than in the unit before "
                                                    "it, though both compute it from the same inputs")
    activations[name] = encoding


def write_part_encodings(units: Sequence[tuple[CalibrationUnit, str | os.PathLike[str]]],
                         previous: tuple[CalibrationUnit, str | os.PathLike[str]] | None,
                         prompt_graph: str | os.PathLike[str], token_graph: str | os.PathLike[str],
                         out_prompt: str | os.PathLike[str], out_token: str | os.PathLike[str], *,
                         kv_cache_tied: bool = False) -> tuple[Encodings, Encodings]:
    """The ``part-encodings`` command: merge a part's units' encodings (``units``: each unit and its encodings
    file, in chain order; ``previous``: the unit before the part's first and its file), give the token graph the
    prompt graph's encodings, check both against their graphs and write them.

    Raises:
        GenieBuildError: no units, units of several parts, or the problems of :func:`merge_unit_encodings`,
            :func:`genie_build.quantize.calibrate_unit.shared_token_tensors` and :func:`genie_build.encodings.
            validate_against_model`; with ``kv_cache_tied``, a cache output whose encoding is not its input's.
    """
    if not units or len({unit.part for unit, _ in units}) != 1:
        raise GenieBuildError("--part-units-json", "needs the units of one part")
    merged = merge_unit_encodings([(unit, read_encodings(path)) for unit, path in units],
                                  None if previous is None else (previous[0], read_encodings(previous[1])))
    prompt_tensors = read_graph_tensors(prompt_graph)
    token_names = shared_token_tensors(prompt_tensors.tensor_names, Path(token_graph))
    prompt = copy_kv_input_encodings(merged, prompt_tensors.tensor_names)
    token = token_encodings(prompt, token_names)
    for graph, enc in ((prompt_graph, prompt), (token_graph, token)):
        tensors = read_graph_tensors(graph)
        validate_against_model(enc, graph, tensors.tensor_names, tensors.param_shapes, tensors.param_layouts)
        if kv_cache_tied:
            check_kv_cache_tied(enc, tensors.tensor_names)
    for enc, out in ((prompt, out_prompt), (token, out_token)):
        write_encodings(out, enc)
        log.info("%s: %d activation and %d param encodings", out, len(enc.activations), len(enc.params))
    return prompt, token
