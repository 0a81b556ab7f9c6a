"""``part-encodings``: a part's prompt and token encodings from its calibration units' encodings
(:func:`genie_build.quantize.part_encodings.write_part_encodings`)."""

from __future__ import annotations

import argparse
import json

from genie_build.cli_args import add_switch
from genie_build.errors import GenieBuildError
from genie_build.plan.calibration_units import units_from_dicts
from genie_build.quantize import part_encodings as stage

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("part-encodings", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--part-units-json", required=True, help="the part's units, as the units file lists them")
    parser.add_argument("--unit-encodings", required=True, nargs="+", help="their encodings, in the same order")
    parser.add_argument("--previous-unit-json", help="the unit before the part's first (not for part 1)")
    parser.add_argument("--previous-encodings", help="its encodings")
    parser.add_argument("--prompt-graph", required=True, help="the part's prompt graph")
    parser.add_argument("--token-graph", required=True, help="the part's token graph")
    add_switch(parser, "--kv-cache-tied", "require each past_*_out to have its past_*_in's encoding (a bundle will be "
                                          "built)")
    parser.add_argument("--out-prompt", required=True, help="the prompt graph's encodings")
    parser.add_argument("--out-token", required=True, help="the token graph's encodings")
    return parser


def run(args: argparse.Namespace) -> int:
    units = _units(args.part_units_json, "--part-units-json")
    if len(units) != len(args.unit_encodings):
        raise GenieBuildError("--unit-encodings", f"{len(args.unit_encodings)} files for {len(units)} units")
    if (args.previous_unit_json is None) != (args.previous_encodings is None):
        raise GenieBuildError("--previous-unit-json", "give it together with --previous-encodings, or neither")
    previous = None if args.previous_unit_json is None else (
        _units(f"[{args.previous_unit_json}]", "--previous-unit-json")[0], args.previous_encodings)
    stage.write_part_encodings(list(zip(units, args.unit_encodings)), previous, args.prompt_graph, args.token_graph,
                               args.out_prompt, args.out_token, kv_cache_tied=args.kv_cache_tied)
    return 0


def _units(text: str, option: str):
    try:
        return units_from_dicts(json.loads(text), option)
    except json.JSONDecodeError as exc:
        raise GenieBuildError(option, f"not valid JSON: {exc}") from None
