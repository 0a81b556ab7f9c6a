"""Export a Hugging Face checkpoint (Qwen2/Qwen2.5, Llama, Qwen3) to Genie's prompt (AR-N) and token (AR-1)
ONNX graphs with external data: transformers' own model behind Genie's IO contract (docs/export.md)."""

from __future__ import annotations

import argparse
import logging

from genie_build.errors import GenieBuildError

log = logging.getLogger(__name__)
HF_EXTRA_HINT = "pip install --no-deps -r envs/requirements-hf.txt"


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("export-hf", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--checkpoint", required=True,
                        help="checkpoint directory: config.json, model.safetensors (or shards + "
                             "model.safetensors.index.json), tokenizer.json")
    parser.add_argument("--out-dir", required=True, help="folder for prompt.onnx, token.onnx and their .onnx.data")
    parser.add_argument("--ar", type=int, required=True, help="tokens per call of the prompt graph (AR)")
    parser.add_argument("--context", type=int, required=True, help="context length CL of both graphs")
    return parser


def run(args: argparse.Namespace) -> int:
    try:  # torch only here: every other command, and the demo, runs without it
        from genie_build.export import export_checkpoint
    except ImportError as exc:
        raise GenieBuildError("export-hf", f"needs torch, transformers and onnxscript ({HF_EXTRA_HINT}): "
                                           f"{exc}") from None
    summary = export_checkpoint(args.checkpoint, args.out_dir, ar=args.ar, context=args.context)
    log.info("exported %s (%s, AR %d, CL %d, %s LM head) to %s", args.checkpoint, summary.model_type,
             summary.shape.ar, summary.shape.context, "untied copy of the tied" if summary.tied_lm_head else "own",
             args.out_dir)
    return 0
