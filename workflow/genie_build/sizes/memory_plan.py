"""Memory plan: will one variant's context binaries fit the device? Guidance, not a guarantee.

The input is a list of (part, weight_bytes, file_bytes) sizes, measured from the compiled binaries or predicted
from shapes alone (``basis="predicted"``), and each context's buffers for the load model
(:mod:`genie_build.plan.load_model`), which predicts the session and address range every context maps to and which do
not map. The size limits come from vendor documentation; the load model is a hypothesis fitted to the field
report (an 11-part build failed to map its last contexts where a 6-part build of the same total worked).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from genie_build import fileio
from genie_build.chipsets import HTP_LOAD, HTP_MODEL_BYTES, HTP_SESSION_BYTES, LoadParams
from genie_build.errors import GenieBuildError
from genie_build.plan.load_model import Basis, Buffer, ContextLoad, LoadPlan, place_contexts
from genie_build.sizes import load_report
from genie_build.sizes.sizes import AccountRecord, read_record
from genie_build.units import MIB

__all__ = ["MemoryLimits", "MemoryPlan", "MemoryWarning", "PartSize", "measured_contexts", "memory_plan_json",
           "memory_plan_markdown", "part_sizes_from_records", "plan_measured_memory", "plan_memory",
           "write_memory_plan"]

log = logging.getLogger(__name__)


SOURCES = {
    "AIHM": "qai-hub-models v0.46.1 (https://github.com/quic/ai-hub-models), tutorials/llm/onboarding.md: "
            "the NPU \"is a 32-bit co-processor. This restricts individual compiled models to approximately "
            "1-2 GB.\"",
    "HTPDOC": "Qualcomm QNN HTP backend manual, doc 80-63442-10 "
              "(https://docs.qualcomm.com/doc/80-63442-10/topic/htp_backend.html), \"Multiple cDSP Sessions\": "
              "each session has a 4 GB virtual address space of which only 3.75 GB is usable; a single context "
              "binary cannot be split across sessions, and clients should keep the heap of a single context "
              "binary under 3 GB.",
    "FIELD": "Field report (Qwen2.5-7B on a phone): an 11-part build of a 4.7 GB model failed to map the shared "
             "weights of contexts 8-10 (\"fastrpc memory map ... failed with error: 0x1\"), while a 6-part "
             "build of the same total loaded and ran with use-mmap and weight sharing.",
}

DISCLAIMER = ("This plan is guidance, not a guarantee. Its size checks follow vendor documentation; its load model is "
              "a hypothesis of a device nobody building this could run, fitted to two observations of one phone: "
              "an 11-part Qwen2.5-7B bundle mapped its first 7 contexts and failed to map contexts 8, 9 and 10, "
              "and a 6-part bundle of the same total mapped all of them (docs/memory-plan.md).")

_BASES = ("measured", "predicted")
# Which SOURCES each check rests on.
_CHECK_SOURCES = {"context_size": ("AIHM", "HTPDOC"), "session_total": ("HTPDOC", "FIELD"),
                  "context_count": ("FIELD",), "load": ("HTPDOC", "FIELD")}


@dataclass(frozen=True)
class PartSize:
    """One part's sizes: the weight bytes the binary maps (shared weights counted once, as stored) and the
    context binary's size on disk."""

    part: int
    weight_bytes: int
    file_bytes: int


@dataclass(frozen=True)
class MemoryLimits:
    """Limits to warn against; ``max_contexts`` None means no limit on the number of contexts."""

    max_context_bytes: int = HTP_MODEL_BYTES
    max_session_bytes: int = HTP_SESSION_BYTES
    max_contexts: int | None = None


@dataclass(frozen=True)
class MemoryWarning:
    check: str              # "context_size" | "session_total" | "context_count" | "load"
    part: int | None        # the part, for a per-context check
    value: int
    limit: int
    sources: tuple[str, ...]  # keys of SOURCES
    message: str


@dataclass(frozen=True)
class MemoryPlan:
    variant: str
    basis: str                          # "measured" (from the binaries) or "predicted" (from shapes)
    parts: tuple[PartSize, ...]         # sorted by part
    limits: MemoryLimits
    warnings: tuple[MemoryWarning, ...]
    load: LoadPlan
    remedies: tuple[str, ...] = ()      # what would make a failing plan map, beside the runtime options
    cpu_table_bytes: int = 0            # bundle.embedding: lut -- the embedding table, on the CPU (0: in part 1)
    part_count: str | None = None       # split.num_parts auto: which bound chose the count

    @property
    def num_contexts(self) -> int:
        return len(self.parts)

    @property
    def total_weight_bytes(self) -> int:
        return sum(part.weight_bytes for part in self.parts)

    @property
    def total_file_bytes(self) -> int:
        return sum(part.file_bytes for part in self.parts)

    @property
    def largest_part(self) -> PartSize:
        return max(self.parts, key=lambda part: (part.file_bytes, -part.part))


