"""Size accounting and the A/B size table.

One accounting record per part x variant is read back from the compiled binary (never from the request),
then the records of all variants become one tidy table: bytes per part, reduction against a baseline
variant, and a flag where a requested option shows no effect. The field report this guards against found
by hand that ``weights_packing`` passed to the CLI was silently ignored: 672.6 MB before and after.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from genie_build import conventions, fileio
from genie_build.errors import GenieBuildError
from genie_build.evaluate.evaluation_table import Quality, read_quality
from genie_build.toolchains import get_toolchain
from genie_build.toolchains.base import AppliedOptions, BinaryInfo, GraphInfo, TensorInfo
from genie_build.units import MIB

__all__ = ["AccountRecord", "GraphCount", "QUALITY_COLUMNS", "TABLE_COLUMNS", "account_binary", "account_part",
           "build_size_table", "check_part_graphs", "read_record", "size_chart_png", "size_table_from_records",
           "size_table_markdown", "write_size_table"]

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

# A packed binary less than this fraction smaller than the baseline's counts as "no effect".
NO_EFFECT_MIN_REDUCTION = 0.01

TABLE_COLUMNS = ("part", "variant", "baseline", "toolchain", "tool_version", "recipe", "bytes", "weight_bytes",
                 "graphs", "graph_bytes", "reduction_vs_baseline", "top1_agreement", "mean_kl", "perplexity", "flag")
# A variant's quality against the float model (genie_build.evaluate.evaluation_table), the same on each of its rows;
# empty where the variant was not evaluated.
QUALITY_COLUMNS = {"top1_agreement": "top1_agreement", "mean_kl": "mean_kl", "perplexity": "variant_perplexity"}
_QUALITY_ROWS = (("top-1 agreement", "top1_agreement", "{:.1%}"), ("mean KL (nats)", "mean_kl", "{:.3g}"),
                 ("perplexity", "perplexity", "{:,.2f}"))

# The fields a record file must have, and their JSON types; the others are optional.
_REQUIRED_TYPES: dict[str, type] = {"part": int, "variant": str, "toolchain": str, "bytes": int,
                                    "weight_bytes": int, "requested": dict, "applied": dict}


@dataclass(frozen=True)
class GraphCount:
    """A graph of an accounted binary: how many IO tensors it has, their bytes, and of those the KV cache
    inputs' (0 in records written before they were counted); the spill-fill and op data the binary says the graph
    needs (None: it does not say)."""

    name: str
    inputs: int
    outputs: int
    io_bytes: int = 0
    kv_bytes: int = 0
    spill_fill_bytes: int | None = None
    op_data_bytes: int | None = None


@dataclass(frozen=True)
class AccountRecord:
    """One part x variant: what its binary holds, beside what was asked for. ``account`` writes it
    (``sizes/{variant}/part_{NN_of_N}.json``, see ``docs/conventions.md``); the size table, the memory plan
    and the estimate's predictions read it. A predicted record has no binary, and ``applied`` is empty."""

    part: int                       # 1-based
    variant: str
    toolchain: str
    bytes: int                      # the binary's size on disk
    weight_bytes: int               # of its weight section as stored; 0: the toolchain cannot tell
    requested: dict[str, Any]       # the variant's options as the config gives them
    applied: AppliedOptions
    tool_version: str = ""
    binary: str | None = None
    graphs: tuple[GraphCount, ...] = ()
    io_tensors: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON record (its keys in the order ``account`` has always written them)."""
        return {"part": self.part, "variant": self.variant, "toolchain": self.toolchain,
                "tool_version": self.tool_version, "binary": self.binary, "bytes": self.bytes,
                "weight_bytes": self.weight_bytes,
                "graphs": [dataclasses.asdict(graph) for graph in self.graphs],
                "io_tensors": self.io_tensors, "requested": dict(self.requested), "applied": self.applied.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str | os.PathLike[str] = "record") -> AccountRecord:
        """Check the fields the table and the memory plan rely on and read the record.

        Raises:
            GenieBuildError: a required field is missing or of the wrong type, a size is out of range, or an
                applied option is unknown.
        """
        for key, expected in _REQUIRED_TYPES.items():
            value = data.get(key)
            # bool is an int subclass; a part or a size of True is still wrong
            if not isinstance(value, expected) or isinstance(value, bool):
                raise GenieBuildError(where, f"field {key!r} is {value!r}; expected {expected.__name__}")
        if data["part"] < 1 or data["bytes"] < 1 or data["weight_bytes"] < 0:
            raise GenieBuildError(where, f"part {data['part']}, bytes {data['bytes']}, weight_bytes "
                                         f"{data['weight_bytes']}: expected part >= 1, bytes >= 1, weight_bytes >= 0")
        return cls(part=data["part"], variant=data["variant"], toolchain=data["toolchain"], bytes=data["bytes"],
                   weight_bytes=data["weight_bytes"], requested=dict(data["requested"]),
                   applied=AppliedOptions.from_dict(data["applied"], os.fspath(where)),
                   tool_version=str(data.get("tool_version", "")), binary=data.get("binary"),
                   graphs=tuple(GraphCount(**graph) for graph in data.get("graphs", ())),
                   io_tensors=data.get("io_tensors", 0))


def account_binary(info: BinaryInfo, part: int, variant: str, requested: dict) -> AccountRecord:
    """The accounting record of one compiled part, read back by its toolchain's ``inspect``.

    Args:
        info: the binary read back by its toolchain's ``inspect``.
        part: 1-based part index.
        variant: the variant name the binary was compiled for.
        requested: the variant's options as the config gives them.
    """
    return AccountRecord(
        part=part, variant=variant, toolchain=info.toolchain, tool_version=info.tool_version, binary=info.path,
        bytes=info.file_bytes, weight_bytes=info.weight_bytes,
        graphs=tuple(_graph_count(graph) for graph in info.graphs),
        io_tensors=sum(len(graph.inputs) + len(graph.outputs) for graph in info.graphs),
        requested=dict(requested), applied=info.applied_options)


def _graph_count(graph: GraphInfo) -> GraphCount:
    """A graph's IO tensor counts and bytes (0 bytes, said in the log, when a tensor's size cannot be told: the
    memory plan then marks the graph's IO as not known)."""
    sizes = [(tensor, _tensor_bytes(tensor)) for tensor in (*graph.inputs, *graph.outputs)]
    unknown = [tensor.name for tensor, size in sizes if size is None]
    if unknown:
        log.warning("graph %s: IO tensors of unknown dtype (%s): its IO bytes are not counted", graph.name,
                    ", ".join(unknown))
        return GraphCount(graph.name, len(graph.inputs), len(graph.outputs), spill_fill_bytes=graph.spill_fill_bytes,
                          op_data_bytes=graph.op_data_bytes)
    return GraphCount(graph.name, len(graph.inputs), len(graph.outputs), io_bytes=sum(size for _, size in sizes),
                      kv_bytes=sum(size for tensor, size in sizes[:len(graph.inputs)]
                                   if conventions.KV_TENSOR.match(tensor.name)),
                      spill_fill_bytes=graph.spill_fill_bytes, op_data_bytes=graph.op_data_bytes)


