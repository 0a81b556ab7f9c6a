"""Train the demo's byte-level BPE tokenizer.json to exactly --vocab entries."""

from __future__ import annotations

import argparse
import logging

from genie_build.demo.train_tokenizer import train_tokenizer

__all__ = ["register_parser", "run"]

logger = logging.getLogger(__name__)


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("train-tokenizer", help=__doc__, description=__doc__)
    parser.add_argument("--corpus", required=True, help="training text (UTF-8)")
    parser.add_argument("--vocab", required=True, type=int, help="vocabulary size (the model's vocab)")
    parser.add_argument("--out", required=True, help="tokenizer.json to write")
    return parser


def run(args: argparse.Namespace) -> int:
    train_tokenizer(args.corpus, args.vocab, args.out)
    logger.info("wrote %s (%d entries) trained on %s", args.out, args.vocab, args.corpus)
    return 0