def part_sizes_from_records(records: Sequence[AccountRecord], variant: str) -> tuple[PartSize, ...]:
    """The sizes of ``variant``'s parts from accounting records (``sizes.read_record``).

    Raises:
        GenieBuildError: no record belongs to ``variant``.
    """
    sizes = tuple(PartSize(part=record.part, weight_bytes=record.weight_bytes, file_bytes=record.bytes)
                  for record in records if record.variant == variant)
    if not sizes:
        variants = sorted({record.variant for record in records})
        raise GenieBuildError("--variant", f"no accounting records for variant {variant!r}; records have {variants}")
    return sizes


def measured_contexts(records: Sequence[AccountRecord]) -> tuple[ContextLoad, ...]:
    """Each accounted binary's buffers: its weight section as stored (its file size where the toolchain cannot
    tell), its graphs' IO as read back (the KV cache inputs once, the rest per graph), and where the binary says
    (a QNN binary) its spill-fill buffer (the largest graph's: one buffer per context) and every graph's op data;
    where it does not (a reference container), those count as 0 and say so."""
    contexts = []
    for record in sorted(records, key=lambda r: r.part):
        weights = (Buffer("shared weights", record.weight_bytes, "measured") if record.weight_bytes
                   else Buffer("shared weights (file size)", record.bytes, "measured"))
        io_known = any(graph.io_bytes for graph in record.graphs)
        basis: Basis = "measured" if io_known else "not known"
        spill_fill = [graph.spill_fill_bytes for graph in record.graphs if graph.spill_fill_bytes is not None]
        op_data = [graph.op_data_bytes for graph in record.graphs if graph.op_data_bytes is not None]
        contexts.append(ContextLoad(record.part, (
            weights, Buffer("KV cache", max((graph.kv_bytes for graph in record.graphs), default=0), basis),
            Buffer("IO", sum(graph.io_bytes - graph.kv_bytes for graph in record.graphs), basis),
            Buffer("spill-fill", max(spill_fill, default=0), "measured" if spill_fill else "not known"),
            Buffer("op data", sum(op_data), "measured" if op_data else "not known"))))
    return tuple(contexts)


def plan_measured_memory(record_paths: Sequence[str | os.PathLike[str]], variant: str, limits: MemoryLimits,
                         json_path: str | os.PathLike[str], md_path: str | os.PathLike[str],
                         png_path: str | os.PathLike[str], load: LoadParams = HTP_LOAD,
                         cpu_table_bytes: int = 0, part_count: str | None = None) -> MemoryPlan:
    """The ``memory-plan`` stage: ``variant``'s parts as accounted (``sizes.read_record``) against ``limits`` and
    the load model under ``load``, written by :func:`write_memory_plan`; ``cpu_table_bytes``: the embedding table the
    CPU maps instead of part 1's context (whose records are then not given); ``part_count``: which bound chose the
    part count.

    Raises:
        GenieBuildError: a bad record, no record of ``variant``, or what :func:`plan_memory` raises.
    """
    records = [read_record(path) for path in record_paths]
    plan = plan_memory(part_sizes_from_records(records, variant), variant, limits,
                       contexts=measured_contexts([record for record in records if record.variant == variant]),
                       load=load, cpu_table_bytes=cpu_table_bytes, part_count=part_count)
    write_memory_plan(plan, json_path, md_path, png_path)
    return plan


