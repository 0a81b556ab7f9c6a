"""Quantize Genie-shaped graphs with aimet-onnx, by a named recipe, calibrated on text: one unit of the calibration
chain at a time (:func:`calibrate_unit`, the ``calibrate-unit`` command), or a whole prompt graph
(:func:`calibrate_prompt`, the reference the chain is compared with).

1. The graph becomes a ``QuantizationSimModel(param_type=..., activation_type="int16", config_file="htp_v79")``:
   16-bit activations, 4- or 8-bit per-channel weights (``w4a16``, ``w8a16``), or LPBQ (``w4a16-lpbq``: 4-bit
   blocks of :data:`LPBQ_BLOCK_SIZE` input channels whose scales are 8-bit integer multiples of one float scale per
   output channel; ``set_lpbq_for_params``).
2. AIMET's own LLM recipe, the steps of ``aimet_onnx.llm_configurator.llm_configurator.
   _apply_int8_kv_cache_tying_and_lm_head`` (what AI Hub Models' w4a16 applies) taken one by one: KV cache inputs
   and outputs 8-bit symmetric, each layer's ``_in`` and ``_out`` tied to one quantizer (with the Concat that joins
   them), the LM head weight 8-bit per channel (in the graph that has the head), and the second input of every
   MatMul (the attention's K and V) 8-bit symmetric.
3. The activations' grids are chosen by ``quantize.calibrator`` (:data:`CALIBRATORS`): ``min-max`` (the range the
   windows reached, AIMET's default), ``tf-enhanced`` (AIMET's SQNR search over the windows' histogram, which may
   clip rare outliers) or ``percentile`` (the :data:`PERCENTILE` th percentile of each end); the MatMul weights
   stay min-max (the embedding table and norm weights, which AIMET quantizes as activations, follow it).
4. ``compute_encodings`` runs the calibration windows (:func:`text_forward_pass`) on the sim's session (weights
   fake-quantized, activations observed in float, so a unit fed the stream its predecessor produced sees what it
   would see inside the whole model), then the encodings are exported (AIMET 1.0.0).

The token graphs are not calibrated: they take the prompt graph's encoding for every tensor they share
(:func:`token_encodings`; :mod:`genie_build.part_encodings` does it for each part).

Memory: AIMET holds a unit's weights in its ``ModelProto``, again in its onnxruntime session and fake-quantized,
about four times its float32 weights (:mod:`genie_build.calibration_units` sizes the units by it); the feeds are
made one window at a time, so they add one KV cache of the unit's layers. Needs aimet-onnx
(``envs/requirements-hf.txt``).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from genie_build.calibrate import float_activations
from genie_build.calibration_units import CalibrationUnit
from genie_build.conventions import (INPUT_IDS, KV_TENSOR, LOGITS, MASK, POS_COS, POS_SIN, causal_mask, kv_name,
                                     rope_tables)
from genie_build.encodings import Encodings, read_encodings, share_encodings, write_encodings
from genie_build.errors import GenieBuildError
from genie_build.fileio import atomic_open
from genie_build.hf_config import head_dim, load_hf_config, read_rope
from genie_build.onnx_graph import check_external_data, graph_tensors, load_graph, model_tensors
from genie_build.ort_session import job_threads
from genie_build.recipes import LPBQ_BLOCK_SIZE, Recipe, recipe_named
from genie_build.split import build_part, cut_graph, ensure_value_info
from genie_build.tokens import read_tokens
from genie_build.toolchains.reference.onnx_io import load_external_bytes

__all__ = ["CALIBRATORS", "DEFAULT_CALIBRATOR", "FeedShape", "ForwardPass", "PERCENTILE", "calibrate_prompt", "calibrate_unit", "calibration_windows",
           "copy_kv_input_encodings", "feed_shape", "genie_feed", "kv_cache_io", "lm_head_weight",
           "recipe_sim", "require_aimet", "session_outputs", "shared_token_tensors", "text_forward_pass",
           "token_encodings", "windows"]

logger = logging.getLogger(__name__)

ACTIVATION_TYPE = "int16"
HTP_CONFIG = "htp_v79"
WEIGHT_OP_TYPES = ("Gemm", "MatMul", "Conv")
AIMET_OUTPUT_SUFFIX = "_updated"
_PASS_THROUGH = ("Identity", "Cast", "Reshape", "Transpose", "Squeeze", "Unsqueeze")
# quantize.calibrator -> aimet-onnx's quant scheme of the activation quantizers (docs/quantize.md, "Calibrators")
CALIBRATORS = {"min-max": "min_max", "tf-enhanced": "tf_enhanced", "percentile": "percentile"}
DEFAULT_CALIBRATOR = "min-max"
PERCENTILE = 99.99

ForwardPass = Callable[[Any], None]   # runs calibration feeds through an onnxruntime session


# --- the graph ---------------------------------------------------------------------------------------------

def lm_head_weight(graph: onnx.GraphProto, where: str | Path) -> tuple[str, str]:
    """``(node, initializer)`` of the LM head: the weighted MatMul/Gemm that ``logits`` comes from, through
    data-movement ops, its weight found through a Transpose or Cast.

    Raises:
        GenieBuildError: no ``logits`` output, or no weighted MatMul/Gemm produces it.
    """
    found = _find_lm_head(graph)
    if found is None:
        raise GenieBuildError(where, f"no weighted MatMul or Gemm produces the output {LOGITS!r} (the LM head)")
    return found


def _find_lm_head(graph: onnx.GraphProto) -> tuple[str, str] | None:
    """:func:`lm_head_weight`, or None for a graph without the LM head."""
    producers = {output: node for node in graph.node for output in node.output}
    initializers = {tensor.name for tensor in graph.initializer}
    node = producers.get(LOGITS)
    while node is not None and node.op_type in _PASS_THROUGH:
        node = producers.get(node.input[0])
    if node is not None and node.op_type in ("MatMul", "Gemm"):
        weight = node.input[1]
        while weight not in initializers and weight in producers and producers[weight].op_type in _PASS_THROUGH:
            weight = producers[weight].input[0]
        if weight in initializers:
            return node.name, weight
    return None


def kv_cache_io(graph: onnx.GraphProto) -> dict[str, str]:
    """Each ``past_{key,value}_{i}_in`` graph input -> its ``_out`` graph output."""
    outputs = {value.name for value in graph.output}
    pairs = {}
    for value in graph.input:
        match = KV_TENSOR.match(value.name)
        if match and match.group(3) == "in":
            out = kv_name(match.group(1), int(match.group(2)), "out")
            if out in outputs:
                pairs[value.name] = out
    return pairs


# --- the AIMET driver --------------------------------------------------------------------------------------

def require_aimet(where: str = "quantize") -> tuple[Any, Any]:
    """aimet-onnx's ``quantsim`` and ``llm_configurator`` modules.

    Raises:
        GenieBuildError: aimet-onnx is not installed (at ``where``: the option or command that asked for it).
    """
    try:
        import aimet_onnx.llm_configurator.llm_configurator as llm_configurator
        import aimet_onnx.quantsim as quantsim
    except ImportError:
        raise GenieBuildError(where, "aimet needs aimet-onnx, which is not installed "
                                     "(pip install --no-deps -r envs/requirements-hf.txt)") from None
    return quantsim, llm_configurator


def calibrate_prompt(prompt_path: str | Path, recipe: Recipe, forward_pass: ForwardPass,
                     calibrator: str = DEFAULT_CALIBRATOR) -> Encodings:
    """The whole prompt graph quantized by ``recipe`` and AIMET's LLM recipe, calibrated by ``forward_pass``: the
    reference the chain of units is compared with (the workflow calibrates unit by unit, :func:`calibrate_unit`).

    Raises:
        GenieBuildError: aimet-onnx is missing, the graph is unreadable or stores float16 weights (aimet-onnx
            leaves a weight reaching its op through a Cast unquantized), or a weight does not split into LPBQ
            blocks.
    """
    path = Path(prompt_path)
    graph = load_graph(path)
    check_external_data(graph, path)
    _check_float32(graph, path)
    lm_head = lm_head_weight(graph.graph, path)
    kv_io = kv_cache_io(graph.graph)
    del graph
    return _calibrated(onnx.load(path), recipe, lm_head, kv_io, path, forward_pass, calibrator)


def _check_float32(model: onnx.ModelProto, path: Path) -> None:
    if any(tensor.data_type == onnx.TensorProto.FLOAT16 for tensor in model.graph.initializer):
        raise GenieBuildError(path, "float16 weights: aimet-onnx does not quantize a weight reaching its op "
                                    "through a Cast; export float32 weights (the demo needs demo.weight_dtype float32)")


def _calibrated(model: onnx.ModelProto, recipe: Recipe, lm_head: tuple[str, str] | None, kv_io: Mapping[str, str],
                where: Path, forward_pass: ForwardPass, calibrator: str = DEFAULT_CALIBRATOR) -> Encodings:
    """``model``'s encodings: a sim set up by :func:`recipe_sim`, calibrated by ``forward_pass``, exported."""
    with tempfile.TemporaryDirectory(prefix="genie-build-aimet-") as scratch:
        sim = recipe_sim(model, recipe, lm_head, kv_io, where, Path(scratch) / "sim", calibrator)
        del model
        sim.compute_encodings(forward_pass)
        sim.export(scratch, "graph", encoding_version="1.0.0", export_model=False)
        return read_encodings(Path(scratch) / "graph.encodings")


