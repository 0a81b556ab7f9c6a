"""``memory-plan``: one variant's context binaries against device memory guidance (JSON, Markdown)."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.chipsets import HTP_MODEL_BYTES, HTP_SESSION_BYTES
from genie_build.cli_args import add_load_options, add_strict_option, load_params, positive_float, positive_int
from genie_build.errors import GenieBuildError
from genie_build.fileio import read_json
from genie_build.sizes.memory_plan import MemoryLimits, plan_measured_memory
from genie_build.units import MIB

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("memory-plan", help="check one variant's context binaries against the "
                                                       "per-context and per-session memory guidance")
    parser.add_argument("--records", required=True, nargs="+", type=Path, help="accounting records (account)")
    parser.add_argument("--variant", required=True, help="the variant to plan (the bundled one)")
    parser.add_argument("--max-context-mb", type=positive_float, default=HTP_MODEL_BYTES / MIB,
                        help="per context binary, MiB (default %(default)s: AIHM's ~1-2 GB per compiled model)")
    parser.add_argument("--max-session-mb", type=positive_float, default=HTP_SESSION_BYTES / MIB,
                        help="per HTP session, MiB (default %(default)s: 3.75 GiB usable, HTP manual)")
    parser.add_argument("--max-contexts", type=positive_int, default=None,
                        help="warn above this many contexts (default: no limit)")
    parser.add_argument("--json", required=True, type=Path, help="memory_plan.json")
    parser.add_argument("--md", required=True, type=Path, help="memory_plan.md")
    parser.add_argument("--png", required=True, type=Path, help="memory_plan.png (the sessions drawn)")
    parser.add_argument("--embedding-table", type=Path, metavar="BIN",
                        help="bundle.embedding: lut: the embedding table (BIN.json beside it), on the CPU; --records "
                             "are then the parts after it")
    parser.add_argument("--split-choice", type=Path, metavar="JSON",
                        help="split.num_parts auto: which bound chose the part count ({\"chosen_by\": ...})")
    add_load_options(parser)
    add_strict_option(parser, "context that will not map")
    return parser


def run(args: argparse.Namespace) -> int:
    limits = MemoryLimits(max_context_bytes=round(args.max_context_mb * MIB),
                          max_session_bytes=round(args.max_session_mb * MIB), max_contexts=args.max_contexts)
    table = 0
    if args.embedding_table is not None:
        # numpy: only a table's plan pays it
        from genie_build.bundle.embedding_table import read_table_file, table_bytes

        described = read_table_file(args.embedding_table)
        table = table_bytes(described.n_vocab, described.n_embd, described.encoding.bitwidth)
    chosen_by = None
    if args.split_choice is not None:
        choice = read_json(args.split_choice)
        chosen_by = choice.get("chosen_by") if isinstance(choice, dict) else None
        if chosen_by is not None and not isinstance(chosen_by, str):
            raise GenieBuildError(args.split_choice, "chosen_by is neither a sentence nor null")
    plan = plan_measured_memory(args.records, args.variant, limits, args.json, args.md, args.png,
                                load=load_params(args), cpu_table_bytes=table, part_count=chosen_by)
    if args.strict and not plan.load.maps:
        failing = plan.load.failing
        raise GenieBuildError(args.json, f"report.strict: part {failing[0].part} of {args.variant!r} will not map "
                                         f"({failing[0].reason})" + (f" and {len(failing) - 1} more" if len(failing) > 1 else ""))
    return 0
