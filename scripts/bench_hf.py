"""Memory and time of the Hugging Face stages on a checkpoint of at least 2 GB: ``export-hf`` then ``quantize``,
each run as ``python -m genie_build <command>`` in its own process, its peak RSS
(``ru_maxrss`` of that child, from ``os.wait4``) set against the checkpoint's bytes on disk, and its wall time.

The checkpoint is a random-weight Qwen2 written by transformers' ``save_pretrained`` in float32 (so the export's
float32 graphs hold the same bytes as the checkpoint, and the ratio says what the export costs beyond the
weights), sharded at 1 GB, with a tokenizer.json padded to the vocabulary. It is made in a child process too,
so this process stays small while the stages run.

Usage::

    .venv/bin/python scripts/bench_hf.py --scratch /tmp/genie-hf-bench [--layers 7] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "resources" / "tokenizer_corpus.txt"
CALIBRATION_CORPUS = REPO / "resources" / "calibration_corpus.txt"   # the quantize stage's default

_MAKE_CHECKPOINT = """
import json, sys, torch, transformers
from genie_build.fileio import write_text
from genie_build.tokenizer_train import build_tokenizer
shape, out, corpus = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
config = transformers.Qwen2Config(**shape, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
torch.manual_seed(0)
with torch.no_grad():
    model = transformers.Qwen2ForCausalLM(config).eval()
model.save_pretrained(out, max_shard_size="1GB")
write_text(f"{out}/tokenizer.json", build_tokenizer(corpus, config.vocab_size).to_str())
"""


@dataclass(frozen=True)
class Run:
    stage: str
    seconds: float
    peak_rss_bytes: int


def run_child(stage: str, command: list[str], log: Path) -> Run:
    """Run ``command``, its output to ``log``; its own peak RSS (not this process's, not other children's)."""
    started = time.perf_counter()
    with log.open("w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO)
        _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{stage} failed ({process.returncode}), see {log}:\n{log.read_text()[-3000:]}")
    return Run(stage, seconds, usage.ru_maxrss * 1024)  # Linux: kilobytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scratch", type=Path, required=True, help="folder for the checkpoint and the exports")
    parser.add_argument("--layers", type=int, default=7)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--ar", type=int, default=128)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--recipe", default="w4a16", help="quantize's recipe")
    parser.add_argument("--num-samples", type=int, default=2, help="quantize's calibration samples")
    parser.add_argument("--min-gb", type=float, default=2.0, help="refuse a smaller checkpoint (a trial: 0)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()

    checkpoint, export = args.scratch / "checkpoint", args.scratch / "export"
    shutil.rmtree(args.scratch, ignore_errors=True)
    args.scratch.mkdir(parents=True)
    python = [sys.executable]
    shape = {"num_hidden_layers": args.layers, "hidden_size": args.hidden, "intermediate_size": args.intermediate,
             "vocab_size": args.vocab, "num_attention_heads": args.hidden // 128, "num_key_value_heads": 4,
             "max_position_embeddings": max(4096, args.context)}
    made = run_child("make checkpoint", [*python, "-c", _MAKE_CHECKPOINT, json.dumps(shape), str(checkpoint),
                                         str(CORPUS)], args.scratch / "make_checkpoint.log")
    checkpoint_bytes = sum(path.stat().st_size for path in checkpoint.glob("*.safetensors"))
    if checkpoint_bytes < args.min_gb * 1e9:
        raise SystemExit(f"the checkpoint has {checkpoint_bytes / 1e9:.2f} GB, below {args.min_gb} GB: add layers")

    runs = [run_child("export-hf", [*python, "-m", "genie_build", "export-hf", "--checkpoint", str(checkpoint),
                                    "--out-dir", str(export), "--ar", str(args.ar), "--context", str(args.context)],
                      args.scratch / "export.log")]
    runs.append(run_child("quantize", [
        *python, "-m", "genie_build", "quantize", "--prompt", str(export / "prompt.onnx"),
        "--token", str(export / "token.onnx"), "--hf-config", str(checkpoint / "config.json"),
        "--tokenizer", str(checkpoint / "tokenizer.json"), "--corpus", str(CALIBRATION_CORPUS),
        "--recipe", args.recipe, "--num-samples", str(args.num_samples),
        "--out-prompt", str(export / "prompt.encodings.json"), "--out-token", str(export / "token.encodings.json")],
        args.scratch / "quantize.log"))

    graph_bytes = sum(path.stat().st_size for path in export.glob("*.onnx*"))
    print(f"checkpoint: Qwen2 float32, {args.layers} layers, hidden {args.hidden}, intermediate "
          f"{args.intermediate}, vocab {args.vocab}, {checkpoint_bytes / 1e9:.2f} GB in "
          f"{len(list(checkpoint.glob('*.safetensors')))} safetensors files (made in {made.seconds:.0f} s); "
          f"AR {args.ar}, CL {args.context}; exported graphs + data {graph_bytes / 1e9:.2f} GB; {os.cpu_count()} cores")
    print()
    print("| stage | wall time | peak RSS | peak RSS / checkpoint |")
    print("|---|---|---|---|")
    for run in runs:
        print(f"| {run.stage} | {run.seconds:.0f} s | {run.peak_rss_bytes / 1e9:.2f} GB | "
              f"{run.peak_rss_bytes / checkpoint_bytes:.2f}x |")
    if not args.keep:
        shutil.rmtree(args.scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
