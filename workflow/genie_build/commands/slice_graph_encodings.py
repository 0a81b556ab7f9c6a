"""``slice-graph-encodings``: cut one graph's full AIMET encodings into one file per split part
(:func:`genie_build.quantize.slice_encodings.slice_graph_encodings`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.cli_args import add_switch
from genie_build.conventions import GRAPH_KINDS
from genie_build.quantize import slice_encodings as stage

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("slice-graph-encodings", help="cut a graph's encodings into one file per part",
                                   description=stage.__doc__)
    parser.add_argument("--graph", required=True, choices=GRAPH_KINDS, help="which graph these encodings are for")
    parser.add_argument("--model", required=True, type=Path, help="the full (unsplit) ONNX graph")
    parser.add_argument("--encodings", required=True, type=Path, help="its AIMET encodings (0.6.1, 1.0.0, 2.0.0)")
    parser.add_argument("--parts-dir", required=True, type=Path, help="the parts folder (part_*/{graph}.onnx)")
    parser.add_argument("--out-dir", required=True, type=Path,
                        help="gets part_{NN_of_N}/{graph}.encodings.json (beside the other graph's)")
    other = parser.add_mutually_exclusive_group()
    other.add_argument("--consistent-with", type=Path, metavar="ENCODINGS",
                       help="the other graph's encodings: tensors in both must have identical encodings")
    other.add_argument("--share-from", type=Path, metavar="ENCODINGS",
                       help="the other graph's encodings: every tensor of it this graph has takes its encoding")
    add_switch(parser, "--kv-cache-tied", "a bundle will be built: each past_*_out must have its past_*_in's encoding "
                                          "(Genie)")
    return parser


def run(args: argparse.Namespace) -> int:
    stage.slice_graph_encodings(args.graph, args.model, args.encodings, args.parts_dir, args.out_dir,
                                consistent_with=args.consistent_with, share_from=args.share_from,
                                kv_cache_tied=args.kv_cache_tied)
    return 0
