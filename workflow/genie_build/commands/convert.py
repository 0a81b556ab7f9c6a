"""``convert``: one ONNX part + its AIMET encodings -> the toolchain's converted graph (DLC, or the
reference toolchain's quantized ONNX), named with the graph name the context binary will carry."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.toolchains import TOOLCHAINS, get_toolchain

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("convert", help="convert one ONNX part with its encodings", description=__doc__)
    parser.add_argument("--toolchain", required=True, choices=sorted(TOOLCHAINS))
    parser.add_argument("--onnx", required=True, type=Path, help="the part's ONNX graph (external data beside it)")
    parser.add_argument("--encodings", required=True, type=Path, help="the part's AIMET encodings")
    parser.add_argument("--graph-name", required=True, help="e.g. prompt_ar32_cl256_01_of_06")
    parser.add_argument("--float-bitwidth", required=True, type=int, choices=(16, 32),
                        help="float width of tensors without an integer encoding")
    parser.add_argument("--out", required=True, type=Path, help="the converted graph (.onnx or .dlc)")
    return parser


def run(args: argparse.Namespace) -> int:
    toolchain = get_toolchain(args.toolchain)
    toolchain.check_available()
    toolchain.convert(args.onnx, args.encodings, args.out, graph_name=args.graph_name,
                      float_bitwidth=args.float_bitwidth)
    return 0
