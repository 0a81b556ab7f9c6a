"""The vendor's native x86-64 libraries, as the PyPI wheel ``onnxruntime-qnn`` installs them.

The wheel (x86-64 Linux) holds Qualcomm's HTP backend (``libQnnHtp.so``: prepares context binaries for any
Snapdragon SoC, and executes them in simulation), ``libQnnSystem.so`` (reads context binaries and DLCs back) and
``libGenie.so`` (Genie's C API). Nothing of them is copied into this project: they are found where pip put them,
and a missing wheel is one line naming the extra that installs it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from genie_build.errors import GenieBuildError

__all__ = ["DISTRIBUTION", "EXTRA", "WheelInfo", "library_path", "locate_wheel"]

DISTRIBUTION = "onnxruntime-qnn"
# The requirements file that installs the wheel (the quick start's install includes it on x86-64 Linux).
EXTRA = "envs/requirements-qnn.txt"
_PACKAGE = "onnxruntime_qnn"
_PLATFORMS = {("Linux", "x86_64")}


@dataclass(frozen=True)
class WheelInfo:
    """Where the wheel's libraries are, and which QNN SDK they come from."""

    library_dir: Path
    version: str                        # the wheel's, e.g. "2.7.0"
    qnn_version: str                    # the QNN SDK's it bundles, e.g. "2.51.0"


@cache
def locate_wheel(what: str = "the vendor's libraries") -> WheelInfo:
    """The installed wheel, found without loading any of its libraries.

    Args:
        what: what needs the wheel, for the error (e.g. ``"toolchain qnn-htp"``).

    Raises:
        GenieBuildError: this platform has no such wheel, or it is not installed for this interpreter.
    """
    system, machine = platform.system(), platform.machine()
    if (system, machine) not in _PLATFORMS:
        raise GenieBuildError(what, f"needs the {DISTRIBUTION} wheel, which exists for x86-64 Linux only "
                                    f"(this is {machine} {system}); use the reference toolchain here")
    try:
        spec = importlib.util.find_spec(_PACKAGE)
    except ImportError:   # a broken or hidden installation counts as none
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise GenieBuildError(what, f"the {DISTRIBUTION} wheel is not installed for {sys.executable}: "
                                    f"pip install -r {EXTRA}")
    library_dir = Path(next(iter(spec.submodule_search_locations)))
    version = importlib.metadata.version(DISTRIBUTION)
    info = importlib.util.spec_from_file_location(f"{_PACKAGE}_build_info",
                                                  library_dir / "build_and_package_info.py")
    module = importlib.util.module_from_spec(info)
    info.loader.exec_module(module)
    return WheelInfo(library_dir, version, getattr(module, "qnn_version", "unknown"))


def library_path(name: str, what: str = "the vendor's libraries") -> Path:
    """The path of one of the wheel's libraries (``"libQnnSystem.so"``, ...).

    Raises:
        GenieBuildError: the wheel is missing (:func:`locate_wheel`), or it lacks that library.
    """
    path = locate_wheel(what).library_dir / name
    if not path.is_file():
        raise GenieBuildError(what, f"{path}: not found in the installed {DISTRIBUTION} wheel "
                                    f"(reinstall it: pip install -r {EXTRA})")
    return path