def recipe_sim(model: onnx.ModelProto, recipe: Recipe, lm_head: tuple[str, str] | None, kv_io: Mapping[str, str],
               where: Path, scratch: Path, calibrator: str = DEFAULT_CALIBRATOR) -> Any:
    """An uncalibrated ``QuantizationSimModel`` of ``model`` set up by ``recipe`` and AIMET's LLM recipe
    (``scratch``: where AIMET keeps the weights of a model too large for one protobuf).

    ``lm_head`` is ``(node, weight)`` of the LM head, None for a graph (a unit of the chain) without it: the
    steps of ``llm_configurator._apply_int8_kv_cache_tying_and_lm_head`` are taken one by one, in its order, so
    that a graph without the head skips only the head's step. Each step is local to a decoder layer or to the
    head, so a unit gets what the whole graph gets (docs/quantize.md). The session takes the job's threads and no
    CPU arena (memory only; the values are the same).
    """
    quantsim, llm_configurator = require_aimet()
    # No CPU arena: it rounds a large tensor's block up to a power of two and keeps it after the run (the LM head's
    # fake-quantized weight and its transpose, 2.2 GB each for Qwen2.5-7B)
    options = {"enable_cpu_mem_arena": False, **({"intra_op_num_threads": job_threads()} if job_threads() else {})}
    sim = quantsim.QuantizationSimModel(model, param_type=recipe.param_type, activation_type=ACTIVATION_TYPE,
                                        config_file=HTP_CONFIG, path=str(scratch), session_options_kwargs=options)
    if recipe.lpbq:
        _set_lpbq(quantsim, sim, {lm_head[0]} if lm_head else set(), where)
    llm_configurator._set_tensors_to_output_8b_sym(sim, [*kv_io, *kv_io.values()])
    if lm_head is not None:
        llm_configurator._set_lm_head_to_8b(sim, lm_head[1])
    llm_configurator._tie_quantizers_for_kv_cache(sim, dict(kv_io))
    llm_configurator._set_matmul_second_input_to_8b(sim)
    _set_calibrator(sim, calibrator)
    return sim


