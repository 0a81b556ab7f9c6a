"""Generate the demo decoder: prompt and token ONNX graphs (external data) and an HF config.json."""

from __future__ import annotations

import argparse
import dataclasses
import logging

from genie_build.demo import WEIGHT_DTYPES, DemoShape, generate_demo

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
    return parser


def run(args: argparse.Namespace) -> int:
    shape = DemoShape(**{spec.name: getattr(args, spec.name) for spec in dataclasses.fields(DemoShape)})
    generate_demo(shape, args.out_dir)
    logger.info("wrote the demo model %s to %s", shape, args.out_dir)
    return 0
