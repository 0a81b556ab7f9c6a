"""The Hugging Face model families genie-build builds, one record each, and those it refuses, with the reason.

A record holds what differs between families: the ``model_type`` and transformers class, the projections of a
decoder layer (names, widths, which config key gives them a bias; a fused one is one projection whose output is
several), the RoPE kinds the bundle carries, the per-head norm, the defaults transformers gives a key a
``config.json`` may leave out, and how the config states a sliding window. The parts are built from transformers'
own modules (:mod:`genie_build.export.export`), so a record is facts, not code: the config reader
(:mod:`genie_build.hf_config`), the checkpoint checks (:mod:`genie_build.hf_checkpoint`), the weight inventory
the plans and the estimate weigh, the export, the Genie config and the tests all read these records.

AIMET's rule per weight is the same for every family: a projection is a ``layers`` weight (the recipe's bits, per
channel), norms and biases stay float, the table and the head have their own rules
(:func:`genie_build.plan.recipes.precision_of`).

Adding a family is one :func:`register` call here and its checkpoint cases in the tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["FAMILIES", "REFUSED_FAMILIES", "Family", "Projection", "Width", "family_of", "register"]

# A width in a decoder layer: the residual stream, the query heads, the key/value heads, the MLP's inner width, and
# the outputs of fused projections (queries, keys and values; gate and up).
Width = Literal["hidden", "q", "kv", "inter", "qkv", "gate_up"]
BiasRule = bool | str  # always, never, or the config.json key that switches it (default false)


@dataclass(frozen=True)
class Projection:
    """One Linear of a decoder layer: its module path under ``model.layers.{i}``, its widths and its bias rule."""

    module: str
    fan_in: Width
    fan_out: Width
    bias: BiasRule = False


@dataclass(frozen=True)
class Family:
    """A model family genie-build exports."""

    model_type: str
    title: str                        # the models' name, as the docs and the schema list them
    architecture: str                 # the transformers causal-LM class; config.json's architectures names it
    projections: tuple[Projection, ...]
    rope_kinds: tuple[str, ...] = ("default",)   # HF rope types Genie's positional-encoding and the host run compute
    qk_norm: bool = False             # an RMSNorm over each head's queries and keys (self_attn.q_norm, k_norm)
    norm: str = "rmsnorm"             # every norm is transformers' {prefix}RMSNorm (weight only)
    # transformers' value of a key config.json may leave out, where it is not the generic one (head_dim:
    # hidden_size // num_attention_heads; tie_word_embeddings: false)
    defaults: Mapping[str, object] = field(default_factory=dict)
    sliding_window_switch: str | None = None     # the key that turns sliding_window on (Qwen's use_sliding_window)

    @property
    def class_prefix(self) -> str:
        """The prefix of the family's transformers classes (``Qwen2`` of ``Qwen2DecoderLayer``, ``Qwen2RMSNorm``)."""
        return self.architecture.removesuffix("ForCausalLM")

    @property
    def modeling_module(self) -> str:
        return f"transformers.models.{self.model_type}.modeling_{self.model_type}"


FAMILIES: dict[str, Family] = {}

# model_type -> why genie-build does not build it (the refusal says so).
REFUSED_FAMILIES: dict[str, str] = {
    "gemma": "Gemma scales its embedding by sqrt(hidden_size) in GemmaModel.forward, outside the modules the export "
             "builds parts from, so a bundle would not compute what the model computes",
    "gemma2": "Gemma 2 scales its embedding and soft-caps its logits in Gemma2Model/Gemma2ForCausalLM.forward, "
              "outside the modules the export builds parts from, and its sliding-window layers need a mask of "
              "their own, where Genie feeds one attention_mask to every layer",
    "gemma3": "Gemma 3's sliding-window layers have a RoPE base of their own (rope_local_base_freq) and a window "
              "shorter than any useful context: Genie feeds one pair of RoPE tables (one positional-encoding) and "
              "one attention_mask to every layer",
    "gemma3_text": "Gemma 3's sliding-window layers have a RoPE base of their own (rope_local_base_freq) and a window "
                   "shorter than any useful context: Genie feeds one pair of RoPE tables (one positional-encoding) "
                   "and one attention_mask to every layer",
}


def register(family: Family) -> Family:
    """Add ``family`` to :data:`FAMILIES` (one record per model_type)."""
    if family.model_type in FAMILIES or family.model_type in REFUSED_FAMILIES:
        raise ValueError(f"model_type {family.model_type!r} is registered twice")
    FAMILIES[family.model_type] = family
    return family


def family_of(model_type: object) -> Family | None:
    """The registered family of a ``config.json``'s model_type, None for any other."""
    return FAMILIES.get(model_type) if isinstance(model_type, str) else None


def _separate(attention_bias: BiasRule, o_bias: BiasRule, mlp_bias: BiasRule) -> tuple[Projection, ...]:
    """Llama's layer: q, k, v and o projections, then gate, up and down."""
    return (Projection("self_attn.q_proj", "hidden", "q", attention_bias),
            Projection("self_attn.k_proj", "hidden", "kv", attention_bias),
            Projection("self_attn.v_proj", "hidden", "kv", attention_bias),
            Projection("self_attn.o_proj", "q", "hidden", o_bias),
            Projection("mlp.gate_proj", "hidden", "inter", mlp_bias),
            Projection("mlp.up_proj", "hidden", "inter", mlp_bias),
            Projection("mlp.down_proj", "inter", "hidden", mlp_bias))


register(Family("qwen2", "Qwen2/Qwen2.5", "Qwen2ForCausalLM", _separate(True, False, False),
                defaults={"sliding_window": 4096}, sliding_window_switch="use_sliding_window"))
register(Family("llama", "Llama", "LlamaForCausalLM", _separate("attention_bias", "attention_bias", "mlp_bias"),
                rope_kinds=("default", "llama3")))
register(Family("mistral", "Mistral", "MistralForCausalLM", _separate(False, False, False),
                defaults={"sliding_window": 4096}))
register(Family("qwen3", "Qwen3", "Qwen3ForCausalLM", _separate("attention_bias", "attention_bias", False),
                qk_norm=True, defaults={"head_dim": 128, "sliding_window": 4096},
                sliding_window_switch="use_sliding_window"))
register(Family("phi3", "Phi-3", "Phi3ForCausalLM",
                (Projection("self_attn.qkv_proj", "hidden", "qkv"), Projection("self_attn.o_proj", "q", "hidden"),
                 Projection("mlp.gate_up_proj", "hidden", "gate_up"), Projection("mlp.down_proj", "inter", "hidden")),
                rope_kinds=("default", "longrope")))
