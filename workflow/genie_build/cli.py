"""``python -m genie_build <command>``: every module in ``genie_build.commands`` is one command.

Each command module has ``register_parser(subparsers)`` returning its parser and ``run(args) -> int``
(the nextstrain/augur layout). A :class:`GenieBuildError` becomes one line ``genie-build: error: …``
on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence

from genie_build import __version__, commands
from genie_build.errors import GenieBuildError

EXIT_USER_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="genie-build", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"genie-build {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register_parser(subparsers).set_defaults(__command__=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args.__command__.run(args) or 0)
    except GenieBuildError as exc:
        print(f"genie-build: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
