"""Genie's conventions in code: what docs/conventions.md describes, in one place every stage imports.

- graph IO: the tensor names Genie feeds and reads (``input_ids``, ``attention_mask``, ``position_ids_cos``/
  ``_sin``, ``past_{key,value}_{i}_{in,out}``, ``logits``) and the HF weight and boundary names the demo and the
  estimate assume;
- part labels and graph names: the index zero-padded to the width of N so that lexicographic order is part
  order (Genie assigns graphs to splits by sorting their names; ``nsp-model.cpp``), and the unsplit graph name;
- how Genie reads AR (tokens per step) and CL (context length) from a graph (:func:`read_ar`, :func:`read_cl`,
  :func:`graph_ar_cl`; the one length it misreads, :func:`cache_length_problem`), after the Genie source shipped
  in the QAIRT SDK (``examples/Genie``):

  - ``qnn-utils.cpp`` ``Tensor``/``Dims``: Genie right-aligns a tensor's dims into four, ``[batch, height,
    width, channel]`` (padded with 1s), and folds a non-1 first dim into ``height`` when the second is 1;
    a rank above 4 keeps its dims 1..3, not its last three (:func:`genie_dims`).
  - ``nsp-graph.cpp`` ``determineGraphInputSize`` / ``determineGraphContextSize``: AR is the element count of
    ``input_ids``, else of ``inputs_embeds`` or ``attention_mask`` over their largest dim, else the last dim
    of a ``past_*key*`` output, else ``logits``' elements over its last dim, else ``(ar|AR)_?(\\d+)`` in the
    graph name; CL is ``attention_mask``'s last dim, else the last dims of a ``past_*key*`` output and its
    ``_in`` summed, else ``(cl|CL)_?(\\d+)`` in the name, else the largest number in the name above 501;

- the feeds Genie computes for a step: RoPE tables (:func:`rope_tables`) and the additive causal mask
  (:func:`causal_mask`), as numbers, not tied to any model description.

What Genie then checks of those tensors (shapes, dtypes, which inputs it feeds) is
:mod:`genie_build.genie_contract`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from genie_build.errors import GenieBuildError
from genie_build.fileio import is_json_int

__all__ = ["AR_IN_NAME", "CL_IN_NAME", "EMBEDDING_BOUNDARY", "EMBEDDING_LAYOUTS", "EMBEDDING_PIECE", "HEAD_PIECE", "EMBED_WEIGHT", "FINAL_NORM_WEIGHT", "FIRST_PART_INPUTS",
           "GENIE_RANK_LIMIT", "GRAPH_KINDS", "GenieDims", "INPUTS_EMBEDS", "INPUT_IDS", "KV_BYTES", "KV_PREFIX",
           "KV_TENSOR",
           "LM_HEAD_WEIGHT", "LOGITS", "MASK", "MASK_MIN", "PART_LABEL_PATTERN", "PART_SUFFIX", "PART_WEIGHTS_NAME",
           "POS_COS", "POS_SIN",
           "Reading", "Tensor", "UNIT_LABEL_PATTERN", "cache_length_problem", "causal_mask", "find_parts",
           "genie_dims", "graph_ar",
           "graph_ar_cl", "graph_keys", "graph_name", "key_kind", "kv_name", "layer_output", "length_graph_key",
           "parse_part_label", "part_encodings_path", "part_folder", "part_graph_path", "part_label",
           "part_weights_path", "piece_names", "read_ar", "read_cl",
           "rope_tables", "shape_text",
           "tensors_by_name", "unit_label", "unsplit_graph_name"]

if TYPE_CHECKING:
    import numpy as np

# --- graph IO ----------------------------------------------------------------------------------------------

INPUT_IDS, INPUTS_EMBEDS, MASK, LOGITS = "input_ids", "inputs_embeds", "attention_mask", "logits"
POS_COS, POS_SIN = "position_ids_cos", "position_ids_sin"
FIRST_PART_INPUTS = (INPUT_IDS, INPUTS_EMBEDS)
KV_PREFIX = "past_"
KV_BYTES = 1  # a KV cache value: 8 bits, as every recipe's KV cache encodings store it
KV_TENSOR = re.compile(r"^past_(key|value)_(\d+)_(in|out)$")
# Names Genie would take for an embedding-output input of the first split (nsp-graph.cpp, nsp-model.cpp)
EMBEDDING_OUTPUTS = ("_model_embed_tokens_Gather_Gather_output_0", "_embed_tokens_Gather_Gather_output_0")
MASK_MIN = -50.0  # additive mask value for hidden positions (AIHM's value for w4a16)


def kv_name(kind: str, layer: int, side: str) -> str:
    """``kv_name("key", 3, "in") == "past_key_3_in"``: the cache tensor of one layer (keys transposed)."""
    return f"{KV_PREFIX}{kind}_{layer}_{side}"


# HF weight names (identical in the prompt and token graphs) and the residual stream after the embedding
EMBED_WEIGHT = "model.embed_tokens.weight"
LM_HEAD_WEIGHT = "lm_head.weight"
FINAL_NORM_WEIGHT = "model.norm.weight"
EMBEDDING_BOUNDARY = "/model/embed_tokens/Gather_output_0"


def layer_output(layer: int) -> str:
    """``layer_output(3) == "/model/layers.3/Add_1_output_0"``: the residual stream after decoder layer ``layer``."""
    return f"/model/layers.{layer}/Add_1_output_0"


# --- part labels and graph names ---------------------------------------------------------------------------

# bundle.embedding: part 1, the embedding alone, as a context binary on the HTP (graph), or as the table Genie reads
# on the CPU (lut, dialog.embedding) -- then part 1 is no context of the bundle
EMBEDDING_LAYOUTS = ("graph", "lut")
GRAPH_KINDS = ("prompt", "token")
_PART_LABEL = re.compile(r"^(\d+)_of_(\d+)$")
PART_LABEL_PATTERN = r"\d+_of_\d+"
# A calibration unit's label starts with "u", so it is never read as (or globbed with) a part's.
UNIT_LABEL_PATTERN = r"u\d+_of_\d+"
PART_SUFFIX = re.compile(r"_(\d+)_of_(\d+)$")
# A part's weights, beside its graphs: one file whatever the source and however many graphs read it (ONNX refuses
# external data that is a hard link or lies outside the graph's folder, so a part's graphs share one folder).
PART_WEIGHTS_NAME = "weights.onnx.data"
_EXPECTED_PARTS = "expected part_01_of_N … part_N_of_N, all N of them"


def part_label(index: int, num_parts: int) -> str:
    """``part_label(1, 11) == "01_of_11"``; ``index`` is 1-based."""
    if not 1 <= index <= num_parts:
        raise ValueError(f"part index {index} outside 1..{num_parts}")
    width = len(str(num_parts))
    return f"{index:0{width}d}_of_{num_parts}"


EMBEDDING_PIECE, HEAD_PIECE = "embedding", "head"


def piece_names(num_layers: int) -> tuple[str, ...]:
    """The pieces of a model of ``num_layers`` decoder layers, by name, in model order: ``embedding``,
    ``layer_0`` .. ``layer_{L-1}``, ``head``; a piece's position here is its index (``Weight.pieces``)."""
    return (EMBEDDING_PIECE, *(f"layer_{layer}" for layer in range(num_layers)), HEAD_PIECE)


