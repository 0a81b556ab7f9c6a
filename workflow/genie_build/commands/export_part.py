"""``export-part``: one part of a Hugging Face checkpoint (a family :mod:`genie_build.families` registers) as Genie's
prompt (AR-N) and token (AR-1) ONNX graphs sharing one weights file, from the part's tensors only (docs/export.md)."""

from __future__ import annotations

import argparse

from genie_build.cli_args import json_object, positive_int
from genie_build.errors import GenieBuildError
from genie_build.plan.plan_file import PartPlan, part_from_dict

__all__ = ["HF_EXTRA_HINT", "add_part_arguments", "part_argument", "register_parser", "run"]

HF_EXTRA_HINT = "pip install --no-deps -r envs/requirements-hf.txt"


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("export-part", help=__doc__.splitlines()[0], description=__doc__)
    add_part_arguments(parser, context_help="context length CL of both graphs",
                       out_dir_help="folder for prompt.onnx, token.onnx and weights.onnx.data")
    return parser


def add_part_arguments(parser: argparse.ArgumentParser, *, context_help: str, out_dir_help: str) -> None:
    """The arguments of a command exporting one part's graphs (``export-part``, ``export-length``)."""
    parser.add_argument("--checkpoint", required=True,
                        help="checkpoint directory: config.json, model.safetensors (or shards + "
                             "model.safetensors.index.json), tokenizer.json")
    parser.add_argument("--part-json", required=True,
                        help="the part, as plan.json lists it (index, label, pieces, layers, boundaries)")
    parser.add_argument("--num-parts", required=True, type=positive_int, help="parts in the plan (graph names)")
    parser.add_argument("--ar", type=positive_int, required=True, help="tokens per call of the prompt graph (AR)")
    parser.add_argument("--context", type=positive_int, required=True, help=context_help)
    parser.add_argument("--out-dir", required=True, help=out_dir_help)


def part_argument(args: argparse.Namespace) -> PartPlan:
    return part_from_dict(json_object(args.part_json, "--part-json"), "--part-json")


def run(args: argparse.Namespace) -> int:
    part = part_argument(args)
    try:  # torch only here: the commands that do not export run without it
        from genie_build.export.export import export_part
    except ImportError as exc:
        raise GenieBuildError("export-part", f"needs torch, transformers and onnxscript ({HF_EXTRA_HINT}): "
                                             f"{exc}") from None
    export_part(args.checkpoint, part, args.out_dir, num_parts=args.num_parts, ar=args.ar, context=args.context)
    return 0
