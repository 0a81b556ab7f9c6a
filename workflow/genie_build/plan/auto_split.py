"""``split.num_parts: auto``: the fewest parts whose contexts each stay under the vendor's 3 GiB (and
``split.max_part_mb`` when set), which all map under the load model (:mod:`genie_build.plan.load_model`), and, for a
build that holds a part per job (a checkpoint's export, verification and evaluation, and each binary's compile),
whose jobs each fit the memory a job of the run may take (:class:`JobMemory`, docs/memory-plan.md).

Also the one place a split request (a count, ``auto`` or a largest part) becomes a plan, and the readers of the IO
dimensions the load model sizes a context's IO tensors by: from an HF ``config.json`` with the export's AR and CL,
or from a prompt graph loaded without its weights.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import onnx

from genie_build.bundle_layout import BundleLayout
from genie_build.chipsets import HTP_CONTEXT_BYTES, LoadParams
from genie_build.conventions import graph_keys, kv_name
from genie_build.errors import GenieBuildError
from genie_build.hf_config import ModelShape, shape_of
from genie_build.job_memory import BinaryCompile, RunMemory, part_jobs_mb
from genie_build.onnx_graph import ar_and_context_length, graph_io
from genie_build.plan.calibration_units import PieceFloat
from genie_build.plan.load_model import IoDims, estimated_contexts, place_contexts
from genie_build.plan.plan_file import PartPlan, Piece, Plan
from genie_build.plan.planners import NUM_PARTS_KEY, indivisible, plan_by_max_part_bytes, plan_by_num_parts
from genie_build.split_request import SplitRequest
from genie_build.units import GIB, MIB

__all__ = ["JobMemory", "auto_plan", "binary_compile", "io_dims_from_graph", "io_dims_from_hf_config", "part_jobs",
           "plan_request"]

log = logging.getLogger(__name__)

_CONTEXT_GIB = f"{HTP_CONTEXT_BYTES / GIB:.0f} GiB"   # the vendor's bound on a context, as the messages name it


@dataclass(frozen=True)
class JobMemory:
    """What a job of the run may take (``limit_mb``, a share of the ``given_mb`` the run is given, ``source`` saying
    whence) and the jobs holding a part (``jobs_of``: job name -> MB)."""

    limit_mb: int
    given_mb: int
    source: str
    jobs_of: Callable[[PartPlan], dict[str, int]]

    def part_mb(self, part: PartPlan) -> int:
        """The MB of the largest job holding ``part``."""
        return max(self.jobs_of(part).values())

    def bound_mb(self, plan: Plan, part: PartPlan) -> int:
        """What a job holding ``part`` may take: :attr:`limit_mb`, or, for a part no split makes smaller (one of the
        planner's blocks, :func:`genie_build.plan.planners.indivisible`), all the run is given: Snakemake runs such
        a job alone."""
        return self.given_mb if part.pieces in indivisible(plan) else self.limit_mb

    def fits(self, plan: Plan) -> bool:
        """Whether every job holding a part of ``plan`` fits its :meth:`bound_mb`."""
        return all(self.part_mb(part) <= self.bound_mb(plan, part) for part in plan.parts)

    def largest(self, plan: Plan, parts: Sequence[PartPlan] | None = None) -> tuple[PartPlan, str, int]:
        """The part (of ``parts``, by default every part of ``plan``) whose job takes the most, that job's name and
        its MB."""
        part = max(plan.parts if parts is None else parts, key=self.part_mb)
        name, mb = max(self.jobs_of(part).items(), key=lambda item: item[1])
        return part, name, mb

    def alone(self, plan: Plan) -> list[PartPlan]:
        """The parts of ``plan`` whose largest job takes more than :attr:`limit_mb` (and fits only alone)."""
        return [part for part in plan.parts if self.part_mb(part) > self.limit_mb]

    def describe_alone(self, plan: Plan) -> str:
        """What :meth:`alone` finds, as the plan's choice says it ('' when nothing)."""
        said = []
        for part in self.alone(plan):
            _, job, mb = self.largest(plan, [part])
            said.append(f"part {part.label}'s {job} ({mb:,} MB) takes more, as no split makes its part smaller: "
                        f"Snakemake runs it alone within the {self.given_mb:,} MB")
        return "".join(f"; {text}" for text in said)

    def describe(self) -> str:
        return f"the {self.limit_mb:,} MB a job may take (a third of the {self.given_mb:,} MB {self.source})"


def part_jobs(floats: Mapping[str, PieceFloat], memory: RunMemory, evaluate: bool,
              compile: BinaryCompile | None = None, embedding: str = "graph") -> JobMemory:
    """What a job of the run may take, and the jobs holding a part: its export, its verification, its evaluation
    with ``evaluate`` (:mod:`genie_build.job_memory`), and with ``compile`` the compile of its binary (parts that
    are binaries in the ``embedding`` layout), which the HTP backend's holding of every graph makes the largest at
    several context lengths; ``floats``: each piece's (:meth:`genie_build.plan.weight_inventory.ModelWeights.
    piece_floats`)."""
    layout = BundleLayout(embedding)

    def jobs_of(part: PartPlan) -> dict[str, int]:
        jobs = part_jobs_mb(sum(floats[name].total for name in part.pieces) / 1e6,
                            max(floats[name].largest for name in part.pieces) / 1e6, evaluate=evaluate)
        if compile is not None and layout.holds(part.index):
            jobs["compile"] = compile.mb(part.estimated_bytes / 1e6)
        return jobs

    return JobMemory(memory.job_limit_mb, memory.given_mb, memory.source, jobs_of)


def binary_compile(toolchains: Sequence[str], context_lengths: Sequence[int]) -> BinaryCompile | None:
    """The compile of each part's binary in a build by ``toolchains`` (none: not weighed) of a checkpoint exported at
    ``context_lengths``: a prompt and a token graph at each."""
    return BinaryCompile(tuple(sorted(set(toolchains))), len(graph_keys(context_lengths))) if toolchains else None


def io_dims_from_hf_config(path: str | os.PathLike[str] | ModelShape, activation_bits: int, ar: int,
                           context_lengths: int | Sequence[int]) -> IoDims:
    """The IO dimensions of an HF ``config.json``'s graphs as the export writes them at ``ar`` and each of
    ``context_lengths`` (one or several).

    Raises:
        GenieBuildError: the config is not one the export reads.
    """
    shape = shape_of(path)
    return IoDims(hidden=shape.hidden, kv_width=shape.kv_heads * shape.head_dim, head_dim=shape.head_dim,
                  intermediate=shape.intermediate, vocab=shape.vocab, ar=ar,
                  context_lengths=_lengths(context_lengths), activation_bytes=-(-activation_bits // 8))


def _lengths(context_lengths: int | Sequence[int]) -> tuple[int, ...]:
    """One context length or several, as the ascending tuple :class:`IoDims` holds."""
    return (context_lengths,) if isinstance(context_lengths, int) else tuple(sorted(context_lengths))


def io_dims_from_graph(model: onnx.ModelProto, activation_bits: int, where: str | os.PathLike[str],
                       other_lengths: Sequence[int] = ()) -> IoDims:
    """The IO dimensions of a prompt graph (docs/conventions.md, Graph IO): AR and CL as Genie reads them, the KV
    cache from ``past_key_0_in`` (``[1, n_kv, D, past]``), the vocabulary from ``logits``; the width from the
    embedding table (the 2-D weight with a vocabulary-sized dim) and the widest activation from the other weights.
    ``other_lengths``: the context lengths of the graphs beside it in each part's binary, whose IO each context
    maps too.

    Raises:
        GenieBuildError: Genie could not read AR and CL, or the graph has no ``logits`` output of rank 3.
    """
    dims = ar_and_context_length(model)
    io = graph_io(model)
    logits = next((spec for spec in io.outputs if spec.name == "logits" and len(spec.shape) == 3), None)
    if dims is None or logits is None or not isinstance(logits.shape[2], int):
        raise GenieBuildError(where, "the load model needs AR and CL readable by Genie and a [1, AR, vocab] logits")
    vocab = logits.shape[2]
    key = next((spec for spec in io.inputs if spec.name == kv_name("key", 0, "in")), None)
    kv_heads, head_dim = (key.shape[1], key.shape[2]) if key is not None else (0, 0)
    matrices = [tuple(tensor.dims) for tensor in model.graph.initializer if len(tensor.dims) == 2]
    hidden = next((min(dims_) for dims_ in matrices if vocab in dims_), max(map(min, matrices), default=0))
    intermediate = max((max(dims_) for dims_ in matrices if vocab not in dims_), default=hidden)
    return IoDims(hidden=hidden, kv_width=kv_heads * head_dim, head_dim=head_dim, intermediate=intermediate,
                  vocab=vocab, ar=dims[0], context_lengths=_lengths([dims[1], *other_lengths]),
                  activation_bytes=-(-activation_bits // 8))


def auto_plan(pieces: Sequence[Piece], embedding_alone: bool, dims: IoDims, load: LoadParams,
              max_part_bytes: int | None = None, embedding: str = "graph", jobs: JobMemory | None = None) -> Plan:
    """The plan with the fewest parts whose contexts (their weights as the planner weighs them, their IO at
    ``dims``) each need less than the vendor's :data:`genie_build.chipsets.HTP_CONTEXT_BYTES`, whose parts are each
    at most ``max_part_bytes``, which all map under ``load`` (the parts :class:`genie_build.bundle_layout.BundleLayout`
    makes binaries in the ``embedding`` layout, ``bundle.embedding``), and whose jobs each fit ``jobs.limit_mb`` (a part
    cut no further, all the run is given: :meth:`JobMemory.bound_mb`). The plan's ``chosen_by`` says which bound chose
    the count.

    Raises:
        GenieBuildError: no part count does (naming the counts tried and the parameters).
    """
    num_parts, most, device, mapped = 2, None, None, None
    while True:
        try:
            plan = plan_by_num_parts(pieces, num_parts, embedding_alone)
        except GenieBuildError:
            break       # past the most parts this model can be cut into
        held = BundleLayout(embedding).binaries(plan.parts)
        contexts = estimated_contexts(held, [part.estimated_bytes for part in held], dims)
        if (all(context.charge < HTP_CONTEXT_BYTES for context in contexts)
                and (max_part_bytes is None or all(part.estimated_bytes <= max_part_bytes for part in plan.parts))
                and place_contexts(contexts, load).maps):
            device, mapped = device or plan, plan
            if jobs is None or jobs.fits(plan):
                log.info("split.num_parts auto: %d parts, the fewest that map%s", num_parts,
                         "" if jobs is None else " and whose jobs fit")
                return dataclasses.replace(plan, chosen_by=_chosen_by(plan, device, jobs))
        most, num_parts = (plan, held, contexts), num_parts + 1
    if mapped is not None and jobs is not None:
        plan = mapped   # the most parts that map: a job in it takes more than it may
        part = next(part for part in plan.parts if jobs.part_mb(part) > jobs.bound_mb(plan, part))
        _, job, mb = jobs.largest(plan, [part])
        bound = (f"all {jobs.given_mb:,} MB {jobs.source}, as its part is cut no further"
                 if jobs.bound_mb(plan, part) == jobs.given_mb else jobs.describe())
        fewer = (" or fewer context lengths (export.context: the HTP backend holds every graph of a binary until it "
                 "writes it) or fewer weight bits" if job == "compile" else "")
        raise GenieBuildError(NUM_PARTS_KEY, f"auto: {device.num_parts} parts map on the device, but at every count "
                                             f"up to {most[0].num_parts} a job takes more than it may (part "
                                             f"{part.label}'s {job}, {mb:,} MB, at {plan.num_parts}: more than "
                                             f"{bound}); run with more memory (--resources mem_mb){fewer}, or give "
                                             "num_parts")
    raise _no_part_count(most, dims, load, max_part_bytes)

def _no_part_count(most: tuple[Plan, list[PartPlan], tuple] | None, dims: IoDims, load: LoadParams,
                   max_part_bytes: int | None) -> GenieBuildError:
    """Why no part count does, from the split into the most parts: a part that alone is too large (its pieces
    cannot be cut further, so no count holds them), else the parts that do not map together."""
    if most is None:
        return GenieBuildError(NUM_PARTS_KEY, "auto: this model cannot be cut into 2 parts")
    plan, held, contexts = most
    for part, context in zip(held, contexts, strict=True):
        if context.charge >= HTP_CONTEXT_BYTES:
            bound = f"over the vendor's {_CONTEXT_GIB} a context"
        elif context.charge > load.usable_bytes:
            bound = f"more than the {load.usable_bytes / MIB:,.0f} MiB of an HTP session"
        elif max_part_bytes is not None and part.estimated_bytes > max_part_bytes:
            bound = f"and weights over split.max_part_mb {max_part_bytes / MIB:,.0f} MiB"
        elif not (alone := place_contexts([context], load).contexts[0]).maps:
            bound = f"and alone {alone.reason}"
        else:
            continue
        return GenieBuildError(NUM_PARTS_KEY, f"auto: part {part.index} of the {plan.num_parts}-part split holds "
                                              f"{'+'.join(part.pieces)} alone, whose context needs "
                                              f"{context.charge / MIB:,.0f} MiB, {bound}: no part count holds it, "
                                              "and a fixed num_parts would build a part that does not map; store "
                                              "it in fewer bits (precision or quantize.recipe)")
    failing = place_contexts(contexts, load).failing
    sessions = f"{load.sessions} session{'' if load.sessions == 1 else 's'}"
    return GenieBuildError(NUM_PARTS_KEY, f"auto: no part count maps in {sessions} of "
                                          f"{load.usable_bytes / MIB:,.0f} MiB under the load model: at "
                                          f"{plan.num_parts} parts, the most this model is cut into, "
                                          f"{len(failing)} of {len(contexts)} contexts do not (parts "
                                          f"{', '.join(str(c.part) for c in failing)}); a fixed num_parts would "
                                          "build contexts that do not map; store the weights in fewer bits")


def _chosen_by(plan: Plan, device: Plan, jobs: JobMemory | None) -> str:
    """Which bound chose ``plan``'s count: the device's (``device``: the fewest parts that map is ``plan``) or the
    build box's."""
    mapped = (f"the fewest whose contexts each stay under {_CONTEXT_GIB} and all map on the device (the memory plan's "
              "load model)")
    if jobs is None:
        return f"split.num_parts auto: {plan.num_parts} parts, {mapped}"
    alone = jobs.describe_alone(plan)
    if device.num_parts == plan.num_parts:
        part, job, mb = jobs.largest(plan, [part for part in plan.parts if part not in jobs.alone(plan)] or None)
        return (f"split.num_parts auto: {plan.num_parts} parts, {mapped}; the device chose the count: their largest "
                f"job (part {part.label}'s {job}, {mb:,} MB) fits {jobs.describe()}{alone}")
    part, job, mb = jobs.largest(device)
    return (f"split.num_parts auto: {plan.num_parts} parts, the fewest that map on the device and whose jobs fit "
            f"{jobs.describe()}; the build box chose the count: {device.num_parts} parts would map, but part "
            f"{part.label}'s {job} would take {mb:,} MB{alone}")


def plan_request(pieces: Sequence[Piece], request: SplitRequest, *, dims: IoDims | None = None,
                 load: LoadParams | None = None, embedding: str = "graph", jobs: JobMemory | None = None) -> Plan:
    """The plan the split ``request`` asks for: its ``num_parts`` parts, the fewest of at most its ``max_part_bytes``
    each, or (``auto``, with ``max_part_bytes`` as an extra bound) :func:`auto_plan` under ``dims``, ``load``, the
    ``embedding`` layout and the build's ``jobs``. The one place a request becomes a plan.

    Raises:
        GenieBuildError: an infeasible request (from the planner or :func:`auto_plan`).
    """
    if request.auto:
        if dims is None or load is None:
            raise ValueError("num_parts auto needs the IO dimensions and the load parameters")
        return auto_plan(pieces, request.embedding_alone, dims, load, request.max_part_bytes, embedding, jobs)
    if request.num_parts is not None:
        return plan_by_num_parts(pieces, request.num_parts, request.embedding_alone)
    return plan_by_max_part_bytes(pieces, request.max_part_bytes, request.embedding_alone)
