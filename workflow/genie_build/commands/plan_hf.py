"""``plan-hf``: the plan of a Hugging Face checkpoint and its calibration chain's units, from its ``config.json``
alone (:func:`genie_build.plan.shape_plan.write_plan_checkpoint`)."""

from __future__ import annotations

import argparse

from genie_build.cli_args import add_embedding_option, add_load_options, add_split_options, load_params, positive_int, split_options
from genie_build.plan import shape_plan as stage
from genie_build.plan.recipes import RECIPES

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("plan-hf", help="plan a checkpoint's parts and calibration units from config.json",
                                   description=__doc__)
    parser.add_argument("--hf-config", required=True, help="the checkpoint's config.json")
    add_split_options(parser)
    parser.add_argument("--recipe", required=True, choices=sorted(RECIPES), help="docs/quantize.md")
    parser.add_argument("--ar", required=True, type=positive_int, help="tokens per call of the prompt graph")
    parser.add_argument("--context", required=True, type=positive_int, help="context length CL of both graphs")
    parser.add_argument("--unit-memory-mb", required=True, type=positive_int,
                        help="memory budget of one calibration job (MB)")
    add_load_options(parser)  # for num_parts auto
    add_embedding_option(parser)
    parser.add_argument("--out-plan", required=True, help="plan.json to write")
    parser.add_argument("--out-units", required=True, help="the calibration units (JSON) to write")
    return parser


def run(args: argparse.Namespace) -> int:
    stage.write_plan_checkpoint(args.hf_config, split_options(args), args.out_plan, args.out_units,
                                recipe=args.recipe, ar=args.ar, context=args.context,
                                unit_memory_mb=args.unit_memory_mb, load=load_params(args), embedding=args.embedding)
    return 0
