"""The memory each kind of job is planned with (its ``mem_mb``, so that Snakemake runs side by side only the jobs
that fit ``--resources mem_mb`` or a cluster node), from what the job holds, each measured at the 7B shape
(docs/large-models.md). The calibration chain's units are planned by
:func:`genie_build.calibration_units.predicted_peak_mb`, which also cuts the chain into units."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from genie_build.onnx_graph import initializer_specs, load_graph

__all__ = ["GraphWeights", "compile_mb", "convert_mb", "evaluation_mb", "export_mb", "files_mb", "graph_weights",
           "tokenize_mb", "verify_parts_mb"]

# torch, transformers and onnxruntime loaded, before any weight
_PROCESS_MB = 1000


def files_mb(paths: Iterable[str | os.PathLike[str]]) -> float:
    """MB of the files among ``paths`` that exist (a job's inputs, its data files listed beside its graphs)."""
    return sum(os.path.getsize(path) for path in paths if os.path.exists(path)) / 1e6


def export_mb(part_float_mb: float) -> int:
    """An export (``export_part``, ``export_length``): the part's float32 weights and about 0.8 GB of torch and
    transformers (the largest 7B part: 6.5 GB of weights, 7.86 GB peak)."""
    return int(1.25 * part_float_mb + _PROCESS_MB)


def verify_parts_mb(largest_part_float_mb: float) -> int:
    """The parts against transformers' modules: one part's session and one layer in torch (7.79 GB at 7B)."""
    return int(1.5 * largest_part_float_mb + _PROCESS_MB)


@dataclass(frozen=True)
class GraphWeights:
    """The weights a graph declares, in MB as stored: all of them, and the largest."""

    total_mb: float
    largest_mb: float


def graph_weights(path: str | os.PathLike[str]) -> GraphWeights:
    """The weights the graph at ``path`` declares, read from its protobuf: a split part's data file may hold other
    graphs' weights too (a checkpoint part's prompt and token graphs share one), so its size says little. None
    while the graph does not exist yet: Snakemake evaluates a job's resources again once its inputs exist."""
    if not os.path.exists(path):
        return GraphWeights(0.0, 0.0)
    sizes = [spec.nbytes / 1e6 for spec in initializer_specs(load_graph(path)).values()]
    return GraphWeights(sum(sizes), max(sizes, default=0.0))


def convert_mb(weights: GraphWeights, *, sdk: bool = False) -> int:
    """A convert. The reference converter reads one weight at a time and holds it beside its codes: 0.6 GB and
    1.5 times the largest weight (3.38 GB for the 7B embedding's 2.18 GB float32 table, 0.56 GB for a layer part
    whose largest weight is 0.27 GB). The SDK's converters load the whole graph: four times its weights, at least
    1 GB."""
    if sdk:
        return max(1000, int(4 * weights.total_mb))
    return int(600 + 1.5 * weights.largest_mb)


def compile_mb(converted_mb: float) -> int:
    """A compile: four times the part's converted graphs and data (1.17 GB for the 7B embedding part's 1.09 GB)."""
    return max(1000, int(4 * converted_mb))


def evaluation_mb(largest_part_float_mb: float) -> int:
    """An evaluation job holds one part at a time in its session, beside a window's logits (the 7B float model's
    largest part, 6.5 GB of float32 weights: 8.06 GB)."""
    return int(1.25 * largest_part_float_mb + _PROCESS_MB)


def tokenize_mb(text_mb: float) -> int:
    """``tokenize_text``: the text, its ids and one chunk's encoding (0.42 GB for 20 MB of text)."""
    return int(20 * text_mb + 500)
