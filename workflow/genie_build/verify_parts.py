"""The verify stage of a model exported part by part: each part's graphs (its prompt and token graphs at every
context length its binary holds), run in onnxruntime, against the checkpoint's own transformers modules run in torch
on the same inputs.

There is no whole graph to compare the parts with (:mod:`genie_build.verify_split` does that for a split), so the
reference is the model itself. Each graph gets a step as Genie feeds it at its own length (a causal mask with cached
entries before the window, the RoPE tables of those positions, random past keys and values; random token ids for
the first part, a random residual stream for a part after it), and every output of the graph (the residual stream
at its cut, its new KV entries, the logits) is compared with what the same transformers modules compute from the
same inputs; the difference allowed is :data:`TOLERANCE` of each output's largest magnitude (measured:
docs/export.md). Float32 through and through.

A job checks one part, as soon as it is exported (docs/export.md, "The verification"): the part's modules are built
and loaded one piece at a time (the embedding, a decoder layer, the head) and each is run on every graph's inputs
before the next is loaded, so the checkpoint's tensors are read once per part, not once per graph; then the graphs
run one after the other, each session dropped before the next, all reading the part's one data file. Memory holds
one part's session and one piece, never the model. Each part is checked on its own inputs rather than its
predecessor's outputs: the check is that a part computes what its modules compute, for which any input serves, and
the names that join the parts are Genie's IO contract's (``check-contract``).
"""

from __future__ import annotations

import logging
import os
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from genie_build.conventions import INPUT_IDS, MASK, POS_COS, POS_SIN, causal_mask, graph_ar, kv_name, rope_tables
from genie_build.errors import GenieBuildError
from genie_build.export import GraphSpan, export_shape, piece_outputs
from genie_build.fileio import write_json
from genie_build.hf_checkpoint import CONFIG_NAME, read_checkpoint
from genie_build.hf_config import read_rope
from genie_build.plan_file import PartPlan
from genie_build.verify_split import run_graph

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
    """Run each of ``part``'s ``graphs`` (prompt AR ``ar``) on a Genie step of its own and compare every output with
    transformers' modules on the same inputs; write the report to ``out``.

    Raises:
        GenieBuildError: an output beyond the tolerance (naming the graph, the output and the difference), a graph
            onnxruntime cannot run, or settings the checkpoint does not fit.
    """
    checkpoint = read_checkpoint(checkpoint_dir)
    span = GraphSpan.of_part(part)

    def feed_of(graph: PartGraph) -> dict[str, np.ndarray]:
        return _step_feed(checkpoint.config, checkpoint.directory / CONFIG_NAME, span, graph, ar, seed)

    expected = piece_outputs(checkpoint, span, [feed_of(graph) for graph in graphs])
    log.info("part %s: transformers' modules ran on the inputs of its %d graphs", part.label, len(graphs))
    checks = []
    for graph, reference in zip(graphs, expected, strict=True):
        actual = run_graph(graph.path, feed_of(graph))   # made again: beside the session, one graph's inputs
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
                     "outputs": [asdict(check) for check in checks]})
    return checks


def _step_feed(config: dict, where: Path, span: GraphSpan, graph: PartGraph, ar: int, seed: int
               ) -> dict[str, np.ndarray]:
    """A step as Genie feeds the graph, half of its cache already filled: random token ids (or a random residual
    stream), the causal mask and RoPE tables of those positions, random past keys and values of the part's layers
    (zero beyond the filled entries); seeded by the graph's key, so a graph gets the same step in every run."""
    shape = export_shape(config, ar, graph.context, where)
    step, past = graph_ar(graph.kind, shape.ar), shape.past(graph.kind)
    past_len = past // 2
    rng = np.random.default_rng([seed, zlib.crc32(graph.key.encode())])
    feed: dict[str, np.ndarray] = {}
    if span.input_boundary:
        feed[span.input_boundary] = rng.standard_normal((1, step, shape.hidden)).astype(np.float32)
    else:
        feed[INPUT_IDS] = rng.integers(0, config["vocab_size"], (1, step)).astype(np.int32)
    if span.layers:
        rope = read_rope(config, where)
        cos, sin = rope_tables(shape.head_dim, float(rope.theta), np.arange(past_len, past_len + step), rope.scaling)
        feed.update({MASK: causal_mask(step, shape.context, past_len), POS_COS: cos, POS_SIN: sin})
    for layer in span.layers:
        keys = np.zeros((1, shape.kv_heads, shape.head_dim, past), np.float32)
        values = np.zeros((1, shape.kv_heads, past, shape.head_dim), np.float32)
        keys[..., :past_len] = rng.standard_normal((1, shape.kv_heads, shape.head_dim, past_len))
        values[:, :, :past_len] = rng.standard_normal((1, shape.kv_heads, past_len, shape.head_dim))
        feed[kv_name("key", layer, "in")], feed[kv_name("value", layer, "in")] = keys, values
    return feed

