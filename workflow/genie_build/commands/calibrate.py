"""Calibrate AIMET 1.0.0 encodings (16-bit activations, 4/8-bit per-channel weights) on the demo model with the
light built-in calibrator (``demo.calibrator: aimet`` calibrates through aimet-onnx's chain instead:
``calibrate-unit``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.errors import GenieBuildError
from genie_build.quantize.calibrate import DEFAULT_NUM_SAMPLES, calibrate

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("calibrate", help=__doc__, description=__doc__)
    parser.add_argument("--model-dir", help="folder holding prompt.onnx, token.onnx and config.json")
    parser.add_argument("--prompt", help="prompt graph (instead of --model-dir)")
    parser.add_argument("--token", help="token graph (instead of --model-dir)")
    parser.add_argument("--hf-config", help="the model's config.json (default: beside the prompt graph)")
    parser.add_argument("--out-prompt", required=True, help="encodings of the prompt graph (.json)")
    parser.add_argument("--out-token", required=True, help="encodings of the token graph (.json)")
    parser.add_argument("--num-samples", type=int, default=DEFAULT_NUM_SAMPLES,
                        help=f"calibration runs per graph (default {DEFAULT_NUM_SAMPLES})")
    return parser


def run(args: argparse.Namespace) -> int:
    prompt, token = _graph_paths(args)
    calibrate(prompt, token, args.out_prompt, args.out_token, num_samples=args.num_samples,
              hf_config_path=args.hf_config)
    return 0


def _graph_paths(args: argparse.Namespace) -> tuple[Path, Path]:
    """``--model-dir`` alone, or both ``--prompt`` and ``--token``."""
    if args.model_dir and not (args.prompt or args.token):
        return Path(args.model_dir) / "prompt.onnx", Path(args.model_dir) / "token.onnx"
    if args.prompt and args.token and not args.model_dir:
        return Path(args.prompt), Path(args.token)
    raise GenieBuildError("calibrate", "give either --model-dir, or both --prompt and --token")
