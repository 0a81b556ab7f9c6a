"""``plan``: check the prompt/token graphs, find the boundaries, write ``plan.json``
(:func:`genie_build.plan.plan_split`)."""

from __future__ import annotations

import argparse

from genie_build.cli_args import positive_float
from genie_build.plan import MIB, plan_split


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("plan", help="choose the split boundaries and write plan.json",
                                   description=__doc__)
    parser.add_argument("--prompt", required=True, help="prompt graph (AR > 1) .onnx")
    parser.add_argument("--token", required=True, help="token graph (AR = 1) .onnx, same weights")
    parser.add_argument("--encodings-prompt", required=True, help="AIMET encodings of the prompt graph (weigh the "
                                                                  "pieces; slice-encodings checks the graphs agree)")
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--num-parts", type=int, help="number of parts (context binaries), at least 2")
    size.add_argument("--max-part-mb", type=positive_float,
                      help="largest part in MiB (2**20 bytes): use the fewest parts that fit")
    parser.add_argument("--embedding-with-layers", action="store_true",
                        help="put the embedding in part 1 with the first layer(s) instead of alone")
    parser.add_argument("--boundaries", nargs="+", metavar="TENSOR",
                        help="the L + 1 residual tensors (after the embedding, after each layer); "
                             "default: found from node scopes")
    parser.add_argument("--skip-weight-check", action="store_true",
                        help="do not compare the graphs' shared weights (the workflow runs check-model for that, "
                             "once per model change, not once per encodings change)")
    parser.add_argument("--out", required=True, help="plan.json to write")
    return parser


def run(args: argparse.Namespace) -> int:
    plan_split(args.prompt, args.token, args.encodings_prompt, args.out, num_parts=args.num_parts,
               max_part_bytes=None if args.max_part_mb is None else int(args.max_part_mb * MIB),
               embedding_alone=not args.embedding_with_layers, boundaries=args.boundaries,
               check_weights=not args.skip_weight_check)
    return 0
