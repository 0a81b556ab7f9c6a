"""``compile-twin``: compile a qnn-htp part's graphs again, without weight sharing, into a twin folder the host run and
Genie's run load on x86 (a weight-shared QNN binary runs only on a device)."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.chipsets import lookup
from genie_build.cli_args import json_object
from genie_build.commands.compile import parse_graphs
from genie_build.toolchains.base import CompileOptions

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("compile-twin", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--graph", required=True, action="extend", nargs="+", metavar="NAME=PATH",
                        help="a converted (QDQ) graph and its graph name, one per graph of the part")
    parser.add_argument("--variant-json", required=True, help="the bundle variant's options, as for compile")
    parser.add_argument("--chipset", required=True, help="target chipset, e.g. SM8750")
    parser.add_argument("--out-dir", required=True, type=Path, help="the twin folder (context.bin, <graph>.onnx)")
    return parser


def run(args: argparse.Namespace) -> int:
    from genie_build.toolchains.qnn_htp.toolchain import QnnHtpToolchain
    from genie_build.toolchains.qnn_htp.twin import write_twin

    QnnHtpToolchain().check_available()
    variant = {**json_object(args.variant_json, "--variant-json"), "weight_sharing_enabled": False}
    write_twin(parse_graphs(args.graph), args.out_dir, CompileOptions.from_variant(variant, lookup(args.chipset)))
    return 0
