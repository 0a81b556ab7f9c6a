"""``check-contract``: the prompt and token graphs follow Genie's IO contract (names, ranks, shapes and dtypes
of input_ids, attention_mask, position_ids_cos/_sin, the KV cache and logits; AR and CL read as Genie reads
them, agreeing between the graphs and with the config), and agree with the model's tokenizer and config.json.
Reads the graphs' structure only, never their weights, and reports every violation at once."""

from __future__ import annotations

import argparse

from genie_build.cli_args import json_object
from genie_build.errors import GenieBuildError
from genie_build.genie_contract import check_contract

__all__ = ["register_parser", "run"]

_CHECKS = {"expect_ar": None, "expect_context": None, "context_size": None, "report_only": False}


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("check-contract", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--prompt", required=True, nargs="+",
                        help="prompt graph (AR > 1) .onnx, or its parts' in part order (a model exported part by part)")
    parser.add_argument("--token", required=True, nargs="+", help="token graph (AR = 1) .onnx, or its parts'")
    parser.add_argument("--expect-ar", type=int, metavar="N", help="the prompt graph's AR the config gives")
    parser.add_argument("--expect-context", type=int, metavar="N", help="the graphs' CL the config gives")
    parser.add_argument("--context-size", type=int, metavar="N", help="Genie's context size (at most the CL)")
    parser.add_argument("--report-only", action="store_true",
                        help="no bundle will be built (bundle.enabled: false): record the violations and pass")
    parser.add_argument("--checks-json", metavar="JSON",
                        help='the four options above as one JSON object (the workflow passes it), e.g. '
                             '\'{"expect_ar": 32, "expect_context": 256, "context_size": null, "report_only": false}\'')
    parser.add_argument("--tokenizer", metavar="FILE", help="the model's tokenizer.json (with --hf-config: checked "
                                                           "against the graphs and config.json)")
    parser.add_argument("--hf-config", metavar="FILE", help="the model's config.json (with --tokenizer)")
    parser.add_argument("--out", required=True, help="JSON summary, written when the check passes")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.checks_json is not None:
        vars(args).update(_checks(args.checks_json))
    if (args.tokenizer is None) != (args.hf_config is None):
        raise GenieBuildError("--tokenizer" if args.tokenizer is None else "--hf-config",
                              "give the tokenizer and config.json together")
    check_contract(args.prompt, args.token, args.out, expect_ar=args.expect_ar, expect_context=args.expect_context,
                   context_size=args.context_size, report_only=args.report_only, tokenizer=args.tokenizer,
                   hf_config=args.hf_config)
    return 0


def _checks(text: str) -> dict:
    checks = json_object(text, "--checks-json")
    unknown = sorted(set(checks) - set(_CHECKS))
    if unknown:
        raise GenieBuildError("--checks-json", f"unknown keys {unknown} (known: {', '.join(_CHECKS)})")
    return {**_CHECKS, **checks, "report_only": bool(checks.get("report_only", False))}
