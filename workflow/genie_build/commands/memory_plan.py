"""``memory-plan``: one variant's context binaries against device memory guidance (JSON, Markdown)."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.cli_args import positive_float, positive_int
from genie_build.memory_plan import (DEFAULT_MAX_CONTEXT_BYTES, DEFAULT_MAX_SESSION_BYTES, MIB, MemoryLimits,
                                     plan_measured_memory)

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("memory-plan", help="check one variant's context binaries against the "
                                                       "per-context and per-session memory guidance")
    parser.add_argument("--records", required=True, nargs="+", type=Path, help="accounting records (account)")
    parser.add_argument("--variant", required=True, help="the variant to plan (the bundled one)")
    parser.add_argument("--max-context-mb", type=positive_float, default=DEFAULT_MAX_CONTEXT_BYTES / MIB,
                        help="per context binary, MiB (default %(default)s: AIHM's ~1-2 GB per compiled model)")
    parser.add_argument("--max-session-mb", type=positive_float, default=DEFAULT_MAX_SESSION_BYTES / MIB,
                        help="per HTP session, MiB (default %(default)s: 3.75 GiB usable, HTP manual)")
    parser.add_argument("--max-contexts", type=positive_int, default=None,
                        help="warn above this many contexts (default: no limit)")
    parser.add_argument("--json", required=True, type=Path, help="memory_plan.json")
    parser.add_argument("--md", required=True, type=Path, help="memory_plan.md")
    return parser


def run(args: argparse.Namespace) -> int:
    limits = MemoryLimits(max_context_bytes=round(args.max_context_mb * MIB),
                          max_session_bytes=round(args.max_session_mb * MIB), max_contexts=args.max_contexts)
    plan_measured_memory(args.records, args.variant, limits, args.json, args.md)
    return 0
