"""The load model: which of a bundle's contexts the device maps, predicted before anyone copies it to a phone.

A hypothesis of a device nobody running genie-build can test here, fitted to two observations of one phone
(docs/memory-plan.md): an 11-part Qwen2.5-7B bundle mapped its first 7 contexts and failed to map the shared
weights of contexts 8, 9 and 10; a 6-part bundle of the same total mapped all. Its rules, each listed in
:data:`ASSUMPTIONS` with its source and how sure it is:

- every context maps its buffers (its shared weights as stored, its graphs' IO tensors with the KV cache at each
  graph's CL, spill-fill and op data) into one HTP session, rounded up to 2 MiB pages;
- each mapping lands at the lowest free address that is a multiple of the largest power of two not above its size
  (a 336 MiB weights buffer on a 256 MiB boundary), inside the session's usable space;
- the loader fills the sessions in load order: it stays in the current one while the context's bytes keep the
  session within its placement budget and moves on to the next otherwise, never back; a context never spans two;
- a mapping that finds no aligned hole fails, and its context is missing (the loader does not retry it elsewhere);
- a context needing more than a session's usable space can never map.

The same functions serve measured binaries (:func:`genie_build.sizes.memory_plan.measured_contexts`, from accounting
records) and the shape-only estimate (:func:`estimated_contexts`): both give :class:`ContextLoad` rows, and
:func:`place_contexts` places them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from genie_build.chipsets import ALIGNMENTS, HTP_MANUAL, LoadParams
from genie_build.conventions import KV_BYTES
from genie_build.units import MIB

if TYPE_CHECKING:  # the memory-plan command starts without the plan file's jsonschema
    from genie_build.plan.plan_file import PartPlan

__all__ = ["ASSUMPTIONS", "Assumption", "Basis", "Buffer", "ContextLoad", "ContextPlacement", "IoDims", "LoadPlan",
           "PAGE", "Placed", "alignment_of", "estimated_contexts", "page_round", "place_contexts"]

PAGE = 2 * MIB
INPUT_IDS_BYTES = 4                          # int32

Mark = Literal["documented", "measured by a third party", "inferred"]
Basis = Literal["measured", "estimated", "not known"]

_OPEN_GENIE = "TadayukiOkada/open-genie-server docs/PLATFORM_NOTES.md (SA8255P, QAIRT 2.49-2.50)"
_FIELD = ("the field report: Qwen2.5-7B on an SM8750 phone, 11 parts failed to map contexts 8-10 (\"fastrpc memory "
          "map ... length: 352321536 failed\"), 6 parts mapped all")
_GENIE_SOURCE = "Genie SDK qnn-api/QnnApi.cpp (public copy)"
_AIMET_RECIPE = "genie_build.plan.recipes: AIMET's LLM recipe, KV cache 8-bit"


@dataclass(frozen=True)
class Assumption:
    key: str
    text: str
    source: str
    mark: Mark


ASSUMPTIONS = (
    Assumption("usable", "each cDSP session has 4 GB of virtual address space of which 3.75 GB is usable",
               HTP_MANUAL, "documented"),
    Assumption("no_span", "a context binary cannot be split across sessions", HTP_MANUAL, "documented"),
    Assumption("next_session", "when a session is full the backend deserializes the context on the next one; "
               "there is no API to choose the session", HTP_MANUAL, "documented"),
    Assumption("io_same_session", "a context's IO buffers are mapped into the session it was deserialized in",
               HTP_MANUAL, "documented"),
    Assumption("under_3gb", "keep the heap of a single context binary under 3 GiB (the manual's \"3 GB\")",
               HTP_MANUAL, "documented"),
    Assumption("alignment", "each mapping is placed at a multiple of the largest power of two not above its size "
               "(a 298 MiB weights buffer on a 256 MiB boundary), so a session fragments", _OPEN_GENIE,
               "measured by a third party"),
    Assumption("budget", "contexts are assigned to sessions by a budget of about 3.4-3.5 GB charged with each "
               "context's shared weights, IO tensors, spill-fill buffers and op data", _OPEN_GENIE,
               "measured by a third party"),
    Assumption("page", "mappings are whole 2 MiB pages (the failing 352,321,536-byte mapping is 168 pages)",
               _FIELD, "inferred"),
    Assumption("no_retry", "a mapping that fails does not move its context to another session; the context is "
               "missing and charges nothing", _FIELD, "inferred"),
    Assumption("load_order", "Genie creates the contexts in the order of ctx-bins, part 1 first", _GENIE_SOURCE,
               "documented"),
    Assumption("order_in_context", "a context maps its shared weights first, then its KV cache, other IO, "
               "spill-fill and op data", _FIELD, "inferred"),
    Assumption("kv_shared", "a context's prompt and token graphs share one KV cache buffer, as long as the longer "
               "of the two; the rest of their IO is one buffer (the 6-part bundle's \"Allocated total size = "
               "162038272 across 12 buffers\": two per context)", _FIELD, "inferred"),
    Assumption("kv_bits", "the KV cache is stored 8-bit, other activations at the precision's activation bits",
               _AIMET_RECIPE, "inferred"),
    Assumption("spill_fill", "estimate: a context's spill-fill buffer is its prompt graph's largest activation "
               "(one buffer per context, as AI Hub writes spill-fill-bufsize 0); measured binaries report none",
               "qualcomm/ai-hub-models llm_helpers.py create_genie_config", "inferred"),
    Assumption("op_data", "op and sequencing data is not estimated nor read back: counted as 0", _FIELD,
               "inferred"),
)


@dataclass(frozen=True)
class Buffer:
    """One buffer a context maps: what it is, its bytes, and where that figure comes from."""

    kind: str            # "shared weights", "KV cache", "IO", "spill-fill", "op data"
    bytes: int
    basis: Basis


@dataclass(frozen=True)
class ContextLoad:
    """One context in load order and the buffers it maps."""

    part: int
    buffers: tuple[Buffer, ...]

    @property
    def charge(self) -> int:
        """What the context takes of a session's budget: its buffers in whole pages."""
        return sum(page_round(buffer.bytes) for buffer in self.buffers)


