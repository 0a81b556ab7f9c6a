"""The plan stage: a prompt/token graph pair checked, cut into *pieces* (``embedding``, ``layer_0`` ..
``layer_{L-1}``, ``head``: final norm + LM head) at its boundaries, each piece weighed by its bytes after
quantization, and the pieces planned into parts (:func:`genie_build.plan.auto_split.plan_request`).

One path for every planner: a model's weights (:mod:`genie_build.plan.weight_inventory`: of a graph, read once, or of a
checkpoint's ``config.json``) are weighed by a rule (:class:`Weighing`: the graph's encodings, or a precision) into
pieces (:func:`weighed_pieces`), which the split request plans. The checkpoint's plan is
:mod:`genie_build.plan.shape_plan`, the estimate :mod:`genie_build.sizes.estimate`; the plan's records and its file are
:mod:`genie_build.plan.plan_file`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx

from genie_build.chipsets import HTP_LOAD, LoadParams
from genie_build.conventions import piece_names
from genie_build.encodings import Encodings, TensorEncoding, read_encodings
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import (InitializerSpec, ar_and_context_length, check_external_data,
                                    check_shared_initializers, load_graph)
from genie_build.plan.auto_split import io_dims_from_graph, plan_request
from genie_build.plan.boundaries import CONFIG_KEY as BOUNDARIES_KEY
from genie_build.plan.boundaries import find_boundaries
from genie_build.plan.calibration_units import CalibrationUnit, calibration_units, part_units, write_units
from genie_build.plan.plan_file import Piece, Plan, write_plan
from genie_build.plan.precision import Precision, weight_encoding
from genie_build.plan.recipes import precision_of, recipe_named
from genie_build.plan.weight_inventory import ModelWeights, Weight, weights_from_graph
from genie_build.split_request import SplitRequest
from genie_build.units import MIB

__all__ = ["Weighing", "by_encodings", "by_precision", "piece_bytes", "plan_float_graphs", "plan_graphs",
           "plan_split", "quantized_bytes", "weighed_pieces", "write_plan_and_units"]

FP16_FALLBACK_BYTES = 2          # float weights without an encoding are kept as fp16
log = logging.getLogger(__name__)

SCALE_OFFSET_PAIR_BYTES = 4      # estimate for one stored scale/offset pair
PER_BLOCK_INT_SCALE_BYTES = 1    # estimate for one LPBQ per-block integer scale

_FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})


# ------------------------------------------------------------------------------------------- weighing

@dataclass(frozen=True)
class Weighing:
    """How the pieces are weighed: the encoding each initializer is stored with (None: none), and whether the
    graph's constants count. A graph's encodings weigh every initializer the converted graph stores; a precision
    rules the weights alone (the size model counts the constants per layer)."""

    encoding_of: Callable[[Weight], TensorEncoding | None]
    counts_constants: bool


def by_encodings(encodings: Encodings) -> Weighing:
    """Each initializer weighed with its param encoding, else an activation encoding AIMET gives it (the table)
    (:meth:`Encodings.of_initializer`), the graph's constants included."""
    return Weighing(lambda weight: encodings.of_initializer(weight.spec.name), counts_constants=True)


def by_precision(precision: Precision) -> Weighing:
    """Each weight weighed as ``precision`` stores it (:func:`genie_build.plan.precision.weight_encoding`)."""
    return Weighing(lambda weight: weight_encoding(weight, precision), counts_constants=False)


def piece_bytes(model: ModelWeights, weighing: Weighing) -> list[int]:
    """Each piece's bytes (0 = embedding, i + 1 = layer i, L + 1 = head): the :func:`quantized_bytes` of the
    initializers it uses. An initializer counts towards every piece that uses it (a tied embedding/LM-head table is
    in the first and the last part, as the split will duplicate it).

    Raises:
        GenieBuildError: a precision rule does not fit a weight.
    """
    totals = [0] * (len(model.boundaries) + 1)
    for weight in (*model.weights, *(model.constants if weighing.counts_constants else ())):
        size = quantized_bytes(weight.spec, weighing.encoding_of(weight))
        for index in weight.pieces:
            totals[index] += size
    return totals