def _set_calibrator(sim: Any, calibrator: str) -> None:
    """Give every activation quantizer ``calibrator``'s quant scheme (after the recipe's steps, which rebuild the
    quantizers they change); the MatMul weights' quantizers keep min-max."""
    if calibrator not in CALIBRATORS:
        raise GenieBuildError("quantize.calibrator", f"{calibrator!r} is not one of {sorted(CALIBRATORS)}")
    if calibrator == DEFAULT_CALIBRATOR:
        return
    from aimet_onnx.common.defs import QuantScheme

    scheme = QuantScheme.from_str(CALIBRATORS[calibrator])
    quantizers = {id(quantizer): quantizer for name in sim.activation_names
                  if (quantizer := sim.qc_quantize_op_dict.get(name)) is not None}   # tied ones once
    for quantizer in quantizers.values():
        quantizer.set_quant_scheme(scheme)
        if calibrator == "percentile":
            # aimet-onnx has no public setter; its tensor quantizer takes the percentile of each end
            quantizer._tensor_quantizer.setPercentileValue(PERCENTILE)


def _set_lpbq(quantsim: Any, sim: Any, excluded: set[str], path: Path) -> None:
    """LPBQ for every backbone weight (the LM head, ``excluded``, stays 8-bit per channel, as AIMET's recipe
    sets it)."""
    try:
        # 4-bit values, 8-bit (twice the bitwidth) per-block integer scales
        quantsim.set_lpbq_for_params(sim, 4, LPBQ_BLOCK_SIZE, op_types=set(WEIGHT_OP_TYPES),
                                     nodes_to_exclude=excluded, strict=True)
    except (RuntimeError, ValueError) as exc:
        raise GenieBuildError(path, f"LPBQ with blocks of {LPBQ_BLOCK_SIZE}: {exc}") from None


