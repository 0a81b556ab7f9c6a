"""Random-weight Hugging Face checkpoints written by transformers' ``save_pretrained`` (safetensors), as a user
downloads them, one per family genie-build registers: Qwen2 (q/k/v biases), Llama with Llama 3's ``llama3`` RoPE
scaling, Mistral (no sliding window, as Mistral-7B-v0.3 states it), Qwen3 (q_norm/k_norm, an explicit head_dim
other than hidden / heads), Phi-3 (fused qkv_proj and gate_up_proj, as Phi-3-mini-4k states it). Test helper
(import it from tests); needs torch and transformers.

Norm weights and biases are drawn around their init values (1 and 0), so a wrong norm or a dropped bias shows in
the logits; ``original_max_position_embeddings`` of the Llama checkpoint is small, so llama3 scaling changes the
RoPE frequencies of the positions the tests use.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from genie_build.demo.train_tokenizer import build_tokenizer
from genie_build.families import FAMILIES as REGISTERED
from genie_build.fileio import write_text
from family_cases import FAMILY_CASES

CORPUS = Path(__file__).resolve().parent.parent / "resources" / "tokenizer_corpus.txt"
FAMILIES = tuple(REGISTERED)


def hf_model(family: str, *, tied: bool = False, layers: int = 2, hidden: int = 64, heads: int = 4,
             kv_heads: int = 2, intermediate: int = 128, vocab: int = 320, context: int = 64, seed: int = 0,
             **keys):
    """A random transformers causal LM of ``family`` (float32); ``keys`` add to or override its config."""
    import torch
    import transformers

    if family not in FAMILY_CASES:
        raise ValueError(f"family {family!r} is not one of {FAMILIES}")
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=context,
                  tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2)
    extra = {key: 2 * hidden // heads if value == "2 * hidden // heads" else value
             for key, value in FAMILY_CASES[family].MODEL_KEYS.items()}
    registered = REGISTERED[family]
    model_class = getattr(transformers, registered.architecture)
    config = model_class.config_class(**common, **{**extra, **keys})
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.1 * torch.randn_like(parameter))
            elif name.endswith(".bias"):
                parameter.copy_(0.1 * torch.randn_like(parameter))
    return model


def make_checkpoint(out_dir: str | os.PathLike[str], family: str, *, tied: bool = False,
                    max_shard_size: str | None = None, dtype: str = "float32",
                    edit: Callable[[Any], None] | None = None, **sizes) -> Path:
    """Write a random checkpoint of ``family`` with a tokenizer.json to ``out_dir``; ``max_shard_size`` (e.g.
    ``"100KB"``) shards the weights with a ``model.safetensors.index.json``; ``dtype`` ``"bfloat16"`` stores them
    as the Hub's checkpoints do; ``edit`` changes the model's weights (under ``torch.no_grad``) before it is saved."""
    import torch

    out = Path(out_dir)
    model = hf_model(family, tied=tied, **sizes)
    if edit is not None:
        with torch.no_grad():
            edit(model)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(out, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    write_text(out / "tokenizer.json", build_tokenizer(CORPUS, model.config.vocab_size).to_str())
    return out
