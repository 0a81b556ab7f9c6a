"""``check-model``: the prompt and token graphs' weights are all there and shared ones agree in shape, dtype and
value (streamed sha256). Its own job in the workflow, so that only a change of the model repeats it."""

from __future__ import annotations

import argparse

from genie_build.check_model import check_model

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("check-model", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--prompt", required=True, help="prompt graph (AR > 1) .onnx")
    parser.add_argument("--token", required=True, help="token graph (AR = 1) .onnx")
    parser.add_argument("--out", required=True, help="JSON summary to write when the check passes")
    return parser


def run(args: argparse.Namespace) -> int:
    check_model(args.prompt, args.token, args.out)
    return 0