@dataclass(frozen=True)
class Placed:
    """A buffer where it was mapped: its session offset, its size in pages and the boundary it was placed on."""

    buffer: Buffer
    offset: int
    size: int
    alignment: int


@dataclass(frozen=True)
class ContextPlacement:
    part: int
    charge: int
    session: int | None               # None: refused before a session was chosen
    placed: tuple[Placed, ...]        # empty when it does not map
    maps: bool
    reason: str                       # one line

    @property
    def weights(self) -> Placed | None:
        """Its first mapping, the shared weights (None when it did not map)."""
        return self.placed[0] if self.placed else None


@dataclass(frozen=True)
class LoadPlan:
    params: LoadParams
    contexts: tuple[ContextPlacement, ...]

    @property
    def maps(self) -> bool:
        return all(context.maps for context in self.contexts)

    @property
    def failing(self) -> tuple[ContextPlacement, ...]:
        return tuple(context for context in self.contexts if not context.maps)

    @property
    def sessions_used(self) -> int:
        return len({context.session for context in self.contexts if context.maps})


@dataclass(frozen=True)
class IoDims:
    """What the estimate needs of a model to size its graphs' IO tensors."""

    hidden: int
    kv_width: int            # KV heads x head dimension
    head_dim: int
    intermediate: int
    vocab: int
    ar: int                  # the prompt graph's tokens per call
    context_lengths: tuple[int, ...]   # every length a part's graphs are compiled at, ascending
    activation_bytes: int
    kv_bytes: int = KV_BYTES

    @property
    def context_length(self) -> int:
        """The largest length: the KV cache's (Genie keeps one buffer and reshapes it for a shorter graph)."""
        return self.context_lengths[-1]


# ------------------------------------------------------------------------------------------- the rules