def copy_kv_input_encodings(enc: Encodings, tensor_names: set[str] | frozenset[str]) -> Encodings:
    """Each ``past_{key,value}_{i}_out`` of the graph (``tensor_names``) with the encoding of its ``_in``: the
    two share one quantizer in AIMET, but AIMET exports it under the input's name only (the output is made by a
    data-movement op)."""
    activations = dict(enc.activations)
    for name in sorted(tensor_names):
        match = KV_TENSOR.match(name)
        cache_in = kv_name(match.group(1), int(match.group(2)), "in") if match and match.group(3) == "out" else None
        if cache_in in activations:
            activations[name] = replace(activations[cache_in], name=name)
    return replace(enc, activations=activations)


def shared_token_tensors(prompt_names: frozenset[str], token_path: Path) -> frozenset[str]:
    """The token graph's tensor names, checked to be the prompt graph's (``prompt_names``) where they need an
    encoding.

    Raises:
        GenieBuildError: the token graph has a float tensor (activation or initializer) that the prompt graph
            lacks, named.
    """
    token = load_graph(token_path)
    check_external_data(token, token_path)
    floats = set(float_activations(token)) | {tensor.name for tensor in token.graph.initializer
                                              if tensor.data_type == onnx.TensorProto.FLOAT}
    missing = sorted(floats - prompt_names)
    if missing:
        raise GenieBuildError(token_path, f"tensors {missing[:3]} ({len(missing)} in all) are not in the prompt "
                                          "graph, so they have no encoding to share; export both graphs from one "
                                          "model so that they name their tensors alike")
    return graph_tensors(token).tensor_names


def token_encodings(prompt_enc: Encodings, token_names: frozenset[str]) -> Encodings:
    """The prompt graph's encodings of the tensors the token graph has (``token_names``)."""
    empty = Encodings(activations={}, params={}, quantizer_args=dict(prompt_enc.quantizer_args),
                      header=prompt_enc.header, version=prompt_enc.version)
    return copy_kv_input_encodings(share_encodings(prompt_enc, empty, token_names), token_names)


# --- calibration feeds from text ---------------------------------------------------------------------------

@dataclass(frozen=True)
class FeedShape:
    """A graph's inputs as Genie feeds them: AR, context, RoPE table width, KV cache shapes, and which of the
    inputs the graph takes (a unit of the chain may take the residual stream instead of ``input_ids``, and the
    embedding's unit takes no mask, RoPE or cache)."""

    ar: int
    context: int
    rope_theta: float
    rope_scaling: Mapping[str, Any] | None
    head_dim: int
    ids_dtype: np.dtype | None              # None: the graph takes no input_ids
    caches: Mapping[str, tuple[int, ...]]   # past_*_in -> shape
    positions: bool = True                  # it takes attention_mask and the RoPE tables
    boundary: str | None = None             # the residual-stream input it takes instead of input_ids


def feed_shape(prompt: onnx.ModelProto, prompt_path: Path, hf_config_path: Path) -> FeedShape:
    """Read a whole prompt graph's feeds from its inputs and the RoPE base from ``config.json``.

    Raises:
        GenieBuildError: an input Genie feeds is missing or not of Genie's rank, or the config has no RoPE base
            or a RoPE scaling Genie's tables do not compute.
    """
    dims = _input_dims(prompt, prompt_path, required=(INPUT_IDS, MASK, POS_COS, POS_SIN))
    return _feed_shape(prompt, dims, hf_config_path, ar=dims[INPUT_IDS][1], context=dims[MASK][2], boundary=None)


