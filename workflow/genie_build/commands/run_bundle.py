"""Generate text on the host from a reference Genie bundle (greedy, with a real KV cache), printing tokens/s."""

from __future__ import annotations

import argparse

from genie_build.errors import GenieBuildError
from genie_build.fileio import write_json
from genie_build.run_bundle import run_bundle, unsplit_tokens


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("run-bundle", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("bundle", metavar="DIR", help="the bundle directory (reference ctx-bins)")
    parser.add_argument("--prompt", required=True, help="the prompt text")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="tokens to generate at most (default 16)")
    parser.add_argument("--compare-with", metavar="BIN",
                        help="the unsplit model compiled as one reference container: fail unless its greedy "
                             "tokens equal the bundle's")
    parser.add_argument("--out", help="also write the result as JSON here")
    return parser


def run(args: argparse.Namespace) -> int:
    result = run_bundle(args.bundle, args.prompt, args.max_new_tokens)
    print(f"{args.prompt}{result.text}")
    print(f"prompt: {len(result.prompt_ids)} tokens in {result.prompt_seconds:.3f} s; generated "
          f"{len(result.new_ids)} tokens, {result.tokens_per_second:.1f} tokens/s; ids {list(result.new_ids)}")
    report = {"prompt": args.prompt, "prompt_ids": list(result.prompt_ids), "new_ids": list(result.new_ids),
              "text": result.text, "tokens_per_second": round(result.tokens_per_second, 1)}
    if args.compare_with:
        expected = unsplit_tokens(args.bundle, args.compare_with, result.prompt_ids, args.max_new_tokens)
        if expected != list(result.new_ids):
            raise GenieBuildError(args.bundle, f"the bundle's tokens {list(result.new_ids)} differ from the unsplit "
                                               f"model's {expected} ({args.compare_with})")
        print(f"equal to the unsplit model's tokens ({args.compare_with})")
        report["unsplit_ids"] = expected
    if args.out:
        write_json(args.out, report)
    return 0