def _tensor_bytes(tensor: TensorInfo) -> int | None:
    """A tensor's bytes as the binary stores it: at its quantized bitwidth where it has one; None for a dtype numpy
    does not know."""
    if tensor.quant is not None and tensor.quant.bitwidth:
        return math.prod(tensor.shape) * -(-tensor.quant.bitwidth // 8)
    import numpy as np  # here: ``account`` starts without numpy (and runs in the QAIRT SDK's Python env)

    try:
        return math.prod(tensor.shape) * np.dtype(tensor.dtype).itemsize
    except TypeError:
        return None


def account_part(toolchain: str, binary: str | os.PathLike[str], part_label: str, variant: str,
                 requested: dict[str, Any], out: str | os.PathLike[str]) -> AccountRecord:
    """The ``account`` stage: read one compiled part back through its toolchain, check that its graphs are
    the part's, and write its record to ``out``.

    Raises:
        GenieBuildError: a bad part label, a missing binary, one the toolchain cannot read, or graphs of
            another part.
    """
    try:
        part, _ = conventions.parse_part_label(part_label)
    except ValueError as exc:
        raise GenieBuildError("--part-label", str(exc)) from None
    if not os.path.isfile(binary):
        raise GenieBuildError(binary, "file not found")
    info = get_toolchain(toolchain).inspect(Path(binary))
    check_part_graphs(info, part_label)
    record = account_binary(info, part, variant, requested)
    _write_record(out, record)
    return record


def check_part_graphs(info: BinaryInfo, label: str) -> None:
    """Refuse a binary whose graphs belong to another part (a swapped or stale file).

    Raises:
        GenieBuildError: a graph name does not end in ``_{label}`` (``conventions.graph_name``).
    """
    strangers = [graph.name for graph in info.graphs if not graph.name.endswith(f"_{label}")]
    if strangers:
        raise GenieBuildError(info.path, f"graphs {strangers} do not belong to part {label}")


def _write_record(path: str | os.PathLike[str], record: AccountRecord) -> None:
    """Write one accounting record atomically."""
    fileio.write_json(path, record.to_dict())


def read_record(path: str | os.PathLike[str]) -> AccountRecord:
    """Read one accounting record (:meth:`AccountRecord.from_dict`).

    Raises:
        GenieBuildError: the file is missing, not JSON, or a field is missing or of the wrong type.
    """
    record = fileio.read_json(path)
    if not isinstance(record, dict):
        raise GenieBuildError(path, f"expected a JSON object, got {type(record).__name__}")
    return AccountRecord.from_dict(record, path)


def _no_effect_reasons(record: AccountRecord, baseline_record: AccountRecord,
                       min_reduction: float = NO_EFFECT_MIN_REDUCTION) -> list[str]:
    """Why an option ``record`` requested shows no effect in its binary (empty list: none).

    ``weights_packing`` is judged by the size against the baseline's binary for the same part (only when
    the baseline does not pack too) and by what the binary reports; ``weight_sharing_enabled``,
    ``optimization_type`` and ``vtcm_mb`` by what the binary reports (the last two per graph). An option the
    binary does not report on is judged by size alone. A binary that reports no weight fitting 4 bits
    (``packable_weights == 0``, e.g. an 8-bit embedding alone) has nothing to pack, which is no sign of an
    ignored option.
    """
    comparison = f"{record.bytes:,} bytes vs {baseline_record.bytes:,} bytes in {baseline_record.variant}"
    requested, applied = record.requested, record.applied
    reasons = []
    if requested.get("weights_packing") and applied.packable_weights != 0:
        if _reported_off(applied.weights_packing):
            reasons.append(f"weights_packing requested but the binary reports it not applied: {comparison}")
        elif (not baseline_record.requested.get("weights_packing")
              and _reduction(record.bytes, baseline_record.bytes) < min_reduction):
            reasons.append(f"weights_packing requested but no effect: {comparison}")
    if requested.get("weight_sharing_enabled"):
        if _reported_off(applied.weight_sharing_enabled):
            reasons.append("weight_sharing_enabled requested but the binary reports it not applied")
        elif applied.shared_weights == 0:
            reasons.append("weight_sharing_enabled requested but the binary shares no weight between its graphs")
    return reasons + _unapplied_graph_options(requested, applied)


def _unapplied_graph_options(requested: dict[str, Any], applied: AppliedOptions) -> list[str]:
    """The O level and VTCM size the binary reports per graph (``{graph: value}``, from the SDK's
    qnn-context-binary-utility) against the requested ones. ``vtcm_mb`` 0 asks for the device's maximum, which
    is not known here; the utility's VTCM figure is in no documented measure, so MB and bytes both count as shown."""
    reasons = []
    levels, wanted_level = applied.optimization_type, requested.get("optimization_type")
    if isinstance(levels, dict) and wanted_level is not None:
        reasons += [f"optimization_type {wanted_level} requested but the binary reports O {level} for graph {graph}"
                    for graph, level in levels.items() if level != wanted_level]
    sizes, wanted_mb = applied.vtcm_size, requested.get("vtcm_mb")
    if isinstance(sizes, dict) and wanted_mb:
        reasons += [f"vtcm_mb {wanted_mb} requested but the binary reports VTCM size {size} for graph {graph}"
                    for graph, size in sizes.items() if size not in (wanted_mb, wanted_mb * MIB)]
    return reasons


def build_size_table(records: Sequence[AccountRecord], baseline: str, *, strict: bool = False,
                     min_reduction: float = NO_EFFECT_MIN_REDUCTION,
                     quality: Mapping[str, Quality] | None = None,
                     unmapped: Mapping[str, Mapping[int, str]] | None = None) -> pd.DataFrame:
    """The tidy A/B table: one row per part and variant, baseline variant first within each part.

    Args:
        records: accounting records (:func:`read_record`), every variant covering the same parts.
        baseline: the variant the others are compared with.
        strict: raise on a flagged row instead of only logging it.
        min_reduction: a packed binary must be at least this fraction smaller than the baseline's.
        quality: evaluated variants' quality against the float model (``evaluate``'s reports).
        unmapped: variant -> part -> why the memory plan's load model predicts the part will not map.

    Returns:
        Columns :data:`TABLE_COLUMNS`; ``recipe`` is the recipe of the variant's encodings (empty: the source's);
        ``graphs`` counts the binary's graphs and ``graph_bytes`` is what it holds besides its weights (its graphs,
        with every context length's; -1 where the toolchain cannot tell the weights' bytes);
        ``reduction_vs_baseline`` is ``1 - bytes / baseline bytes``; the quality columns are the variant's
        (:data:`QUALITY_COLUMNS`, NaN where it was not evaluated); ``flag`` is empty or the reasons an option
        showed no effect and the part will not map on the device.

    Raises:
        GenieBuildError: no records, unknown baseline, a duplicate part, variants covering different
            parts, or (``strict``) a flagged row.
    """
    # Imported here: ``account`` also runs in the QAIRT SDK's Python env, which need not have pandas.
    import pandas as pd

    by_key = _index_records(records, baseline)
    variant_order = _variant_order(records, baseline)
    quality, unmapped = quality or {}, unmapped or {}
    unknown = sorted(set(quality) - set(variant_order))
    if unknown:
        raise GenieBuildError("--quality", f"reports of variants without binaries: {', '.join(unknown)}")
    rows = []
    for part, variant in sorted(by_key, key=lambda key: (key[0], variant_order.index(key[1]))):
        record, baseline_record = by_key[(part, variant)], _packing_baseline(by_key, part, variant, baseline)
        evaluated = quality.get(variant)
        rows.append({
            "part": part, "variant": variant, "baseline": baseline, "toolchain": record.toolchain,
            "tool_version": record.tool_version, "recipe": record.requested.get("recipe") or "",
            "bytes": record.bytes, "weight_bytes": record.weight_bytes, "graphs": len(record.graphs),
            "graph_bytes": record.bytes - record.weight_bytes if record.weight_bytes else -1,
            "reduction_vs_baseline": _reduction(record.bytes, by_key[(part, baseline)].bytes),
            **{column: getattr(evaluated, field) if evaluated else math.nan
               for column, field in QUALITY_COLUMNS.items()},
            "flag": "; ".join([*_no_effect_reasons(record, baseline_record, min_reduction),
                               *([f"will not map on the device (memory plan): {unmapped[variant][part]}"]
                                 if part in unmapped.get(variant, {}) else [])]),
        })
    table = pd.DataFrame(rows, columns=list(TABLE_COLUMNS)).astype(
        {"part": "int64", "bytes": "int64", "weight_bytes": "int64", "graphs": "int64", "graph_bytes": "int64",
         "reduction_vs_baseline": "float64",
         **{column: "float64" for column in QUALITY_COLUMNS}})
    _report_flags(table, by_key, strict)
    return table


def _packing_baseline(by_key: Mapping[tuple[int, str], AccountRecord], part: int, variant: str,
                      baseline: str) -> AccountRecord:
    """What a variant's ``weights_packing`` is judged against for one part: the variant of the same toolchain,
    recipe and options that does not pack, where the table has one (packing is then the only difference), else
    the baseline."""
    record = by_key[(part, variant)]
    if record.requested.get("weights_packing"):
        options = {key: value for key, value in record.requested.items() if key != "weights_packing"}
        for (other_part, other), candidate in by_key.items():
            if (other_part == part and other != variant and candidate.toolchain == record.toolchain
                    and not candidate.requested.get("weights_packing")
                    and {key: value for key, value in candidate.requested.items() if key != "weights_packing"}
                    == options):
                return candidate
    return by_key[(part, baseline)]


def _size_table_csv(table: pd.DataFrame) -> str:
    """The tidy table as CSV text (``\\n`` line ends, reductions to six decimals, quality to six significant digits:
    a KL is often below 1e-4)."""
    quality = {column: table[column].map(lambda value: "" if math.isnan(value) else f"{value:.6g}")
               for column in QUALITY_COLUMNS}
    return table.assign(**quality).to_csv(index=False, lineterminator="\n", float_format="%.6f")


def size_table_markdown(table: pd.DataFrame) -> str:
    """The table for people: parts as rows, one size column per variant, a reduction column per
    non-baseline variant, a totals row; flagged cells carry a footnote."""
    baseline = table["baseline"].iloc[0]
    variants = list(dict.fromkeys(table["variant"]))
    symbol, scale = _size_symbol(int(table["bytes"].max()))
    wide = table.pivot(index="part", columns="variant", values="bytes")
    flags = table.set_index(["part", "variant"])["flag"]
    others = [variant for variant in variants if variant != baseline]

    header = ["part", *(f"{variant} ({symbol})" for variant in variants), *(f"{v} vs {baseline}" for v in others)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    footnotes: list[str] = []
    for part in wide.index:
        cells = [str(part)]
        for variant in variants:
            cell = _format_size(int(wide.at[part, variant]), scale)
            if flags[(part, variant)]:
                footnotes.append(f"[^{len(footnotes) + 1}]: part {part}, `{variant}`: {flags[(part, variant)]}")
                cell += f" [^{len(footnotes)}]"
            cells.append(cell)
        cells += [_format_reduction(int(wide.at[part, v]), int(wide.at[part, baseline])) for v in others]
        lines.append("| " + " | ".join(cells) + " |")
    totals = wide.sum()
    lines.append("| " + " | ".join(["**total**", *(f"**{_format_size(int(totals[v]), scale)}**" for v in variants),
                                    *(f"**{_format_reduction(int(totals[v]), int(totals[baseline]))}**"
                                      for v in others)]) + " |")
    per_variant = table.drop_duplicates("variant").set_index("variant")
    padding = [""] * len(others)
    if per_variant["recipe"].astype(bool).any():
        lines.append("| " + " | ".join(["recipe", *(per_variant.at[v, "recipe"] or "source" for v in variants),
                                        *padding]) + " |")
    evaluated = per_variant["top1_agreement"].notna().any()
    if evaluated:
        for label, column, form in _QUALITY_ROWS:
            values = per_variant[column]
            lines.append("| " + " | ".join([label, *("n/a" if math.isnan(values[v]) else form.format(values[v])
                                                     for v in variants), *padding]) + " |")

    intro = [
        f"# Context binary sizes against `{baseline}`",
        "",
        f"Bytes on disk of each part's context binary, read back from the binary (1 {symbol} = {scale:,} bytes). "
        f"Reduction = 1 - size / size of the `{baseline}` binary for the same part; "
        f"a flagged cell is an option that was requested but shows no effect."
        + (" Top-1 agreement, mean KL and perplexity: each evaluated variant against the float model on held-out "
           "text (evaluation.md; evaluation.png draws size against agreement)."
           if evaluated else ""),
        "",
        "Variants: " + "; ".join(f"`{v}`: {per_variant.at[v, 'toolchain']} {per_variant.at[v, 'tool_version']}".rstrip()
                                 for v in variants) + ".",
        "",
        *_graphs_line(table, variants, symbol, scale),
    ]
    return "\n".join(intro + lines + ([""] + footnotes if footnotes else [])) + "\n"


def _graphs_line(table: pd.DataFrame, variants: Sequence[str], symbol: str, scale: int) -> list[str]:
    """What the graphs cost beside the weights (several context lengths add graphs, not weights)."""
    counts = sorted(set(table["graphs"]) - {0})
    known = table[table["graph_bytes"] >= 0]
    if not counts or known.empty:
        return []
    per_variant = known.groupby("variant")[["graph_bytes", "bytes"]].sum()
    shares = "; ".join(f"`{v}` {_format_size(int(per_variant.at[v, 'graph_bytes']), scale)} of "
                       f"{_format_size(int(per_variant.at[v, 'bytes']), scale)} {symbol}"
                       for v in variants if v in per_variant.index)
    return [f"Graphs per context binary: {', '.join(map(str, counts))}; what they take besides the weights, which "
            f"they share: {shares}.", ""]


def size_chart_png(table: pd.DataFrame) -> bytes:
    """Grouped bars per part, one colour per variant, totals in the legend; flagged bars hatched."""
    # Imported here: matplotlib takes about a second to import and only the size-table command draws.
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    baseline = table["baseline"].iloc[0]
    variants = list(dict.fromkeys(table["variant"]))
    parts = sorted(set(table["part"]))
    symbol, scale = _size_symbol(int(table["bytes"].max()))
    width = 0.8 / len(variants)

    figure = Figure(figsize=(max(6.0, 1.0 + 0.9 * len(parts) * len(variants) ** 0.5), 4.0), dpi=100)
    axes = figure.subplots()
    # legend entries built by hand: bar() would take a variant's entry from its first bar, hatched or not
    handles = []
    for index, variant in enumerate(variants):
        rows = table[table["variant"] == variant].sort_values("part")
        offsets = [parts.index(part) + (index - (len(variants) - 1) / 2) * width for part in rows["part"]]
        axes.bar(offsets, rows["bytes"] / scale, width, color=f"C{index}",
                 hatch=["//" if flag else "" for flag in rows["flag"]])
        handles.append(Patch(color=f"C{index}",
                             label=f"{variant}: total {_format_size(int(rows['bytes'].sum()), scale)} {symbol}"))
    if table["flag"].astype(bool).any():
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="flagged: no effect"))
    axes.legend(handles=handles)
    axes.set_xticks(range(len(parts)), [str(part) for part in parts])
    axes.set_xlabel("part")
    axes.set_ylabel(f"context binary size ({symbol})")
    axes.set_title(f"Context binary size per part (baseline: {baseline})")
    figure.tight_layout()
    buffer = io.BytesIO()
    # no Software/date metadata, so the same table gives the same bytes
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def write_size_table(table: pd.DataFrame, csv_path: str | os.PathLike[str], md_path: str | os.PathLike[str],
                     png_path: str | os.PathLike[str]) -> None:
    """Write the CSV, Markdown and PNG renderings of :func:`build_size_table`'s table atomically."""
    fileio.write_text(csv_path, _size_table_csv(table))
    fileio.write_text(md_path, size_table_markdown(table))
    fileio.write_bytes(png_path, size_chart_png(table))


