"""``plan``: check the prompt/token graphs, find the boundaries, write ``plan.json``
(:func:`genie_build.plan.plan_split`)."""

from __future__ import annotations

import argparse

from genie_build.cli_args import add_split_options, split_options
from genie_build.plan import MIB, plan_split


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("plan", help="choose the split boundaries and write plan.json",
                                   description=__doc__)
    parser.add_argument("--prompt", required=True, help="prompt graph (AR > 1) .onnx")
    parser.add_argument("--token", required=True, help="token graph (AR = 1) .onnx, same weights")
    parser.add_argument("--encodings-prompt", required=True, help="AIMET encodings of the prompt graph (weigh the "
                                                                  "pieces; slice-encodings checks the graphs agree)")
    add_split_options(parser)
    parser.add_argument("--skip-weight-check", action="store_true",
                        help="do not compare the graphs' shared weights (the workflow runs check-model for that, "
                             "once per model change, not once per encodings change)")
    parser.add_argument("--out", required=True, help="plan.json to write")
    return parser


def run(args: argparse.Namespace) -> int:
    split = split_options(args)
    plan_split(args.prompt, args.token, args.encodings_prompt, args.out, num_parts=split["num_parts"],
               max_part_bytes=None if split["max_part_mb"] is None else int(split["max_part_mb"] * MIB),
               embedding_alone=split["embedding_alone"], boundaries=split["boundaries"],
               check_weights=not args.skip_weight_check)
    return 0
