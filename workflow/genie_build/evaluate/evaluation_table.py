"""What an evaluation found, beside size: a variant's :class:`Quality` against the float model (the report
``evaluate`` writes per variant), the bounds that flag it, and ``evaluation.{md,csv,png}``, which put each variant's
size beside it (genie_build.evaluate.evaluate runs the models), and a qnn-htp bundle's perplexity by Genie itself
(:class:`GenieRow`, genie_build.evaluate.genie_accuracy) beside the float model's on the tokens Genie scored."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from genie_build.errors import GenieBuildError
from genie_build.fileio import read_json, read_text, write_bytes, write_text
from genie_build.units import MIB

__all__ = ["ClippedTensor", "Clipping", "Diagnosis", "GenieRow", "MAX_TABLE_BYTES", "Quality", "QualityBounds",
           "QualityRow", "calibration_seen", "genie_row", "quality_flags", "quality_rows", "read_quality",
           "read_report", "write_quality_table"]

MAX_TABLE_BYTES = 16 * MIB


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
class ClippedTensor:
    """An activation's held-out values against its grid ``[low, high]``: the share outside it and the extremes."""

    name: str
    share: float
    low: float
    high: float
    min: float
    max: float

    @property
    def past_end(self) -> float:
        """How far the furthest value lies past the grid's nearer end, in grid widths (0: inside)."""
        return max(0.0, self.max - self.high, self.low - self.min) / max(self.high - self.low, 1e-30)

    def describe(self) -> str:
        """E.g. ``logits 0.41% outside [-10.1, 10.1], reached 12.1``."""
        reached = self.max if self.max - self.high >= self.low - self.min else self.min
        return f"{self.name} {self.share:.2%} outside [{self.low:.4g}, {self.high:.4g}], reached {reached:.4g}"