def unit_label(index: int, num_units: int) -> str:
    """``unit_label(3, 17) == "u03_of_17"``: the calibration chain's unit ``index`` (1-based) of ``num_units``."""
    if not 1 <= index <= num_units:
        raise ValueError(f"unit index {index} outside 1..{num_units}")
    return f"u{index:0{len(str(num_units))}d}_of_{num_units}"


def parse_part_label(label: str) -> tuple[int, int]:
    """Inverse of :func:`part_label`: ``"01_of_11" -> (1, 11)``."""
    match = _PART_LABEL.match(label)
    if not match:
        raise ValueError(f"not a part label: {label!r} (expected e.g. '01_of_11')")
    return int(match.group(1)), int(match.group(2))


def part_folder(label: str) -> str:
    """``part_folder("01_of_06") == "part_01_of_06"``: the folder holding a part's graphs (``parts/``), their
    encodings (``encodings/<source or recipe>/``) and converted graphs
    (``converted/<source or recipe>/<converter>/``)."""
    return f"part_{label}"


def part_graph_path(parts_dir: str | os.PathLike[str], label: str, graph: str) -> Path:
    """``parts_dir/part_{label}/{graph}.onnx``: one graph of a part (``graph`` a kind or a length's key), beside
    the part's other graphs."""
    return Path(parts_dir) / part_folder(label) / f"{graph}.onnx"