def plan_memory(sizes: Sequence[PartSize], variant: str, limits: MemoryLimits = MemoryLimits(),
                basis: str = "measured", *, contexts: Sequence[ContextLoad] | None = None, load: LoadParams = HTP_LOAD,
                remedies: Sequence[str] = (), cpu_table_bytes: int = 0, part_count: str | None = None) -> MemoryPlan:
    """Check one variant's parts against the limits and place its ``contexts`` (one per part, in load order)
    by the load model under ``load`` (``contexts`` None: each maps its weights alone, its file size where the
    weights are unknown); every warning is also logged.

    A context binary's size on disk stands for what loading it takes (weights plus the graph data it
    holds), so both the per-context and the per-session checks use file bytes; weight bytes are reported
    beside them.

    Raises:
        GenieBuildError: no parts, a part given twice, a negative size, an unknown ``basis``, or contexts that
            are not the parts'.
    """
    if basis not in _BASES:
        raise GenieBuildError("basis", f"{basis!r} is not one of {_BASES}")
    parts = tuple(sorted(sizes, key=lambda size: size.part))
    if not parts:
        raise GenieBuildError("--records", f"no part sizes for variant {variant!r}")
    for previous, current in zip(parts, parts[1:]):
        if previous.part == current.part:
            raise GenieBuildError("--records", f"part {current.part} of variant {variant!r} given twice")
    for size in parts:
        if size.weight_bytes < 0 or size.file_bytes < 0:
            raise GenieBuildError("--records", f"part {size.part} of variant {variant!r} has negative sizes {size}")
    if contexts is None:
        contexts = [ContextLoad(size.part, (Buffer("shared weights", size.weight_bytes or size.file_bytes,
                                                   "measured"),)) for size in parts]
    if sorted(context.part for context in contexts) != [size.part for size in parts]:
        raise GenieBuildError("--records", f"the load model's contexts {[c.part for c in contexts]} are not the "
                                           f"parts {[size.part for size in parts]} of variant {variant!r}")
    plan = MemoryPlan(variant=variant, basis=basis, parts=parts, limits=limits, warnings=(),
                      load=place_contexts(contexts, load), remedies=tuple(remedies), cpu_table_bytes=cpu_table_bytes,
                      part_count=part_count)
    plan = replace(plan, warnings=_check(plan))
    for warning in plan.warnings:
        log.warning("memory plan %s: %s", variant, warning.message)
    return plan


def memory_plan_json(plan: MemoryPlan) -> dict:
    """The plan as a JSON-ready dict: sizes, totals, limits with their sources, warnings, the disclaimer."""
    largest = plan.largest_part
    return {
        "variant": plan.variant,
        "basis": plan.basis,
        "guidance_only": True,
        "disclaimer": DISCLAIMER,
        "num_contexts": plan.num_contexts,
        "embedding": {"layout": "lut" if plan.cpu_table_bytes else "graph", "cpu_table_bytes": plan.cpu_table_bytes},
        "part_count": plan.part_count,
        "parts": [asdict(part) for part in plan.parts],
        "largest_part": asdict(largest),
        "total_weight_bytes": plan.total_weight_bytes,
        "total_file_bytes": plan.total_file_bytes,
        "limits": {
            "max_context_bytes": {"value": plan.limits.max_context_bytes,
                                  "sources": list(_CHECK_SOURCES["context_size"])},
            "max_session_bytes": {"value": plan.limits.max_session_bytes,
                                  "sources": list(_CHECK_SOURCES["session_total"])},
            "max_contexts": {"value": plan.limits.max_contexts, "sources": list(_CHECK_SOURCES["context_count"])},
        },
        "warnings": [asdict(warning) for warning in plan.warnings],
        "load": load_report.load_plan_json(plan.load),
        "sources": SOURCES,
    }


def memory_plan_markdown(plan: MemoryPlan) -> str:
    """The plan for people: a table per part, the checks against the limits, warnings, sources."""
    limits = plan.limits
    largest = plan.largest_part
    # one unknown part makes the total unknown too
    total_weights = _weights_mib(plan.total_weight_bytes) if all(p.weight_bytes for p in plan.parts) else "unknown"
    lines = [
        f"# Memory plan for `{plan.variant}` ({plan.num_contexts} contexts, sizes {plan.basis})",
        "",
        f"> {DISCLAIMER}",
        "",
        f"| part | mapped weights (MiB) | context binary (MiB) | share of the {_mib(limits.max_context_bytes)} MiB "
        "per-context limit |",
        "|---:|---:|---:|---:|",
        *(f"| {p.part} | {_weights_mib(p.weight_bytes)} | {_mib(p.file_bytes)} | "
          f"{100 * p.file_bytes / limits.max_context_bytes:.1f}% |" for p in plan.parts),
        f"| **total** | **{total_weights}** | **{_mib(plan.total_file_bytes)}** | |",
        "",
        _embedding_line(plan),
        "",
        *([f"**Part count**: {plan.part_count}.", ""] if plan.part_count else []),
        "Mapped weights are the weight bytes each binary holds; with weight sharing the prompt and token graphs "
        "map them once (\"unknown\": the toolchain cannot read the weight section back). "
        "1 MiB = 1,048,576 bytes.",
        "",
        "Every variant's sizes: [size_table.md](size_table.md); how far each variant's outputs are from the float "
        "model's (top-1 agreement, KL, perplexity), beside its size: [evaluation.md](evaluation.md) and "
        "[evaluation.png](evaluation.png), from `snakemake evaluate` or `evaluate.enabled`.",
        "",
        "| check | value | limit | status | source |",
        "|---|---:|---:|---|---|",
        _check_row(plan, "context_size", "largest context binary",
                   f"{_mib(largest.file_bytes)} MiB (part {largest.part})", f"{_mib(limits.max_context_bytes)} MiB"),
        _check_row(plan, "session_total", "all context binaries in one HTP session",
                   f"{_mib(plan.total_file_bytes)} MiB", f"{_mib(limits.max_session_bytes)} MiB"),
        _check_row(plan, "context_count", "number of contexts", str(plan.num_contexts),
                   "none" if limits.max_contexts is None else str(limits.max_contexts)),
        "",
        *load_report.load_plan_markdown(plan.load, plan.remedies, embedding_table=bool(plan.cpu_table_bytes)),
        "",
        "## Warnings",
        "",
        *([f"- {warning.message} [{', '.join(warning.sources)}]" for warning in plan.warnings] or ["None."]),
        "",
        "## Sources",
        "",
        *(f"- **{key}**: {text}" for key, text in SOURCES.items()),
    ]
    return "\n".join(lines) + "\n"


