"""Write the embedding lookup table Genie reads on the CPU (``bundle.embedding: lut``) from part 1's graph.

The table is quantized per tensor with the embedding output's encoding (else the table's), as qairt-dev's LLM
builder quantizes it; ``<out>.json`` beside it gives its shape, datatype, scale and offset for the bundle.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("embedding-table", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--onnx", required=True, type=Path, help="part 1 (the embedding lookup) of the prompt graph")
    parser.add_argument("--encodings", required=True, type=Path, help="part 1's encodings")
    parser.add_argument("--out", required=True, type=Path, help="the table, e.g. embedding_table.bin")
    return parser


def run(args: argparse.Namespace) -> int:
    from genie_build.bundle.embedding_table import write_embedding_table

    write_embedding_table(args.onnx, args.encodings, args.out)
    return 0