def part_weights_path(parts_dir: str | os.PathLike[str], label: str) -> Path:
    """``parts_dir/part_{label}/weights.onnx.data``: the one data file all of a part's graphs read, whatever the
    source (the split of whole graphs, a checkpoint's export), each weight stored once."""
    return Path(parts_dir) / part_folder(label) / PART_WEIGHTS_NAME


def part_encodings_path(encodings_dir: str | os.PathLike[str], label: str, graph: str) -> Path:
    """``encodings_dir/part_{label}/{graph}.encodings.json``: one graph's encodings of a part."""
    return Path(encodings_dir) / part_folder(label) / f"{graph}.encodings.json"


def find_parts(parts_dir: Path, graph: str) -> dict[str, Path]:
    """One graph's parts in a parts folder, label -> path, in part order: every ``part_{NN_of_N}/{graph}.onnx``.

    Raises:
        GenieBuildError: no parts, a folder name that is not a part label, or a set that is not exactly
            parts 1..N of one N.
    """
    paths = sorted(parts_dir.glob(f"part_*/{graph}.onnx"))
    if not paths:
        raise GenieBuildError(parts_dir, f"no part_*/{graph}.onnx files ({_EXPECTED_PARTS})")
    parts: dict[str, Path] = {}
    for path in paths:
        label = path.parent.name.removeprefix("part_")
        try:
            _, num_parts = parse_part_label(label)
        except ValueError as exc:
            raise GenieBuildError(path, str(exc)) from None
        parts[label] = path
    expected = [part_label(index, num_parts) for index in range(1, num_parts + 1)]
    if list(parts) != expected:
        raise GenieBuildError(parts_dir, f"{graph} parts {', '.join(parts)} are not exactly parts "
                                         f"{', '.join(expected)} ({_EXPECTED_PARTS})")
    return parts


def unsplit_graph_name(kind: str, ar: int, cl: int) -> str:
    """``unsplit_graph_name("prompt", 32, 256) == "prompt_ar32_cl256"``: the whole (unsplit) graph."""
    if kind not in GRAPH_KINDS:
        raise ValueError(f"graph kind {kind!r} is not one of {GRAPH_KINDS}")
    return f"{kind}_ar{ar}_cl{cl}"


def length_graph_key(kind: str, cl: int) -> str:
    """``length_graph_key("prompt", 512) == "prompt_cl512"``: the file key of a graph at a context length other than
    the largest, whose graphs keep the kind's own key (``prompt``, ``token``)."""
    if kind not in GRAPH_KINDS:
        raise ValueError(f"graph kind {kind!r} is not one of {GRAPH_KINDS}")
    return f"{kind}_cl{cl}"


def key_kind(key: str) -> str:
    """The kind of a graph's file key: ``prompt``, ``token``, or :func:`length_graph_key`'s ``prompt_cl512``.

    Raises:
        ValueError: a key of no kind.
    """
    kind, _, length = key.partition("_cl")
    if kind not in GRAPH_KINDS or (length and not length.isdigit()) or key.endswith("_cl"):
        raise ValueError(f"graph key {key!r} is not a kind ({', '.join(GRAPH_KINDS)}) or a kind at a context length "
                         "(e.g. prompt_cl512)")
    return kind