def write_memory_plan(plan: MemoryPlan, json_path: str | os.PathLike[str], md_path: str | os.PathLike[str],
                      png_path: str | os.PathLike[str]) -> None:
    """Write ``memory_plan.json``, ``memory_plan.md`` and ``memory_plan.png`` (the sessions drawn) atomically."""
    fileio.write_json(json_path, memory_plan_json(plan))
    fileio.write_text(md_path, memory_plan_markdown(plan))
    fileio.write_bytes(png_path, load_report.load_plan_png(plan.load, plan.variant))


def _check(plan: MemoryPlan) -> tuple[MemoryWarning, ...]:
    limits = plan.limits
    warnings = [
        MemoryWarning("context_size", size.part, size.file_bytes, limits.max_context_bytes,
                      _CHECK_SOURCES["context_size"],
                      f"part {size.part}: context binary {_mib(size.file_bytes)} MiB is over the "
                      f"{_mib(limits.max_context_bytes)} MiB per-context guidance (about 1-2 GB per compiled "
                      f"model); split the model into more parts")
        for size in plan.parts if size.file_bytes > limits.max_context_bytes
    ]
    if plan.total_file_bytes > limits.max_session_bytes:
        warnings.append(MemoryWarning(
            "session_total", None, plan.total_file_bytes, limits.max_session_bytes, _CHECK_SOURCES["session_total"],
            f"all {plan.num_contexts} context binaries together take {_mib(plan.total_file_bytes)} MiB, over the "
            f"{_mib(limits.max_session_bytes)} MiB usable in one HTP session; this relies on use-mmap paging "
            f"weights on demand, which worked for a 6-part 4.7 GB build but not for an 11-part one"))
    if limits.max_contexts is not None and plan.num_contexts > limits.max_contexts:
        warnings.append(MemoryWarning(
            "context_count", None, plan.num_contexts, limits.max_contexts, _CHECK_SOURCES["context_count"],
            f"{plan.num_contexts} contexts is over the configured maximum of {limits.max_contexts}; "
            f"fewer, larger parts may map where many small ones fail"))
    warnings.extend(MemoryWarning("load", context.part, context.charge, plan.load.params.usable_bytes,
                                  _CHECK_SOURCES["load"], f"part {context.part} will not map: {context.reason}")
                    for context in plan.load.failing)
    return tuple(warnings)


def _check_row(plan: MemoryPlan, check: str, name: str, value: str, limit: str) -> str:
    """One row of the checks table; its status comes from the warnings, so the comparison lives in _check."""
    failed = [warning for warning in plan.warnings if warning.check == check]
    status = "**over**" if failed else ("not set" if limit == "none" else "ok")
    sources = ", ".join(_CHECK_SOURCES[check])
    return f"| {name} | {value} | {limit} | {status} | {sources} |"


def _embedding_line(plan: MemoryPlan) -> str:
    if plan.cpu_table_bytes:
        return (f"The embedding is a table on the CPU (`bundle.embedding: lut`): {_mib(plan.cpu_table_bytes)} MiB "
                "the CPU maps from the bundle's file, outside the HTP sessions below; the contexts are the parts "
                "after it.")
    return "The embedding is part 1's context (`bundle.embedding: graph`), mapped into an HTP session like the others."


def _weights_mib(size: int) -> str:
    """0 weight bytes is how a toolchain says it cannot tell (the QAIRT SDK's binary utility reports none)."""
    return _mib(size) if size else "unknown"


def _mib(size: int) -> str:
    # two decimals so that the small demo model's parts do not all read 0.0
    return f"{size / MIB:,.2f}"
