"""What an evaluation found, beside size: a variant's :class:`Quality` against the float model (the report
``evaluate`` writes per variant), the bounds that flag it, and ``evaluation.{md,csv,png}``, which put each variant's
size beside it (genie_build.evaluate runs the models)."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from genie_build.errors import GenieBuildError
from genie_build.fileio import read_json, read_text, write_bytes, write_text

__all__ = ["MAX_TABLE_BYTES", "Quality", "QualityBounds", "QualityRow", "quality_flags", "quality_rows",
           "read_quality", "write_quality_table"]

MAX_TABLE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Quality:
    """A variant against the float model on ``positions`` tokens of held-out text."""

    positions: int
    top1_agreement: float      # share of positions where both models' most likely next token is the same
    mean_kl: float             # KL(float || variant), nats per position
    float_perplexity: float
    variant_perplexity: float

    def to_dict(self) -> dict:
        """The report's fields."""
        return asdict(self)


@dataclass(frozen=True)
class QualityBounds:
    """``report.min_top1_agreement`` and ``report.max_mean_kl``; None: no bound."""

    min_top1_agreement: float | None = None
    max_mean_kl: float | None = None


def quality_flags(quality: Quality, bounds: QualityBounds) -> list[str]:
    """What ``quality`` breaks of ``bounds`` (empty: nothing)."""
    flags = []
    if bounds.min_top1_agreement is not None and quality.top1_agreement < bounds.min_top1_agreement:
        flags.append(f"top-1 agreement {quality.top1_agreement:.1%} < min_top1_agreement "
                     f"{bounds.min_top1_agreement:.1%}")
    if bounds.max_mean_kl is not None and quality.mean_kl > bounds.max_mean_kl:
        flags.append(f"mean KL {quality.mean_kl:.4f} > max_mean_kl {bounds.max_mean_kl}")
    return flags


def read_quality(path: str | os.PathLike[str]) -> tuple[str, Quality]:
    """A report :func:`quality_of`'s command wrote: the variant and its quality.

    Raises:
        GenieBuildError: unreadable, or a field missing.
    """
    report = read_json(path)
    try:
        return report["variant"], Quality(**{field: report[field] for field in Quality.__dataclass_fields__})
    except (KeyError, TypeError) as exc:
        raise GenieBuildError(path, f"not an evaluation report: {exc}") from None


@dataclass(frozen=True)
class QualityRow:
    """One evaluated variant: its binaries' total size, its quality and what it breaks of the bounds."""

    variant: str
    size_bytes: int | None     # None: the size table has no such variant
    quality: Quality
    flags: tuple[str, ...]


def quality_rows(reports: Sequence[str | os.PathLike[str]], size_table_csv: str | os.PathLike[str],
                 bounds: QualityBounds = QualityBounds()) -> list[QualityRow]:
    """Each report beside its variant's total size in ``size_table.csv``, flagged against ``bounds``."""
    totals: dict[str, int] = {}
    for row in csv.DictReader(read_text(size_table_csv, max_bytes=MAX_TABLE_BYTES).splitlines()):
        totals[row["variant"]] = totals.get(row["variant"], 0) + int(row["bytes"])
    rows = []
    for path in reports:
        variant, quality = read_quality(path)
        rows.append(QualityRow(variant, totals.get(variant), quality, tuple(quality_flags(quality, bounds))))
    return rows


def write_quality_table(rows: Sequence[QualityRow], md_path: str | os.PathLike[str], csv_path: str | os.PathLike[str],
                        png_path: str | os.PathLike[str], *, strict: bool = False) -> list[str]:
    """``evaluation.{md,csv,png}``: each variant's size beside its quality, and size against agreement drawn.
    Returns the flags.

    Raises:
        GenieBuildError: with ``strict``, a flagged variant (nothing is written).
    """
    flags = [f"{row.variant}: {flag}" for row in rows for flag in row.flags]
    if strict and flags:
        raise GenieBuildError(md_path, "report.strict: " + "; ".join(flags))
    write_text(md_path, _quality_markdown(rows))
    write_text(csv_path, _quality_csv(rows))
    write_bytes(png_path, _quality_png(rows))
    return flags


def _megabytes(size: int | None) -> str:
    return "n/a" if size is None else f"{size / 1e6:,.1f}"


def _quality_markdown(rows: Sequence[QualityRow]) -> str:
    positions = rows[0].quality.positions if rows else 0
    lines = [f"| {row.variant} | {_megabytes(row.size_bytes)} | {row.quality.top1_agreement:.1%} | "
             f"{row.quality.mean_kl:.3g} | {row.quality.variant_perplexity:,.2f} | {row.quality.float_perplexity:,.2f} "
             f"| {'; '.join(row.flags)} |" for row in rows]
    return "\n".join([
        "# Size and quality per variant", "",
        "Each variant's context binaries, run on the host one part at a time with every activation encoding applied, "
        f"against the float model on {positions} tokens of held-out text (teacher-forced). Top-1 agreement: how "
        "often both models' most likely next token is the same; KL: mean KL(float || variant) in nats per token. "
        "Size: all parts' binaries (1 MB = 1,000,000 bytes); `evaluation.png` draws size against agreement.", "",
        "| variant | size (MB) | top-1 agreement | mean KL | perplexity | float perplexity | flag |",
        "|---|---:|---:|---:|---:|---:|---|", *lines, ""])


def _quality_csv(rows: Sequence[QualityRow]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["variant", "bytes", "positions", "top1_agreement", "mean_kl", "perplexity", "float_perplexity",
                     "flag"])
    for row in rows:
        quality = row.quality
        writer.writerow([row.variant, "" if row.size_bytes is None else row.size_bytes, quality.positions,
                         f"{quality.top1_agreement:.6f}", f"{quality.mean_kl:.6g}", f"{quality.variant_perplexity:.6g}",
                         f"{quality.float_perplexity:.6g}", "; ".join(row.flags)])
    return buffer.getvalue()


def _quality_png(rows: Sequence[QualityRow]) -> bytes:
    """Size (x) against top-1 agreement (y), a point per variant, flagged ones hollow."""
    # Imported here: matplotlib takes about a second to import and only the evaluation table draws.
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.0, 4.0), dpi=100)
    axes = figure.subplots()
    for index, row in enumerate(row for row in rows if row.size_bytes is not None):
        x, y = row.size_bytes / 1e6, 100 * row.quality.top1_agreement
        axes.scatter([x], [y], color=f"C{index}", facecolors="none" if row.flags else f"C{index}", s=60,
                     label=f"{row.variant}: KL {row.quality.mean_kl:.3g}" + (" (flagged)" if row.flags else ""))
        axes.annotate(row.variant, (x, y), textcoords="offset points", xytext=(6, 6))
    axes.set_xlabel("context binaries, all parts (MB)")
    axes.set_ylabel("top-1 agreement with the float model (%)")
    axes.set_title("Size against quality per variant")
    if rows:
        axes.legend()
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})  # the same rows give the same bytes
    return buffer.getvalue()
