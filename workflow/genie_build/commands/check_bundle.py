"""Check a Genie bundle against the rules Genie enforces when it loads one (also bundles made elsewhere), by Genie's
own libraries where the onnxruntime-qnn wheel is installed."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from genie_build.bundle.bundle import withdraw_bundle
from genie_build.bundle.check_bundle import RULES, check_bundle
from genie_build.bundle.check_vendor import checkers
from genie_build.fileio import write_json

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("check-bundle", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("bundle", metavar="DIR", help="the bundle directory")
    parser.add_argument("--hf-config", metavar="FILE", help="the model's HF config.json (checks n-vocab against it)")
    parser.add_argument("--chipset", metavar="NAME", help="the intended chipset, e.g. SM8750 (checks soc_model "
                                                          "and dsp_arch against it)")
    parser.add_argument("--out", metavar="FILE", help="also write the findings as JSON (written only when the "
                                                      "bundle passes, so a failed check leaves no report behind)")
    parser.add_argument("--withdraw", action="store_true",
                        help="on any error, move the bundle aside to DIR.rejected so that it does not look finished "
                             "(the workflow's check: a rerun builds the bundle again)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Print every finding and who checked each config (the vendor's libraries, or why they were skipped); exit 1
    when any finding is an error."""
    findings = check_bundle(args.bundle, hf_config=args.hf_config, chipset=args.chipset)
    for finding in findings:
        print(finding)
    found = checkers()
    for name, checker in found.items():
        print(checker.line(name))
    errors = sum(f.severity == "error" for f in findings)
    print(f"{args.bundle}: {errors} errors, {len(findings) - errors} warnings")
    if errors:
        if args.withdraw:
            print(f"{args.bundle}: moved aside to {withdraw_bundle(args.bundle)}")
        return 1
    if args.out:
        skipped = {checker.rule for checker in found.values() if checker.skipped is not None}
        write_json(args.out, {"bundle": str(args.bundle), "rules_checked": sorted(set(RULES) - skipped),
                              "checked_by": {name: checker.to_dict() for name, checker in found.items()},
                              "errors": 0, "warnings": [asdict(finding) for finding in findings]})
    return 0
