"""The verify stage of a model exported part by part: each part's graphs (its prompt and token graphs at every
context length its binary holds), run in onnxruntime, against the checkpoint's own transformers modules run in torch
on the same step.

There is no whole graph to compare the parts with (:mod:`genie_build.split.verify_split` does that for a split), so the
reference is the model itself. Each graph kind gets one step (:func:`_kind_steps`): random token ids for the first
part, a random residual stream for a part after it, random past keys and values filling half the cache of the kind's
shortest graph, the RoPE tables of the positions after them. transformers' modules run it once, on a cache of
exactly those entries; each graph of the kind, at every length, runs it with the entries spread over its own cache
from the first slot to the last and the other slots hidden by the mask (:func:`_graph_feed`), and every output (the
residual stream at its cut, its new KV entries, the logits) must be what the modules computed, within
:data:`TOLERANCE` of each output's largest magnitude. Attention sums over the slots the mask shows, in any order,
and a hidden slot weighs exp(-50) of a shown one, so a right graph gives the modules' outputs at every length and
layout; a graph that hides, drops or misplaces part of its cache, reads its mask or RoPE tables wrongly, or holds
other weights does not (docs/export.md, "The verification"). Float32 through and through; onnxruntime runs the
graphs with its fusions (:func:`genie_build.ort_session.float_check_options`).

A job checks one part, as soon as it is exported: the part's modules are built and loaded one piece at a time (the
embedding, a decoder layer, the head) and each is run on the steps before the next is loaded, so the checkpoint's
tensors are read once per part; then the graphs run one after the other, each session dropped before the next, all
reading the part's one data file. Memory holds one part's session and one piece, never the model. Each part is
checked on its own inputs rather than its predecessor's outputs: the check is that a part computes what its modules
compute, for which any input serves, and the names that join the parts are Genie's IO contract's
(``check-contract``).
"""

from __future__ import annotations

import logging
import os
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from genie_build.conventions import (INPUT_IDS, MASK, MASK_MIN, POS_COS, POS_SIN, causal_mask, graph_ar, kv_name,
                                     rope_tables)
from genie_build.errors import GenieBuildError
from genie_build.export.export import ExportShape, GraphSpan, export_shape, piece_outputs
from genie_build.fileio import write_json
from genie_build.hf_checkpoint import CONFIG_NAME, read_checkpoint
from genie_build.hf_config import read_rope
from genie_build.ort_session import float_check_options
from genie_build.plan.plan_file import PartPlan
from genie_build.split.verify_split import run_graph

__all__ = ["TOLERANCE", "PartCheck", "PartGraph", "verify_part"]

log = logging.getLogger(__name__)
TOLERANCE = 1e-4


@dataclass(frozen=True)
class PartGraph:
    """One graph of a part: its key (``prompt``, ``token_cl512``, ...), kind, context length and file."""

    key: str
    kind: str
    context: int
    path: Path


@dataclass(frozen=True)
class PartCheck:
    """One output of one graph: the largest difference from transformers', and that output's largest value."""

    graph: str
    output: str
    max_abs_diff: float
    max_abs_reference: float

    @property
    def within_tolerance(self) -> bool:
        return self.max_abs_diff <= TOLERANCE * max(self.max_abs_reference, 1.0)


def verify_part(checkpoint_dir: str | os.PathLike[str], part: PartPlan, graphs: list[PartGraph], *, ar: int,
                out: str | os.PathLike[str], seed: int = 0) -> list[PartCheck]:
    """Run each of ``part``'s ``graphs`` (prompt AR ``ar``) on its kind's step (:func:`_kind_steps`, laid out in the
    graph's own cache by :func:`_graph_feed`) and compare every output with transformers' modules on that step; write
    the report to ``out``.

    Raises:
        GenieBuildError: an output beyond the tolerance (naming the graph, the output and the difference), a graph
            onnxruntime cannot run, or settings the checkpoint does not fit.
    """
    checkpoint = read_checkpoint(checkpoint_dir)
    span = GraphSpan.of_part(part)
    where = checkpoint.directory / CONFIG_NAME
    shapes = {graph.key: export_shape(checkpoint.config, ar, graph.context, where) for graph in graphs}
    steps = _kind_steps(checkpoint.config, where, span, [(graph.kind, shapes[graph.key]) for graph in graphs], seed)
    kinds = sorted(steps)
    expected = dict(zip(kinds, piece_outputs(checkpoint, span, [steps[kind].feed for kind in kinds]), strict=True))
    log.info("part %s: transformers' modules ran on the steps of its %d graphs (%s)", part.label, len(graphs),
             ", ".join(f"{kind}: {steps[kind].filled} cache entries" for kind in kinds))
    checks = []
    for graph in graphs:
        reference = expected[graph.kind]
        feed = _graph_feed(steps[graph.kind], span, shapes[graph.key])
        actual = run_graph(graph.path, feed, float_check_options())
        for name, value in reference.items():
            check = PartCheck(graph.key, name, float(np.max(np.abs(actual[name] - value))),
                              float(np.max(np.abs(value))))
            checks.append(check)
            if not check.within_tolerance:
                raise GenieBuildError(graph.path, f"output {name!r} differs from transformers' modules by "
                                                  f"{check.max_abs_diff:g} (largest value {check.max_abs_reference:g}, "
                                                  f"tolerance {TOLERANCE:g} of it)")
        log.info("part %s, %s (CL %d): %d outputs within %g of transformers' modules", part.label, graph.key,
                 graph.context, len(reference), max(c.max_abs_diff for c in checks if c.graph == graph.key))
    write_json(out, {"part": part.label, "reference": "transformers modules of the checkpoint, piece by piece",
                     "tolerance": TOLERANCE, "graphs": {graph.key: str(graph.path) for graph in graphs},
                     "cache_entries": {kind: steps[kind].filled for kind in kinds},
                     "outputs": [asdict(check) for check in checks]})
    return checks


