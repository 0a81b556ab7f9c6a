"""``compile``: link one part's converted prompt and token graphs into one context binary, with a
variant's options (weights packing, optimization level, weight sharing, VTCM) for the target chipset."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.cli_args import json_object
from genie_build.errors import GenieBuildError
from genie_build.toolchains import TOOLCHAINS, compile_variant

__all__ = ["parse_graphs", "register_parser", "run"]

def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("compile", help="link a part's converted graphs into one context binary",
                                   description=__doc__)
    parser.add_argument("--toolchain", required=True, choices=sorted(TOOLCHAINS))
    parser.add_argument("--graph", required=True, action="extend", nargs="+", metavar="NAME=PATH",
                        help="a converted graph and its graph name, one per graph (prompt and token): "
                             "--graph A=a.onnx B=b.onnx or --graph A=a.onnx --graph B=b.onnx")
    parser.add_argument("--variant-json", required=True,
                        help='the variant\'s options, e.g. \'{"weights_packing": true, "optimization_type": 3, '
                             '"weight_sharing_enabled": true, "vtcm_mb": 0, "float_bitwidth": 16}\'')
    parser.add_argument("--chipset", required=True, help="target chipset, e.g. SM8750")
    parser.add_argument("--out", required=True, type=Path, help="the context binary to write")
    return parser


def run(args: argparse.Namespace) -> int:
    compile_variant(args.toolchain, parse_graphs(args.graph), args.out,
                    json_object(args.variant_json, "--variant-json"), args.chipset)
    return 0


def parse_graphs(items: list[str]) -> dict[str, Path]:
    graphs: dict[str, Path] = {}
    for item in items:
        name, separator, path = item.partition("=")
        if not separator or not name or not path:
            raise GenieBuildError("--graph", f"{item!r} is not NAME=PATH")
        if name in graphs:
            raise GenieBuildError("--graph", f"graph {name!r} given twice")
        graphs[name] = Path(path)
    return graphs
