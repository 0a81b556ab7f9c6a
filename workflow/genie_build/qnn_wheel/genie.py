"""Genie's C API -- ``libGenie.so`` of the ``onnxruntime-qnn`` wheel (Genie 2.51, API 1.21 on x86-64) -- through
ctypes.

What genie-build asks of it today: whether Genie accepts a ``genie_config.json`` (``GenieDialogConfig_createFromJson``
parses it with Genie's own JSON reader and validates the dialog against the JSON schemas the library embeds), and
why not, in Genie's words. Genie prints that reason to ``std::cerr`` and nowhere else (its log API binds to a config
handle, which a refused config never gets), so the call runs inside :func:`genie_build.qnn_wheel.native.native_output`.

The handles are opaque pointers and every function returns a ``Genie_Status_t`` (int32, 0 on success); the
signatures below are those facts, declared once in :data:`_FUNCTIONS`. Further calls (a dialog on a bundle, a token
query, ``GenieAccuracy``) belong here beside them: their signatures in :data:`_FUNCTIONS`, a :class:`Genie` method
per use, a dialog config handle from ``Genie._create_dialog_config``.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from functools import cache

from genie_build.errors import GenieBuildError
from genie_build.qnn_wheel import DISTRIBUTION, WheelInfo, library_path, locate_wheel
from genie_build.qnn_wheel.native import native_output

__all__ = ["LIBRARY", "Genie", "GenieRefusal", "load_genie"]

LIBRARY = "libGenie.so"
_STATUS = ctypes.c_int32
_HANDLE = ctypes.c_void_p
# name -> (restype, argtypes): the part of Genie's C API this binding calls
_FUNCTIONS = {
    "Genie_getApiMajorVersion": (ctypes.c_uint32, []),
    "Genie_getApiMinorVersion": (ctypes.c_uint32, []),
    "Genie_getApiPatchVersion": (ctypes.c_uint32, []),
    "GenieDialogConfig_createFromJson": (_STATUS, [ctypes.c_char_p, ctypes.POINTER(_HANDLE)]),
    "GenieDialogConfig_free": (_STATUS, [_HANDLE]),
}
# Genie_Status_t values as Genie 2.51 returned them for a refused config
_STATUS_NAMES = {-7: "not JSON to Genie's parser", -8: "refused by Genie's schema"}
# What Genie's validator says of every combinator on the way down to the real reason: not worth repeating
_SCHEMA_NOISE = ("at least one subschema has failed, but all of them are required to validate",)
_SCHEMA_ERROR = re.compile(r"^\s*- at '(?P<pointer>[^']*)': (?P<reason>.*)$")
_PREFIX = "Failed to validate dialog config: "


@dataclass(frozen=True)
class GenieRefusal:
    """Why Genie refused a config: its status and its reasons, one line each (a schema error names the key as a
    dotted path from ``dialog``)."""

    status: int
    reasons: tuple[str, ...]

    @property
    def status_name(self) -> str:
        return _STATUS_NAMES.get(self.status, f"Genie status {self.status}")

    def __str__(self) -> str:
        return f"{self.status_name}: {'; '.join(self.reasons)}"


class Genie:
    """``libGenie.so`` loaded, with the wheel it came from."""

    def __init__(self, library: ctypes.CDLL, wheel: WheelInfo) -> None:
        for name, (restype, argtypes) in _FUNCTIONS.items():
            function = getattr(library, name)
            function.restype, function.argtypes = restype, argtypes
        self._library = library
        self.wheel = wheel

    @property
    def api_version(self) -> str:
        """Genie's C API version, e.g. ``"1.21.0"``."""
        lib = self._library
        return f"{lib.Genie_getApiMajorVersion()}.{lib.Genie_getApiMinorVersion()}.{lib.Genie_getApiPatchVersion()}"

    def describe(self) -> str:
        """Which Genie this is, for reports: the library, its API, the wheel and the QNN SDK it comes from."""
        return (f"{LIBRARY} (Genie API {self.api_version}; {DISTRIBUTION} {self.wheel.version}, "
                f"QNN SDK {self.wheel.qnn_version})")

    def dialog_config_refusal(self, text: str) -> GenieRefusal | None:
        """None when Genie accepts ``text`` as a dialog config; otherwise why not."""
        handle, refusal = self._create_dialog_config(text)
        if handle is not None:
            self._library.GenieDialogConfig_free(handle)
        return refusal

    def _create_dialog_config(self, text: str) -> tuple[ctypes.c_void_p | None, GenieRefusal | None]:
        """A ``GenieDialogConfig_Handle_t`` for ``text`` (the caller frees it), or why Genie refuses the config."""
        handle = _HANDLE()
        with native_output() as said:
            status = self._library.GenieDialogConfig_createFromJson(text.encode("utf-8"), ctypes.byref(handle))
        if status == 0 and handle.value:
            return handle, None
        return None, GenieRefusal(status, _reasons(said.text) or ("(Genie said nothing)",))


@cache
def load_genie(what: str = "Genie's own check") -> Genie:
    """The wheel's libGenie, loaded once per process.

    Raises:
        GenieBuildError: the wheel is missing (:func:`genie_build.qnn_wheel.locate_wheel`) or the library does not
            load.
    """
    path = library_path(LIBRARY, what)
    try:
        with native_output():
            library = ctypes.CDLL(str(path))
        return Genie(library, locate_wheel(what))
    except (OSError, AttributeError) as exc:  # not loadable, or without the functions of this binding
        raise GenieBuildError(path, f"does not load as Genie's library: {exc}") from None


def _reasons(said: str) -> tuple[str, ...]:
    """Genie's message, one reason per schema error (``dialog.context.size: unexpected instance type``), or its
    lines joined when it is not a schema report (a JSON parse error, an unknown top-level key)."""
    reasons = []
    for line in said.splitlines():
        match = _SCHEMA_ERROR.match(line)
        if match:
            steps = [step for step in match["reason"].split(" - ") if step not in _SCHEMA_NOISE]
            reasons.append(f"{_dotted(match['pointer'])}: {' - '.join(steps) or match['reason']}")
    if reasons:
        return tuple(reasons)
    text = " ".join(line.strip() for line in said.splitlines() if line.strip())
    while text.startswith(_PREFIX):
        text = text[len(_PREFIX):]
    return (text,) if text else ()


def _dotted(pointer: str) -> str:
    """A JSON pointer into the dialog (``/engine/backend``) as the dotted path of the file (``dialog.engine.backend``)."""
    parts = [part.replace("~1", "/").replace("~0", "~") for part in pointer.split("/") if part]
    return ".".join(["dialog", *parts])