def graph_keys(lengths: Iterable[int]) -> list[tuple[int, str, str]]:
    """(CL, kind, key) of every graph at the context ``lengths``, the largest length first: its graphs keep the kind's
    own key, the others' are :func:`length_graph_key`'s."""
    ordered = sorted(set(lengths), reverse=True)
    return [(cl, kind, kind if cl == ordered[0] else length_graph_key(kind, cl))
            for cl in ordered for kind in GRAPH_KINDS]


def graph_name(kind: str, ar: int, cl: int, index: int, num_parts: int) -> str:
    """``graph_name("prompt", 32, 256, 1, 11) == "prompt_ar32_cl256_01_of_11"``."""
    return f"{unsplit_graph_name(kind, ar, cl)}_{part_label(index, num_parts)}"


def graph_ar(kind: str, prompt_ar: int) -> int:
    """New tokens per call of a graph: the prompt graph's AR, 1 for the token graph."""
    if kind not in GRAPH_KINDS:
        raise ValueError(f"graph kind {kind!r} is not one of {GRAPH_KINDS}")
    return prompt_ar if kind == "prompt" else 1


# --- how Genie reads AR and CL -----------------------------------------------------------------------------

# Genie's fallbacks for graphs whose tensors do not tell (nsp-graph.cpp)
AR_IN_NAME = re.compile(r"(ar|AR)_?(\d+)")
CL_IN_NAME = re.compile(r"(cl|CL)_?(\d+)")
CONTEXT_SAFE_LIMIT = 501
GENIE_RANK_LIMIT = 4


class Tensor(Protocol):
    """What the contract reads of a graph input or output (TensorSpec of an ONNX graph, TensorInfo of a
    ctx-bin's graph)."""

    name: str
    shape: tuple
    dtype: str


@dataclass(frozen=True)
class GenieDims:
    """A tensor's dims as Genie holds them (``qnn-utils.cpp`` ``Dims``)."""

    batch: int
    height: int
    width: int
    channel: int

    @property
    def elements(self) -> int:
        return self.height * self.width * self.channel  # Genie's getNumElements leaves batch out

    @property
    def largest(self) -> int:
        return max(self.height, self.width, self.channel)

    @property
    def hwc(self) -> tuple[int, int, int]:
        return (self.height, self.width, self.channel)


@dataclass(frozen=True)
class Reading:
    """AR or CL as Genie reads it, and from where (for messages); ``value`` None: Genie cannot read it."""

    value: int | None
    source: str



def genie_dims(shape: Sequence[object]) -> GenieDims | None:
    """``shape`` as Genie's ``Dims`` (batch size 1), or None when a dim is not a fixed size."""
    if not all(is_json_int(dim) for dim in shape):
        return None
    dims = [1] * max(0, GENIE_RANK_LIMIT - len(shape)) + [int(dim) for dim in shape]
    height = dims[0] if dims[0] != 1 and dims[1] == 1 else dims[1]  # "Hack to mix batch dimension"
    batch = dims[0] if dims[0] > 1 and dims[1] != 1 else 1
    return GenieDims(batch, height, dims[2], dims[3])


