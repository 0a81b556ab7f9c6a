"""``convert-dlc``: a qnn-htp converted (QDQ) graph -> the DLC the vendor's IR library makes of it, the graph in
QNN's own form for the vendor's tools (``qnn-context-binary-generator``, the QAIRT Python API), named with the graph
name the context binary carries."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("convert-dlc", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--graph", required=True, type=Path, help="a qnn-htp converted graph (its data file beside it)")
    parser.add_argument("--graph-name", required=True, help="the DLC's graph name, e.g. prompt_ar32_cl256_2_of_6")
    parser.add_argument("--out", required=True, type=Path, help="the DLC to write")
    return parser


def run(args: argparse.Namespace) -> int:
    from genie_build.toolchains.qnn_htp.toolchain import convert_dlc

    convert_dlc(args.graph, args.graph_name, args.out)
    return 0
