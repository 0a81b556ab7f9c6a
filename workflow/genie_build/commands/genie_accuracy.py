"""``genie-accuracy``: a qnn-htp bundle's perplexity on held-out text computed by the vendor's Genie itself
(GenieAccuracy of the onnxruntime-qnn wheel's libGenie.so, through the bundle's twins), beside the float model's on
the same tokens (docs/genie-run.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.cli_args import add_genie_run_arguments, positive_int
from genie_build.evaluate.genie_accuracy import genie_perplexity
from genie_build.fileio import write_json
from genie_build.run.genie_run import MODES

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("genie-accuracy", help=__doc__.splitlines()[0], description=__doc__)
    add_genie_run_arguments(parser, MODES)
    parser.add_argument("--variant", required=True, help="the bundle's variant (recorded)")
    parser.add_argument("--tokens", required=True, type=Path,
                        help="the held-out text's token ids (what tokenize-text wrote), as the evaluation reads them")
    parser.add_argument("--float-parts", required=True, nargs="+", type=Path,
                        help="the float prompt graphs, part order: the float model's perplexity on Genie's tokens")
    parser.add_argument("--max-windows", required=True, type=positive_int,
                        help="the evaluation's windows of the prompt graph's AR: Genie scores at least as many tokens")
    parser.add_argument("--out", required=True, type=Path, help="the result (JSON)")
    return parser


def run(args: argparse.Namespace) -> int:
    result = genie_perplexity(args.bundle, args.twin, variant=args.variant, tokens_path=args.tokens,
                              float_parts=args.float_parts, max_windows=args.max_windows, mode=args.mode)
    if result.skipped:
        print(f"{args.variant}: Genie's perplexity not computed: {result.skipped}")
    else:
        print(f"{args.variant}: perplexity by {result.genie} {result.perplexity:.4f} on {result.positions} tokens "
              f"({result.windows} windows, {result.seconds:.1f} s); the float model's {result.float_perplexity:.4f}")
    write_json(args.out, result.to_dict())
    return 0