def read_ar(graph_name: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> Reading:
    """AR as ``determineGraphInputSize`` reads it (first source that exists wins)."""
    by_input, by_output = tensors_by_name(inputs), tensors_by_name(outputs)
    for name, per_row in ((INPUT_IDS, False), (INPUTS_EMBEDS, True), *((n, True) for n in EMBEDDING_OUTPUTS),
                          (MASK, True)):
        if name in by_input:
            dims = genie_dims(by_input[name].shape)
            if dims is None:
                return Reading(None, _described(by_input[name]))
            how = "its elements / its largest dim" if per_row else "its elements"
            return Reading(dims.elements // dims.largest if per_row else dims.elements,
                           f"{_described(by_input[name])} ({how})")
    key_out = _first_key_output(outputs)
    if key_out is not None:
        dims = genie_dims(key_out.shape)
        return Reading(dims and dims.channel, f"{_described(key_out)} (its last dim)")
    if LOGITS in by_output:
        dims = genie_dims(by_output[LOGITS].shape)
        return Reading(dims and dims.elements // dims.channel, f"{_described(by_output[LOGITS])} "
                                                               "(its elements / its last dim)")
    return _from_name(AR_IN_NAME, graph_name, "AR")


def read_cl(graph_name: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> Reading:
    """CL as ``determineGraphContextSize`` reads it (first source that exists wins)."""
    by_input = tensors_by_name(inputs)
    if MASK in by_input:
        dims = genie_dims(by_input[MASK].shape)
        return Reading(dims and dims.channel, f"{_described(by_input[MASK])} (its last dim)")
    key_out = _first_key_output(outputs)
    key_in = by_input.get(key_out.name[:key_out.name.rfind("_")] + "_in") if key_out is not None else None
    if key_out is not None and key_in is not None:
        out_dims, in_dims = genie_dims(key_out.shape), genie_dims(key_in.shape)
        value = out_dims.channel + in_dims.channel if out_dims and in_dims else None
        return Reading(value, f"{_described(key_in)} + {_described(key_out)} (their last dims)")
    named = _from_name(CL_IN_NAME, graph_name, "CL")
    if named.value is not None:
        return named
    largest = max((int(number) for number in re.findall(r"\d+", graph_name)), default=0)
    if largest > CONTEXT_SAFE_LIMIT:
        return Reading(largest, f"the largest number in graph name {graph_name!r} (above {CONTEXT_SAFE_LIMIT})")
    return Reading(None, f"no attention_mask, no past_key_*_in/_out pair and no 'cl<N>' in graph name "
                         f"{graph_name!r}")



def tensors_by_name(tensors: Iterable[Tensor]) -> dict[str, Tensor]:
    return {tensor.name: tensor for tensor in tensors}


def _first_key_output(outputs: Sequence[Tensor]) -> Tensor | None:
    """The output Genie takes for the key cache: the first, in name order, starting with the cache prefix and
    containing "key" (Genie's tensor map is ordered by name)."""
    return next((t for t in sorted(outputs, key=lambda t: t.name) if t.name.startswith(KV_PREFIX)
                 and "key" in t.name), None)


def _from_name(pattern: re.Pattern[str], graph_name: str, what: str) -> Reading:
    match = pattern.search(graph_name)
    if match:
        return Reading(int(match.group(2)), f"graph name {graph_name!r}")
    return Reading(None, f"no tensor gives it and graph name {graph_name!r} has no {what.lower()}<N>")



def _described(tensor: Tensor) -> str:
    return f"{tensor.name} {shape_text(tensor.shape)}"



def shape_text(shape: Iterable[object]) -> str:
    return "[" + ", ".join(str(dim) if dim is not None else "?" for dim in shape) + "]"


def graph_ar_cl(graph_name: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> tuple[int | None, int | None]:
    """(AR, CL) as Genie derives them (:func:`read_ar` / :func:`read_cl`): from the tensors, else from the name.
    Pass ``graph_name=""`` for what the tensors alone give."""
    return read_ar(graph_name, inputs, outputs).value, read_cl(graph_name, inputs, outputs).value


def cache_length_problem(ar: int, cl: int) -> str | None:
    """Why Genie cannot run a graph of AR ``ar`` at context length ``cl`` whose cache holds CL - AR entries, or None.

    Measured with Genie 2.51 on x86: at CL = 2 x AR (AR 8 at CL 16, AR 4 at CL 8) the graph's cache inputs (CL - AR
    entries) and outputs (AR) have one shape, Genie logs it as "Integrated KV$: True" (a graph that updates its
    cache itself), and its tokens differ from the graph's own from that graph's first chunk on; AR 4 at CL 12 and
    AR 8 at CL 32 or 64 are read as they are and give the host run's tokens.
    """
    if cl != 2 * ar:
        return None
    return (f"its cache inputs (CL - AR = {ar} entries) and outputs ({ar}) have one shape, which Genie takes for a "
            "graph that updates its cache itself, and it answers wrongly (docs/genie-run.md)")


# --- the feeds of one step ---------------------------------------------------------------------------------

def rope_tables(head_dim: int, theta: float, positions: Sequence[int] | np.ndarray,
                scaling: Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """RoPE cos/sin halves for the given positions, as HF computes them (float32 throughout).

    Args:
        scaling: the HF rope-scaling parameters (``rope_scaling`` / ``rope_parameters``) when the model scales
            its RoPE; None or rope type "default" for plain RoPE. "llama3" and "longrope" scale (what Genie's
            ``rope-scaling`` of that ``rope-type`` computes); another type is a ValueError.

    Returns:
        ``(cos, sin)``, each ``[1, 1, len(positions), head_dim / 2]`` float32.
    """
    import numpy as np  # here, not at the top: most commands read names from this module and need no numpy
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / np.power(np.float32(theta), exponents)).astype(np.float32)
    rope_type = str(scaling.get("rope_type") or scaling.get("type") or "default") if scaling else "default"
    attention_factor = None
    if rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    elif rope_type == "longrope":
        inv_freq, attention_factor = _longrope_inv_freq(head_dim, theta, exponents, scaling)
    elif rope_type != "default":
        raise ValueError(f"rope type {rope_type!r}: only default, llama3 and longrope RoPE tables are implemented")
    angles = np.asarray(positions, dtype=np.float32)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    if attention_factor is not None:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos[None, None], sin[None, None]


def _longrope_inv_freq(head_dim: int, theta: float, exponents: np.ndarray, scaling: Mapping[str, Any]
                       ) -> tuple[np.ndarray, np.float32]:
    """LongRoPE (HF ``_compute_longrope_parameters``, Genie's ``ROPE_LONGROPE``): each frequency divided by its
    ``short_factor``, the tables scaled by sqrt(1 + ln(factor) / ln(original_max_position_embeddings)). Both take
    ``short_factor`` while the context is at most ``original_max_position_embeddings``, which the checks before any
    job require of a bundle (:func:`genie_build.hf_checkpoint.check_settings`)."""
    import numpy as np  # see rope_tables
    factors = np.asarray(scaling["short_factor"], dtype=np.float32)
    if factors.shape != (head_dim // 2,):
        raise ValueError(f"short_factor has {factors.size} values; the head dim {head_dim} needs {head_dim // 2}")
    inv_freq = (np.float32(1.0) / (factors * np.power(np.float32(theta), exponents))).astype(np.float32)
    factor, original = float(scaling["factor"]), float(scaling["original_max_position_embeddings"])
    return inv_freq, np.float32(math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0)


def _llama3_inv_freq(inv_freq: np.ndarray, scaling: Mapping[str, Any]) -> np.ndarray:
    """Llama 3.1's frequency scaling (HF ``_compute_llama3_parameters``): wavelengths above the original context
    / low_freq_factor are divided by ``factor``, those below / high_freq_factor kept, and the band between
    interpolated."""
    import numpy as np  # see rope_tables
    factor, low, high = (float(scaling[key]) for key in ("factor", "low_freq_factor", "high_freq_factor"))
    original = float(scaling["original_max_position_embeddings"])
    wavelength = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelength > original / low, inv_freq / np.float32(factor), inv_freq).astype(np.float32)
    smooth = ((original / wavelength - low) / (high - low)).astype(np.float32)
    smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
    medium = ~(wavelength < original / high) & ~(wavelength > original / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def causal_mask(ar: int, context: int, past_len: int) -> np.ndarray:
    """Additive attention mask ``[1, ar, context]``: 0 where visible, :data:`MASK_MIN` elsewhere.

    Columns ``0..past-1`` (``past = context - ar``) are the cache, of which the first ``past_len`` hold
    valid entries; columns ``past..context-1`` are the new tokens, each seeing itself and earlier ones.

    Raises:
        ValueError: ``past_len`` is outside ``0..context-ar``.
    """
    import numpy as np  # see rope_tables

    past = context - ar
    if not 0 <= past_len <= past:
        raise ValueError(f"past_len {past_len} outside 0..{past}")
    mask = np.full((1, ar, context), MASK_MIN, dtype=np.float32)
    mask[:, :, :past_len] = 0.0
    new_columns = np.arange(ar)
    mask[0, :, past:][new_columns[None, :] <= new_columns[:, None]] = 0.0
    return mask