def size_table_from_records(record_paths: Sequence[str | os.PathLike[str]], baseline: str,
                            csv_path: str | os.PathLike[str], md_path: str | os.PathLike[str],
                            png_path: str | os.PathLike[str], *, strict: bool = False,
                            quality_reports: Sequence[str | os.PathLike[str]] = (),
                            memory_plan: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """The ``size-table`` stage: the records' table (:func:`build_size_table`) in its three renderings, with the
    quality of the variants ``quality_reports`` evaluated and the parts ``memory_plan`` (``memory_plan.json``)
    predicts will not map flagged.

    Raises:
        GenieBuildError: a bad record, report or memory plan, or what :func:`build_size_table` raises (nothing is
            written then).
    """
    quality = dict(read_quality(path) for path in quality_reports)
    table = build_size_table([read_record(path) for path in record_paths], baseline, strict=strict, quality=quality,
                             unmapped=None if memory_plan is None else _unmapped_parts(memory_plan))
    write_size_table(table, csv_path, md_path, png_path)
    return table


def _unmapped_parts(path: str | os.PathLike[str]) -> dict[str, dict[int, str]]:
    """variant -> part -> reason, of the contexts a ``memory_plan.json`` predicts will not map."""
    plan = fileio.read_json(path)
    try:
        return {plan["variant"]: {context["part"]: context["reason"] for context in plan["load"]["contexts"]
                                  if not context["maps"]}}
    except (KeyError, TypeError):
        raise GenieBuildError(path, "is not a memory plan with a load section (memory-plan writes one)") from None


def _index_records(records: Sequence[AccountRecord], baseline: str) -> dict[tuple[int, str], AccountRecord]:
    if not records:
        raise GenieBuildError("--records", "no accounting records given")
    by_key: dict[tuple[int, str], AccountRecord] = {}
    for record in records:
        key = (record.part, record.variant)
        if key in by_key:
            raise GenieBuildError(record.binary or "--records",
                                  f"part {key[0]} of variant {key[1]!r} accounted twice")
        by_key[key] = record
    parts_of: dict[str, set[int]] = {}
    for part, variant in by_key:
        parts_of.setdefault(variant, set()).add(part)
    if baseline not in parts_of:
        raise GenieBuildError("baseline", f"variant {baseline!r} has no records; variants: {sorted(parts_of)}")
    for variant, parts in sorted(parts_of.items()):
        if parts != parts_of[baseline]:
            raise GenieBuildError("--records", f"variant {variant!r} has parts {sorted(parts)} but baseline "
                                               f"{baseline!r} has {sorted(parts_of[baseline])}")
    return by_key


def _variant_order(records: Sequence[AccountRecord], baseline: str) -> list[str]:
    """Baseline first, then the others in the order the records name them (the config's order)."""
    return [baseline, *(v for v in dict.fromkeys(record.variant for record in records) if v != baseline)]


def _report_flags(table: pd.DataFrame, by_key: dict[tuple[int, str], AccountRecord], strict: bool) -> None:
    flagged = table[table["flag"] != ""]
    for row in flagged.itertuples():
        log.warning("part %d, variant %s: %s", row.part, row.variant, row.flag)
    if strict and not flagged.empty:
        first = flagged.iloc[0]
        more = f" (and {len(flagged) - 1} more flagged)" if len(flagged) > 1 else ""
        raise GenieBuildError(by_key[(int(first["part"]), first["variant"])].binary or "--records",
                              f"{first['flag']}{more}")


def _reported_off(applied: bool | None) -> bool:
    """The binary says an option was not applied (None: it does not say)."""
    return applied is not None and not applied


def _reduction(size: int, baseline_size: int) -> float:
    return 1.0 - size / baseline_size


def _size_symbol(largest_bytes: int) -> tuple[str, int]:
    """MB like the field report; kB when every binary is under 1 MB (the tiny demo), so cells are not 0.0."""
    return ("MB", 1_000_000) if largest_bytes >= 1_000_000 else ("kB", 1_000)


def _format_size(size: int, scale: int) -> str:
    return f"{size / scale:,.1f}"


def _format_reduction(size: int, baseline_size: int) -> str:
    return f"{_reduction(size, baseline_size) * 100:.1f}%"