@dataclass(frozen=True)
class Clipping:
    """The share of every held-out activation value of a variant outside its grid, and the tensors that clip
    most (largest share first)."""

    share: float
    values: int
    tensors: tuple[ClippedTensor, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Clipping":
        return cls(share=data["share"], values=data["values"],
                   tensors=tuple(ClippedTensor(**tensor) for tensor in data["tensors"]))


@dataclass(frozen=True)
class Diagnosis:
    """What a variant's figures come from: its weights alone (every activation left in float) against the float
    model, how much of its KL its activation encodings add, and what its calibration saw."""

    weights_only: Quality | None      # None: not measured
    calibration: dict                 # calibrator, windows, tokens, text (as the build recorded it)

    def activation_kl_share(self, full: Quality) -> float | None:
        """The share of the variant's KL its activation encodings cost: ``1 - KL(weights only) / KL(full)``."""
        if self.weights_only is None or full.mean_kl <= 0:
            return None
        return max(0.0, 1.0 - self.weights_only.mean_kl / full.mean_kl)


@dataclass(frozen=True)
class QualityBounds:
    """``report.min_top1_agreement``, ``report.max_mean_kl`` and ``report.max_clipped_share``; None: no bound."""

    min_top1_agreement: float | None = None
    max_mean_kl: float | None = None
    max_clipped_share: float | None = None


def quality_flags(quality: Quality, bounds: QualityBounds, clipping: Clipping | None = None) -> list[str]:
    """What ``quality`` (and ``clipping``) break of ``bounds`` (empty: nothing)."""
    flags = []
    if bounds.min_top1_agreement is not None and quality.top1_agreement < bounds.min_top1_agreement:
        flags.append(f"top-1 agreement {quality.top1_agreement:.1%} < min_top1_agreement "
                     f"{bounds.min_top1_agreement:.1%}")
    if bounds.max_mean_kl is not None and quality.mean_kl > bounds.max_mean_kl:
        flags.append(f"mean KL {quality.mean_kl:.4f} > max_mean_kl {bounds.max_mean_kl}")
    if bounds.max_clipped_share is not None and clipping is not None and clipping.share > bounds.max_clipped_share:
        worst = f" (most: {clipping.tensors[0].describe()})" if clipping.tensors else ""
        flags.append(f"clipped share {clipping.share:.3%} > max_clipped_share {bounds.max_clipped_share:.3%}{worst}")
    return flags


def _quality_from(report: dict) -> Quality:
    return Quality(**{field: report[field] for field in Quality.__dataclass_fields__})


def read_quality(path: str | os.PathLike[str]) -> tuple[str, Quality]:
    """A report :func:`quality_of`'s command wrote: the variant and its quality.

    Raises:
        GenieBuildError: unreadable, or a field missing.
    """
    variant, quality, _, _ = read_report(path)
    return variant, quality


def read_report(path: str | os.PathLike[str]) -> tuple[str, Quality, Clipping | None, Diagnosis]:
    """The whole report: the variant, its quality, its clipping and its diagnosis (either absent in a report of
    the float model's comparison alone).

    Raises:
        GenieBuildError: unreadable, or a field missing.
    """
    report = read_json(path)
    try:
        clipping = Clipping.from_dict(report["clipping"]) if report.get("clipping") is not None else None
        weights_only = report.get("weights_only")
        diagnosis = Diagnosis(weights_only=None if weights_only is None else _quality_from(weights_only),
                              calibration=dict(report.get("calibration") or {}))
        return report["variant"], _quality_from(report), clipping, diagnosis
    except (KeyError, TypeError, AttributeError) as exc:
        raise GenieBuildError(path, f"not an evaluation report: {exc}") from None


@dataclass(frozen=True)
class QualityRow:
    """One evaluated variant: its binaries' total size, its quality, clipping and diagnosis, and what it breaks of
    the bounds."""

    variant: str
    size_bytes: int | None     # None: the size table has no such variant
    quality: Quality
    flags: tuple[str, ...]
    clipping: Clipping | None = None
    diagnosis: Diagnosis = Diagnosis(weights_only=None, calibration={})


def _size_totals(size_table_csv: str | os.PathLike[str]) -> dict[str, int]:
    """Each variant's binaries' total bytes in ``size_table.csv``."""
    totals: dict[str, int] = {}
    for row in csv.DictReader(read_text(size_table_csv, max_bytes=MAX_TABLE_BYTES).splitlines()):
        totals[row["variant"]] = totals.get(row["variant"], 0) + int(row["bytes"])
    return totals


@dataclass(frozen=True)
class GenieRow:
    """A bundle's perplexity by Genie (``genie-accuracy``'s report): None with why not (``skipped``), beside the
    float model's on the ``positions`` tokens Genie scored, in ``windows`` windows."""

    variant: str
    size_bytes: int | None
    perplexity: float | None
    float_perplexity: float | None
    positions: int
    windows: int
    skipped: str | None


def genie_row(path: str | os.PathLike[str], size_table_csv: str | os.PathLike[str]) -> GenieRow:
    """The report ``genie-accuracy`` wrote, beside its variant's size.

    Raises:
        GenieBuildError: unreadable, or a field missing.
    """
    report = read_json(path)
    try:
        return GenieRow(report["variant"], _size_totals(size_table_csv).get(report["variant"]), report["perplexity"],
                        report["float_perplexity"], report["positions"], report["windows"], report["skipped"])
    except (KeyError, TypeError) as exc:
        raise GenieBuildError(path, f"not a report of Genie's perplexity: {exc}") from None


def quality_rows(reports: Sequence[str | os.PathLike[str]], size_table_csv: str | os.PathLike[str],
                 bounds: QualityBounds = QualityBounds()) -> list[QualityRow]:
    """Each report beside its variant's total size in ``size_table.csv``, flagged against ``bounds``."""
    totals = _size_totals(size_table_csv)
    rows = []
    for path in reports:
        variant, quality, clipping, diagnosis = read_report(path)
        rows.append(QualityRow(variant, totals.get(variant), quality, tuple(quality_flags(quality, bounds, clipping)),
                               clipping, diagnosis))
    return rows


def write_quality_table(rows: Sequence[QualityRow], md_path: str | os.PathLike[str], csv_path: str | os.PathLike[str],
                        png_path: str | os.PathLike[str], *, strict: bool = False,
                        genie: GenieRow | None = None) -> list[str]:
    """``evaluation.{md,csv,png}``: each variant's size beside its quality, and size against agreement drawn; with
    ``genie``, a row of the bundle's perplexity by Genie. Returns the flags.

    Raises:
        GenieBuildError: with ``strict``, a flagged variant (nothing is written).
    """
    flags = [f"{row.variant}: {flag}" for row in rows for flag in row.flags]
    if strict and flags:
        raise GenieBuildError(md_path, "report.strict: " + "; ".join(flags))
    write_text(md_path, _quality_markdown(rows, genie))
    write_text(csv_path, _quality_csv(rows, genie))
    write_bytes(png_path, _quality_png(rows))
    return flags


def _megabytes(size: int | None) -> str:
    return "n/a" if size is None else f"{size / 1e6:,.1f}"


def _share(value: float | None) -> str:
    return "" if value is None else f"{value:.3%}"


def _weights_only_kl(row: QualityRow) -> str:
    weights_only = row.diagnosis.weights_only
    return "" if weights_only is None else f"{weights_only.mean_kl:.3g}"


def _activation_share(row: QualityRow) -> str:
    share = row.diagnosis.activation_kl_share(row.quality)
    return "" if share is None else f"{share:.0%}"


def calibration_seen(config: Mapping[str, Any], recipe: str | None, ar: int) -> dict[str, Any]:
    """What the calibration of a variant's encodings saw (its ``recipe``; the prompt graph's ``ar``), which the
    evaluation records in its report and the table prints (:func:`_calibration`): the chain's text and windows, the
    demo's built-in calibrator's random feeds, or the model's own encodings.

    Args:
        config: a validated config (:func:`genie_build.config.validate_config`).
    """
    # the config's schema and, for the built-in calibrator, onnxruntime: not the table's
    from genie_build.config import calibration_chain, calibration_windows, source_kind

    if calibration_chain(config):
        windows = calibration_windows(config["quantize"], ar)
        return {"calibrator": f"aimet-onnx {config['quantize']['calibrator']}", "recipe": recipe,
                "windows": windows, "tokens": windows * ar, "text": os.path.basename(config["quantize"]["corpus"])}
    if source_kind(config) == "demo":   # the built-in calibrator: seeded random feeds of each graph
        from genie_build.quantize.calibrate import DEFAULT_NUM_SAMPLES

        return {"calibrator": "builtin min-max", "windows": DEFAULT_NUM_SAMPLES, "tokens": DEFAULT_NUM_SAMPLES * ar,
                "text": "random token ids and KV caches"}
    return {"calibrator": "the model's own encodings (model.encodings)"}


def _calibration(row: QualityRow) -> str:
    """E.g. ``aimet min-max, 8 windows (256 tokens) of calibration_corpus.txt``."""
    seen = row.diagnosis.calibration
    if not seen:
        return "not recorded"
    windows = seen.get("windows")
    text = f" of {seen['text']}" if seen.get("text") else ""
    amount = "" if windows is None else f", {windows} windows ({seen.get('tokens', '?')} tokens){text}"
    return f"{seen.get('calibrator', '?')}{amount}"


def _genie_markdown(genie: GenieRow | None) -> tuple[list[str], list[str]]:
    """The Genie row of the table and the paragraph that says what it is (none without ``genie``)."""
    if genie is None:
        return [], []
    size = _megabytes(genie.size_bytes)
    if genie.perplexity is None:
        return ([f"| {genie.variant} | {size} | | | | | not computed | | | | |"],
                ["", f"Genie perplexity of the bundle ({genie.variant}): not computed, {genie.skipped}."])
    row = f"| {genie.variant} | {size} | | | | {genie.float_perplexity:,.2f} | {genie.perplexity:,.2f} | | | | |"
    text = (f"Genie perplexity: the bundle ({genie.variant}) run by Genie itself (GenieAccuracy of the onnxruntime-qnn "
            f"wheel's libGenie.so, through its twins in the HTP simulation) on {genie.positions} tokens of the "
            f"held-out text in {genie.windows} windows; its float perplexity is the float model's on the same tokens "
            "(docs/genie-run.md).")
    return [row], ["", text]


def _quality_markdown(rows: Sequence[QualityRow], genie: GenieRow | None = None) -> str:
    positions = rows[0].quality.positions if rows else 0
    lines = [f"| {row.variant} | {_megabytes(row.size_bytes)} | {row.quality.top1_agreement:.1%} | "
             f"{row.quality.mean_kl:.3g} | {row.quality.variant_perplexity:,.2f} | {row.quality.float_perplexity:,.2f} "
             f"| | {_share(row.clipping.share if row.clipping else None)} | {_weights_only_kl(row)} | "
             f"{_activation_share(row)} | {'; '.join(row.flags)} |" for row in rows]
    genie_lines, genie_text = _genie_markdown(genie)
    details = []
    for row in rows:
        weights_only = row.diagnosis.weights_only
        details += [f"- **{row.variant}**: calibrated by {_calibration(row)}."
                    + ("" if weights_only is None else
                       f" Weights alone (activations in float): top-1 agreement {weights_only.top1_agreement:.1%}, "
                       f"mean KL {weights_only.mean_kl:.3g}.")]
        if row.clipping is not None and row.clipping.tensors:
            details += [f"  - {tensor.describe()} ({tensor.past_end:.1%} of its grid past the end)"
                        for tensor in row.clipping.tensors]
    return "\n".join([
        "# Size and quality per variant", "",
        "Each variant's context binaries, run on the host one part at a time with every activation encoding applied, "
        f"against the float model on {positions} tokens of held-out text (teacher-forced). Top-1 agreement: how "
        "often both models' most likely next token is the same; KL: mean KL(float || variant) in nats per token. "
        "Size: all parts' binaries (1 MB = 1,000,000 bytes); `evaluation.png` draws size against agreement. "
        "Outside grid: the share of the held-out activation values that fall outside their encodings' grids (and "
        "are clipped); weights-only KL: the variant with every activation left in float; from activations: the "
        "share of the KL the activation encodings add.", "",
        "| variant | size (MB) | top-1 agreement | mean KL | perplexity | float perplexity | Genie perplexity "
        "| outside grid | weights-only KL | from activations | flag |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|", *lines, *genie_lines, *genie_text, "",
        "## Calibration and the tensors that clip most", "", *details, ""])


def _quality_csv(rows: Sequence[QualityRow], genie: GenieRow | None = None) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["variant", "bytes", "positions", "top1_agreement", "mean_kl", "perplexity", "float_perplexity",
                     "genie_perplexity", "clipped_share", "weights_only_top1_agreement", "weights_only_mean_kl",
                     "most_clipped", "flag"])
    for row in rows:
        quality, weights_only = row.quality, row.diagnosis.weights_only
        clipped = row.clipping.tensors if row.clipping else ()
        writer.writerow([row.variant, "" if row.size_bytes is None else row.size_bytes, quality.positions,
                         f"{quality.top1_agreement:.6f}", f"{quality.mean_kl:.6g}", f"{quality.variant_perplexity:.6g}",
                         f"{quality.float_perplexity:.6g}", "",
                         "" if row.clipping is None else f"{row.clipping.share:.6g}",
                         "" if weights_only is None else f"{weights_only.top1_agreement:.6f}",
                         "" if weights_only is None else f"{weights_only.mean_kl:.6g}",
                         "; ".join(f"{tensor.name}={tensor.share:.6g}" for tensor in clipped),
                         "; ".join(row.flags)])
    if genie is not None:
        computed = genie.perplexity is not None
        writer.writerow([genie.variant, "" if genie.size_bytes is None else genie.size_bytes,
                         genie.positions if computed else "", "", "", "",
                         f"{genie.float_perplexity:.6g}" if computed else "",
                         f"{genie.perplexity:.6g}" if computed else "", "", "", "", "", genie.skipped or ""])
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