def page_round(size: int) -> int:
    return -(-size // PAGE) * PAGE


def alignment_of(size: int, rule: str) -> int:
    """The boundary a mapping of ``size`` bytes (in pages) is placed on: the largest power of two not above it
    (``"power_of_two"``), or a page (``"page"``)."""
    if rule not in ALIGNMENTS:
        raise ValueError(f"alignment rule {rule!r} is not one of {ALIGNMENTS}")
    if rule == "page" or size <= PAGE:
        return PAGE
    return 1 << (size.bit_length() - 1)


def _first_fit(taken: Sequence[tuple[int, int]], size: int, alignment: int, limit: int) -> int | None:
    """The lowest multiple of ``alignment`` where ``size`` bytes fit between the ``taken`` ranges below ``limit``."""
    candidate = 0
    for start, end in sorted(taken):
        offset = -(-candidate // alignment) * alignment
        if offset + size <= start:
            return offset
        candidate = max(candidate, end)
    offset = -(-candidate // alignment) * alignment
    return offset if offset + size <= limit else None


def place_contexts(contexts: Sequence[ContextLoad], params: LoadParams) -> LoadPlan:
    """Place ``contexts`` (in load order) into sessions by the rules of the module docstring."""
    taken: list[list[tuple[int, int]]] = [[] for _ in range(params.sessions)]
    charged = [0] * params.sessions
    session = 0
    placements = []
    for context in contexts:
        charge = context.charge
        if charge > params.usable_bytes:
            placements.append(ContextPlacement(
                context.part, charge, None, (), False,
                f"needs {charge / MIB:,.0f} MiB mapped, more than the {params.usable_bytes / MIB:,.0f} MiB usable in "
                f"one session; a context cannot span sessions: split it"))
            continue
        # an empty session takes any context that fits it; the budget decides when the loader moves on
        while session < params.sessions and charged[session] and charged[session] + charge > params.budget_bytes:
            session += 1
        if session == params.sessions:
            placements.append(ContextPlacement(
                context.part, charge, None, (), False,
                f"no session left: all {params.sessions} sessions' {params.budget_bytes / MIB:,.0f} MiB budgets "
                f"are spent"))
            continue
        placements.append(_map_into(context, charge, session, taken[session], params))
        if placements[-1].maps:
            charged[session] += charge
    return LoadPlan(params, tuple(placements))


def _map_into(context: ContextLoad, charge: int, session: int, taken: list[tuple[int, int]],
              params: LoadParams) -> ContextPlacement:
    """Map the context's buffers one after another into ``taken`` (kept only when all of them map)."""
    placed: list[Placed] = []
    for buffer in context.buffers:
        if buffer.bytes == 0:
            continue
        size = page_round(buffer.bytes)
        alignment = alignment_of(size, params.alignment)
        offset = _first_fit(taken + [(p.offset, p.offset + p.size) for p in placed], size, alignment,
                            params.usable_bytes)
        if offset is None:
            return ContextPlacement(
                context.part, charge, session, (), False,
                f"no {alignment / MIB:,.0f} MiB-aligned hole of {size / MIB:,.0f} MiB for its {buffer.kind} below "
                f"{params.usable_bytes / MIB:,.0f} MiB in session {session}, which its budget still admits")
        placed.append(Placed(buffer, offset, size, alignment))
    taken.extend((p.offset, p.offset + p.size) for p in placed)
    end = max(p.offset + p.size for p in placed) if placed else 0
    return ContextPlacement(context.part, charge, session, tuple(placed), True,
                            f"maps in session {session}, ending at {end / MIB:,.0f} MiB")


# ------------------------------------------------------------------------------------------- the buffers

def estimated_contexts(parts: Sequence[PartPlan], weight_bytes: Sequence[int], dims: IoDims) -> tuple[ContextLoad, ...]:
    """Each part's buffers predicted from shapes: its weights as the estimate stores them (``weight_bytes``, in
    ``parts``' order), its graphs' IO tensors at the prompt AR and at AR 1 at every context length, the KV cache at
    the largest CL (shared by all its graphs), and a spill-fill buffer of its prompt graph's largest activation."""
    contexts = []
    for part, weights in zip(parts, weight_bytes, strict=True):
        layers = sum(piece.startswith("layer_") for piece in part.pieces)
        embedding, head = "embedding" in part.pieces, "head" in part.pieces
        kv, io = 0, 0
        for cl in dims.context_lengths:
            for ar in (dims.ar, 1):  # the prompt graph, then the token graph's one token per call
                kv = max(kv, layers * 2 * dims.kv_width * (cl - ar) * dims.kv_bytes)
                io += _graph_io_bytes(ar, cl, layers, embedding, head, dims)
        widest = max(dims.hidden, dims.intermediate if layers else 0, dims.vocab if head else 0)
        contexts.append(ContextLoad(part.index, (
            Buffer("shared weights", weights, "estimated"), Buffer("KV cache", kv, "estimated"),
            Buffer("IO", io, "estimated"), Buffer("spill-fill", dims.ar * widest * dims.activation_bytes, "estimated"),
            Buffer("op data", 0, "not known"))))
    return tuple(contexts)


def _graph_io_bytes(ar: int, cl: int, layers: int, embedding: bool, head: bool, dims: IoDims) -> int:
    """A graph's IO besides the KV cache input (docs/conventions.md, Graph IO): input_ids or the residual stream
    in, the residual stream or logits out, the mask, the RoPE tables and the new KV entries of its layers."""
    act = dims.activation_bytes
    hidden_state = ar * dims.hidden * act
    total = ar * INPUT_IDS_BYTES if embedding else hidden_state
    total += ar * dims.vocab * act if head else hidden_state
    if layers:
        total += ar * cl * act + 2 * ar * (dims.head_dim // 2) * act
        total += layers * 2 * dims.kv_width * ar * dims.kv_bytes
    return total
