"""What the children that call the vendor's libraries share (:mod:`genie_build.qnn_wheel.system`,
:mod:`genie_build.qnn_wheel.judge`, :mod:`genie_build.qnn_wheel.dialog_run`).

The libraries crash on inputs nobody checked before them and hang now and then, so every call runs in ``python -m
<module>``: this package first on the child's path, its memory bounded where the caller can say how much it needs, no
core dumps, its answers on a stream of their own (the libraries print to stdout), and whatever ends it -- a signal
or an exit -- told in words.
"""

from __future__ import annotations

import os
import resource
import signal
from pathlib import Path
from typing import TextIO

__all__ = ["answer_stream", "child_environment", "limit_resources", "signal_name"]


def child_environment() -> dict[str, str]:
    """The caller's environment with this package first on the path: the child runs a module of it."""
    package_root = str(Path(__file__).resolve().parents[2])
    inherited = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": package_root + (os.pathsep + inherited if inherited else "")}


def limit_resources(address_space: int | None) -> None:
    """In the child: no core file from a crash, and at most ``address_space`` bytes mapped (None: no limit)."""
    if address_space is not None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def answer_stream() -> TextIO:
    """In the child: the original stdout, for its answers; stdout itself then goes to stderr, where the libraries'
    own prints belong."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return out


def signal_name(number: int) -> str:
    """``SIGSEGV`` for 11; ``signal N`` for a number that names none."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
