"""Split the prompt and token graphs into the plan's parts (streaming the weights)."""

from __future__ import annotations

import argparse
import logging

from genie_build.plan import read_plan
from genie_build.split import split_model

logger = logging.getLogger(__name__)


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("split", help=__doc__, description=__doc__)
    parser.add_argument("--plan", required=True, help="plan.json")
    parser.add_argument("--prompt", required=True, help="the full prompt graph (.onnx, data beside it)")
    parser.add_argument("--token", required=True, help="the full token graph (.onnx, data beside it)")
    parser.add_argument("--out-dir", required=True,
                        help="parts directory; gets prompt/ and token/ with part_{NN_of_N}.onnx(.data)")
    return parser


def run(args: argparse.Namespace) -> int:
    parts = split_model(args.prompt, args.token, read_plan(args.plan), args.out_dir)
    for kind, paths in parts.items():
        logger.info("%s: %d parts in %s", kind, len(paths), paths[0].parent)
    return 0
