"""Quantize a Genie-shaped prompt/token graph pair with aimet-onnx, by a named recipe, calibrated on text.

One AIMET driver for every caller (the ``quantize`` command and the demo's ``demo.calibrator: aimet``):

1. The prompt graph becomes a ``QuantizationSimModel(param_type=..., activation_type="int16",
   config_file="htp_v79")``: 16-bit activations, 4- or 8-bit per-channel weights (``w4a16``, ``w8a16``), or
   LPBQ (``w4a16-lpbq``: 4-bit blocks of :data:`LPBQ_BLOCK_SIZE` input channels whose scales are 8-bit integer
   multiples of one float scale per output channel; ``set_lpbq_for_params``).
2. AIMET's own LLM recipe, ``aimet_onnx.llm_configurator.llm_configurator._apply_int8_kv_cache_tying_and_lm_head``
   (what AI Hub Models' w4a16 applies): KV cache inputs and outputs 8-bit symmetric, each layer's ``_in`` and
   ``_out`` tied to one quantizer (with the Concat that joins them), the LM head weight 8-bit per channel, and
   the second input of every MatMul (the attention's K and V) 8-bit symmetric.
3. ``compute_encodings`` runs a caller's forward pass on the sim's session (weights fake-quantized, activations
   observed in float), then the encodings are exported (AIMET 1.0.0).
4. The token graph is not calibrated: it takes the prompt graph's encoding for every tensor they share (Genie
   refuses a shared tensor quantized differently in the two graphs). A float tensor of the token graph that the
   prompt graph lacks has no encoding to take, so it is an error naming it.

Memory: AIMET holds the prompt graph's weights in its ``ModelProto`` and again in its onnxruntime session, plus
one quantizer per tensor; the calibration feeds are made one window at a time (:func:`text_forward_pass`), so
they add one KV cache. The token graph is read without its weights. Needs aimet-onnx
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
from genie_build.conventions import (INPUT_IDS, KV_TENSOR, LOGITS, MASK, POS_COS, POS_SIN, causal_mask, kv_name,
                                     rope_tables)
from genie_build.encodings import Encodings, read_encodings, share_encodings, write_encodings
from genie_build.errors import GenieBuildError
from genie_build.fileio import read_json
from genie_build.genie_config import read_rope
from genie_build.onnx_graph import check_external_data, graph_tensors, load_graph, read_graph_tensors

logger = logging.getLogger(__name__)

ACTIVATION_TYPE = "int16"
HTP_CONFIG = "htp_v79"
LPBQ_BLOCK_SIZE = 64          # AIMET's LLM LPBQ recipe and AI Hub's LPBQ exports (block_size 64)
WEIGHT_OP_TYPES = ("Gemm", "MatMul", "Conv")
DEFAULT_NUM_SAMPLES = 8
AIMET_OUTPUT_SUFFIX = "_updated"
_PASS_THROUGH = ("Identity", "Cast", "Reshape", "Transpose", "Squeeze", "Unsqueeze")

ForwardPass = Callable[[Any], None]   # runs calibration feeds through an onnxruntime session


@dataclass(frozen=True)
class Recipe:
    """What a recipe sets beyond AIMET's LLM recipe: the backbone weights' type and whether they are LPBQ."""

    name: str
    param_type: str
    lpbq: bool = False


RECIPES = {recipe.name: recipe for recipe in (Recipe("w4a16", "int4"), Recipe("w4a16-lpbq", "int4", lpbq=True),
                                              Recipe("w8a16", "int8"))}


def recipe_named(name: str) -> Recipe:
    """Raises: GenieBuildError: ``name`` is no recipe."""
    if name not in RECIPES:
        raise GenieBuildError("--recipe", f"{name!r} is not one of {sorted(RECIPES)}")
    return RECIPES[name]


# --- the graph ---------------------------------------------------------------------------------------------

def lm_head_weight(graph: onnx.GraphProto, where: str | Path) -> tuple[str, str]:
    """``(node, initializer)`` of the LM head: the weighted MatMul/Gemm that ``logits`` comes from, through
    data-movement ops, its weight found through a Transpose or Cast.

    Raises:
        GenieBuildError: no ``logits`` output, or no weighted MatMul/Gemm produces it.
    """
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
    raise GenieBuildError(where, f"no weighted MatMul or Gemm produces the output {LOGITS!r} (the LM head)")


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


def calibrate_prompt(prompt_path: str | Path, recipe: Recipe, forward_pass: ForwardPass) -> Encodings:
    """The prompt graph quantized by ``recipe`` and AIMET's LLM recipe, calibrated by ``forward_pass``.

    Raises:
        GenieBuildError: aimet-onnx is missing, the graph is unreadable or stores float16 weights (aimet-onnx
            leaves a weight reaching its op through a Cast unquantized), or a weight does not split into LPBQ
            blocks.
    """
    path = Path(prompt_path)
    graph = load_graph(path)
    check_external_data(graph, path)
    if any(tensor.data_type == onnx.TensorProto.FLOAT16 for tensor in graph.graph.initializer):
        raise GenieBuildError(path, "float16 weights: aimet-onnx does not quantize a weight reaching its op "
                                    "through a Cast; export float32 weights (the demo needs demo.weight_dtype float32)")
    lm_head_node, lm_head = lm_head_weight(graph.graph, path)
    kv_io = kv_cache_io(graph.graph)
    del graph
    with tempfile.TemporaryDirectory(prefix="genie-build-aimet-") as scratch:
        sim = recipe_sim(onnx.load(path), recipe, lm_head_node, lm_head, kv_io, path, Path(scratch) / "sim")
        sim.compute_encodings(forward_pass)
        sim.export(scratch, "prompt", encoding_version="1.0.0", export_model=False)
        return read_encodings(Path(scratch) / "prompt.encodings")


def recipe_sim(model: onnx.ModelProto, recipe: Recipe, lm_head_node: str, lm_head: str, kv_io: Mapping[str, str],
               where: Path, scratch: Path) -> Any:
    """An uncalibrated ``QuantizationSimModel`` of ``model`` set up by ``recipe`` and AIMET's LLM recipe
    (``scratch``: where AIMET keeps the weights of a model too large for one protobuf)."""
    quantsim, llm_configurator = require_aimet()
    sim = quantsim.QuantizationSimModel(model, param_type=recipe.param_type, activation_type=ACTIVATION_TYPE,
                                        config_file=HTP_CONFIG, path=str(scratch))
    if recipe.lpbq:
        _set_lpbq(quantsim, sim, lm_head_node, where)
    llm_configurator._apply_int8_kv_cache_tying_and_lm_head(sim, dict(kv_io), lm_head)
    return sim


def _set_lpbq(quantsim: Any, sim: Any, lm_head_node: str, path: Path) -> None:
    """LPBQ for every backbone weight (the LM head stays 8-bit per channel, as AIMET's recipe sets it)."""
    try:
        # 4-bit values, 8-bit (twice the bitwidth) per-block integer scales
        quantsim.set_lpbq_for_params(sim, 4, LPBQ_BLOCK_SIZE, op_types=set(WEIGHT_OP_TYPES),
                                     nodes_to_exclude={lm_head_node}, strict=True)
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


def quantize_pair(prompt_path: str | Path, token_path: str | Path, out_prompt: str | Path, out_token: str | Path,
                  *, recipe: Recipe, forward_pass: ForwardPass) -> tuple[Encodings, Encodings]:
    """Quantize the prompt graph (:func:`calibrate_prompt`), give the token graph its encodings, write both.

    Raises:
        GenieBuildError: the problems of :func:`shared_token_tensors` (checked before AIMET runs) and
            :func:`calibrate_prompt`.
    """
    prompt_path, token_path = Path(prompt_path), Path(token_path)
    prompt_names = read_graph_tensors(prompt_path).tensor_names
    token_names = shared_token_tensors(prompt_names, token_path)
    prompt = copy_kv_input_encodings(calibrate_prompt(prompt_path, recipe, forward_pass), prompt_names)
    token = token_encodings(prompt, token_names)
    for enc, out in ((prompt, out_prompt), (token, out_token)):
        write_encodings(out, enc)
        logger.info("%s: %d activation and %d param encodings (%s)", out, len(enc.activations),
                    len(enc.params), recipe.name)
    return prompt, token


# --- calibration feeds from text ---------------------------------------------------------------------------

@dataclass(frozen=True)
class FeedShape:
    """The prompt graph's inputs as Genie feeds them: AR, context, RoPE table width, KV cache shapes."""

    ar: int
    context: int
    rope_theta: float
    rope_scaling: Mapping[str, Any] | None
    head_dim: int
    ids_dtype: np.dtype
    caches: Mapping[str, tuple[int, ...]]   # past_*_in -> shape
    vocab: int


def feed_shape(prompt: onnx.ModelProto, prompt_path: Path, hf_config_path: Path) -> FeedShape:
    """Read the feeds' sizes from the prompt graph's inputs and the RoPE base from ``config.json``.

    Raises:
        GenieBuildError: an input Genie feeds is missing or not of Genie's rank, or the config has no RoPE base
            or a RoPE scaling Genie's tables do not compute.
    """
    config = read_json(hf_config_path)
    inputs = {value.name: value for value in prompt.graph.input}
    dims = {name: tuple(dim.dim_value for dim in value.type.tensor_type.shape.dim) for name, value in inputs.items()}
    for name, rank in ((INPUT_IDS, 2), (MASK, 3), (POS_COS, 4), (POS_SIN, 4)):
        if len(dims.get(name, ())) != rank:
            raise GenieBuildError(prompt_path, f"input {name!r} of rank {rank} expected (Genie's IO contract), "
                                               f"found {dims.get(name)}")
    rope = read_rope(config, hf_config_path)   # either HF layout, as genie_config writes it for Genie
    theta, scaling = float(rope.theta), rope.scaling
    try:
        rope_tables(2, theta, [0], scaling)
    except (ValueError, KeyError) as exc:
        raise GenieBuildError(hf_config_path, f"RoPE scaling {scaling}: {exc}") from None
    logits = next((value for value in prompt.graph.output if value.name == LOGITS), None)
    vocab = logits.type.tensor_type.shape.dim[-1].dim_value if logits is not None else int(config["vocab_size"])
    return FeedShape(ar=dims[INPUT_IDS][1], context=dims[MASK][2], rope_theta=theta, rope_scaling=scaling,
                     head_dim=2 * dims[POS_COS][3],
                     ids_dtype=onnx.helper.tensor_dtype_to_np_dtype(inputs[INPUT_IDS].type.tensor_type.elem_type),
                     caches={name: shape for name, shape in dims.items() if KV_TENSOR.match(name)}, vocab=vocab)


def corpus_token_ids(corpus_path: str | Path, tokenizer_path: str | Path, vocab: int) -> np.ndarray:
    """The corpus as token ids of the model's tokenizer (Hugging Face ``tokenizers``).

    Raises:
        GenieBuildError: a file is missing or unreadable, the corpus has no tokens, or an id is outside the
            model's vocabulary.
    """
    from tokenizers import Tokenizer

    try:
        text = Path(corpus_path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GenieBuildError(corpus_path, f"cannot read the calibration text: {exc}") from None
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
    except Exception as exc:  # tokenizers raises its own Exception subclass for every problem
        raise GenieBuildError(tokenizer_path, f"not a tokenizers tokenizer.json: {exc}") from None
    ids = np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)
    if ids.size == 0:
        raise GenieBuildError(corpus_path, "the calibration text gives no tokens")
    if ids.max() >= vocab:
        raise GenieBuildError(tokenizer_path, f"token id {int(ids.max())} is outside the model's vocabulary "
                                              f"of {vocab}")
    return ids


def windows(ids: np.ndarray, ar: int, count: int) -> Iterator[np.ndarray]:
    """``count`` consecutive windows of ``ar`` tokens, the text read again from its start if it runs out."""
    needed = ar * count
    stream = np.resize(ids, needed) if ids.size < needed else ids[:needed]
    yield from stream.reshape(count, ar)


def text_forward_pass(shape: FeedShape, ids: np.ndarray, num_samples: int) -> ForwardPass:
    """A forward pass over ``num_samples`` windows of ``ids``, fed as Genie feeds its prompt graph: window k at
    positions ``past_len .. past_len + AR - 1`` with the causal mask, RoPE tables, and the KV cache holding what
    the graph itself output for the windows before it in the same sequence (new entries written at
    ``past_len``). When the cache has no room for another window the next window starts a new sequence
    (empty cache, position 0), as a new conversation would."""
    past = shape.context - shape.ar

    def run(session: Any) -> None:
        caches = {name: np.zeros(dims, np.float32) for name, dims in shape.caches.items()}
        past_len = 0
        for window in windows(ids, shape.ar, num_samples):
            if past_len > past:
                caches = {name: np.zeros_like(cache) for name, cache in caches.items()}
                past_len = 0
            feed = genie_feed(shape, window, past_len, caches)
            outputs = session_outputs(session, feed)
            for name in caches:
                write_new_entries(caches[name], outputs[kv_name(*_kv_kind_layer(name), "out")], name, past_len)
            past_len += shape.ar

    return run


def genie_feed(shape: FeedShape, window: np.ndarray, past_len: int, caches: Mapping[str, np.ndarray]
               ) -> dict[str, np.ndarray]:
    """The prompt graph's feed for ``window`` (AR token ids) after ``past_len`` cached tokens."""
    cos, sin = rope_tables(shape.head_dim, shape.rope_theta, np.arange(past_len, past_len + shape.ar),
                           shape.rope_scaling)
    return {INPUT_IDS: np.asarray(window)[None].astype(shape.ids_dtype),
            MASK: causal_mask(shape.ar, shape.context, past_len), POS_COS: cos, POS_SIN: sin, **caches}


def session_outputs(session: Any, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a sim's session: its outputs by the graph's output names (AIMET renames a quantized output
    ``<name>_updated``, aimet_onnx quantsim ``_insert_quantizer``)."""
    names = [output.name for output in session.get_outputs()]
    return {name.removesuffix(AIMET_OUTPUT_SUFFIX): value for name, value in zip(names, session.run(None, dict(feed)))}


def _kv_kind_layer(name: str) -> tuple[str, int]:
    match = KV_TENSOR.match(name)
    return match.group(1), int(match.group(2))


def write_new_entries(cache: np.ndarray, new: np.ndarray, name: str, past_len: int) -> None:
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


def quantize(prompt_path: str | Path, token_path: str | Path, out_prompt: str | Path, out_token: str | Path, *,
             hf_config_path: str | Path, tokenizer_path: str | Path, corpus_path: str | Path, recipe: str,
             num_samples: int = DEFAULT_NUM_SAMPLES) -> tuple[Encodings, Encodings]:
    """The ``quantize`` command: both graphs' AIMET encodings by ``recipe``, calibrated on ``num_samples``
    windows of the corpus.

    Raises:
        GenieBuildError: a bad recipe, ``num_samples < 1``, or any of the problems of :func:`feed_shape`,
            :func:`corpus_token_ids` and :func:`quantize_pair`.
    """
    chosen = recipe_named(recipe)
    if num_samples < 1:
        raise GenieBuildError("--num-samples", f"must be at least 1, got {num_samples}")
    prompt = Path(prompt_path)
    shape = feed_shape(load_graph(prompt), prompt, Path(hf_config_path))
    ids = corpus_token_ids(corpus_path, tokenizer_path, shape.vocab)
    require_aimet()  # after the inputs are read: importing aimet-onnx (and torch) takes seconds, a bad input does not
    return quantize_pair(prompt, token_path, out_prompt, out_token, recipe=chosen,
                         forward_pass=text_forward_pass(shape, ids, num_samples))


def feeds_forward_pass(feeds: Sequence[Mapping[str, np.ndarray]] | Iterator[Mapping[str, np.ndarray]]
                       ) -> ForwardPass:
    """A forward pass over given feeds (the demo's deterministic random ones)."""
    def run(session: Any) -> None:
        for feed in feeds:
            session.run(None, dict(feed))

    return run
