"""Train the demo model: a Qwen2 decoder of the demo's shape on the demo's public-domain text, on the CPU.

The weights go to ``resources/demo_model.safetensors`` (float16, Hugging Face names and layout), which
:mod:`genie_build.demo` builds the demo's graphs from, so a build needs no torch. The text is the King James
Version's Genesis and Exodus 5-40 (``resources/calibration_corpus.txt`` and ``resources/training_corpus.txt``);
Exodus 1-4 (``resources/evaluation_text.txt``) is held out for the evaluation. The tokenizer is the demo's own,
trained by the workflow's ``train-tokenizer`` on ``resources/tokenizer_corpus.txt``.

Reproducible: fixed seeds, torch's deterministic algorithms, a fixed thread count and a fixed order of batches;
the same torch on the same kind of CPU gives the same bytes (float rounding may differ across CPUs and torch
versions, so the committed file, not a rerun, is the demo's model). It prints the held-out perplexity beside the
unigram model's.

Usage (needs torch and transformers, ``envs/requirements-hf.txt``; about ten minutes on one core of an idle machine)::

    .venv-test/bin/python scripts/train_demo.py [--steps 800] [--out resources/demo_model.safetensors]
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
from transformers import Qwen2Config, Qwen2ForCausalLM

from genie_build.demo import TRAINED_SHAPE, hf_config
from genie_build.genie_config import load_tokenizer
from genie_build.train_tokenizer import train_tokenizer

RESOURCES = Path(__file__).resolve().parent.parent / "resources"
TRAINING_TEXTS = ("calibration_corpus.txt", "training_corpus.txt")
HELD_OUT = "evaluation_text.txt"
SEED = 20261203


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
def perplexity(model: Qwen2ForCausalLM, ids: torch.Tensor, length: int) -> float:
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
    parser.add_argument("--out", type=Path, default=RESOURCES / "demo_model.safetensors")
    args = parser.parse_args()

    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(args.threads)
    shape = TRAINED_SHAPE
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer_path = Path(scratch) / "tokenizer.json"
        train_tokenizer(RESOURCES / "tokenizer_corpus.txt", shape.vocab, tokenizer_path)
        tokenizer_sha = hashlib.sha256(tokenizer_path.read_bytes()).hexdigest()
        train = token_ids(tokenizer_path, [RESOURCES / name for name in TRAINING_TEXTS])
        held_out = token_ids(tokenizer_path, [RESOURCES / HELD_OUT])
    print(f"{len(train)} training tokens, {len(held_out)} held-out tokens")

    config = Qwen2Config(**{key: value for key, value in hf_config(shape).items() if key != "architectures"},
                         attn_implementation="eager")
    config.torch_dtype = "float32"
    model = Qwen2ForCausalLM(config)
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
    unigram = unigram_perplexity(train, held_out, shape.vocab)
    print(f"held-out perplexity {held:.2f}, unigram {unigram:.2f}")

    weights = {name: tensor.detach().to(torch.float16).contiguous() for name, tensor in model.state_dict().items()}
    metadata = {"shape": json.dumps(hf_config(shape), sort_keys=True), "tokenizer_sha256": tokenizer_sha,
                "steps": str(args.steps), "batch": str(args.batch), "length": str(args.length), "seed": str(SEED),
                "held_out_perplexity": f"{held:.4f}", "unigram_perplexity": f"{unigram:.4f}",
                "torch": torch.__version__}
    save_file(weights, str(args.out), metadata=metadata)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
