"""What the calls into the vendor's libraries share: they run in a child process (``python -m <module>``) with this
package first on its path, a bounded address space and no core file, and a signal that ended it is named."""

from __future__ import annotations

import os
import resource
import signal
from pathlib import Path

__all__ = ["child_environment", "limit_resources", "signal_name"]


def child_environment() -> dict[str, str]:
    """The caller's environment with this package first on the path: the child runs a module of it."""
    package_root = str(Path(__file__).resolve().parents[2])
    inherited = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": package_root + (os.pathsep + inherited if inherited else "")}


def limit_resources(address_space: int) -> None:
    """In the child: bound its memory, and keep a crash from writing a core file."""
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def signal_name(number: int) -> str:
    """``SIGSEGV`` for 11; ``signal N`` for a number that names none."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
