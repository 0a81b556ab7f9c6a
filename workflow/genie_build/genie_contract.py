"""Genie's IO contract: the graph inputs and outputs Genie needs before it loads a binary model.

One module for both checks: the workflow's check of the prompt and token ONNX graphs before anything is
built (:func:`model_violations`, command ``check-contract``) and ``check-bundle``'s check of every graph of
a bundle (:func:`graph_violations`). How Genie reads AR and CL, and its view of a tensor's dims, are
conventions (:mod:`genie_build.conventions`, ``read_ar``/``read_cl``/``genie_dims``). Sources (the Genie source
shipped in the QAIRT SDK, ``examples/Genie``):

- ``nsp-model.cpp`` ``validateModel`` / ``checkShape``: ``input_ids`` (or ``inputs_embeds``) in the first
  split, ``logits`` in the last (elements = vocab or AR x vocab), ``attention_mask`` ``[1, AR, CL]``,
  ``position_ids_cos``/``_sin`` ``[1, AR, rope_dim]``, keys ``[*, kv_dim, past]`` / values
  ``[*, past, kv_dim]`` in, ``[*, kv_dim, AR]`` / ``[*, AR, kv_dim]`` out (only the new AR tokens), with
  past = CL - AR, or CL when the cache is scattered (Genie's test: key input length == the mask's CL).
  ``checkShape`` compares ``[height, width, channel]``, so a leading 1 (``[1, 1, AR, CL]``) is the same shape.
- Measured with Genie 2.51 (its log at level 4, "Integrated KV$"): a graph whose cache inputs and outputs have one
  shape, CL = 2 x AR, is taken for one that updates its cache itself, and Genie's tokens go wrong from its first
  chunk on (:func:`genie_build.conventions.cache_length_problem`).
- Dtypes (ONNX graphs, before quantization): Genie writes token ids as integers and the mask, RoPE tables
  and cache as floats or their quantized codes (``nsp-model.cpp`` attention-mask fill: 0 / -1000 for a
  float mask), so a 0/1 integer mask as Hugging Face exports it is not what Genie feeds.

Genie-build's bundles use RoPE (``pos-id-dim``/``positional-encoding``), so ``position_ids_cos``/``_sin`` are
required and Genie feeds no other position input.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from genie_build.conventions import (FIRST_PART_INPUTS, GENIE_RANK_LIMIT, INPUT_IDS, INPUTS_EMBEDS, KV_TENSOR,
                                     LOGITS, MASK, POS_COS, POS_SIN, GenieDims, Tensor, cache_length_problem,
                                     genie_dims, read_ar, read_cl, shape_text, tensors_by_name)
from genie_build.errors import GenieBuildError

__all__ = ["FED_INPUTS", "Violation", "check_contract", "graph_violations", "model_violations"]

log = logging.getLogger(__name__)

# a tensor that looks like a cache entry under another naming (present_key_3, past_key_values.3.key, ...)
_KV_LIKE = re.compile(r"(past|present|cache|kv)", re.IGNORECASE)
_KEY_OR_VALUE = re.compile(r"(key|value)", re.IGNORECASE)
TOKEN_DTYPES = ("int32", "int64", "uint32")
FLOAT_DTYPES = ("float32", "float16")
FED_INPUTS = (INPUT_IDS, INPUTS_EMBEDS, MASK, POS_COS, POS_SIN)
BUNDLE_OFF_HINT = ("to build the binaries, the size table and the memory plan of this export without a bundle, "
                   "set bundle.enabled: false")


@dataclass(frozen=True)
class Violation:
    """One tensor (or graph) that breaks the contract: what it is, and what Genie needs instead."""

    graph: str
    tensor: str
    found: str
    needed: str

    def __str__(self) -> str:
        return f"{self.graph}: {self.tensor} {self.found}; Genie needs {self.needed}"


def graph_violations(graph: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor], *, ar: int | None,
                     cl: int | None, whole: bool, check_dtypes: bool) -> list[Violation]:
    """Every contract violation of one graph; the shape rules need its AR and CL (skipped when one is None).

    Args:
        graph: the graph's name in messages.
        whole: the graph is the whole model (first and last split at once): then every contract tensor must be
            there and Genie must feed every input; a split part is checked only on the tensors it has.
        check_dtypes: check dtypes (ONNX graphs; a ctx-bin's dtypes are quantized types).
    """
    by_input, by_output = tensors_by_name(inputs), tensors_by_name(outputs)
    found = [*_unreadable(graph, (*inputs, *outputs))]
    if whole:
        found += _missing(graph, by_input, by_output)
    if ar is not None and cl is not None:
        found += _check_mask(graph, by_input.get(MASK), ar, cl)
        found += _check_rope(graph, by_input.get(POS_COS), by_input.get(POS_SIN), ar)
        found += _check_logits(graph, by_output.get(LOGITS), ar)
        found += _check_kv(graph, inputs, outputs, ar=ar, cl=cl, whole=whole)
    if check_dtypes:
        found += _check_dtypes(graph, (*inputs, *outputs))
    return found


def model_violations(graphs: dict[str, tuple[Sequence[Tensor], Sequence[Tensor]]], *,
                     expected: dict[str, tuple[int, int]] | None = None,
                     context_size: int | None = None) -> tuple[dict[str, tuple[int | None, int | None]],
                                                               list[Violation]]:
    """The prompt and token graphs (whole, unsplit) against the contract.

    Args:
        graphs: ``{"prompt": (inputs, outputs), "token": (inputs, outputs)}``.
        expected: (AR, CL) the config gives each graph (the demo's), checked against Genie's reading.
        context_size: the config's Genie context size (``bundle.context_size``), at most the CL.

    Returns:
        (AR, CL) of each graph as Genie reads it, and every violation.
    """
    dims, found = {}, []
    for kind, (inputs, outputs) in graphs.items():
        ar, cl = read_ar("", inputs, outputs), read_cl("", inputs, outputs)
        dims[kind] = (ar.value, cl.value)
        for what, reading in (("AR", ar), ("CL", cl)):
            if reading.value is None:
                found.append(Violation(kind, "graph", f"gives Genie no {what} ({reading.source})",
                                       "static input_ids [1, AR] and attention_mask [1, AR, CL]"))
        found += graph_violations(kind, inputs, outputs, ar=ar.value, cl=cl.value, whole=True, check_dtypes=True)
    found += _check_pair(dims, expected or {}, context_size)
    return dims, found


def check_contract(prompt: str | Sequence[str], token: str | Sequence[str], out: str | os.PathLike[str], *,
                   expect_ar: int | None = None, expect_context: int | None = None, context_size: int | None = None,
                   report_only: bool = False, tokenizer: str | None = None, hf_config: str | None = None) -> None:
    """The ``check-contract`` stage: the prompt and token graphs' IO against the contract (structure only, never
    the weights), AR and CL as Genie reads them agreeing between the graphs and with the config's, and -- given
    the tokenizer and ``config.json`` -- the three checked against each other
    (:func:`genie_build.consistency.check_consistency`); the summary goes to ``out``.

    Args:
        prompt, token: each graph's file, or its parts' files in part order (a model exported part by part): the
            parts' inputs and outputs less the tensors that pass between them are the model's.
        expect_ar, expect_context: the config's prompt AR and CL (None: not checked against a config).
        context_size: Genie's context size, at most the CL.
        report_only: no bundle will be built, so violations and disagreements are recorded (and logged) instead
            of raised.
        tokenizer, hf_config: the model's ``tokenizer.json`` and ``config.json`` (both or neither).

    Raises:
        GenieBuildError: a violation (naming the graph file of the first) or a disagreement (naming its file),
            unless ``report_only``.
    """
    # Imported here: check-bundle checks binaries with this module and need not import onnx or tokenizers.
    from genie_build.consistency import check_consistency
    from genie_build.fileio import write_json
    from genie_build.onnx_graph import graph_io, load_graph

    files = {kind: [given] if isinstance(given, (str, os.PathLike)) else list(given)
             for kind, given in (("prompt", prompt), ("token", token))}
    paths = {kind: os.fspath(found[0]) for kind, found in files.items()}
    graphs = {kind: _model_io([graph_io(load_graph(path)) for path in found]) for kind, found in files.items()}
    expected = {} if expect_context is None else {"prompt": (expect_ar, expect_context), "token": (1, expect_context)}
    io = {kind: (graph.inputs, graph.outputs) for kind, graph in graphs.items()}
    dims, violations = model_violations(io, expected=expected, context_size=context_size)
    if violations and not report_only:
        culprit = next((paths[v.graph] for v in violations if v.graph in paths), paths["prompt"])
        raise GenieBuildError(culprit, _contract_error_text(violations))
    for violation in violations:
        log.warning("no bundle will be built, so this is not an error: %s", violation)
    warnings, disagreement = [], None
    if tokenizer is not None and hf_config is not None:
        try:
            warnings = check_consistency(io, tokenizer, hf_config)
        except GenieBuildError as exc:
            if not report_only:
                raise
            disagreement = str(exc)
            log.warning("no bundle will be built, so this is not an error: %s", disagreement)
    for warning in warnings:
        log.warning("%s", warning)
    named = {kind: [os.fspath(path) for path in found] for kind, found in files.items()}
    write_json(out, {**{kind: found[0] if len(found) == 1 else found for kind, found in named.items()},
                     "graphs": {kind: {"ar": ar, "cl": cl} for kind, (ar, cl) in dims.items()},
                     "bundle_enabled": not report_only, "violations": [str(v) for v in violations],
                     **({"tokenizer": tokenizer, "hf_config": hf_config, "disagreement": disagreement,
                         "warnings": warnings} if tokenizer is not None else {})})


def _model_io(parts: Sequence[Any]) -> Any:
    """The IO of a model made of ``parts`` (each a :class:`genie_build.onnx_graph.GraphIO`, in part order): what
    the parts take and give, less what passes between them, each name once."""
    produced = {spec.name for io in parts for spec in io.outputs}
    consumed = {spec.name for io in parts for spec in io.inputs}
    inputs = {spec.name: spec for io in parts for spec in io.inputs if spec.name not in produced}
    outputs = {spec.name: spec for io in parts for spec in io.outputs if spec.name not in consumed}
    return type(parts[0])(tuple(inputs.values()), tuple(outputs.values()))


def _contract_error_text(violations: Sequence[Violation]) -> str:
    """The one-line problem of a model that breaks the contract: every violation, then the way out."""
    return (f"{len(violations)} violation(s) of Genie's IO contract, so Genie could not load a bundle of these "
            f"graphs: " + "; ".join(map(str, violations)) + f". Fix the export, or {BUNDLE_OFF_HINT}")


# --- one graph ---------------------------------------------------------------------------------------------

def _unreadable(graph: str, tensors: Iterable[Tensor]) -> list[Violation]:
    found = []
    for tensor in tensors:
        if genie_dims(tensor.shape) is None:
            found.append(Violation(graph, tensor.name, f"has shape {shape_text(tensor.shape)}",
                                   "fixed sizes in every dim (export with static shapes)"))
        elif len(tensor.shape) > GENIE_RANK_LIMIT:
            found.append(Violation(graph, tensor.name, f"has rank {len(tensor.shape)} ({shape_text(tensor.shape)})",
                                   f"rank {GENIE_RANK_LIMIT} at most (Genie reads dims 1..3 of a longer shape, "
                                   "not its last three)"))
    return found


def _missing(graph: str, by_input: dict[str, Tensor], by_output: dict[str, Tensor]) -> list[Violation]:
    found = []
    if not any(name in by_input for name in FIRST_PART_INPUTS):
        found.append(Violation(graph, INPUT_IDS, "is not an input", "input_ids [1, AR] (or inputs_embeds) as "
                                                                    "an input of the first part"))
    if LOGITS not in by_output:
        found.append(Violation(graph, LOGITS, "is not an output", "logits [1, AR, vocab] as an output of the "
                                                                  "last part"))
    found += [Violation(graph, name, "is not an input", need)
              for name, need in ((MASK, "attention_mask [1, AR, CL]"), (POS_COS, "position_ids_cos [1, AR, rope_dim]"),
                                 (POS_SIN, "position_ids_sin [1, AR, rope_dim]")) if name not in by_input]
    found += [Violation(graph, name, "is an input Genie does not feed",
                        "only input_ids (or inputs_embeds), attention_mask, position_ids_cos/_sin and "
                        "past_key_{i}_in/past_value_{i}_in as inputs")
              for name in by_input if name not in FED_INPUTS and not KV_TENSOR.match(name)]
    return found


def _check_mask(graph: str, mask: Tensor | None, ar: int, cl: int) -> list[Violation]:
    dims = genie_dims(mask.shape) if mask is not None else None
    if dims is None or dims.hwc == (1, ar, cl):
        return []
    return [Violation(graph, MASK, _found_shape(mask, dims), f"[1, AR, CL] = [1, {ar}, {cl}] (a row of CL "
                                                             "entries for each of the AR new tokens)")]


def _check_rope(graph: str, cos: Tensor | None, sin: Tensor | None, ar: int) -> list[Violation]:
    found = []
    tables = [(tensor, genie_dims(tensor.shape)) for tensor in (cos, sin) if tensor is not None]
    rope_dims = {dims.channel for _, dims in tables if dims is not None}
    for tensor, dims in tables:
        if dims is not None and dims.hwc[:2] != (1, ar):
            found.append(Violation(graph, tensor.name, _found_shape(tensor, dims),
                                   f"[1, AR, rope_dim] = [1, {ar}, {dims.channel}]"))
    if len(rope_dims) > 1:
        found.append(Violation(graph, f"{POS_COS}/{POS_SIN}", f"have last dims {sorted(rope_dims)}",
                               "one rope_dim for both tables"))
    return found


def _check_logits(graph: str, logits: Tensor | None, ar: int) -> list[Violation]:
    dims = genie_dims(logits.shape) if logits is not None else None
    if dims is None or (dims.elements % dims.largest == 0 and dims.elements // dims.largest in (1, ar)):
        return []
    return [Violation(graph, LOGITS, _found_shape(logits, dims),
                      f"vocab or AR x vocab elements = [1, {ar}, {dims.largest}] (vocab = its largest dim)")]


def _check_kv(graph: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor], *, ar: int, cl: int,
              whole: bool) -> list[Violation]:
    found = [Violation(graph, tensor.name, f"looks like a cache {side} but is not named past_key_{{i}}_{suffix} / "
                                           f"past_value_{{i}}_{suffix}",
                       f"past_key_{{i}}_{suffix} and past_value_{{i}}_{suffix} (Genie finds the cache by these "
                       "names)")
             for side, suffix, tensors in (("input", "in", inputs), ("output", "out", outputs))
             for tensor in tensors if _looks_like_cache(tensor.name) and not KV_TENSOR.match(tensor.name)]
    cache = {tensor.name: (tensor, genie_dims(tensor.shape)) for side, tensors in (("in", inputs), ("out", outputs))
             for tensor in tensors if (match := KV_TENSOR.match(tensor.name)) and match.group(3) == side}
    found += [Violation(graph, tensor.name, f"is an {'output' if side == 'in' else 'input'}",
                        "past_*_in as inputs and past_*_out as outputs")
              for side, tensors in (("in", outputs), ("out", inputs))
              for tensor in tensors if (match := KV_TENSOR.match(tensor.name)) and match.group(3) == side]
    layers = sorted({int(KV_TENSOR.match(name).group(2)) for name in cache})
    if whole:
        found += [Violation(graph, name, "is missing", f"all four of past_key_{layer}_in/_out and "
                                                       f"past_value_{layer}_in/_out for layer {layer}")
                  for layer in layers for name in _layer_names(layer) if name not in cache]
    # kv_dim: the values' last dim (values are [*, length, kv_dim] in every layout; genie-build's kv-dim is the
    # model's head dim, and so is this)
    head_dim = next((dims.channel for name, (_, dims) in sorted(cache.items()) if "_value_" in name and dims), None)
    key_in_dims = next((dims for name, (_, dims) in sorted(cache.items())
                        if name.startswith("past_key_") and name.endswith("_in") and dims), None)
    scatter = key_in_dims is not None and key_in_dims.channel == cl  # Genie's own test (analyzeCacheGroupKV)
    past = cl if scatter else cl - ar
    if cache and not scatter and (problem := cache_length_problem(ar, cl)) is not None:
        found.append(Violation(graph, "graph", f"has CL {cl} = 2 x AR {ar}", f"another CL or AR: {problem}"))
    if head_dim is None:
        return found
    for name, (tensor, dims) in sorted(cache.items(), key=lambda item: _layer_order(item[0])):
        if dims is not None:
            found += _check_cache_entry(graph, tensor, dims, ar=ar, cl=cl, past=past, head_dim=head_dim)
    return found


def _check_cache_entry(graph: str, tensor: Tensor, dims: GenieDims, *, ar: int, cl: int, past: int,
                       head_dim: int) -> list[Violation]:
    kind, _, side = KV_TENSOR.match(tensor.name).groups()
    length, length_name = (past, "past" if past != cl else "CL (scattered cache)") if side == "in" else (ar, "AR")
    needed = (head_dim, length) if kind == "key" else (length, head_dim)
    if dims.hwc[1:] == needed:
        return []
    layout = (f"[*, kv_dim, {length_name}] = [*, {needed[0]}, {needed[1]}]" if kind == "key"
              else f"[*, {length_name}, kv_dim] = [*, {needed[0]}, {needed[1]}]")
    why = []
    entries = dims.width if kind == "value" or dims.channel == head_dim else dims.channel
    if kind == "key" and dims.channel == head_dim and dims.width != head_dim:
        why.append("the keys are not transposed (Genie keeps keys as [kv_dim, length])")
    if side == "out" and entries != ar:
        whole_cache = "the whole cache, " if entries == cl and cl != ar else ""
        why.append(f"it holds {whole_cache}{entries} entries where Genie takes only the {ar} new "
                   f"token{'s' if ar != 1 else ''}")
    elif side == "in" and entries != past:
        why.append(f"it holds {entries} past entries where Genie takes {past} "
                   f"(CL {cl} - AR {ar}, or CL with a scattered cache)")
    return [Violation(graph, tensor.name, _found_shape(tensor, dims) + (f": {', and '.join(why)}" if why else ""),
                      f"{layout} (kv_dim = head dim {head_dim})")]


def _check_dtypes(graph: str, tensors: Iterable[Tensor]) -> list[Violation]:
    found = []
    for tensor in tensors:
        allowed = TOKEN_DTYPES if tensor.name == INPUT_IDS else FLOAT_DTYPES \
            if tensor.name in (INPUTS_EMBEDS, MASK, POS_COS, POS_SIN, LOGITS) or KV_TENSOR.match(tensor.name) \
            else None
        if allowed is not None and tensor.dtype not in allowed:
            extra = (" (Genie writes an additive mask: 0 where visible, a large negative value where hidden, "
                     "or their quantized codes; not a 0/1 integer mask)" if tensor.name == MASK else "")
            found.append(Violation(graph, tensor.name, f"is {tensor.dtype}{extra}", " or ".join(allowed)))
    return found


# --- the two graphs ----------------------------------------------------------------------------------------

def _check_pair(dims: dict[str, tuple[int | None, int | None]], expected: dict[str, tuple[int, int]],
                context_size: int | None) -> list[Violation]:
    found = []
    prompt_ar, prompt_cl = dims.get("prompt", (None, None))
    token_ar, token_cl = dims.get("token", (None, None))
    if token_ar not in (None, 1):
        found.append(Violation("token", "graph", f"has AR {token_ar}", "AR 1 for the token graph (it generates "
                                                                      "one token per step)"))
    if prompt_ar is not None and prompt_ar <= 1:
        found.append(Violation("prompt", "graph", f"has AR {prompt_ar}", "AR above 1 for the prompt graph"))
    if None not in (prompt_cl, token_cl) and prompt_cl != token_cl:
        found.append(Violation("token", "graph", f"has CL {token_cl} but the prompt graph CL {prompt_cl}",
                               "one CL for both graphs (they share one KV cache)"))
    for kind, (want_ar, want_cl) in expected.items():
        got_ar, got_cl = dims.get(kind, (None, None))
        found += [Violation(kind, "graph", f"has {what} {got} but the config says {want}", f"{what} {want}")
                  for what, got, want in (("AR", got_ar, want_ar), ("CL", got_cl, want_cl))
                  if got is not None and got != want]
    cls = [cl for cl in (prompt_cl, token_cl) if cl is not None]
    if context_size is not None and cls and context_size > max(cls):
        found.append(Violation("config", "bundle.context_size", f"is {context_size}",
                               f"at most the graphs' CL {max(cls)} (Genie: 'Config specifies "
                               f"context->size={context_size}, but loaded max-CL={max(cls)}')"))
    return found


# --- helpers -----------------------------------------------------------------------------------------------

def _looks_like_cache(name: str) -> bool:
    return bool(_KV_LIKE.search(name) and _KEY_OR_VALUE.search(name))


def _layer_names(layer: int) -> tuple[str, ...]:
    return tuple(f"past_{kind}_{layer}_{side}" for side in ("in", "out") for kind in ("key", "value"))


def _layer_order(name: str) -> tuple[int, str]:
    match = KV_TENSOR.match(name)
    return (int(match.group(2)), name) if match else (-1, name)


def _found_shape(tensor: Tensor, dims: GenieDims) -> str:
    """``is [1, 64]`` and, where Genie's view differs, how Genie reads it."""
    shape = shape_text(tensor.shape)
    view = shape_text(dims.hwc)
    return f"is {shape}" + ("" if shape == view else f" (Genie reads it as {view})")


