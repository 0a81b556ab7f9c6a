"""The memory each kind of job is planned with (its ``mem_mb``, so that Snakemake runs side by side only the jobs
that fit ``--resources mem_mb`` or a cluster node), from what the job holds, each measured at the 7B shape
(docs/large-models.md); and the memory a job of the run may take at most (:func:`run_memory`), which
``split.num_parts: auto`` keeps a part's jobs within (docs/memory-plan.md). The calibration chain's units are planned by
:func:`genie_build.plan.calibration_units.unit_peak_mb`, by which the chain is also cut into units."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from genie_build.onnx_graph import initializer_specs, load_graph

__all__ = ["JOB_SHARE", "BinaryCompile", "GraphWeights", "RunMemory", "compile_mb", "convert_mb", "evaluation_mb",
           "export_mb", "files_mb", "genie_mb", "graph_weights", "part_jobs_mb", "run_memory", "tokenize_mb",
           "verify_parts_mb"]

# torch, transformers and onnxruntime loaded, before any weight
_PROCESS_MB = 1000
# beside a part's float32 weights, an export holds torch's and transformers' own (1.3-1.5 GB at 7B)
_EXPORT_MB = 1600
# beside the part's weights, a verification's process, its steps' inputs and outputs (at 7B); beside 1.5 times one
# weight (its float32 and the stored copy torch widens), the rest of that piece
_VERIFY_MB, _VERIFY_PIECE_MB = 900, 450
# A job may take a third of the memory the run is given: two jobs side by side (the calibration chain's unit and a
# part's export, verification or convert, one per core of the 2-core box) and a third left to the system and the
# page cache the weights are read through
JOB_SHARE = 3


@dataclass(frozen=True)
class RunMemory:
    """The memory the run is given, and whence (``--resources mem_mb`` or the machine's)."""

    given_mb: int
    source: str

    @property
    def job_limit_mb(self) -> int:
        """What one job may take: :data:`JOB_SHARE`'s share."""
        return self.given_mb // JOB_SHARE


def run_memory(resources: Mapping[str, object]) -> RunMemory:
    """The memory a Snakemake run is given: its ``--resources mem_mb`` (``resources``: the workflow's global
    resources, name -> value), else this machine's physical memory."""
    given = resources.get("mem_mb")
    if isinstance(given, int) and given > 0:
        return RunMemory(given, "the run is given (--resources mem_mb)")
    return RunMemory(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1_000_000,
                     "of this machine (give --resources mem_mb to plan for another)")


def files_mb(paths: Iterable[str | os.PathLike[str]]) -> float:
    """MB of the files among ``paths`` that exist (a job's inputs, its data files listed beside its graphs)."""
    return sum(os.path.getsize(path) for path in paths if os.path.exists(path)) / 1e6


def export_mb(part_float_mb: float) -> int:
    """An export (``export_part``, ``export_length``): the part's float32 weights and 1.3-1.5 GB of torch and
    transformers (7B parts: 6.53 GB of weights, 7.86 GB peak; 4.05 GB, 5.53; the embedding's 2.18 GB, 3.67)."""
    return int(part_float_mb + _EXPORT_MB)


def verify_parts_mb(part_float_mb: float, largest_weight_mb: float) -> int:
    """A part's graphs against transformers' modules: the part's session, whose fused float32 weights it holds once,
    or one piece's float32 tensors beside the stored copy of the one torch widens, whichever is larger, and the
    steps' inputs and outputs (7B-shaped parts: a layer and the head, 3.11 GB of weights, 3.80 GB; the embedding,
    2.18 GB in one tensor, 3.70 GB; a layer, 0.93 GB, 1.83 GB)."""
    return int(max(part_float_mb + _VERIFY_MB, 1.5 * largest_weight_mb + _VERIFY_PIECE_MB))


def part_jobs_mb(part_float_mb: float, largest_weight_mb: float, *, evaluate: bool) -> dict[str, int]:
    """The jobs holding one part's float weights, by name: its export, its verification, and with ``evaluate`` its
    evaluation."""
    jobs = {"export": export_mb(part_float_mb), "verification": verify_parts_mb(part_float_mb, largest_weight_mb)}
    return {**jobs, "evaluation": evaluation_mb(part_float_mb)} if evaluate else jobs


@dataclass(frozen=True)
class BinaryCompile:
    """What compiles each part's binary: the toolchains of the build's variants and the graphs a binary holds (a
    prompt and a token graph at every context length)."""

    toolchains: tuple[str, ...]
    graphs: int

    def mb(self, stored_mb: float) -> int:
        """The largest compile of a part whose weights take ``stored_mb`` as the encodings store them."""
        return max((compile_mb(stored_mb, graphs=self.graphs, toolchain=toolchain) for toolchain in self.toolchains),
                   default=0)


@dataclass(frozen=True)
class GraphWeights:
    """The weights a graph declares, in MB as stored: all of them, and the largest."""

    total_mb: float
    largest_mb: float


def graph_weights(path: str | os.PathLike[str]) -> GraphWeights:
    """The weights the graph at ``path`` declares, read from its protobuf: a part's data file holds the weights of
    every graph of the part (one file for its prompt and token graphs at every length), so its size says little. None
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


def compile_mb(converted_mb: float, *, graphs: int = 1, toolchain: str = "reference") -> int:
    """A compile of ``graphs`` graphs whose converted files hold ``converted_mb``: the reference toolchain four times
    the files (1.17 GB for the 7B embedding part's 1.09 GB); the HTP backend (``qnn-htp``) holds every graph of a
    weight-shared context prepared until it writes the binary, so 1.9 GB and 3.6 times the weights per graph
    (measured at Qwen2.5-7B's width, the weights' stored bytes x graphs -> peak: a layer's 117 MB x 4 -> 3.56 GB,
    a layer and the LM head's 662 MB x 2 -> 5.75 GB, six layers' 700 MB x 8 -> 21.73 GB; two layers' 235 MB x 8 ->
    7.64 GB, the last layer and the head x 8 -> 18.47 GB)."""
    if toolchain == "qnn-htp":
        return int(1900 + 3.6 * graphs * converted_mb)
    return max(1000, int(4 * converted_mb))


def evaluation_mb(largest_part_float_mb: float) -> int:
    """An evaluation job holds one part at a time in its session, beside a window's logits (the 7B float model's
    largest part, 6.53 GB of float32 weights: 8.06 GB)."""
    return int(largest_part_float_mb + _EXPORT_MB)


def genie_mb(twins_mb: float) -> int:
    """Genie's run of a bundle (``genie_run``, ``genie_accuracy``): the job's process, and Genie's child with every
    twin of the bundle loaded at once in the HTP simulation, planned at three times the twins' bytes (the demo's
    0.7 MB of twins: 158 MB peak, the process alone; a larger bundle was not measured)."""
    return int(_PROCESS_MB + 3 * twins_mb)


def tokenize_mb(text_mb: float) -> int:
    """``tokenize_text``: the text, its ids and one chunk's encoding (0.42 GB for 20 MB of text)."""
    return int(20 * text_mb + 500)
