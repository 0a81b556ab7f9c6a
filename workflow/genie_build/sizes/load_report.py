"""The load model shown where people look: the per-context table and the remedies of ``memory_plan.md``, the
``load`` section of ``memory_plan.json``, and ``memory_plan.png``, each session's address space with the contexts
as bars (a failing one red)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from genie_build.plan.load_model import ASSUMPTIONS, ContextPlacement, LoadPlan
from genie_build.units import MIB

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn
    from matplotlib.figure import Figure

__all__ = ["EMBEDDING_TABLE_REMEDY", "RUNTIME_REMEDIES", "Remedy", "label_heights", "load_plan_figure",
           "load_plan_json", "load_plan_markdown", "load_plan_png"]

# a label's height in the figure, as a share of the session's address space drawn (7 pt of the axes' ~5 in is 2%)
_LABEL_GAP = 0.03


@dataclass(frozen=True)
class Remedy:
    name: str
    what: str
    source: str
    predicted: str       # whether the load model can predict its effect


EMBEDDING_TABLE_REMEDY = "bundle.embedding: lut"
RUNTIME_REMEDIES = (
    Remedy(EMBEDDING_TABLE_REMEDY,
           "the embedding as the table Genie looks tokens up in on the CPU (dialog.embedding) instead of part 1's "
           "context: one context and its mapping fewer (docs/embedding-table.md)",
           "Genie Dialog.cpp and Embedding.cpp (public copies): dialog.embedding with type lut and lut-path; "
           "qairt-dev 0.13.0's GenAIBuilder prepares such a table by default", "yes: the plan without part 1's "
           "context"),
    Remedy("bundle.share_resources: true",
           "htp_backend_ext_config.json's groupContext share_resources with Genie's allow-async-init: the contexts "
           "are created as one list with SHARE_RESOURCES (SEQUENTIAL_WITH_VA_OPTIMIZATION where the SoC supports "
           "it), \"ideal for large generative AI workloads with multiple splits\"",
           "Qualcomm QNN HTP backend manual 80-63442-10, QnnContext_createFromBinaryListAsync; quic/ai-hub-apps "
           "ChatApp htp_config/qualcomm-snapdragon-8-elite.json", "no: the VA optimization's rule is not published"),
    Remedy("context.io_memory_estimation",
           "QNN_HTP_CONTEXT_CONFIG_OPTION_IO_MEM_ESTIMATION: the backend reserves each context's IO space when it "
           "places it (sequential init, more peak RAM)", "Qualcomm QNN HTP backend manual 80-63442-10",
           "partly: it moves IO into the budget the model already charges"),
    Remedy("a shared spill-fill group",
           "Genie's spill-fill-bufsize set to the largest spillFillBufferSize qnn-context-binary-utility reports "
           "(synchronous init) registers the contexts as one group with one spill-fill buffer",
           "Qualcomm QNN HTP backend manual 80-63442-10, REGISTER_MULTI_CONTEXTS",
           "yes, once the binaries' spill-fill sizes are read: one buffer instead of one per context"),
)


def load_plan_json(load: LoadPlan) -> dict:
    return {
        "maps": load.maps,
        "params": asdict(load.params),
        "contexts": [{"part": c.part, "session": c.session, "charge_bytes": c.charge, "maps": c.maps, "reason": c.reason,
                      "buffers": [{**asdict(p.buffer), "offset": p.offset, "pages_bytes": p.size,
                                   "alignment": p.alignment} for p in c.placed]}
                     for c in load.contexts],
        "assumptions": [asdict(assumption) for assumption in ASSUMPTIONS],
    }


def load_plan_markdown(load: LoadPlan, remedies: Sequence[str] = (), *,
                       embedding_table: bool = False) -> list[str]:
    """The section of ``memory_plan.md`` on the load model: a row per context in load order, then what to do
    about a plan that does not map (the table of ``bundle.embedding: lut`` unless ``embedding_table``: the plan has
    it already), then the assumptions with their sources."""
    params = load.params
    verdict = ("every context maps" if load.maps else
               f"**{len(load.failing)} of {len(load.contexts)} contexts will not map** (parts "
               f"{', '.join(str(c.part) for c in load.failing)})")
    lines = [
        "## Load model: which contexts map",
        "",
        f"Predicted: {verdict}, in {load.sessions_used} of {params.sessions} sessions of "
        f"{params.usable_bytes / MIB:,.0f} MiB usable, placement budget {params.budget_bytes / MIB:,.0f} MiB, "
        f"alignment `{params.alignment}` ({params.source}). Drawn in [memory_plan.png](memory_plan.png).",
        "",
        "| context (part) | session | weights offset (MiB) | weights aligned size (MiB) | other mappings (MiB) | "
        "charged (MiB) | maps | why |",
        "|---:|---:|---:|---:|---:|---:|---|---|",
        *(_context_row(c) for c in load.contexts),
        "",
        "Aligned size: the shared weights in 2 MiB pages on the boundary they were placed on; other mappings: the KV "
        "cache, other IO, spill-fill and op data, each placed in the lowest hole its own boundary allows; charged: "
        "all of them in pages, what the context takes of a session's placement budget.",
    ]
    if not load.maps:
        lines += ["", "### Remedies", "", *(f"- {remedy}" for remedy in remedies),
                  *(f"- **{r.name}**: {r.what}. Source: {r.source}. Predicted by the model: {r.predicted}."
                    for r in RUNTIME_REMEDIES if not (embedding_table and r.name == EMBEDDING_TABLE_REMEDY))]
    lines += ["", "### Assumptions", "", "| assumption | mark | source |", "|---|---|---|",
              *(f"| {a.text} | {a.mark} | {a.source} |" for a in ASSUMPTIONS)]
    return lines


def _context_row(context: ContextPlacement) -> str:
    weights = context.weights
    where = ("| - | - | - " if weights is None else
             f"| {weights.offset / MIB:,.0f} | {weights.size / MIB:,.0f} on {weights.alignment / MIB:,.0f} | "
             f"{sum(p.size for p in context.placed[1:]) / MIB:,.0f} ")
    return (f"| {context.part} | {'-' if context.session is None else context.session} {where}| "
            f"{context.charge / MIB:,.0f} | {'yes' if context.maps else '**no**'} | {context.reason} |")


def load_plan_png(load: LoadPlan, variant: str) -> bytes:
    """:func:`load_plan_figure` as PNG bytes."""
    from matplotlib import pyplot as plt

    fig = load_plan_figure(load, variant)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def load_plan_figure(load: LoadPlan, variant: str) -> Figure:
    """Each session as a column of its usable address space, each context's mappings as bars at their offsets
    (grey when it maps, red when it does not), a failing context drawn where it was refused; each context's label
    beside its weights, moved up clear of the label below it where contexts are small (the demo's six fill a few MiB
    of a 3,840 MiB session)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch

    params = load.params
    columns = max(params.sessions, 1)
    fig, ax = plt.subplots(figsize=(2.2 * columns + 3, 6))
    usable = params.usable_bytes / MIB
    for session in range(columns):
        ax.bar(session, usable, width=0.6, color="none", edgecolor="black", linewidth=1)
    mapped = [context for context in load.contexts if context.maps]
    for context in mapped:
        for placed in context.placed:
            ax.bar(context.session, placed.size / MIB, bottom=placed.offset / MIB, width=0.5,
                   color="tab:blue" if placed.buffer.kind.startswith("shared") else "tab:cyan",
                   edgecolor="white", linewidth=0.5)
    for session in range(columns):
        here = sorted((c for c in mapped if c.session == session), key=lambda c: c.weights.offset)
        heights = label_heights([c.weights.offset / MIB for c in here], _LABEL_GAP * usable)
        for context, height in zip(here, heights, strict=True):
            offset = context.weights.offset / MIB
            if height > offset:   # a leader from the moved label down to its weights
                ax.plot([session + 0.25, session + 0.3], [offset, height], color="grey", linewidth=0.5)
            ax.text(session + 0.3, height, f" part {context.part}", va="bottom", fontsize=7)
    failing = load.failing
    for row, context in enumerate(failing):
        # beside the sessions: a failing context has no address; its height is what it would have taken
        ax.bar(columns + 0.2 * row, context.charge / MIB, width=0.18, color="tab:red")
        ax.text(columns + 0.2 * row, context.charge / MIB, f"{context.part}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks([*range(columns), *([columns] if failing else [])],
                  [*(f"session {s}" for s in range(columns)), *(["not mapped"] if failing else [])])
    ax.set_ylabel("address in the session (MiB)")
    ax.set_ylim(0, usable * 1.08)
    ax.set_title(f"{variant}: {len(load.contexts) - len(failing)} of {len(load.contexts)} contexts map")
    ax.legend(handles=[Patch(color="tab:blue", label="shared weights"), Patch(color="tab:cyan", label="IO, KV, spill-fill"),
                       Patch(color="tab:red", label="does not map")], loc="upper right", fontsize=7)
    fig.tight_layout()
    return fig


def label_heights(offsets: Sequence[float], gap: float) -> list[float]:
    """Where labels of ascending ``offsets`` go: each at its offset, or ``gap`` above the label below it when that
    is higher."""
    heights: list[float] = []
    for offset in offsets:
        heights.append(max(offset, heights[-1] + gap) if heights else offset)
    return heights
