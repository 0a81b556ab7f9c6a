"""Check that a graph's parts chained in onnxruntime give the full graph's outputs bit for bit
(:func:`genie_build.split.verify_split.verify_split`)."""

from __future__ import annotations

import argparse

from genie_build.split.verify_split import verify_split

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("verify-split", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--model", required=True, help="the full graph (.onnx)")
    parser.add_argument("--parts-dir", required=True, help="the parts folder (part_{NN_of_N}/{graph}.onnx)")
    parser.add_argument("--graph", required=True, help="the parts' file name: prompt, token, prompt_cl512, ...")
    parser.add_argument("--out", required=True, help="report (.json)")
    parser.add_argument("--vocab", type=int, help="token id range (default: the embedding table's rows)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated input (default 0)")
    return parser


def run(args: argparse.Namespace) -> int:
    verify_split(args.model, args.parts_dir, args.graph, args.out, vocab=args.vocab, seed=args.seed)
    return 0
