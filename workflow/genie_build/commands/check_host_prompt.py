"""``check-host-prompt``: the host run's prompt, tokenized as the host run does, leaves room for the tokens it
generates within the context size (:func:`genie_build.tokens.check_host_prompt`); its ids go to ``--out``."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build import tokens as stage
from genie_build.cli_args import positive_int

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("check-host-prompt", help="the host run's prompt fits the context",
                                   description=__doc__)
    parser.add_argument("--tokenizer", required=True, type=Path, help="the model's tokenizer.json")
    parser.add_argument("--prompt", required=True, help="the host run's prompt")
    parser.add_argument("--context-size", required=True, type=positive_int,
                        help="the tokens a run may hold (Genie's context size)")
    parser.add_argument("--max-new-tokens", required=True, type=positive_int, help="the tokens the host run generates")
    parser.add_argument("--out", required=True, type=Path, help="the prompt's ids (JSON)")
    return parser


def run(args: argparse.Namespace) -> int:
    stage.check_host_prompt(args.tokenizer, args.prompt, args.out, context_size=args.context_size,
                            new_tokens=args.max_new_tokens)
    return 0