def _unit_feed_shape(unit: onnx.ModelProto, where: Path, hf_config_path: Path, *, ar: int, context: int,
                     boundary: str | None) -> FeedShape:
    """The feeds of a unit of the chain (AR and context are the model's, from the plan: an embedding unit's
    inputs do not say its context, and the window schedule depends on it).

    Raises:
        GenieBuildError: as :func:`feed_shape`, for the inputs the unit takes.
    """
    dims = _input_dims(unit, where, required=())
    return _feed_shape(unit, dims, hf_config_path, ar=ar, context=context, boundary=boundary)


def _input_dims(model: onnx.ModelProto, where: Path, required: Sequence[str]) -> dict[str, tuple[int, ...]]:
    dims = {value.name: tuple(dim.dim_value for dim in value.type.tensor_type.shape.dim) for value in model.graph.input}
    for name, rank in ((INPUT_IDS, 2), (MASK, 3), (POS_COS, 4), (POS_SIN, 4)):
        if (name in required or name in dims) and len(dims.get(name, ())) != rank:
            raise GenieBuildError(where, f"input {name!r} of rank {rank} expected (Genie's IO contract), "
                                         f"found {dims.get(name)}")
    return dims


def _feed_shape(model: onnx.ModelProto, dims: Mapping[str, tuple[int, ...]], hf_config_path: Path, *, ar: int,
                context: int, boundary: str | None) -> FeedShape:
    config = load_hf_config(hf_config_path)
    rope = read_rope(config, hf_config_path)   # either HF layout, as genie_config writes it for Genie
    theta, scaling = float(rope.theta), rope.scaling
    try:
        rope_tables(head_dim(config, hf_config_path), theta, [0], scaling)
    except (ValueError, KeyError) as exc:
        raise GenieBuildError(hf_config_path, f"RoPE scaling {scaling}: {exc}") from None
    types = {value.name: value.type.tensor_type.elem_type for value in model.graph.input}
    return FeedShape(ar=ar, context=context, rope_theta=theta, rope_scaling=scaling,
                     head_dim=2 * dims[POS_COS][3] if POS_COS in dims else head_dim(config, hf_config_path),
                     ids_dtype=onnx.helper.tensor_dtype_to_np_dtype(types[INPUT_IDS]) if INPUT_IDS in types else None,
                     caches={name: shape for name, shape in dims.items() if KV_TENSOR.match(name)},
                     positions=MASK in dims, boundary=boundary if boundary in dims else None)


def windows(ids: np.ndarray, ar: int, count: int) -> Iterator[np.ndarray]:
    """``count`` consecutive windows of ``ar`` tokens from the start of ``ids``.

    Raises:
        GenieBuildError: fewer than ``count * ar`` ids (a text is never repeated to fill its windows).
    """
    if ids.size < ar * count:
        raise GenieBuildError("calibration text", f"has {ids.size} tokens, {count} windows of {ar} need {ar * count}")
    yield from np.asarray(ids[:ar * count]).reshape(count, ar)


def calibration_windows(ids: np.ndarray, ar: int, context: int, count: int) -> Iterator[tuple[np.ndarray, int]]:
    """Each window of :func:`windows` with the number of tokens before it in its sequence: window k at positions
    ``past_len .. past_len + AR - 1``; when the cache has no room for another window the next one starts a new
    sequence (``past_len`` 0), as a new conversation would. Every unit of the chain replays this schedule."""
    past_len = 0
    for window in windows(ids, ar, count):
        if past_len > context - ar:
            past_len = 0
        yield window, past_len
        past_len += ar