@dataclass(frozen=True)
class _Step:
    """One step of a graph kind, shared by its graphs at every length: ``feed`` holds the part's inputs by Genie
    name with a cache of exactly the ``filled`` entries that hold values (the mask shows all of them, and the new
    tokens causally), which is how transformers' modules run it."""

    kind: str
    filled: int
    feed: dict[str, np.ndarray]


def _kind_steps(config: dict, where: Path, span: GraphSpan, graphs: list[tuple[str, ExportShape]], seed: int
                ) -> dict[str, _Step]:
    """For each kind among ``graphs`` (``(kind, shape)``), a step: random token ids (or a random residual stream),
    and for a part with decoder layers random keys and values filling half the cache of the kind's shortest graph
    and the RoPE tables of the positions after them; seeded by the kind, so a part gets the same steps in every
    run."""
    steps = {}
    for kind in sorted({kind for kind, _ in graphs}):
        shape = min((shape for each, shape in graphs if each == kind), key=lambda shape: shape.context)
        step, filled = graph_ar(kind, shape.ar), shape.past(kind) // 2 if span.layers else 0
        rng = np.random.default_rng([seed, zlib.crc32(kind.encode())])
        feed: dict[str, np.ndarray] = {}
        if span.input_boundary:
            feed[span.input_boundary] = rng.standard_normal((1, step, shape.hidden)).astype(np.float32)
        else:
            feed[INPUT_IDS] = rng.integers(0, config["vocab_size"], (1, step)).astype(np.int32)
        if span.layers:
            rope = read_rope(config, where)
            cos, sin = rope_tables(shape.head_dim, float(rope.theta), np.arange(filled, filled + step), rope.scaling)
            feed.update({MASK: causal_mask(step, filled + step, filled), POS_COS: cos, POS_SIN: sin})
        for layer in span.layers:
            feed[kv_name("key", layer, "in")] = rng.standard_normal(
                (1, shape.kv_heads, shape.head_dim, filled)).astype(np.float32)
            feed[kv_name("value", layer, "in")] = rng.standard_normal(
                (1, shape.kv_heads, filled, shape.head_dim)).astype(np.float32)
        steps[kind] = _Step(kind, filled, feed)
    return steps


def _filled_slots(filled: int, past: int) -> np.ndarray:
    """The cache slots of a graph of ``past`` slots that hold a step's ``filled`` entries: spread evenly from the
    first slot to the last, so every region of the cache takes part at every length."""
    return np.round(np.linspace(0, past - 1, filled)).astype(np.int64)


def _graph_feed(step: _Step, span: GraphSpan, shape: ExportShape) -> dict[str, np.ndarray]:
    """``step`` as a graph of ``shape`` takes it: its entries in the slots :func:`_filled_slots` gives, zero keys
    and values in the others, which the mask hides; the new tokens in the mask's last columns as Genie gives them."""
    feed = {name: value for name, value in step.feed.items()
            if name in (INPUT_IDS, POS_COS, POS_SIN) or name == span.input_boundary}
    if not span.layers:
        return feed
    past, window = shape.past(step.kind), graph_ar(step.kind, shape.ar)
    slots = _filled_slots(step.filled, past)
    mask = np.full((1, window, past + window), MASK_MIN, np.float32)
    mask[:, :, slots] = 0.0
    mask[:, :, past:] = step.feed[MASK][:, :, step.filled:]
    feed[MASK] = mask
    for layer in span.layers:
        keys = np.zeros((1, shape.kv_heads, shape.head_dim, past), np.float32)
        values = np.zeros((1, shape.kv_heads, past, shape.head_dim), np.float32)
        keys[..., slots] = step.feed[kv_name("key", layer, "in")]
        values[:, :, slots] = step.feed[kv_name("value", layer, "in")]
        feed[kv_name("key", layer, "in")], feed[kv_name("value", layer, "in")] = keys, values
    return feed
