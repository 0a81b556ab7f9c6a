"""The load model shown where people look: the per-context table and the remedies of ``memory_plan.md``, the
``load`` section of ``memory_plan.json``, and ``memory_plan.png``, each session's address space with the contexts
as bars (a failing one red)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from genie_build.load_model import ASSUMPTIONS, ContextPlacement, LoadPlan

__all__ = ["RUNTIME_REMEDIES", "Remedy", "load_plan_json", "load_plan_markdown", "load_plan_png"]

MIB = 1024 ** 2


@dataclass(frozen=True)
class Remedy:
    name: str
    what: str
    source: str
    predicted: str       # whether the load model can predict its effect


RUNTIME_REMEDIES = (
    Remedy("embedding as a CPU table",
           "run the embedding lookup on the CPU from a table instead of a context: one context and its mapping "
           "fewer (not built by genie-build yet)",
           "Genie Dialog.cpp and Embedding.cpp (public copies): dialog.embedding with type lut and lut-path; "
           "qairt-dev 0.13.0's GenAIBuilder prepares such a table by default", "yes: rerun the plan without the "
           "embedding part"),
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


def load_plan_markdown(load: LoadPlan, remedies: Sequence[str] = ()) -> list[str]:
    """The section of ``memory_plan.md`` on the load model: a row per context in load order, then what to do
    about a plan that does not map, then the assumptions with their sources."""
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
                    for r in RUNTIME_REMEDIES)]
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
    """Each session as a column of its usable address space, each context's mappings as bars at their offsets
    (grey when it maps, red when it does not), a failing context drawn where it was refused."""
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
    for context in load.contexts:
        if context.maps:
            for placed in context.placed:
                ax.bar(context.session, placed.size / MIB, bottom=placed.offset / MIB, width=0.5,
                       color="tab:blue" if placed.buffer.kind.startswith("shared") else "tab:cyan",
                       edgecolor="white", linewidth=0.5)
            ax.text(context.session + 0.3, context.weights.offset / MIB, f" part {context.part}", va="bottom",
                    fontsize=7)
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
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()
