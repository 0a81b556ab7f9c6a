"""``evaluate-float``: the float model's logits on held-out text, one part at a time (``.npy``, float32
``[windows, AR, vocab]``), which ``evaluate`` compares every variant with."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.commands.evaluate import add_text_arguments, rope_of
from genie_build.errors import GenieBuildError
from genie_build.evaluate.evaluate import write_float_logits

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("evaluate-float", help="the float model's logits on held-out text",
                                   description=__doc__)
    parser.add_argument("--float-parts", required=True, nargs="+", type=Path,
                        help="the float prompt graphs, part order")
    add_text_arguments(parser)
    parser.add_argument("--out", required=True, type=Path, help="the logits (.npy)")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.out.resolve() in {path.resolve() for path in (*args.float_parts, args.tokens)}:
        raise GenieBuildError(args.out, "is one of the inputs; write the logits elsewhere")
    windows, ar, vocab = write_float_logits(args.float_parts, args.out, tokens_path=args.tokens,
                                            rope=rope_of(args), max_windows=args.max_windows)
    print(f"float model: {windows} windows of {ar} tokens, vocabulary {vocab}")
    return 0
