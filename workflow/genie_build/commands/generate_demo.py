"""Generate the demo decoder: prompt and token ONNX graphs (external data) and an HF config.json."""

from __future__ import annotations

import argparse
import dataclasses
import logging

from genie_build.cli_args import json_object
from genie_build.demo.demo import WEIGHT_DTYPES, DemoShape, generate_demo
from genie_build.errors import GenieBuildError

__all__ = ["register_parser", "run", "shape_from_args"]

logger = logging.getLogger(__name__)


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("generate-demo", help=__doc__, description=__doc__)
    parser.add_argument("--out-dir", required=True, help="folder for prompt.onnx, token.onnx (+ .data), config.json")
    # One option per DemoShape field, so a new field is a new option with its default.
    for spec in dataclasses.fields(DemoShape):
        kind = type(spec.default)
        parser.add_argument(f"--{spec.name.replace('_', '-')}", dest=spec.name, type=kind, default=spec.default,
                            choices=WEIGHT_DTYPES if spec.name == "weight_dtype" else None,
                            help=f"(default {spec.default})")
    parser.add_argument("--weights", help="the trained model's safetensors file (the demo's own shape only; default: "
                                          "random weights)")
    parser.add_argument("--shape-json", help='the same fields as one JSON object (the config\'s demo section, as '
                                             'the workflow passes it), e.g. \'{"layers": 2, "ar": 8}\'')
    return parser


def run(args: argparse.Namespace) -> int:
    shape = shape_from_args(args)
    generate_demo(shape, args.out_dir, args.weights)
    logger.info("wrote the demo model %s to %s (%s weights)", shape, args.out_dir,
                args.weights or "random")
    return 0


def shape_from_args(args: argparse.Namespace) -> DemoShape:
    """The shape of the options and ``--shape-json`` (its fields first); a parser without a field's option takes
    the field's default."""
    return DemoShape(**{**{spec.name: getattr(args, spec.name, spec.default) for spec in dataclasses.fields(DemoShape)},
                        **_shape_fields(args.shape_json)})


def _shape_fields(text: str | None) -> dict:
    """The DemoShape fields of ``--shape-json``, each converted as its own option would convert it."""
    given = json_object(text, "--shape-json") if text is not None else {}
    kinds = {spec.name: type(spec.default) for spec in dataclasses.fields(DemoShape)}
    unknown = sorted(set(given) - set(kinds))
    if unknown:
        raise GenieBuildError("--shape-json", f"unknown fields {unknown} (known: {', '.join(kinds)})")
    try:
        return {name: kinds[name](value) for name, value in given.items()}
    except (TypeError, ValueError) as exc:
        raise GenieBuildError("--shape-json", str(exc)) from None
