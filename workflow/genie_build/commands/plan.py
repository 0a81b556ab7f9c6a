"""``plan``: check the prompt/token graphs, find the boundaries, write ``plan.json``: the pieces weighed with the
prompt graph's encodings (:func:`genie_build.plan.plan.plan_split`), or, for float graphs to be calibrated part by part,
by a recipe's rule from the weights' shapes, with the calibration chain's units
(:func:`genie_build.plan.plan.plan_float_graphs`)."""

from __future__ import annotations

import argparse

from genie_build.cli_args import add_embedding_option, add_load_options, add_split_options, load_params, positive_int, split_options
from genie_build.errors import GenieBuildError
from genie_build.plan.plan import plan_float_graphs, plan_split
from genie_build.plan.recipes import RECIPES
from genie_build.split_request import SplitRequest

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("plan", help="choose the split boundaries and write plan.json",
                                   description=__doc__)
    parser.add_argument("--prompt", required=True, help="prompt graph (AR > 1) .onnx")
    parser.add_argument("--token", required=True, help="token graph (AR = 1) .onnx, same weights")
    weighing = parser.add_mutually_exclusive_group(required=True)
    weighing.add_argument("--encodings-prompt", help="AIMET encodings of the prompt graph (weigh the pieces; "
                                                     "slice-graph-encodings checks the graphs agree)")
    weighing.add_argument("--recipe", choices=sorted(RECIPES),
                          help="no encodings yet: weigh the pieces as this recipe will quantize them")
    parser.add_argument("--unit-memory-mb", type=positive_int,
                        help="with --recipe: memory budget of one calibration job (MB), for the units")
    parser.add_argument("--out-units", help="with --recipe: the calibration units (JSON) to write")
    add_split_options(parser)
    parser.add_argument("--skip-weight-check", action="store_true",
                        help="do not compare the graphs' shared weights (the workflow runs check-model for that, "
                             "once per model change, not once per encodings change)")
    add_load_options(parser)  # for num_parts auto
    parser.add_argument("--other-lengths", type=positive_int, nargs="*", default=[], metavar="CL",
                        help="for num_parts auto: the context lengths of the graphs each part's binary holds beside "
                             "these, whose IO every context maps too")
    add_embedding_option(parser)  # for num_parts auto
    parser.add_argument("--out", required=True, help="plan.json to write")
    return parser


def run(args: argparse.Namespace) -> int:
    split = split_options(args)
    if args.recipe is not None and (args.unit_memory_mb is None or args.out_units is None):
        raise GenieBuildError("--recipe", "needs --unit-memory-mb and --out-units (the calibration units)")
    request = SplitRequest.from_section(split)
    settings = {"boundaries": split["boundaries"], "check_weights": not args.skip_weight_check,
                "load": load_params(args), "other_lengths": args.other_lengths, "embedding": args.embedding}
    if args.recipe is not None:
        plan_float_graphs(args.prompt, args.token, args.out, args.out_units, request, recipe=args.recipe,
                          unit_memory_mb=args.unit_memory_mb, **settings)
    else:
        plan_split(args.prompt, args.token, args.encodings_prompt, args.out, request, **settings)
    return 0
