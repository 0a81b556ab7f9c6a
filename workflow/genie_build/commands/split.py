"""Split one graph (prompt or token) into the plan's parts, streaming the weights."""

from __future__ import annotations

import argparse
import logging

from genie_build.conventions import GRAPH_KINDS
from genie_build.plan_file import read_plan
from genie_build.split import split_graph

__all__ = ["register_parser", "run"]

logger = logging.getLogger(__name__)


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("split", help=__doc__, description=__doc__)
    parser.add_argument("--plan", required=True, help="plan.json")
    parser.add_argument("--graph", required=True, choices=GRAPH_KINDS, help="which graph (names the part graphs)")
    parser.add_argument("--model", required=True, help="the full graph (.onnx, data beside it)")
    parser.add_argument("--out-dir", required=True,
                        help="the graph's parts directory: gets part_{NN_of_N}.onnx(.data), all or nothing")
    return parser


def run(args: argparse.Namespace) -> int:
    paths = split_graph(args.model, read_plan(args.plan), args.out_dir, args.graph)
    logger.info("%s: %d parts in %s", args.graph, len(paths), args.out_dir)
    return 0
