"""A tiny random-weight Hugging Face Qwen2 exported by ``torch.onnx.export(dynamo=True, optimize=False)``.

Test helper (import it from tests): a real exporter's graph, as opposed to the Genie-named demo graphs.
``optimize=False`` keeps HF parameter names (prefixed ``m.``, the wrapper's attribute) and gives the prompt
and token graphs identical initializers, so they can share weights.

Graph IO (fixed shapes, past = context - AR):
inputs ``input_ids [1, AR] int64``, ``attention_mask [1, context] int64`` (1 = visible),
``position_ids [1, AR] int64``, ``past_key_{i}_in`` / ``past_value_{i}_in [1, kv_heads, past, head_dim]``;
outputs ``logits [1, AR, vocab]``, ``past_key_{i}_out`` / ``past_value_{i}_out [1, kv_heads, context, head_dim]``
(the whole cache, past + new, as HF returns it).
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from pathlib import Path

import pytest

HF_INSTALL_HINT = "pip install --no-deps -r envs/requirements-hf.txt"


def export_tiny_qwen2(out_dir: str | os.PathLike[str], layers: int = 4, hidden: int = 64, heads: int = 4,
                      kv_heads: int = 2, intermediate: int = 128, vocab: int = 256, context: int = 64,
                      prompt_ar: int = 32, seed: int = 0) -> tuple[Path, Path]:
    """Export a random-weight ``Qwen2ForCausalLM`` twice: prompt (AR = ``prompt_ar``) and token (AR = 1).

    Returns:
        ``(prompt.onnx, token.onnx)`` in ``out_dir``, each with its ``.onnx.data``.

    Raises:
        pytest.skip.Exception: torch, transformers or onnxscript is not installed.
    """
    try:
        import onnxscript  # noqa: F401  (torch's dynamo exporter needs it)
        import torch
        from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM
    except ImportError as exc:
        pytest.skip(f"the HF export needs torch, transformers and onnxscript: {HF_INSTALL_HINT} ({exc})")

    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=context, tie_word_embeddings=False,
                         attn_implementation="eager")   # plain MatMul/Softmax attention, no SDPA decomposition
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    head_dim = hidden // heads

    class FlatIO(torch.nn.Module):
        """Flat tensors in and out, so every cache entry is a named graph input/output."""

        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(layers)],
                                 config=config)
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
            return (out.logits, *(tensor for layer in out.past_key_values.layers
                                  for tensor in (layer.keys, layer.values)))

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    wrapper = FlatIO().eval()
    kv_names = [f"past_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]
    paths = []
    for graph, ar in (("prompt", prompt_ar), ("token", 1)):
        past = context - ar
        args = (torch.randint(0, vocab, (1, ar)), torch.ones(1, context, dtype=torch.int64),
                torch.arange(past, context).unsqueeze(0),
                *(torch.zeros(1, kv_heads, past, head_dim) for _ in kv_names))
        path = out / f"{graph}.onnx"
        # The exporter prints progress and warns about missing torchvision; neither matters to tests.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(wrapper, args, str(path), dynamo=True, optimize=False, external_data=True,
                              input_names=["input_ids", "attention_mask", "position_ids",
                                           *(f"{name}_in" for name in kv_names)],
                              output_names=["logits", *(f"{name}_out" for name in kv_names)])
        paths.append(path)
    return paths[0], paths[1]
