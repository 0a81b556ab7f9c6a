"""Generate text on the host from a reference Genie bundle (greedy, with a real KV cache), printing tokens/s."""

from __future__ import annotations

import argparse

from genie_build.run_bundle import run_bundle


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("run-bundle", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("bundle", metavar="DIR", help="the bundle directory (reference ctx-bins)")
    parser.add_argument("--prompt", required=True, help="the prompt text")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="tokens to generate at most (default 16)")
    return parser


def run(args: argparse.Namespace) -> int:
    result = run_bundle(args.bundle, args.prompt, args.max_new_tokens)
    print(f"{args.prompt}{result.text}")
    print(f"prompt: {len(result.prompt_ids)} tokens in {result.prompt_seconds:.3f} s; generated "
          f"{len(result.new_ids)} tokens, {result.tokens_per_second:.1f} tokens/s; ids {list(result.new_ids)}")
    return 0
