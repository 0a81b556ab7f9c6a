"""``calibrate-unit``: one unit of the calibration chain, carved from its part's prompt graph, quantized by a
recipe (w4a16, w4a16-lpbq, w8a16) and calibrated by aimet-onnx on the calibration text's token ids, fed the
residual stream the unit before it stored (:func:`genie_build.quantize.calibrate_unit.calibrate_unit`,
docs/quantize.md)."""

from __future__ import annotations

import argparse
import json

from genie_build.cli_args import positive_int
from genie_build.errors import GenieBuildError
from genie_build.plan.calibration_units import units_from_dicts
from genie_build.plan.recipes import RECIPES
from genie_build.quantize import calibrate_unit as stage

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("calibrate-unit", help="AIMET encodings of one unit of the calibration chain",
                                   description=stage.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part-graph", required=True, help="the prompt graph of the unit's part")
    parser.add_argument("--part-units-json", required=True, help="the units of that part, as the units file lists them")
    parser.add_argument("--unit", required=True, help="the unit's label, e.g. u03_of_17")
    parser.add_argument("--boundary-in", help="the residual stream the unit before it stored (.npy); not for the first")
    parser.add_argument("--hf-config", required=True, help="the model's config.json (RoPE)")
    parser.add_argument("--tokens", required=True, help="the calibration text's token ids (what tokenize-text wrote)")
    parser.add_argument("--recipe", required=True, choices=sorted(RECIPES), help="docs/quantize.md")
    parser.add_argument("--num-samples", required=True, type=int,
                        help="calibration windows of the prompt graph's AR tokens (at least 1)")
    parser.add_argument("--calibrator", default=stage.DEFAULT_CALIBRATOR, choices=sorted(stage.CALIBRATORS),
                        help="how the activations' grids are chosen (docs/quantize.md, Calibrators)")
    parser.add_argument("--ar", required=True, type=positive_int, help="the prompt graph's AR")
    parser.add_argument("--context", required=True, type=positive_int, help="the context length CL")
    parser.add_argument("--out-encodings", required=True, help="the unit's encodings (AIMET 1.0.0 .json)")
    parser.add_argument("--out-boundary", required=True, help="the unit's output stream, for the next unit (.npy)")
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        units = units_from_dicts(json.loads(args.part_units_json), "--part-units-json")
    except json.JSONDecodeError as exc:
        raise GenieBuildError("--part-units-json", f"not valid JSON: {exc}") from None
    stage.calibrate_unit(args.part_graph, units, args.unit, args.out_encodings, args.out_boundary,
                         hf_config_path=args.hf_config, tokens_path=args.tokens, recipe=args.recipe,
                         num_samples=args.num_samples, ar=args.ar, context=args.context,
                         boundary_in=args.boundary_in, calibrator=args.calibrator)
    return 0
