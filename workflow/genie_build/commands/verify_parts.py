"""``verify-parts``: every graph of one part of a model exported part by part, run in onnxruntime, against the
checkpoint's transformers modules on the same inputs (:func:`genie_build.export.verify_parts.verify_part`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from genie_build.cli_args import positive_int
from genie_build.conventions import GRAPH_KINDS
from genie_build.errors import GenieBuildError
from genie_build.plan.plan_file import part_from_dict

__all__ = ["register_parser", "run"]

HF_EXTRA_HINT = "pip install --no-deps -r envs/requirements-hf.txt"


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("verify-parts", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--checkpoint", required=True, help="the checkpoint directory")
    parser.add_argument("--part-json", required=True, help="the part, as plan.json lists it")
    parser.add_argument("--ar", required=True, type=positive_int, help="the prompt graphs' AR")
    parser.add_argument("--graphs-json", required=True,
                        help='the part\'s graphs, [[key, kind, context], ...] (e.g. [["prompt", "prompt", 4096]])')
    parser.add_argument("--paths", required=True, nargs="+", help="those graphs' files, in the same order")
    parser.add_argument("--out", required=True, help="the report (JSON)")
    return parser


def run(args: argparse.Namespace) -> int:
    try:  # torch only here
        from genie_build.export.verify_parts import PartGraph, verify_part
    except ImportError as exc:
        raise GenieBuildError("verify-parts", f"needs torch and transformers ({HF_EXTRA_HINT}): {exc}") from None
    try:
        part = part_from_dict(json.loads(args.part_json), "--part-json")
        listed = json.loads(args.graphs_json)
        graphs = [PartGraph(str(key), kind, int(context), Path(path))
                  for (key, kind, context), path in zip(listed, args.paths, strict=True)]
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise GenieBuildError("--graphs-json", f"not one [key, kind, context] per path: {exc}") from None
    if any(graph.kind not in GRAPH_KINDS for graph in graphs):
        raise GenieBuildError("--graphs-json", f"a graph's kind is not one of {list(GRAPH_KINDS)}")
    verify_part(args.checkpoint, part, graphs, ar=args.ar, out=args.out)
    return 0