def text_forward_pass(shape: FeedShape, ids: np.ndarray, num_samples: int, *,
                      boundary_in: np.ndarray | None = None, collect: str | None = None,
                      collected: list[np.ndarray] | None = None) -> ForwardPass:
    """A forward pass over ``num_samples`` windows of ``ids`` (:func:`calibration_windows`), fed as Genie feeds
    its graphs: the causal mask, RoPE tables, and the KV cache holding what the graph itself output for the
    windows before it in the same sequence (new entries written at ``past_len``; emptied when a sequence starts).

    A unit of the chain takes window k's residual stream from ``boundary_in[k]`` and gives its own, ``collect``,
    which is appended to ``collected`` window by window.
    """
    def run(session: Any) -> None:
        if collected is not None:
            collected.clear()
        caches = {name: np.zeros(dims, np.float32) for name, dims in shape.caches.items()}
        for index, (window, past_len) in enumerate(calibration_windows(ids, shape.ar, shape.context, num_samples)):
            if past_len == 0:
                caches = {name: np.zeros_like(cache) for name, cache in caches.items()}
            boundary = None if boundary_in is None else boundary_in[index]
            outputs = session_outputs(session, genie_feed(shape, window, past_len, caches, boundary))
            for name in caches:
                _write_new_entries(caches[name], outputs[kv_name(*_kv_kind_layer(name), "out")], name, past_len)
            if collect is not None and collected is not None:
                collected.append(outputs[collect])
            logger.info("calibrated window %d of %d (%d tokens before it)", index + 1, num_samples, past_len)

    return run


