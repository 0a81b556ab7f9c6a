"""The verify stage of a model exported part by part: each part's graph, run in onnxruntime, against the
checkpoint's own transformers modules run in torch on the same inputs.

There is no whole graph to compare the parts with (:mod:`genie_build.verify_split` does that for a split), so the
reference is the model itself: the parts run chained on one feed as Genie feeds a step (a causal mask with cached
entries before the window, the RoPE tables of those positions, random past keys and values), and every output of
every part (the residual stream at its cut, its new KV entries, the logits) is compared with what the same
transformers modules compute from the same inputs. The modules are built and loaded one piece at a time (the
embedding, a decoder layer, the head) and each part's session is dropped before the next, so memory holds one
part, never the model. Float32 through and through; the difference allowed is :data:`TOLERANCE` of each output's
largest magnitude (measured: docs/export.md).
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from genie_build.conventions import INPUT_IDS, MASK, POS_COS, POS_SIN, causal_mask, graph_ar, kv_name, rope_tables
from genie_build.errors import GenieBuildError
from genie_build.export import GraphSpan, ExportShape, export_shape, piece_outputs
from genie_build.fileio import write_json
from genie_build.hf_checkpoint import CONFIG_NAME, read_checkpoint
from genie_build.hf_config import read_rope
from genie_build.plan_file import Plan
from genie_build.verify_split import run_graph

__all__ = ["TOLERANCE", "PartCheck", "verify_parts"]

log = logging.getLogger(__name__)
TOLERANCE = 1e-4


@dataclass(frozen=True)
class PartCheck:
    """One output of one part: the largest difference from transformers', and that output's largest value."""

    part: str
    output: str
    max_abs_diff: float
    max_abs_reference: float

    @property
    def within_tolerance(self) -> bool:
        return self.max_abs_diff <= TOLERANCE * max(self.max_abs_reference, 1.0)


def verify_parts(checkpoint_dir: str | os.PathLike[str], plan: Plan, kind: str,
                 graphs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *, context: int | None = None,
                 seed: int = 0) -> list[PartCheck]:
    """Run the ``kind`` graphs of the plan's parts (``graphs``, in part order, at context length ``context``, by
    default the plan's) chained on one Genie feed and compare every output with transformers' modules; write the
    report to ``out``.

    Raises:
        GenieBuildError: an output beyond the tolerance (naming the part's graph, the output and the difference),
            or a graph onnxruntime cannot run.
    """
    checkpoint = read_checkpoint(checkpoint_dir)
    shape = export_shape(checkpoint.config, plan.graph_ar["prompt"], context or plan.context_length,
                         checkpoint.directory / CONFIG_NAME)
    values = _step_feed(checkpoint.config, checkpoint.directory / CONFIG_NAME, shape, kind, seed)
    checks = []
    for part, graph in zip(plan.parts, graphs, strict=True):
        span = GraphSpan.of_part(part)
        inputs, _ = span.io_names()
        expected = piece_outputs(checkpoint, span, {name: values[name] for name in inputs})
        actual = run_graph(Path(graph), values)
        for name, value in expected.items():
            check = PartCheck(part.label, name, float(np.max(np.abs(actual[name] - value))),
                              float(np.max(np.abs(value))))
            checks.append(check)
            if not check.within_tolerance:
                raise GenieBuildError(graph, f"output {name!r} differs from transformers' modules by "
                                             f"{check.max_abs_diff:g} (largest value {check.max_abs_reference:g}, "
                                             f"tolerance {TOLERANCE:g} of it)")
        values.update(actual)
        log.info("part %s (%s): %d outputs within %g of transformers' modules", part.label, kind, len(expected),
                 max(c.max_abs_diff for c in checks if c.part == part.label))
    write_json(out, {"graph": kind, "reference": "transformers modules of the checkpoint, piece by piece",
                     "tolerance": TOLERANCE, "parts": [asdict(check) for check in checks]})
    return checks


def _step_feed(config: dict, where: Path, shape: ExportShape, kind: str, seed: int) -> dict[str, np.ndarray]:
    """A step as Genie feeds it, half of the cache already filled: random token ids, the causal mask and RoPE
    tables of those positions, random past keys and values (zero beyond the filled entries)."""
    ar, past = graph_ar(kind, shape.ar), shape.past(kind)
    past_len = past // 2
    rng = np.random.default_rng([seed, zlib.crc32(kind.encode())])
    rope = read_rope(config, where)
    cos, sin = rope_tables(shape.head_dim, float(rope.theta), np.arange(past_len, past_len + ar), rope.scaling)
    feed = {INPUT_IDS: rng.integers(0, config["vocab_size"], (1, ar)).astype(np.int32),
            MASK: causal_mask(ar, shape.context, past_len), POS_COS: cos, POS_SIN: sin}
    for layer in range(shape.layers):
        keys = np.zeros((1, shape.kv_heads, shape.head_dim, past), np.float32)
        values = np.zeros((1, shape.kv_heads, past, shape.head_dim), np.float32)
        keys[..., :past_len] = rng.standard_normal((1, shape.kv_heads, shape.head_dim, past_len))
        values[:, :, :past_len] = rng.standard_normal((1, shape.kv_heads, past_len, shape.head_dim))
        feed[kv_name("key", layer, "in")], feed[kv_name("value", layer, "in")] = keys, values
    return feed
