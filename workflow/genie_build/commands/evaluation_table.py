"""``evaluation-table``: the evaluated variants' size beside their quality (``evaluation.{md,csv,png}``), flagged
against the report's bounds."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from genie_build.cli_args import add_strict_option
from genie_build.evaluate.evaluation_table import QualityBounds, genie_row, quality_rows, write_quality_table

__all__ = ["register_parser", "run"]

log = logging.getLogger(__name__)


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("evaluation-table", help="size beside quality per variant", description=__doc__)
    parser.add_argument("--reports", required=True, nargs="+", type=Path, help="evaluate's reports")
    parser.add_argument("--size-table", required=True, type=Path, help="size_table.csv")
    parser.add_argument("--min-top1-agreement", type=float, default=None)
    parser.add_argument("--max-mean-kl", type=float, default=None)
    parser.add_argument("--max-clipped-share", type=float, default=None)
    parser.add_argument("--genie-accuracy", type=Path,
                        help="genie-accuracy's report: the bundle's perplexity by Genie, a row of its own")
    add_strict_option(parser, "variant")
    parser.add_argument("--md", required=True, type=Path, help="evaluation.md")
    parser.add_argument("--csv", required=True, type=Path, help="evaluation.csv")
    parser.add_argument("--png", required=True, type=Path, help="evaluation.png: size against agreement")
    return parser


def run(args: argparse.Namespace) -> int:
    rows = quality_rows(args.reports, args.size_table, QualityBounds(args.min_top1_agreement, args.max_mean_kl,
                                                                        args.max_clipped_share))
    genie = None if args.genie_accuracy is None else genie_row(args.genie_accuracy, args.size_table)
    flags = write_quality_table(rows, args.md, args.csv, args.png, strict=args.strict, genie=genie)
    for flag in flags:
        log.warning("%s", flag)
    return 0
