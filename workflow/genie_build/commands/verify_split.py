"""Check that a graph's parts chained in onnxruntime give the full graph's outputs bit for bit."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from genie_build.conventions import part_label
from genie_build.errors import GenieBuildError
from genie_build.fileio import write_json
from genie_build.verify import build_feed, verify_chain

logger = logging.getLogger(__name__)


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("verify-split", help=__doc__, description=__doc__)
    parser.add_argument("--model", required=True, help="the full graph (.onnx)")
    parser.add_argument("--parts-dir", required=True, help="directory of part_{NN_of_N}.onnx for that graph")
    parser.add_argument("--out", required=True, help="report (.json)")
    parser.add_argument("--vocab", type=int, help="token id range (default: the embedding table's rows)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated input (default 0)")
    return parser


def run(args: argparse.Namespace) -> int:
    parts = find_parts(Path(args.parts_dir))
    report = verify_chain(args.model, parts, build_feed(args.model, vocab=args.vocab, seed=args.seed))
    write_json(args.out, report.to_dict())
    logger.info("%s: %d outputs bit-exact over %d parts", args.model, len(report.outputs), len(parts))
    return 0


def find_parts(parts_dir: Path) -> list[Path]:
    """The ``part_{NN_of_N}.onnx`` files of a directory in part order, all N of them.

    Raises:
        GenieBuildError: no parts, mixed N, or a part missing.
    """
    paths = sorted(parts_dir.glob("part_*.onnx"))
    expected = [f"part_{part_label(index, len(paths))}.onnx" for index in range(1, len(paths) + 1)]
    if not paths or [path.name for path in paths] != expected:
        raise GenieBuildError(parts_dir, f"expected part_01_of_N.onnx … part_N_of_N.onnx, found "
                                         f"{[path.name for path in paths]}")
    return paths
