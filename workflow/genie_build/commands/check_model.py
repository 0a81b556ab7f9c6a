"""``check-model``: the prompt and token graphs' weights are all there and shared ones agree in shape, dtype and
value (streamed sha256). Its own job in the workflow, so that only a change of the model repeats it."""

from __future__ import annotations

import argparse

from genie_build.conventions import GRAPH_KINDS
from genie_build.split.check_model import check_model

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("check-model", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--prompt", required=True, help="prompt graph (AR > 1) .onnx")
    parser.add_argument("--token", required=True, help="token graph (AR = 1) .onnx")
    parser.add_argument("--length-graph", action="append", default=[], type=_kind_and_path, metavar="KIND=PATH",
                        help="a graph at another context length (prompt=… or token=…), whose weights must be its "
                             "kind's; repeat for each")
    parser.add_argument("--out", required=True, help="JSON summary to write when the check passes")
    return parser


def run(args: argparse.Namespace) -> int:
    check_model(args.prompt, args.token, args.out, args.length_graph)
    return 0


def _kind_and_path(text: str) -> tuple[str, str]:
    kind, _, path = text.partition("=")
    if kind not in GRAPH_KINDS or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not KIND=PATH with KIND one of {', '.join(GRAPH_KINDS)}")
    return kind, path
