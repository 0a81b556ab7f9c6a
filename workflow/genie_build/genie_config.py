"""``genie_config.json`` and ``htp_backend_ext_config.json`` for a Genie bundle.

The keys and their mandatory sets follow Genie's ``Dialog.cpp`` validation and the files AIHM and AIHA ship
(AIHM's ``llm_helpers.create_genie_config``). RoPE is always ``model.positional-encoding`` (``type: rope``, ``rope-dim``,
``rope-theta``, and ``rope-scaling`` copied from the HF config when the model scales its RoPE), the style
qairt-dev's own LLM builder writes for every RoPE model (``gen_ai_builder_htp.py``; its Genie config model is
``modules/genie_execution/genie_config.py``) -- never also ``QnnHtp.pos-id-dim``/``rope-theta``, the older style
of AIHA's Qwen config, because Genie rejects both at once.

The keys Genie knows, requires and types are defined once, here beside the writer (:data:`GENIE_CONFIG_SECTIONS`):
:mod:`genie_build.bundle.check_bundle` checks every bundle's ``genie_config.json`` by them, and by Genie itself where
the vendor's library is installed (:mod:`genie_build.bundle.check_vendor`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from genie_build.chipsets import lookup
from genie_build.errors import GenieBuildError
from genie_build.fileio import is_json_int, is_json_number, read_text
from genie_build.hf_config import head_dim, read_rope, rope_kind
from genie_build.htp_extensions import group_context
from genie_build.units import MIB

__all__ = ["BINARY_SOURCES", "EXPECTED_VALUES", "GENIE_CONFIG_NAME", "GENIE_CONFIG_SECTIONS", "GENIE_ROPE_SCALING_KEYS",
           "GENIE_ROPE_TYPES", "GenieSection", "HTP_EXT_CONFIG_NAME", "JsonType", "MAX_TOKENIZER_BYTES",
           "ROPE_SCALING_TYPES", "TOKENIZER_NAME", "genie_rope_scaling", "load_tokenizer", "make_genie_config",
           "make_htp_backend_ext_config", "sampler_problem"]

GENIE_CONFIG_NAME = "genie_config.json"
HTP_EXT_CONFIG_NAME = "htp_backend_ext_config.json"
TOKENIZER_NAME = "tokenizer.json"

# Real tokenizer.json files are 2-35 MB (Qwen, Llama 3, Gemma): anything far larger is not one.
MAX_TOKENIZER_BYTES = 256 * MIB
DEFAULT_N_THREADS = 3
DEFAULT_SAMPLER = {"version": 1, "seed": 42, "temp": 0.8, "top-k": 40, "top-p": 0.95}

# HF rope type -> Genie rope-type (Dialog.cpp validateRopeScalingConfig).
GENIE_ROPE_TYPES = {"llama3": "llama3", "longrope": "longrope", "linear": "linear", "yarn": "yarnrope"}
# HF rope-scaling key -> Genie rope-scaling key; keys not listed here have no Genie equivalent.
GENIE_ROPE_SCALING_KEYS = {
    "factor": "factor",
    "low_freq_factor": "low-freq-factor",
    "high_freq_factor": "high-freq-factor",
    "original_max_position_embeddings": "original-max-position-embeddings",
    "long_factor": "long-factor",
    "short_factor": "short-factor",
    "beta_fast": "beta-fast",
    "beta_slow": "beta-slow",
    "attention_factor": "attn-factor",
}
# Keys of an HF rope dict that describe the kind of RoPE rather than a scaling parameter (a partial rotary factor
# other than 1 is refused before any job: Genie rotates the whole head).
_ROPE_DESCRIPTOR_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


def genie_rope_scaling(scaling: dict[str, Any], where: str | os.PathLike[str]) -> dict[str, Any]:
    """HF rope-scaling parameters -> Genie's ``rope-scaling`` object (values copied, never invented).

    Raises:
        GenieBuildError: a rope type or parameter Genie has no equivalent for.
    """
    hf_type = rope_kind(scaling)
    if hf_type not in GENIE_ROPE_TYPES:
        raise GenieBuildError(where, f"rope type {hf_type!r} is not supported by Genie "
                                     f"(supported: {', '.join(GENIE_ROPE_TYPES)})")
    result: dict[str, Any] = {"rope-type": GENIE_ROPE_TYPES[hf_type]}
    for key, value in scaling.items():
        if key in _ROPE_DESCRIPTOR_KEYS:
            continue
        if key not in GENIE_ROPE_SCALING_KEYS:
            raise GenieBuildError(where, f"rope scaling parameter {key!r} has no Genie equivalent "
                                         f"(known: {', '.join(GENIE_ROPE_SCALING_KEYS)})")
        result[GENIE_ROPE_SCALING_KEYS[key]] = value
    return result


def _special_token_ids(hf_config: dict, tokenizer_path: str | os.PathLike[str],
                       where: str | os.PathLike[str]) -> tuple[int, int | list[int]]:
    """``(bos, eos)`` from the HF config, each checked to be an added token of ``tokenizer.json``.

    Returns:
        bos as an int; eos as an int or a list of ints (as the HF config gives it).

    Raises:
        GenieBuildError: an id missing from the HF config (naming it), or absent from the tokenizer's added
            tokens (naming the tokenizer).
    """
    bos, eos = hf_config.get("bos_token_id"), hf_config.get("eos_token_id")
    if not is_json_int(bos):
        raise GenieBuildError(where, f"bos_token_id must be an integer token id, got {bos!r}")
    eos_ids = eos if isinstance(eos, list) else [eos]
    if not eos_ids or not all(is_json_int(token) for token in eos_ids):
        raise GenieBuildError(where, f"eos_token_id must be an integer or a list of integers, got {eos!r}")
    added = _added_token_ids(tokenizer_path)
    for label, token in [("bos_token_id", bos)] + [("eos_token_id", token) for token in eos_ids]:
        if token not in added:
            raise GenieBuildError(tokenizer_path, f"{label} {token} (from {os.fspath(where)}) is not an added "
                                                  f"token of this tokenizer (added ids: {sorted(added)})")
    return bos, eos


def _added_token_ids(tokenizer_path: str | os.PathLike[str]) -> set[int]:
    """Ids of the tokenizer's added (special) tokens.

    Raises:
        GenieBuildError: the file is missing or is not a tokenizer the ``tokenizers`` library can load.
    """
    return set(load_tokenizer(tokenizer_path).get_added_tokens_decoder())


def load_tokenizer(tokenizer_path: str | os.PathLike[str], *, inside: Iterable[str | os.PathLike[str]] | None = None
                   ) -> Tokenizer:
    """Load ``tokenizer.json``, turning every failure into a one-line GenieBuildError.

    The file is read as a regular file of at most :data:`MAX_TOKENIZER_BYTES` (and, with ``inside``, only inside
    those folders: :func:`genie_build.fileio.read_text`). The same unchanged file is parsed once per process.

    Raises:
        GenieBuildError: missing, not a regular file, too large, outside ``inside``, or not a tokenizer.
    """
    if not os.path.lexists(tokenizer_path):
        raise GenieBuildError(tokenizer_path, "tokenizer not found")
    text = read_text(tokenizer_path, inside=inside, max_bytes=MAX_TOKENIZER_BYTES)
    try:
        return _parsed_tokenizer(text)
    except Exception as exc:  # the library raises a bare Exception for every parse error
        raise GenieBuildError(tokenizer_path, f"not a tokenizers JSON file: {' '.join(str(exc).split())}") from None


@functools.lru_cache(maxsize=2)
def _parsed_tokenizer(text: str) -> Tokenizer:
    return Tokenizer.from_str(text)


# --- the keys Genie reads: what check-bundle checks a genie_config.json against (tests/test_genie_config.py checks
# make_genie_config's output against them) ------------------------------------------------------------------

@dataclass(frozen=True)
class JsonType:
    """A JSON value type as a config key must have it: ``name`` as messages say it, ``accepts`` the check."""

    name: str
    accepts: Callable[[Any], bool]


INT = JsonType("int", lambda value: is_json_int(value))
NON_NEGATIVE_INT = JsonType("int >= 0", lambda value: is_json_int(value) and value >= 0)
NUMBER = JsonType("number", lambda value: is_json_number(value))
NON_NEGATIVE_NUMBER = JsonType("number >= 0", lambda value: is_json_number(value) and value >= 0)
BOOL = JsonType("bool", lambda value: isinstance(value, bool))
STR = JsonType("str", lambda value: isinstance(value, str))
OBJECT = JsonType("object", lambda value: isinstance(value, dict))
STRS = JsonType("str[]", lambda value: isinstance(value, list) and all(isinstance(item, str) for item in value))
INT_OR_INTS = JsonType("int|int[]", lambda value: is_json_int(value) or (isinstance(value, list) and bool(value)
                                                                    and all(is_json_int(item) for item in value)))


@dataclass(frozen=True)
class GenieSection:
    """A JSON object Genie validates: the keys it requires, the others it knows, key types."""

    mandatory: frozenset[str]
    optional: frozenset[str]
    types: Mapping[str, JsonType]

    @property
    def known(self) -> frozenset[str]:
        return self.mandatory | self.optional


def _keys(*names: str) -> frozenset[str]:
    return frozenset(names)


# Dotted path -> section: the keys Genie 2.51 (libGenie API 1.21, the onnxruntime-qnn 2.7.0 wheel) accepts in a
# basic dialog, from the JSON schemas it embeds (urn:genie:schema:dialog, dialogContext, sampler, htpBackend,
# engineModelBinary, enginePositionalEncoding, tokenEmbedding). genie-build checks basic dialogs of QnnHtp ctx-bins
# (EXPECTED_VALUES), so the blocks Genie allows only with another dialog type, backend or model type (ssd-q1, lade,
# spd, kv-share, multistream, eaglet; QnnGenAiTransformer, GTE, QnnGpu; library, checkpoint) and engine.role (for
# spd, kv-share and eaglet only) are unknown here, and QnnHtp and binary are mandatory. tests/test_genie_library.py
# compares this table with the schemas read from the installed library.
GENIE_CONFIG_SECTIONS: dict[str, GenieSection] = {
    "dialog": GenieSection(
        _keys("version", "type", "context", "tokenizer", "engine"),
        _keys("sampler", "embedding", "perlayer-embedding", "stop-sequence", "max-num-tokens", "harmony", "debug",
              "nested-generator", "nested-policy", "accumulator-size", "callback-type"),
        {"version": INT, "type": STR, "sampler": OBJECT, "embedding": OBJECT, "stop-sequence": STRS,
         "max-num-tokens": NON_NEGATIVE_INT}),
    "dialog.context": GenieSection(
        _keys("version", "bos-token", "eos-token", "size", "n-vocab"),
        _keys("eot-token", "img-token", "draft-n-vocab", "pad-token", "n-embd", "embedding-length", "grammar"),
        {"version": INT, "bos-token": INT, "eos-token": INT_OR_INTS, "size": NON_NEGATIVE_INT,
         "n-vocab": NON_NEGATIVE_INT, "eot-token": INT, "draft-n-vocab": NON_NEGATIVE_INT, "pad-token": INT,
         "n-embd": NON_NEGATIVE_INT, "embedding-length": INT, "grammar": OBJECT}),
    "dialog.sampler": GenieSection(
        _keys("version"), _keys("type", "seed", "temp", "top-k", "top-p", "greedy", "callback-name", "token-penalty"),
        {"version": INT, "type": STR, "seed": INT, "temp": NON_NEGATIVE_NUMBER, "top-k": NON_NEGATIVE_INT,
         "top-p": NON_NEGATIVE_NUMBER, "greedy": BOOL, "callback-name": STR, "token-penalty": OBJECT}),
    "dialog.tokenizer": GenieSection(_keys("version", "path"), _keys(), {"version": INT, "path": STR}),
    "dialog.engine": GenieSection(
        _keys("version", "backend", "model", "n-threads"),
        _keys("type", "longcontext", "cache-groups", "training-config", "optimizer-config", "batching"),
        {"version": INT, "n-threads": NON_NEGATIVE_INT, "backend": OBJECT, "model": OBJECT, "type": STR,
         "longcontext": OBJECT, "batching": OBJECT}),
    "dialog.engine.backend": GenieSection(
        _keys("version", "type", "QnnHtp"), _keys("extensions", "device"),
        {"version": INT, "type": STR, "extensions": STR, "device": STR, "QnnHtp": OBJECT}),
    "dialog.engine.backend.QnnHtp": GenieSection(
        _keys("version", "spill-fill-bufsize", "mmap-budget", "use-mmap", "cpu-mask", "poll"),
        _keys("data-alignment-size", "pos-id-dim", "kv-dim", "batch-size", "batch-multiplier", "kv-update-method",
              "allow-async-init", "allow-async-enqueue", "rope-theta", "enable-graph-switching", "shared-engine",
              "graph-switching-lora-policy", "graph-retention-order", "weight-shared-lora", "skip-lora-validation",
              "multi-nsp-prefill", "execute-select-graphs", "direct-io"),
        {"version": INT, "spill-fill-bufsize": NON_NEGATIVE_INT, "mmap-budget": NON_NEGATIVE_INT, "use-mmap": BOOL,
         "cpu-mask": STR, "poll": BOOL, "pos-id-dim": INT, "kv-dim": INT, "batch-size": NON_NEGATIVE_INT,
         "batch-multiplier": NON_NEGATIVE_INT, "allow-async-init": BOOL, "allow-async-enqueue": BOOL,
         "rope-theta": NUMBER, "enable-graph-switching": BOOL, "shared-engine": BOOL, "graph-retention-order": STRS,
         "weight-shared-lora": BOOL, "skip-lora-validation": BOOL, "multi-nsp-prefill": BOOL,
         "execute-select-graphs": STRS, "kv-update-method": STR, "data-alignment-size": NON_NEGATIVE_INT,
         "direct-io": BOOL}),
    "dialog.engine.model": GenieSection(
        _keys("version", "type", "binary"),
        _keys("mask-type", "cross-attention", "positional-encoding", "draft-token-map", "linear-attention"),
        {"version": INT, "type": STR, "binary": OBJECT, "mask-type": STR, "cross-attention": BOOL,
         "draft-token-map": STR, "linear-attention": BOOL}),
    "dialog.engine.model.binary": GenieSection(_keys("version"), _keys("ctx-bins", "fcb", "lora"),
                                               {"version": INT, "ctx-bins": STRS, "fcb": STRS}),
    # Genie also takes a list of these (one per cache group); the table checks the object form genie-build writes
    "dialog.engine.model.positional-encoding": GenieSection(
        _keys("type"), _keys("rope-dim", "rope-theta", "rope-scaling", "rope-freqs-type", "prefix"),
        {"type": STR, "rope-dim": INT, "rope-theta": NUMBER, "rope-scaling": OBJECT, "rope-freqs-type": STR,
         "prefix": STR}),
    "dialog.engine.model.positional-encoding.rope-scaling": GenieSection(
        _keys(),
        _keys("rope-type", "factor", "low-freq-factor", "high-freq-factor", "original-max-position-embeddings",
              "time-step", "spatial-merge-size", "dim", "extrapolation-factor", "attn-factor", "beta-fast",
              "beta-slow", "partial-rotary-factor", "short-factor", "long-factor", "mrope-section"),
        {"rope-type": STR, "factor": NUMBER, "low-freq-factor": NUMBER, "high-freq-factor": NUMBER,
         "original-max-position-embeddings": NUMBER, "attn-factor": NUMBER, "beta-fast": NUMBER,
         "beta-slow": NUMBER, "partial-rotary-factor": NUMBER}),
    "dialog.embedding": GenieSection(
        _keys("version", "size"), _keys("type", "datatype", "lut-path", "quant-param"),
        {"version": INT, "size": NON_NEGATIVE_INT, "type": STR, "datatype": STR, "lut-path": STR,
         "quant-param": OBJECT}),
}
# section -> key -> the one value genie-build's checks understand (Genie accepts others, checked differently)
EXPECTED_VALUES = {"dialog": {"type": "basic"}, "dialog.engine.backend": {"type": "QnnHtp"},
                   "dialog.engine.model": {"type": "binary"}}
# Genie 2.51's rope-scaling.rope-type values (the vision models' types only in their -mrope form)
ROPE_SCALING_TYPES = ("llama3", "default", "longrope", "qwen2vl-mrope", "qwen3vl-mrope", "yarnrope", "linear",
                      "hunyuan", "proportional")
BINARY_SOURCES = ("ctx-bins", "fcb")  # exactly one (engineModelBinary's oneOf)


def sampler_problem(sampler: Mapping[str, Any]) -> str | None:
    """Why Genie would not honour the sampler's ``greedy: true``, or None.

    Genie 2.51 ignores ``greedy``: its sampler, given the same logits, draws the same tokens with it as without it
    (docs/genie-checks.md); only ``top-k: 1`` or ``temp: 0`` make it pick the most likely token every time.
    """
    if sampler.get("greedy") is not True or sampler.get("top-k") == 1 or sampler.get("temp") == 0:
        return None
    settings = ", ".join(f"{key} {sampler[key]}" for key in ("temp", "top-k", "top-p") if key in sampler)
    return (f"sampler.greedy is true, but Genie ignores it and samples ({settings or 'its defaults'}): deterministic "
            "output needs top-k 1 (or temp 0)")


def make_genie_config(hf_config: dict, tokenizer_path: str | os.PathLike[str], ctx_bins: list[str],
                      context_size: int, *, hf_config_path: str | os.PathLike[str] = "config.json",
                      n_threads: int = DEFAULT_N_THREADS, share_resources: bool = False,
                      graph_switching: bool | None = None, embedding: Mapping[str, Any] | None = None,
                      spill_fill_bufsize: int = 0) -> dict:
    """The whole ``genie_config.json`` for a basic dialog over ``ctx_bins`` (bundle file names, part order).

    Args:
        hf_config: the model's HF ``config.json`` contents.
        tokenizer_path: the ``tokenizer.json`` that goes in the bundle (bos/eos are checked against it).
        ctx_bins: ctx-bin file names in part order.
        context_size: ``dialog.context.size``; check-bundle checks it against the compiled CL.
        hf_config_path: where ``hf_config`` came from, for error messages.
        n_threads: ``engine.n-threads``.
        share_resources: initialize the contexts asynchronously (``allow-async-init``), the path on which Genie
            applies the extension config's ``groupContext`` (:mod:`genie_build.htp_extensions`).
        graph_switching: ``bundle.graph_switching``: QnnHtp ``enable-graph-switching``; None: the key is not
            written (Genie's default).
        embedding: ``dialog.embedding`` when the embedding is a CPU table
            (:func:`genie_build.bundle.embedding_table.dialog_embedding`); None: the embedding is part 1's graph.
        spill_fill_bufsize: QnnHtp ``spill-fill-bufsize``: the largest spill-fill buffer a graph of the bundle needs,
            as its binaries say (0: none, or not told).

    Raises:
        GenieBuildError: naming the HF config or the tokenizer (see :func:`read_rope`,
            :func:`_special_token_ids`, :func:`head_dim`).
    """
    vocab = hf_config.get("vocab_size")
    if not (is_json_int(vocab) and vocab > 0):
        raise GenieBuildError(hf_config_path, f"vocab_size must be a positive integer, got {vocab!r}")
    if not (is_json_int(context_size) and context_size > 0):
        raise GenieBuildError("context_size", f"must be a positive integer, got {context_size!r}")
    if not ctx_bins:
        raise GenieBuildError("ctx_bins", "a bundle needs at least one ctx-bin")
    bos, eos = _special_token_ids(hf_config, tokenizer_path, hf_config_path)
    kv_dim = head_dim(hf_config, hf_config_path)
    rope = read_rope(hf_config, hf_config_path)
    qnn_htp: dict[str, Any] = {"version": 1, "use-mmap": True, "spill-fill-bufsize": spill_fill_bufsize,
                               "mmap-budget": 0, "poll": True, "cpu-mask": "0xe0", "kv-dim": kv_dim, "allow-async-init": share_resources}
    if graph_switching is not None:
        qnn_htp["enable-graph-switching"] = graph_switching
    model: dict[str, Any] = {"version": 1, "type": "binary", "binary": {"version": 1, "ctx-bins": list(ctx_bins)}}
    model["positional-encoding"] = {"type": "rope", "rope-dim": kv_dim // 2, "rope-theta": _genie_theta(rope.theta)}
    if rope.scaling is not None:
        model["positional-encoding"]["rope-scaling"] = genie_rope_scaling(rope.scaling, hf_config_path)
    dialog: dict[str, Any] = {
        "version": 1,
        "type": "basic",
        "context": {"version": 1, "size": context_size, "n-vocab": vocab, "bos-token": bos, "eos-token": eos},
        "sampler": dict(DEFAULT_SAMPLER),
        "tokenizer": {"version": 1, "path": TOKENIZER_NAME},
        "engine": {"version": 1, "n-threads": n_threads,
                   "backend": {"version": 1, "type": "QnnHtp", "QnnHtp": qnn_htp,
                               "extensions": HTP_EXT_CONFIG_NAME},
                   "model": model},
    }
    if embedding is not None:
        dialog["embedding"] = dict(embedding)
    return {"dialog": dialog}


def make_htp_backend_ext_config(chipset: str, *, share_resources: bool = False) -> dict:
    """``htp_backend_ext_config.json`` for ``chipset`` (a name in :mod:`genie_build.chipsets`), as AIHM writes it;
    with ``share_resources`` also the ``groupContext`` the ChatApp of quic/ai-hub-apps writes
    (:mod:`genie_build.htp_extensions`).

    Raises:
        GenieBuildError: unknown chipset (from the chipset table).
    """
    chip = lookup(chipset)
    config: dict[str, Any] = {
        "devices": [{"soc_model": chip.soc_model, "dsp_arch": chip.dsp_arch,
                     "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 100}]}],
        "memory": {"mem_type": "shared_buffer"},
        "context": {"weight_sharing_enabled": True},
    }
    if share_resources:
        config["groupContext"] = group_context()
    return config


def _genie_theta(theta: float) -> int | float:
    """Genie configs carry integral thetas as integers (AIHM writes ``int(rope_theta)``); keep fractions."""
    return int(theta) if float(theta).is_integer() else theta
