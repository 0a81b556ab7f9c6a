"""Generate text on the host from a Genie bundle (greedy, with a real KV cache), printing tokens/s: reference
containers on the CPU, QNN binaries through their twins in the HTP simulation of the vendor's x86 libraries."""

from __future__ import annotations

import argparse

from genie_build.fileio import write_json
from genie_build.run.run_bundle import host_run

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("run-bundle", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("bundle", metavar="DIR", help="the bundle directory")
    parser.add_argument("--twin", metavar="DIR", nargs="+", default=(),
                        help="for a bundle of QNN binaries: each ctx-bin's twin folder, in order (compile-twin)")
    parser.add_argument("--prompt", required=True, help="the prompt text")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="tokens to generate at most (default 16)")
    compare = parser.add_mutually_exclusive_group()
    compare.add_argument("--compare-with", metavar="BIN",
                         help="the unsplit model compiled as one reference container: fail unless its greedy "
                              "tokens equal the bundle's")
    compare.add_argument("--compare-with-parts", metavar="ONNX", nargs="+", default=(),
                         help="instead, every part's graphs as the converter wrote them (a model exported part by "
                              "part has no unsplit graph; a qnn-htp bundle is compared with its QDQ graphs)")
    parser.add_argument("--embedding-part", nargs=2, metavar=("ONNX", "ENCODINGS"),
                        help="for a bundle whose embedding is a table: part 1's graph and encodings, from which the "
                             "reference computes each token's row as the table must hold it (never read from the "
                             "bundle's table)")
    parser.add_argument("--out", help="also write the result as JSON here")
    return parser


def run(args: argparse.Namespace) -> int:
    result = host_run(args.bundle, args.prompt, args.max_new_tokens, compare_with=args.compare_with,
                      compare_with_parts=args.compare_with_parts, twins=args.twin,
                      embedding_part=args.embedding_part)
    generation = result.generation
    print(f"{args.prompt}{generation.text}")
    print(f"prompt: {len(generation.prompt_ids)} tokens in {generation.prompt_seconds:.3f} s; generated "
          f"{len(generation.new_ids)} tokens, {generation.tokens_per_second:.1f} tokens/s; ids "
          f"{list(generation.new_ids)}; graphs "
          + ", ".join(f"AR {run.ar} CL {run.cl} x{run.steps}" for run in generation.graph_runs))
    if result.reference_ids is not None:
        print(f"equal to the tokens of {result.compared_with}")
    if args.out:
        write_json(args.out, result.to_dict())
    return 0
