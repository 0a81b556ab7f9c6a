"""``size-table``: the A/B table of context binary sizes across variants (CSV, Markdown, PNG), with the quality of
the variants that were evaluated."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.cli_args import add_strict_option
from genie_build.sizes.sizes import size_table_from_records

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("size-table", help="A/B table of context binary sizes per part and variant, "
                                                      "flagging options that show no effect")
    parser.add_argument("--records", required=True, nargs="+", type=Path, help="accounting records (account)")
    parser.add_argument("--baseline", required=True, help="the variant the others are compared with")
    add_strict_option(parser, "option")
    parser.add_argument("--quality", nargs="+", type=Path, default=(),
                        help="evaluate's reports: the evaluated variants' quality columns")
    parser.add_argument("--memory-plan", type=Path, default=None,
                        help="memory_plan.json: flag the parts its load model predicts will not map")
    parser.add_argument("--csv", required=True, type=Path, help="size_table.csv (tidy)")
    parser.add_argument("--md", required=True, type=Path, help="size_table.md (for people)")
    parser.add_argument("--png", required=True, type=Path, help="size_table.png (bar chart)")
    return parser


def run(args: argparse.Namespace) -> int:
    size_table_from_records(args.records, args.baseline, args.csv, args.md, args.png, strict=args.strict,
                            quality_reports=args.quality, memory_plan=args.memory_plan)
    return 0
