"""Train the demo model: a Qwen2 decoder of the demo's shape on the demo's public-domain text, on the CPU; or, with
``--family llama``, a Llama 3 decoder of another shape trained the same way, written as a Hugging Face checkpoint.

The weights go to ``resources/demo_model.safetensors`` (float16, Hugging Face names and layout), which
:mod:`genie_build.demo.demo` builds the demo's graphs from, so a build needs no torch. The Llama model (4 layers, hidden
256, vocabulary 4096, Llama 3's RoPE base and ``llama3`` scaling, :data:`LLAMA_SHAPE`) goes to a checkpoint folder
(``config.json``, ``model.safetensors`` in float16, its own ``tokenizer.json``) that ``model.hf_checkpoint`` builds:
a second trained model of another family, on which the calibration's defaults were chosen (docs/quantize.md). The text is the King James
Version's Genesis and Exodus 5-40 (``resources/calibration_corpus.txt`` and ``resources/training_corpus.txt``);
Exodus 1-4 (``resources/evaluation_text.txt``) is held out for the evaluation. The tokenizer is the demo's own,
trained by the workflow's ``train-tokenizer`` on ``resources/tokenizer_corpus.txt``.

Reproducible: fixed seeds, torch's deterministic algorithms, a fixed thread count and a fixed order of batches;
the same torch on the same kind of CPU gives the same bytes (float rounding may differ across CPUs and torch
versions, so the committed file, not a rerun, is the demo's model). It prints the held-out perplexity beside the
unigram model's.

Usage (needs torch and transformers, ``envs/requirements-hf.txt``; about ten minutes on one core of an idle machine)::

    .venv-test/bin/python scripts/train_demo.py [--steps 800] [--out resources/demo_model.safetensors]
    .venv-test/bin/python scripts/train_demo.py --family llama --out bench/llama-demo   # a checkpoint folder
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from genie_build.demo.demo import TRAINED_SHAPE, hf_config
from genie_build.demo.train_tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID, train_tokenizer
from genie_build.genie_config import load_tokenizer

RESOURCES = Path(__file__).resolve().parent.parent / "resources"
TRAINING_TEXTS = ("calibration_corpus.txt", "training_corpus.txt")
HELD_OUT = "evaluation_text.txt"
SEED = 20261203
# The second family: Llama 3's layout (no q/k/v biases, RoPE base 500000 with llama3 scaling), half the demo's layers
# and twice its vocabulary; its attention as the demo's (4 heads of 64, 2 KV heads) unless --heads gives more heads
LLAMA_SHAPE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
               "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
               "vocab_size": 4096, "max_position_embeddings": 256, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 128},
               "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
               "bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_ID, "torch_dtype": "float16"}


def text_of(path: Path) -> str:
    """The text without its header (the lines starting with ``#`` that name the source and licence)."""
    return "\n".join(line for line in path.read_text(encoding="utf-8").splitlines() if not line.startswith("#"))


def token_ids(tokenizer_path: Path, texts: list[Path]) -> torch.Tensor:
    tokenizer = load_tokenizer(tokenizer_path)
    ids = [i for path in texts for i in tokenizer.encode(text_of(path), add_special_tokens=False).ids]
    return torch.tensor(ids, dtype=torch.long)


def batches(ids: torch.Tensor, length: int, batch: int, steps: int, seed: int):
    """``steps`` batches of ``batch`` random windows of ``length + 1`` tokens, from a seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - length - 1, (batch,), generator=generator)
        yield torch.stack([ids[start:start + length + 1] for start in starts.tolist()])


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def perplexity(model: PreTrainedModel, ids: torch.Tensor, length: int) -> float:
    """Teacher-forced perplexity over consecutive windows of ``length`` tokens."""
    model.eval()
    nll, count = 0.0, 0
    for start in range(0, len(ids) - length - 1, length):
        window = ids[start:start + length + 1][None]
        logits = model(window[:, :-1]).logits
        nll += float(torch.nn.functional.cross_entropy(logits[0], window[0, 1:], reduction="sum"))
        count += length
    model.train()
    return math.exp(nll / count)


def unigram_perplexity(train: torch.Tensor, held_out: torch.Tensor, vocab: int) -> float:
    counts = np.bincount(train.numpy(), minlength=vocab) + 1.0
    log_p = np.log(counts / counts.sum())
    return float(np.exp(-log_p[held_out.numpy()].mean()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=256, help="tokens per training window (the demo's context)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the result depends on it)")
    parser.add_argument("--family", choices=("qwen2", "llama"), default="qwen2",
                        help="qwen2: the demo's model; llama: LLAMA_SHAPE, written as a checkpoint folder")
    parser.add_argument("--heads", type=int, default=4, help="--family llama: attention heads (of 2 KV heads)")
    parser.add_argument("--out", type=Path, help="the demo's weights file, or the Llama checkpoint's folder "
                                                 "(default: resources/demo_model.safetensors for the demo)")
    args = parser.parse_args()
    if args.out is None and args.family == "llama":
        parser.error("--family llama needs --out (a checkpoint folder)")
    out = args.out or RESOURCES / "demo_model.safetensors"

    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(args.threads)
    shape = hf_config(TRAINED_SHAPE) if args.family == "qwen2" else {**LLAMA_SHAPE, "num_attention_heads": args.heads}
    vocab = shape["vocab_size"]
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer_path = Path(scratch) / "tokenizer.json"
        train_tokenizer(RESOURCES / "tokenizer_corpus.txt", vocab, tokenizer_path)
        tokenizer_bytes = tokenizer_path.read_bytes()
        tokenizer_sha = hashlib.sha256(tokenizer_bytes).hexdigest()
        train = token_ids(tokenizer_path, [RESOURCES / name for name in TRAINING_TEXTS])
        held_out = token_ids(tokenizer_path, [RESOURCES / HELD_OUT])
    print(f"{len(train)} training tokens, {len(held_out)} held-out tokens")

    config_class, model_class = (Qwen2Config, Qwen2ForCausalLM) if args.family == "qwen2" else (LlamaConfig,
                                                                                              LlamaForCausalLM)
    config = config_class(**{key: value for key, value in shape.items() if key != "architectures"},
                          attn_implementation="eager")
    config.torch_dtype = "float32"
    model = model_class(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    started = time.monotonic()
    for step, batch in enumerate(batches(train, args.length, args.batch, args.steps, SEED)):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr, warmup=args.steps // 20)
        logits = model(batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.3f} ({time.monotonic() - started:.0f} s)", flush=True)
    held = perplexity(model, held_out, args.length)
    unigram = unigram_perplexity(train, held_out, vocab)
    print(f"held-out perplexity {held:.2f}, unigram {unigram:.2f}")

    weights = {name: tensor.detach().to(torch.float16).contiguous() for name, tensor in model.state_dict().items()}
    metadata = {"shape": json.dumps(shape, sort_keys=True), "tokenizer_sha256": tokenizer_sha,
                "steps": str(args.steps), "batch": str(args.batch), "length": str(args.length), "seed": str(SEED),
                "held_out_perplexity": f"{held:.4f}", "unigram_perplexity": f"{unigram:.4f}",
                "torch": torch.__version__}
    if args.family == "llama":   # a checkpoint folder, as the Hub's
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(shape, indent=1, sort_keys=True) + "\n")
        (out / "tokenizer.json").write_bytes(tokenizer_bytes)
        out = out / "model.safetensors"
        metadata["format"] = "pt"
    save_file(weights, str(out), metadata=metadata)
    print(f"wrote {out} ({out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
