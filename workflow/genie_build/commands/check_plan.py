"""``check-plan``: the plan made before calibration against the pieces weighed from the calibrated encodings;
other parts are an error (:mod:`genie_build.quantize.check_plan`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.errors import GenieBuildError
from genie_build.plan.plan_file import read_plan
from genie_build.quantize.check_plan import check_plan, measured_pieces

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("check-plan", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--plan", required=True, help="plan.json")
    parser.add_argument("--graphs", required=True, nargs="+", help="each part's prompt graph, in part order")
    parser.add_argument("--encodings", required=True, nargs="+", help="each part's prompt encodings, in part order")
    parser.add_argument("--out", required=True, help="the comparison (JSON)")
    return parser


def run(args: argparse.Namespace) -> int:
    plan = read_plan(args.plan)
    if not len(args.graphs) == len(args.encodings) == plan.num_parts:
        raise GenieBuildError(args.plan, f"{plan.num_parts} parts, but {len(args.graphs)} graphs and "
                                         f"{len(args.encodings)} encodings given")
    parts = {part.label: (Path(graph), Path(enc)) for part, graph, enc in zip(plan.parts, args.graphs, args.encodings)}
    check_plan(plan, measured_pieces(plan, parts), args.out, args.plan)
    return 0
