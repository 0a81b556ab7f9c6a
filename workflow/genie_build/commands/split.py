"""Split one graph (prompt or token, at any context length) into the plan's parts, streaming the weights: each part
into its folder of the parts folder, beside the part's other graphs."""

from __future__ import annotations

import argparse
import logging

from genie_build.conventions import GRAPH_KINDS
from genie_build.fileio import write_json
from genie_build.plan_file import read_plan
from genie_build.split import split_graph

__all__ = ["register_parser", "run"]

logger = logging.getLogger(__name__)


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("split", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--plan", required=True, help="plan.json")
    parser.add_argument("--graph", required=True, choices=GRAPH_KINDS, help="which graph (names the part graphs)")
    parser.add_argument("--key", help="the parts' file name (default: --graph; prompt_cl512 for another length)")
    parser.add_argument("--model", required=True, help="the full graph (.onnx, data beside it)")
    parser.add_argument("--parts-dir", required=True,
                        help="the parts folder: gets part_{NN_of_N}/{key}.onnx(.data), moved in once all are written")
    parser.add_argument("--out", help="a record of the parts written (.json), written last")
    return parser


def run(args: argparse.Namespace) -> int:
    paths = split_graph(args.model, read_plan(args.plan), args.parts_dir, args.graph, args.key)
    if args.out:
        write_json(args.out, {"graph": args.key or args.graph, "parts": [str(path) for path in paths]})
    logger.info("%s: %d parts in %s", args.key or args.graph, len(paths), args.parts_dir)
    return 0
