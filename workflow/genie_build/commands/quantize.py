"""``quantize``: AIMET encodings for a Genie-shaped prompt/token graph pair by a recipe (w4a16, w4a16-lpbq,
w8a16), calibrated by aimet-onnx on text through the model's tokenizer (:func:`genie_build.quantize.quantize`)."""

from __future__ import annotations

import argparse

from genie_build import quantize as stage


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("quantize", help="AIMET encodings for a prompt/token graph pair, by a recipe",
                                   description=stage.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", required=True, help="the prompt graph (AR-N, Genie's IO contract)")
    parser.add_argument("--token", required=True, help="the token graph (AR-1), sharing the prompt graph's tensors")
    parser.add_argument("--hf-config", required=True, help="the model's config.json (RoPE base)")
    parser.add_argument("--tokenizer", required=True, help="the model's tokenizer.json")
    parser.add_argument("--corpus", required=True, help="calibration text (UTF-8)")
    parser.add_argument("--recipe", required=True, choices=sorted(stage.RECIPES), help="docs/quantize.md")
    parser.add_argument("--num-samples", type=int, default=stage.DEFAULT_NUM_SAMPLES,
                        help="calibration windows of the prompt graph's AR tokens "
                             f"(default {stage.DEFAULT_NUM_SAMPLES})")
    parser.add_argument("--out-prompt", required=True, help="the prompt graph's encodings (AIMET 1.0.0 .json)")
    parser.add_argument("--out-token", required=True, help="the token graph's encodings (AIMET 1.0.0 .json)")
    return parser


def run(args: argparse.Namespace) -> int:
    stage.quantize(args.prompt, args.token, args.out_prompt, args.out_token, hf_config_path=args.hf_config,
                   tokenizer_path=args.tokenizer, corpus_path=args.corpus, recipe=args.recipe,
                   num_samples=args.num_samples)
    return 0
