"""A Hugging Face ``config.json`` as genie-build reads it: the one reader of its dimensions, RoPE, head size and the
tensors it implies, for every family :mod:`genie_build.families` registers and both layouts transformers writes
(transformers 4: ``rope_theta`` and ``rope_scaling`` at the top level; transformers 5: ``rope_parameters``). The
export, the plans, the estimate, the calibrators, the Genie config and check-bundle all read a config.json through
it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from genie_build.conventions import EMBED_WEIGHT, FINAL_NORM_WEIGHT, LM_HEAD_WEIGHT
from genie_build.errors import GenieBuildError
from genie_build.families import FAMILIES, Family, family_of
from genie_build.fileio import is_json_int, is_json_number, read_json
from genie_build.units import MIB

__all__ = ["ModelShape", "Rope", "StoredTensor", "head_dim", "load_hf_config", "read_model_shape", "read_rope",
           "rope_kind", "shape_of", "stored_tensors", "supported_text"]

MAX_HF_CONFIG_BYTES = 16 * MIB  # a config.json is a few kB


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


def head_dim(hf_config: Mapping[str, Any], where: str | os.PathLike[str]) -> int:
    """``head_dim`` if the config gives it, else transformers' default for the family (Qwen3: 128), else
    ``hidden_size // num_attention_heads``."""
    explicit = hf_config.get("head_dim")
    if explicit is None:
        family = family_of(hf_config.get("model_type"))
        explicit = family.defaults.get("head_dim") if family else None
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
    if scaled is not None and rope_kind(scaled) == "longrope":
        scaled = _longrope_parameters(scaled, hf_config, where)
    return Rope(theta=next(iter(thetas.values())), scaling=scaled)


def _longrope_parameters(scaling: dict[str, Any], hf_config: Mapping[str, Any], where: str | os.PathLike[str]
                         ) -> dict[str, Any]:
    """LongRoPE's parameters as transformers completes them: ``original_max_position_embeddings`` from the top level
    (Phi-3's configs state it there), ``factor`` as max_position_embeddings over it when not given.

    Raises:
        GenieBuildError: no original_max_position_embeddings, or no factor and no max_position_embeddings.
    """
    completed = dict(scaling)
    original = completed.setdefault("original_max_position_embeddings",
                                    hf_config.get("original_max_position_embeddings"))
    limit = hf_config.get("max_position_embeddings")
    if not (is_json_int(original) and original > 1):
        raise GenieBuildError(where, f"longrope needs original_max_position_embeddings, got {original!r}")
    if completed.get("factor") is None:
        if not (is_json_int(limit) and limit > 0):
            raise GenieBuildError(where, "longrope without factor needs max_position_embeddings")
        completed["factor"] = limit / original
    return completed


