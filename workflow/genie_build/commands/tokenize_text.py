"""``tokenize-text``: a text as the model's token ids (``.npy``, int32), tokenized once for every job that reads it,
checked to fill the windows asked and to stay within ``config.json``'s ``vocab_size``
(:func:`genie_build.tokens.tokenize_text`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build import tokens as stage
from genie_build.cli_args import positive_int
from genie_build.errors import GenieBuildError

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("tokenize-text", help="a text as the model's token ids", description=__doc__)
    parser.add_argument("--text", required=True, type=Path, help="the text (UTF-8)")
    parser.add_argument("--tokenizer", required=True, type=Path, help="the model's tokenizer.json")
    parser.add_argument("--hf-config", required=True, type=Path, help="the model's config.json (vocab_size)")
    parser.add_argument("--needed", required=True, type=positive_int, help="tokens the text must have at least")
    parser.add_argument("--use", required=True, help="what needs them, for the message (e.g. 'quantize.num_samples "
                                                     "8 windows of 32 tokens')")
    parser.add_argument("--out", required=True, type=Path, help="the token ids (.npy)")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.out.resolve() in {path.resolve() for path in (args.text, args.tokenizer, args.hf_config)}:
        raise GenieBuildError(args.out, "is one of the inputs; write the token ids elsewhere")
    count = stage.tokenize_text(args.text, args.tokenizer, args.hf_config, args.out, needed=args.needed, use=args.use)
    print(f"{args.text}: {count} tokens")
    return 0
