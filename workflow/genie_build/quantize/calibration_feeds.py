"""The calibration windows from text, fed as Genie feeds a prompt graph: which inputs a graph (or a unit of the
chain) takes (:class:`FeedShape`), the windows of the text's ids and the KV cache each one sees
(:func:`calibration_windows`), and the forward pass aimet-onnx calibrates on (:func:`text_forward_pass`), one window
at a time (docs/quantize.md, "Calibration from text")."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from genie_build.conventions import INPUT_IDS, KV_TENSOR, MASK, POS_COS, POS_SIN, causal_mask, kv_name, rope_tables
from genie_build.errors import GenieBuildError
from genie_build.hf_config import head_dim, load_hf_config, read_rope

__all__ = ["AIMET_OUTPUT_SUFFIX", "FeedShape", "ForwardPass", "calibration_windows", "feed_shape", "genie_feed",
           "session_outputs", "text_forward_pass", "unit_feed_shape", "windows"]

logger = logging.getLogger(__name__)

AIMET_OUTPUT_SUFFIX = "_updated"
ForwardPass = Callable[[Any], None]   # runs calibration feeds through an onnxruntime session


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


def unit_feed_shape(unit: onnx.ModelProto, where: Path, hf_config_path: Path, *, ar: int, context: int,
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
                      boundary_in: Callable[[int], np.ndarray] | None = None, collect: str | None = None,
                      sink: Callable[[np.ndarray], None] | None = None) -> ForwardPass:
    """A forward pass over ``num_samples`` windows of ``ids`` (:func:`calibration_windows`), fed as Genie feeds
    its graphs: the causal mask, RoPE tables, and the KV cache holding what the graph itself output for the
    windows before it in the same sequence (new entries written at ``past_len``; emptied when a sequence starts).

    A unit of the chain takes window k's residual stream from ``boundary_in(k)`` and hands its output ``collect``
    to ``sink`` window by window: nothing of the windows is held beyond the one running.
    """
    def run(session: Any) -> None:
        caches = {name: np.zeros(dims, np.float32) for name, dims in shape.caches.items()}
        for index, (window, past_len) in enumerate(calibration_windows(ids, shape.ar, shape.context, num_samples)):
            if past_len == 0:
                caches = {name: np.zeros_like(cache) for name, cache in caches.items()}
            boundary = None if boundary_in is None else boundary_in(index)
            outputs = session_outputs(session, genie_feed(shape, window, past_len, caches, boundary))
            for name in caches:
                _write_new_entries(caches[name], outputs[kv_name(*_kv_kind_layer(name), "out")], name, past_len)
            if collect is not None and sink is not None:
                sink(outputs[collect])
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


