"""``account``: read a compiled context binary back and write its accounting record (part x variant)."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build import conventions
from genie_build.cli_args import json_object
from genie_build.errors import GenieBuildError
from genie_build.sizes import account_binary, check_part_graphs, write_record
from genie_build.toolchains import get_toolchain


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
    try:
        part, _ = conventions.parse_part_label(args.part_label)
    except ValueError as exc:
        raise GenieBuildError("--part-label", str(exc)) from None
    requested = json_object(args.variant_json, "--variant-json")
    if not args.binary.is_file():
        raise GenieBuildError(args.binary, "file not found")
    info = get_toolchain(args.toolchain).inspect(args.binary)
    check_part_graphs(info, args.part_label)
    write_record(args.out, account_binary(info, part, args.variant, requested))
    return 0