def weighed_pieces(model: ModelWeights, weighing: Weighing) -> list[Piece]:
    """The model's pieces, each weighing its :func:`piece_bytes`.

    Raises:
        GenieBuildError: as :func:`piece_bytes`.
    """
    totals, boundaries = piece_bytes(model, weighing), model.boundaries
    names = piece_names(len(boundaries) - 1)
    return [Piece(names[0], "embedding", totals[0], output_boundary=boundaries[0]),
            *(Piece(names[layer + 1], "layer", totals[layer + 1], layer, boundaries[layer + 1])
              for layer in range(len(boundaries) - 1)),
            Piece(names[-1], "head", totals[-1])]


# ------------------------------------------------------------------------------------------- graphs

def plan_graphs(prompt_path: str | os.PathLike[str], token_path: str | os.PathLike[str], weighing: Weighing,
                request: SplitRequest, *, boundaries: Sequence[str] | None = None, check_weights: bool = True,
                load: LoadParams = HTP_LOAD, activation_bits: int = 16, other_lengths: Sequence[int] = (),
                embedding: str = "graph") -> tuple[Plan, ModelWeights]:
    """The plan of a prompt/token graph pair, each graph read once without its weights, and the prompt graph's
    weights: the pair checked, its boundaries found, its pieces weighed by ``weighing`` and planned by ``request``
    (``num_parts`` "auto" under ``load`` in the ``embedding`` layout, the graph's IO at ``activation_bits`` and at
    every context length of ``other_lengths`` beside its own).

    Args:
        boundaries: the L + 1 residual tensors; default: found from node scopes.
        check_weights: compare the graphs' shared weights (the workflow's ``check_model`` job does that once per
            model change, not once per encodings change).

    Raises:
        GenieBuildError: a graph's data is missing, the graphs' weights or boundaries differ, AR or CL cannot be
            read, or the request is infeasible.
    """
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
    weights = weights_from_graph(prompt, found)
    dims = io_dims_from_graph(prompt, activation_bits, prompt_path, other_lengths) if request.auto else None
    plan = plan_request(weighed_pieces(weights, weighing), request, dims=dims, load=load, embedding=embedding)
    shapes = _graph_shapes({"prompt": (prompt, prompt_path), "token": (token, token_path)})
    return dataclasses.replace(plan, **shapes), weights


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


def plan_split(prompt_path: str, token_path: str, encodings_path: str, out: str | os.PathLike[str],
               request: SplitRequest, **settings) -> Plan:
    """The ``plan`` command with encodings: :func:`plan_graphs` weighing the pieces with the prompt graph's
    encodings (whether the graphs' encodings agree is :func:`genie_build.encodings.check_graphs_consistent`'s check,
    not this one), written to ``out``.

    Raises:
        GenieBuildError: as :func:`plan_graphs`, or the encodings cannot be read.
    """
    plan, _ = plan_graphs(prompt_path, token_path, by_encodings(read_encodings(encodings_path)), request, **settings)
    write_plan(out, plan)
    for part in plan.parts:
        log.info("part %s: %s, %.2f MiB", part.label, "+".join(part.pieces), part.estimated_bytes / MIB)
    return plan


def plan_float_graphs(prompt_path: str | os.PathLike[str], token_path: str | os.PathLike[str],
                      out_plan: str | os.PathLike[str], out_units: str | os.PathLike[str], request: SplitRequest, *,
                      recipe: str, unit_memory_mb: int, **settings) -> tuple[Plan, tuple[CalibrationUnit, ...]]:
    """The ``plan`` command for float graphs without encodings: :func:`plan_graphs` weighing the pieces as the named
    recipe will store them, and the calibration chain's units; both written.

    Raises:
        GenieBuildError: as :func:`plan_graphs` and :func:`genie_build.plan.calibration_units.calibration_units`.
    """
    precision = precision_of(recipe_named(recipe))
    plan, weights = plan_graphs(prompt_path, token_path, by_precision(precision), request,
                                activation_bits=precision.activations, **settings)
    units = calibration_units(plan, weights.piece_floats(), unit_memory_mb)
    write_plan_and_units(plan, units, out_plan, out_units)
    return plan, units


def write_plan_and_units(plan: Plan, units: tuple[CalibrationUnit, ...], out_plan: str | os.PathLike[str],
                         out_units: str | os.PathLike[str]) -> None:
    """Write ``plan.json`` and the calibration units' file, and log each part with its units."""
    write_plan(out_plan, plan)
    write_units(out_units, units)
    for part in plan.parts:
        log.info("part %s: %s, %.2f MiB; units %s", part.label, "+".join(part.pieces), part.estimated_bytes / MIB,
                 ", ".join(f"{unit.label} ({'+'.join(unit.pieces)})" for unit in part_units(units, part.label)))


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
