"""Split the model's graphs (prompt and token, at every context length) into the plan's parts, streaming the
weights: each part's graphs into its folder of the parts folder, reading the part's one weights file."""

from __future__ import annotations

import argparse
import logging

from genie_build.conventions import key_kind
from genie_build.errors import GenieBuildError
from genie_build.fileio import write_json
from genie_build.plan.plan_file import read_plan
from genie_build.split.split import split_graphs

__all__ = ["register_parser", "run"]

logger = logging.getLogger(__name__)


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("split", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--plan", required=True, help="plan.json")
    parser.add_argument("--graph", required=True, nargs="+", metavar="KEY=PATH",
                        help="each whole graph (.onnx, data beside it) under its key: prompt, token, or a kind at "
                             "another context length (prompt_cl512); the first graph's weights are stored first")
    parser.add_argument("--parts-dir", required=True,
                        help="the parts folder: gets part_{NN_of_N}/{key}.onnx and the part's weights.onnx.data, "
                             "moved in once all are written")
    parser.add_argument("--out", help="a record of the parts written (.json), written last")
    return parser


def run(args: argparse.Namespace) -> int:
    models = {}
    for item in args.graph:
        key, _, path = item.partition("=")
        if not path or key in models:
            raise GenieBuildError("--graph", f"expected KEY=PATH, each key once, got {item!r}")
        try:
            key_kind(key)
        except ValueError as exc:
            raise GenieBuildError("--graph", str(exc)) from None
        models[key] = path
    parts = split_graphs(models, read_plan(args.plan), args.parts_dir)
    if args.out:
        write_json(args.out, {"graphs": {key: [str(path) for path in paths] for key, paths in parts.items()}})
    logger.info("%s: %d parts in %s", ", ".join(parts), len(next(iter(parts.values()))), args.parts_dir)
    return 0
