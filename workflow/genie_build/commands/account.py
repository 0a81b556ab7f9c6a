"""``account``: read a compiled context binary back and write its accounting record (part x variant)."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.cli_args import json_object
from genie_build.sizes.sizes import account_part

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("account", help="bytes, weight bytes, graphs and applied options of one "
                                                   "context binary, read back from the binary")
    parser.add_argument("--toolchain", required=True, help="the toolchain that compiled the binary")
    parser.add_argument("--binary", required=True, type=Path, help="compiled/{variant}/part_NN_of_N.bin")
    parser.add_argument("--part-label", required=True, help="e.g. 01_of_06")
    parser.add_argument("--variant", required=True, help="the variant's name")
    parser.add_argument("--variant-json", required=True, help="the variant's requested options as a JSON object")
    parser.add_argument("--out", required=True, type=Path, help="sizes/{variant}/part_NN_of_N.json")
    return parser


def run(args: argparse.Namespace) -> int:
    account_part(args.toolchain, args.binary, args.part_label, args.variant,
                 json_object(args.variant_json, "--variant-json"), args.out)
    return 0