@dataclass(frozen=True)
class ModelShape:
    """A decoder's dimensions and the optional weights of its layers, as its ``config.json`` states them."""

    family: Family
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool          # the LM head is the embedding table (the export writes it as its own copy)
    biases: frozenset[str]   # the projections (module paths) that have a bias

    @property
    def model_type(self) -> str:
        return self.family.model_type

    def width(self, name: str) -> int:
        """A :data:`genie_build.families.Width` of this model."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"hidden": self.hidden, "q": q, "kv": kv, "inter": self.intermediate, "qkv": q + 2 * kv,
                "gate_up": 2 * self.intermediate}[name]


def supported_text() -> str:
    """The families the export builds, for a refusal."""
    return ", ".join(f"{family.model_type} ({family.architecture})" for family in FAMILIES.values())


def read_model_shape(config: Mapping[str, Any], where: str | os.PathLike[str]) -> ModelShape:
    """The shape of a ``config.json`` of a registered family (either transformers layout).

    Raises:
        GenieBuildError: another model type, or a dimension that is missing or not a positive integer (named).
    """
    model_type = config.get("model_type")
    family = family_of(model_type)
    if family is None:
        raise GenieBuildError(where, f"model_type {model_type!r} is not supported (supported: {supported_text()})")
    keys = {"layers": "num_hidden_layers", "hidden": "hidden_size", "intermediate": "intermediate_size",
            "heads": "num_attention_heads", "vocab": "vocab_size"}
    dims = {field_: _positive_int(config, key, where) for field_, key in keys.items()}
    kv_heads = (_positive_int(config, "num_key_value_heads", where) if config.get("num_key_value_heads") is not None
                else dims["heads"])
    biases = frozenset(projection.module for projection in family.projections
                       if projection.bias is True or (isinstance(projection.bias, str)
                                                      and bool(config.get(projection.bias, False))))
    return ModelShape(family=family, **dims, kv_heads=kv_heads, head_dim=head_dim(config, where),
                      tied=bool(config.get("tie_word_embeddings", family.defaults.get("tie_word_embeddings", False))),
                      biases=biases)


def shape_of(model: str | os.PathLike[str] | ModelShape) -> ModelShape:
    """A model's shape: given (a checkpoint read once), or read from the ``config.json`` at ``model``.

    Raises:
        GenieBuildError: as :func:`load_hf_config` and :func:`read_model_shape`.
    """
    return model if isinstance(model, ModelShape) else read_model_shape(load_hf_config(model), model)


@dataclass(frozen=True)
class StoredTensor:
    """A tensor a checkpoint of this shape stores, as transformers stores it (a Linear weight ``[out, in]``), the
    piece that uses it (0 = embedding, i + 1 = layer i, L + 1 = head) and what it is."""

    name: str
    shape: tuple[int, ...]
    piece: int
    kind: Literal["embedding", "linear", "bias", "norm", "lm_head"]


def _layer_tensors(shape: ModelShape, layer: int) -> list[StoredTensor]:
    """The tensors of decoder layer ``layer``: its projections (and their biases), its norms."""
    prefix, piece = f"model.layers.{layer}", layer + 1
    tensors = []
    for projection in shape.family.projections:
        fan_in, fan_out = shape.width(projection.fan_in), shape.width(projection.fan_out)
        tensors.append(StoredTensor(f"{prefix}.{projection.module}.weight", (fan_out, fan_in), piece, "linear"))
        if projection.module in shape.biases:
            tensors.append(StoredTensor(f"{prefix}.{projection.module}.bias", (fan_out,), piece, "bias"))
    norms = [(norm, shape.hidden) for norm in ("input_layernorm", "post_attention_layernorm")]
    if shape.family.qk_norm:
        norms += [(f"self_attn.{norm}", shape.head_dim) for norm in ("q_norm", "k_norm")]
    return tensors + [StoredTensor(f"{prefix}.{norm}.weight", (width,), piece, "norm") for norm, width in norms]


def stored_tensors(shape: ModelShape) -> list[StoredTensor]:
    """Every tensor a checkpoint of ``shape`` stores, in model order (a tied checkpoint stores no LM head)."""
    head = shape.layers + 1
    tensors = [StoredTensor(EMBED_WEIGHT, (shape.vocab, shape.hidden), 0, "embedding")]
    for layer in range(shape.layers):
        tensors += _layer_tensors(shape, layer)
    tensors.append(StoredTensor(FINAL_NORM_WEIGHT, (shape.hidden,), head, "norm"))
    if not shape.tied:
        tensors.append(StoredTensor(LM_HEAD_WEIGHT, (shape.vocab, shape.hidden), head, "lm_head"))
    return tensors


def _positive_int(config: Mapping[str, Any], key: str, where: str | os.PathLike[str]) -> int:
    value = config.get(key)
    if not (is_json_int(value) and value > 0):
        raise GenieBuildError(where, f"{key} must be a positive integer, got {value!r}")
    return value


def rope_kind(rope: dict[str, Any]) -> str:
    """The HF rope type of a ``rope_scaling``/``rope_parameters`` dict ("default" when unnamed)."""
    return str(rope.get("rope_type") or rope.get("type") or "default")
