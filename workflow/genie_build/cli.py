"""``python -m genie_build <command>``: every module in ``genie_build.commands`` is one command.

Each command module has ``register_parser(subparsers)`` returning its parser and ``run(args) -> int``
(the nextstrain/augur layout). A :class:`GenieBuildError` becomes one line ``genie-build: error: …``
on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import resource
import sys
import time
from collections.abc import Sequence

from genie_build import __version__, commands
from genie_build.errors import GenieBuildError
from genie_build.fileio import write_text

__all__ = ["EXIT_USER_ERROR", "build_parser", "main", "program"]

EXIT_USER_ERROR = 2


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command, or with just the module ``only`` (each command imports its own heavy
    libraries, and a workflow job runs one command: importing all of them cost every job half a second)."""
    parser = argparse.ArgumentParser(prog="genie-build", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"genie-build {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--benchmark", metavar="TSV",
                        help="write this run's wall time and peak RSS here (for jobs Snakemake cannot benchmark: "
                             "rules eligible for between-workflow caching)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    names = sorted(info.name for info in pkgutil.iter_modules(commands.__path__))
    for name in [only] if only in names else names:
        module = importlib.import_module(f"{commands.__name__}.{name}")
        module.register_parser(subparsers).set_defaults(__command__=module)
    return parser


def _command_module(argv: Sequence[str]) -> str | None:
    """The module name of the command in ``argv`` (its first word that is not an option), if any."""
    return next((word.replace("-", "_") for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_command_module(argv)).parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        started = time.perf_counter()
        status = int(args.__command__.run(args) or 0)
        if args.benchmark and status == 0:
            _write_benchmark(args.benchmark, time.perf_counter() - started)
    except GenieBuildError as exc:
        print(f"genie-build: error: {exc}", file=sys.stderr)
        status = EXIT_USER_ERROR
    return status


def program() -> None:
    """The ``genie-build`` program (``python -m genie_build``): :func:`main`, then the process ends with its status.

    A process that loaded the vendor's QNN backends ends at once: their static destructors crash (SIGBUS) once a
    weight-shared context was left unfinished by a refused graph, which would turn a one-line error into a crash.
    Every output is closed (atomic writes) by then. :func:`main` itself never ends the process (tests call it)."""
    status = main()
    backend = sys.modules.get("genie_build.toolchains.qnn_htp.backend")
    if backend is not None and backend.backends_loaded():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def _write_benchmark(path: str, seconds: float) -> None:
    """A TSV with the columns of Snakemake's ``benchmark:`` files that a process can measure of itself;
    ``max_rss`` (MB) is the exact peak (``getrusage``), not a sample."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    hours, rest = divmod(int(seconds), 3600)
    clock = f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
    write_text(path, "s\th:m:s\tmax_rss\tcpu_time\n"
                     f"{seconds:.4f}\t{clock}\t{usage.ru_maxrss / 1024:.2f}\t{usage.ru_utime + usage.ru_stime:.2f}\n")