def genie_feed(shape: FeedShape, window: np.ndarray, past_len: int, caches: Mapping[str, np.ndarray],
               boundary: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The graph's feed for ``window`` (AR token ids) after ``past_len`` cached tokens: what of the prompt
    graph's inputs it takes, and ``boundary`` for its residual-stream input."""
    feed: dict[str, np.ndarray] = dict(caches)
    if shape.ids_dtype is not None:
        feed[INPUT_IDS] = np.asarray(window)[None].astype(shape.ids_dtype)
    if shape.boundary is not None:
        feed[shape.boundary] = boundary
    if shape.positions:
        cos, sin = rope_tables(shape.head_dim, shape.rope_theta, np.arange(past_len, past_len + shape.ar),
                               shape.rope_scaling)
        feed.update({MASK: causal_mask(shape.ar, shape.context, past_len), POS_COS: cos, POS_SIN: sin})
    return feed


def session_outputs(session: Any, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a sim's session: its outputs by the graph's output names (AIMET renames a quantized output
    ``<name>_updated``, aimet_onnx quantsim ``_insert_quantizer``)."""
    names = [output.name for output in session.get_outputs()]
    return {name.removesuffix(AIMET_OUTPUT_SUFFIX): value for name, value in zip(names, session.run(None, dict(feed)))}


def _kv_kind_layer(name: str) -> tuple[str, int]:
    match = KV_TENSOR.match(name)
    return match.group(1), int(match.group(2))


def _write_new_entries(cache: np.ndarray, new: np.ndarray, name: str, past_len: int) -> None:
    """Put a graph's new K/V entries into its cache at ``past_len``: keys ``[1, kv, d, len]`` along the last
    axis, values ``[1, kv, len, d]`` along axis 2 (docs/conventions.md). Columns past the cache's end (the last
    window of a full cache) are dropped: no later window of the sequence reads them."""
    axis = cache.ndim - 1 if _kv_kind_layer(name)[0] == "key" else cache.ndim - 2
    room = max(0, min(new.shape[axis], cache.shape[axis] - past_len))
    target = [slice(None)] * cache.ndim
    target[axis] = slice(past_len, past_len + room)
    source = [slice(None)] * cache.ndim
    source[axis] = slice(0, room)
    cache[tuple(target)] = new[tuple(source)]


# --- the chain: one unit at a time ---------------------------------------------------------------------------

def calibrate_unit(part_graph: str | Path, units: Sequence[CalibrationUnit], label: str, out_encodings: str | Path,
                   out_boundary: str | Path, *, hf_config_path: str | Path, tokens_path: str | Path, recipe: str,
                   num_samples: int, ar: int, context: int, boundary_in: str | Path | None = None,
                   calibrator: str = DEFAULT_CALIBRATOR) -> Encodings:
    """The ``calibrate-unit`` command: unit ``label`` of the chain, one of its part's ``units``
    (:mod:`genie_build.calibration_units`), carved from the part's prompt graph, quantized by ``recipe`` and
    AIMET's LLM recipe, and
    calibrated on ``num_samples`` windows of the calibration text's ids (``tokens_path``: what ``tokenize-text``
    wrote; only those windows are read), fed the residual stream the unit before it stored
    (``boundary_in``); writes its encodings and its own output stream (``out_boundary``: ``[windows, 1, AR,
    hidden]`` float32, empty for the last unit, whose output is the logits).

    Raises:
        GenieBuildError: a bad recipe or sample count, a unit the chain does not have, a boundary file of another
            shape than the windows need, or the problems of :func:`_unit_graph`,
            :func:`genie_build.tokens.read_tokens` and :func:`calibrate_prompt`.
    """
    chosen = recipe_named(recipe)
    if calibrator not in CALIBRATORS:
        raise GenieBuildError("--calibrator", f"{calibrator!r} is not one of {sorted(CALIBRATORS)}")
    if num_samples < 1:
        raise GenieBuildError("--num-samples", f"must be at least 1, got {num_samples}")
    part_path = Path(part_graph)
    unit = next((unit for unit in units if unit.label == label), None)
    if unit is None or {other.part for other in units} != {unit.part}:
        raise GenieBuildError("--part-units-json", f"not the units of one part holding unit {label!r}")
    model = _unit_graph(part_path, units, label)
    shape = _unit_feed_shape(model, part_path, Path(hf_config_path), ar=ar, context=context,
                             boundary=unit.input_boundary)
    ids = read_tokens(tokens_path, num_samples * ar)
    streamed = None if shape.boundary is None else _read_boundary(boundary_in, num_samples, ar)
    require_aimet("calibrate-unit")  # after the inputs are read: importing aimet-onnx takes seconds, a bad input not
    logger.info("unit %s: %s of part %s, %d windows of %d tokens", label, "+".join(unit.pieces), unit.part,
                num_samples, ar)
    for stored in model_tensors(model):   # read through the resolver: onnx's loader refuses a symlinked data file
        if stored.tensor.data_location == onnx.TensorProto.EXTERNAL:
            load_external_bytes(stored, part_path)
    _check_float32(model, part_path)
    collected: list[np.ndarray] = []
    forward_pass = text_forward_pass(shape, ids, num_samples, boundary_in=streamed, collect=unit.output_boundary,
                                     collected=collected)
    encodings = _calibrated(model, chosen, _find_lm_head(model.graph), kv_cache_io(model.graph), part_path,
                            forward_pass, calibrator)
    write_encodings(out_encodings, encodings)
    _write_boundary(out_boundary, np.stack(collected) if collected else np.zeros((0,), np.float32))
    logger.info("unit %s: %d activation and %d param encodings", label, len(encodings.activations),
                len(encodings.params))
    return encodings


def _unit_graph(part_graph: Path, units: Sequence[CalibrationUnit], label: str) -> onnx.ModelProto:
    """Unit ``label`` carved from its part's graph (``units``: the part's units) by the split's own cut, its
    weights still external (in the part's data file).

    Raises:
        GenieBuildError: the part graph is unreadable, or the units' boundaries do not cut it.
    """
    model = load_graph(part_graph)
    check_external_data(model, part_graph)
    labels = [unit.label for unit in units]
    specs = cut_graph(model, labels, [unit.output_boundary for unit in units[:-1]], part_graph)
    spec = specs[labels.index(label)]
    model = ensure_value_info(model, [*spec.inputs, *spec.outputs], part_graph)
    return build_part(model, spec, label)


def _read_boundary(path: str | Path | None, windows_count: int, ar: int) -> np.ndarray:
    """The residual stream a unit stored for the next, checked against the windows it must cover.

    Raises:
        GenieBuildError: no file, not a ``.npy``, or another shape than ``[windows, 1, AR, hidden]`` float32.
    """
    if path is None:
        raise GenieBuildError("--boundary-in", "this unit takes the residual stream of the unit before it")
    try:
        stream = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise GenieBuildError(path, f"cannot read the stored residual stream: {exc}") from None
    if stream.dtype != np.float32 or stream.ndim != 4 or stream.shape[:3] != (windows_count, 1, ar):
        raise GenieBuildError(path, f"holds {stream.dtype} {list(stream.shape)}, not [{windows_count}, 1, {ar}, "
                                    "hidden] float32: it was stored for other calibration settings")
    return stream


def _write_boundary(path: str | Path, stream: np.ndarray) -> None:
    with atomic_open(path) as handle:
        np.save(handle, stream, allow_pickle=False)
