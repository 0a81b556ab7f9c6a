"""A Hugging Face ``config.json`` as genie-build reads it: the one reader of its dimensions, RoPE and head size, for
every family genie-build knows and both layouts transformers writes (transformers 4: ``rope_theta`` and
``rope_scaling`` at the top level; transformers 5: ``rope_parameters``). The export, the plans, the estimate, the
calibrators, the Genie config and check-bundle all read a config.json through it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from genie_build.errors import GenieBuildError
from genie_build.fileio import is_json_int, is_json_number, read_json

__all__ = ["SHAPED_MODEL_TYPES", "ModelShape", "Rope", "head_dim", "load_hf_config", "read_model_shape", "read_rope",
           "rope_kind"]

MAX_HF_CONFIG_BYTES = 16 * 1024**2  # a config.json is a few kB
# Families whose decoder layers the shape reader names and sizes (the estimate also takes Mistral's, which is
# Llama's layer).
SHAPED_MODEL_TYPES = ("qwen2", "llama", "mistral", "qwen3")


@dataclass(frozen=True)
class Rope:
    """RoPE as the HF config describes it: ``scaling`` is None for plain RoPE, else its HF parameters."""

    theta: float
    scaling: dict[str, Any] | None


def load_hf_config(path: str | os.PathLike[str]) -> dict:
    """Read an HF ``config.json``.

    Raises:
        GenieBuildError: missing, not JSON, or not a JSON object.
    """
    config = read_json(path, max_bytes=MAX_HF_CONFIG_BYTES)
    if not isinstance(config, dict):
        raise GenieBuildError(path, f"an HF config must be a JSON object, got {type(config).__name__}")
    return config


def head_dim(hf_config: dict, where: str | os.PathLike[str]) -> int:
    """``head_dim`` if the config gives it, else ``hidden_size // num_attention_heads``."""
    explicit = hf_config.get("head_dim")
    if is_json_int(explicit) and explicit > 0:
        return explicit
    hidden, heads = hf_config.get("hidden_size"), hf_config.get("num_attention_heads")
    if not (is_json_int(hidden) and is_json_int(heads) and hidden > 0 and heads > 0 and hidden % heads == 0):
        raise GenieBuildError(where, f"cannot derive head_dim: head_dim={explicit!r}, "
                                     f"hidden_size={hidden!r}, num_attention_heads={heads!r}")
    return hidden // heads


def read_rope(hf_config: dict, where: str | os.PathLike[str]) -> Rope:
    """RoPE theta and scaling from either HF layout: ``rope_theta`` + ``rope_scaling`` (transformers 4)
    or ``rope_parameters`` (transformers 5).

    Raises:
        GenieBuildError: no theta; the two layouts disagree (plain RoPE in one, scaled in the other, or two
            thetas) — the config then states both rope styles and Genie could only be given one.
    """
    legacy_scaling = hf_config.get("rope_scaling")
    parameters = hf_config.get("rope_parameters")
    for key, value in (("rope_scaling", legacy_scaling), ("rope_parameters", parameters)):
        if value is not None and not isinstance(value, dict):
            raise GenieBuildError(where, f"{key} must be an object or null, got {value!r}")
    described = {key: value for key, value in (("rope_scaling", legacy_scaling),
                                                ("rope_parameters", parameters)) if value}
    kinds = {key: rope_kind(value) for key, value in described.items()}
    if len(set(kinds.values())) > 1:
        raise GenieBuildError(where, "states both rope styles: " + ", ".join(
            f"{key} says {kind!r}" for key, kind in kinds.items()) + "; keep one")
    thetas = {key: value for key, value in (("rope_theta", hf_config.get("rope_theta")),
                                             ("rope_parameters.rope_theta", (parameters or {}).get("rope_theta")))
              if value is not None}
    if not thetas:
        raise GenieBuildError(where, "no rope_theta (neither rope_theta nor rope_parameters.rope_theta)")
    if len(set(thetas.values())) > 1 or not all(is_json_number(v) and v > 0 for v in thetas.values()):
        raise GenieBuildError(where, f"rope theta must be one positive number, got {thetas}")
    scaled = next((value for value in described.values() if rope_kind(value) != "default"), None)
    return Rope(theta=next(iter(thetas.values())), scaling=scaled)


@dataclass(frozen=True)
class ModelShape:
    """A decoder's dimensions and the optional weights of its layers, as its ``config.json`` states them."""

    model_type: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool          # the LM head is the embedding table (the export writes it as its own copy)
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool       # a norm on each head's queries and keys (Qwen3)


def read_model_shape(config: Mapping[str, Any], where: str | os.PathLike[str]) -> ModelShape:
    """The shape of a Qwen2, Llama, Mistral or Qwen3 ``config.json`` (either transformers layout).

    Raises:
        GenieBuildError: another model type, or a dimension that is missing or not a positive integer (named).
    """
    model_type = config.get("model_type")
    if model_type not in SHAPED_MODEL_TYPES:
        raise GenieBuildError(where, f"model_type {model_type!r} is not supported "
                                     f"(supported: {', '.join(SHAPED_MODEL_TYPES)})")
    keys = {"layers": "num_hidden_layers", "hidden": "hidden_size", "intermediate": "intermediate_size",
            "heads": "num_attention_heads", "vocab": "vocab_size"}
    dims = {field_: _positive_int(config, key, where) for field_, key in keys.items()}
    kv_heads = (_positive_int(config, "num_key_value_heads", where) if config.get("num_key_value_heads") is not None
                else dims["heads"])
    attention_bias = bool(config.get("attention_bias", False))
    return ModelShape(model_type=model_type, **dims, kv_heads=kv_heads, head_dim=head_dim(dict(config), where),
                      tied=bool(config.get("tie_word_embeddings", False)),
                      qkv_bias=model_type == "qwen2" or attention_bias,
                      o_bias=model_type != "qwen2" and attention_bias, mlp_bias=bool(config.get("mlp_bias", False)),
                      qk_norm=model_type == "qwen3")


def _positive_int(config: Mapping[str, Any], key: str, where: str | os.PathLike[str]) -> int:
    value = config.get(key)
    if not (is_json_int(value) and value > 0):
        raise GenieBuildError(where, f"{key} must be a positive integer, got {value!r}")
    return value


def rope_kind(rope: dict[str, Any]) -> str:
    """The HF rope type of a ``rope_scaling``/``rope_parameters`` dict ("default" when unnamed)."""
    return str(rope.get("rope_type") or rope.get("type") or "default")
