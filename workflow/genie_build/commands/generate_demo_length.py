"""Generate the demo's prompt and token graphs at another context length, sharing the weights of those generate-demo
wrote at the largest (docs/context-lengths.md)."""

from __future__ import annotations

import argparse
import logging

from genie_build.cli_args import positive_int
from genie_build.commands.generate_demo import shape_from_args
from genie_build.demo.demo import generate_demo_length

__all__ = ["register_parser", "run"]

logger = logging.getLogger(__name__)


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("generate-demo-length", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--out-dir", required=True, help="generate-demo's folder: prompt.onnx and token.onnx (+ .data)")
    parser.add_argument("--shape-json", required=True,
                        help="the demo's shape as generate-demo took it (its context the largest length)")
    parser.add_argument("--context", type=positive_int, required=True, help="the context length CL of the new graphs")
    return parser


def run(args: argparse.Namespace) -> int:
    written = generate_demo_length(shape_from_args(args), args.out_dir, args.context)
    logger.info("wrote %s", ", ".join(map(str, written.values())))
    return 0
