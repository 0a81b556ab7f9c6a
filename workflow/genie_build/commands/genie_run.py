"""``genie-run``: the vendor's Genie (libGenie.so of the onnxruntime-qnn wheel) loads a qnn-htp bundle through its
twins on the build box and answers the host run's prompt, which must give the host run's tokens; or only creates the
dialog and lists the graphs it loaded (a load check); auto skips a bundle too large for the HTP simulation
(docs/genie-run.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.cli_args import add_genie_run_arguments, add_strict_option
from genie_build.commands.compile import parse_graphs
from genie_build.fileio import write_json
from genie_build.run.genie_run import MODES, SKIPPED, genie_run

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("genie-run", help=__doc__.splitlines()[0], description=__doc__)
    add_genie_run_arguments(parser, MODES)
    parser.add_argument("--prompt", type=Path, help="host_prompt.json (check-host-prompt): the prompt's ids Genie "
                                                    "answers and how many tokens it generates (needed to generate)")
    parser.add_argument("--host-run", type=Path, help="host_run.json: the tokens Genie must give")
    parser.add_argument("--float-graph", action="extend", nargs="+", default=[], metavar="NAME=PATH",
                        help="the float model's graphs, every part's, each under its graph name: its tokens are "
                             "reported beside Genie's")
    add_strict_option(parser, "token of Genie's that differs from the host run's (report.strict)")
    parser.add_argument("--out", type=Path, help="also write the result as JSON here")
    return parser


def run(args: argparse.Namespace) -> int:
    result = genie_run(args.bundle, args.twin, mode=args.mode, prompt=args.prompt, host_run=args.host_run,
                       float_graphs=parse_graphs(args.float_graph), strict=args.strict)
    report = result.to_dict()
    if args.out:
        write_json(args.out, report)
    if result.mode == SKIPPED:
        print(f"Genie's run not made: {result.why}")
        return 0
    print(f"{result.genie} loaded {args.bundle} through its twins in {result.load_seconds:.2f} s: graphs "
          + ", ".join(f"AR {graph['ar']} CL {graph['cl']} x{graph['parts']}" for graph in result.graphs_loaded))
    for change in result.config_changes:
        print(f"{change.file}: {change.key} {change.bundle!r} -> {change.run!r} ({change.why})")
    if result.mode == "generate":
        print(f"tokens {report['new_ids']}" + (": the host run's" if report.get("equal_to_host_run") else "")
              + (f" ({report['difference']})" if "difference" in report else "")
              + ("" if "float_ids" not in report else
                 f"; the float model's {'the same' if report['equal_to_float'] else report['float_ids']}"))
    else:
        print(f"load check only: {result.why}")
    return 0
