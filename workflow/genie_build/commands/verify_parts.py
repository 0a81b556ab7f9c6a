"""``verify-parts``: each part of a model exported part by part, run in onnxruntime and chained, against the
checkpoint's transformers modules on the same inputs (:func:`genie_build.verify_parts.verify_parts`)."""

from __future__ import annotations

import argparse

from genie_build.cli_args import positive_int
from genie_build.conventions import GRAPH_KINDS
from genie_build.errors import GenieBuildError
from genie_build.plan_file import read_plan

__all__ = ["register_parser", "run"]

HF_EXTRA_HINT = "pip install --no-deps -r envs/requirements-hf.txt"


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("verify-parts", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--checkpoint", required=True, help="the checkpoint directory")
    parser.add_argument("--plan", required=True, help="plan.json")
    parser.add_argument("--graph", required=True, choices=GRAPH_KINDS, help="which graph of the parts")
    parser.add_argument("--parts", required=True, nargs="+", help="that graph of every part, in part order")
    parser.add_argument("--context", type=positive_int,
                        help="the parts' context length CL, when not the plan's (a graph at another length)")
    parser.add_argument("--out", required=True, help="the report (JSON)")
    return parser


def run(args: argparse.Namespace) -> int:
    try:  # torch only here
        from genie_build.verify_parts import verify_parts
    except ImportError as exc:
        raise GenieBuildError("verify-parts", f"needs torch and transformers ({HF_EXTRA_HINT}): {exc}") from None
    plan = read_plan(args.plan)
    if len(args.parts) != plan.num_parts:
        raise GenieBuildError(args.plan, f"{plan.num_parts} parts, {len(args.parts)} graphs given")
    verify_parts(args.checkpoint, plan, args.graph, args.parts, args.out, context=args.context)
    return 0
