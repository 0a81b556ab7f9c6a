"""The HTP backend's extensions library -- ``libQnnHtpNetRunExtensions.so`` of the ``onnxruntime-qnn`` wheel --
reading an ``htp_backend_ext_config.json`` as Genie has it read.

Genie hands the bundle's extension config to this library when a dialog loads (``BackendExtensions``: ``dlopen``,
``createBackendInterface``, then the interface's ``setupLogging``, ``initialize`` and ``loadConfig``). The library
validates the file against the JSON schema it embeds and then reads every key, logging an error for a value it
cannot use (a type the schema does not allow, an unknown key in ``graphs[]`` or ``cores[]``, a ``perf_profile`` it
does not know); Genie then carries on without the extensions. :func:`extension_errors` makes the same calls and
returns the errors the library logged.

The interface is a C++ object: its first word points at its virtual table (Itanium ABI). The slots used, read from
the disassembly of the QNN 2.51 library (:data:`KNOWN_QNN_SDKS`; another SDK's layout is not assumed): 2
``setupLogging(QnnLog_Callback_t, QnnLog_Level_t) -> bool``, 3 ``initialize(void* backendLibHandle) -> bool`` (it
looks up ``QnnInterface_getProviders`` in the wheel's ``libQnnHtp.so``), 7 ``loadConfig(std::string path) -> bool``.
The ``std::string`` is libc++'s (the library's own copy in the wheel): a zeroed object is an empty string in libc++'s
layout, filled and destroyed by libc++'s exported ``assign`` and destructor, found through the library's handle.
"""

from __future__ import annotations

import ctypes
import json
import re
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

from genie_build.errors import GenieBuildError
from genie_build.qnn_wheel import DISTRIBUTION, WheelInfo, library_path, locate_wheel
from genie_build.qnn_wheel.native import format_message, native_output

__all__ = ["KNOWN_QNN_SDKS", "LIBRARY", "HtpExtensions", "layout_problem", "load_htp_extensions"]

LIBRARY = "libQnnHtpNetRunExtensions.so"
BACKEND = "libQnnHtp.so"
KNOWN_QNN_SDKS = ("2.51.",)  # whose library's virtual-table slots were read (module docstring)
_SETUP_LOGGING, _INITIALIZE, _LOAD_CONFIG = 2, 3, 7
_LOG_ERROR = 1  # QnnLog_Level_t: the library's errors only (its warnings are about this x86 host)
_STRING_BYTES = 64  # libc++'s std::string is 24 bytes on x86-64; room to spare
_ASSIGN = "_ZNSt3__112basic_stringIcNS_11char_traitsIcEENS_9allocatorIcEEE6assignEPKc"
_DESTROY = "_ZNSt3__112basic_stringIcNS_11char_traitsIcEENS_9allocatorIcEEED2Ev"
_LOG_CALLBACK_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p)
_SCHEMA_DETAIL = re.compile(r"^#(?P<pointer>/\S*?)(?P<detail>\{.*\})$")
_POINTER = re.compile(r"#(/[^\s{]*)")
_SCHEMA_HEADER = "Schema error:"

# The library keeps the logging callback after an interface is destroyed: one callback for the process, kept alive
# here, appending to the list of the check under way.
_messages: list[str] = []


@_LOG_CALLBACK_TYPE
def _log(template: bytes, level: int, timestamp: int, arguments: int | None) -> None:
    _messages.append(format_message(template, arguments))


class HtpExtensions:
    """The wheel's extensions library and HTP backend, loaded."""

    def __init__(self, extensions: ctypes.CDLL, backend: ctypes.CDLL, wheel: WheelInfo) -> None:
        extensions.createBackendInterface.restype = ctypes.c_void_p
        extensions.destroyBackendInterface.argtypes = [ctypes.c_void_p]
        for name in (_ASSIGN, _DESTROY):
            getattr(extensions, name).argtypes = [ctypes.c_void_p] + ([ctypes.c_char_p] if name == _ASSIGN else [])
        self._extensions, self._backend, self.wheel = extensions, backend, wheel

    def describe(self) -> str:
        return f"{LIBRARY} ({DISTRIBUTION} {self.wheel.version}, QNN SDK {self.wheel.qnn_version})"

    def extension_errors(self, text: bytes, name: str) -> tuple[str, ...]:
        """The errors the library logs reading ``text`` as an extension config (none: it reads it cleanly), each one
        line, the key as a dotted path; ``name`` stands for the file in them."""
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "htp_backend_ext_config.json"
            path.write_bytes(text)
            _messages.clear()
            with native_output():
                loaded = self._load_config(str(path))
            said = [message.replace(str(path), name) for message in _messages]
        errors = _errors(said)
        return errors or (() if loaded else ("loadConfig failed without a message",))

    def _load_config(self, path: str) -> bool:
        interface = self._extensions.createBackendInterface()
        if not interface:
            raise GenieBuildError(LIBRARY, "createBackendInterface returned no interface")
        try:
            if not self._slot(interface, _SETUP_LOGGING, ctypes.c_void_p, ctypes.c_int)(interface, _log, _LOG_ERROR):
                raise GenieBuildError(LIBRARY, "setupLogging failed")
            if not self._slot(interface, _INITIALIZE, ctypes.c_void_p)(interface, self._backend._handle):
                raise GenieBuildError(LIBRARY, f"initialize with the wheel's {BACKEND} failed")
            string = ctypes.create_string_buffer(_STRING_BYTES)  # zeroed: an empty libc++ string
            getattr(self._extensions, _ASSIGN)(string, path.encode())
            try:
                return bool(self._slot(interface, _LOAD_CONFIG, ctypes.c_void_p)(interface, string))
            finally:
                getattr(self._extensions, _DESTROY)(string)
        finally:
            self._extensions.destroyBackendInterface(interface)

    @staticmethod
    def _slot(interface: int, index: int, *argtypes: type) -> Callable[..., bool]:
        """Virtual function ``index`` of the interface, called with ``this`` first."""
        table = ctypes.c_void_p.from_address(interface).value
        address = ctypes.c_void_p.from_address(table + index * ctypes.sizeof(ctypes.c_void_p)).value
        return ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, *argtypes)(address)


@cache
def load_htp_extensions(what: str = "the backend extension check") -> HtpExtensions:
    """The wheel's extensions library with its HTP backend, loaded once per process.

    Raises:
        GenieBuildError: the wheel is missing (:func:`genie_build.qnn_wheel.locate_wheel`), comes from a QNN SDK
            whose library layout is not known here, or a library does not load.
    """
    wheel = locate_wheel(what)
    problem = layout_problem(wheel)
    if problem is not None:
        raise GenieBuildError(what, problem)
    paths = library_path(LIBRARY, what), library_path(BACKEND, what)
    try:
        with native_output():  # libQnnHtp prints a notice when it loads
            extensions, backend = (ctypes.CDLL(str(path)) for path in paths)
        return HtpExtensions(extensions, backend, wheel)
    except (OSError, AttributeError) as exc:
        raise GenieBuildError(paths[0], f"does not load as the HTP extensions library: {exc}") from None


def layout_problem(wheel: WheelInfo) -> str | None:
    """Why this binding cannot call the wheel's library (a QNN SDK whose interface layout was not read), or None."""
    if wheel.qnn_version.startswith(KNOWN_QNN_SDKS):
        return None
    return (f"the {DISTRIBUTION} wheel bundles QNN SDK {wheel.qnn_version}; this binding knows the interface of "
            f"{LIBRARY} in QNN SDK {', '.join(version + 'x' for version in KNOWN_QNN_SDKS)} only")


def _errors(said: list[str]) -> tuple[str, ...]:
    """The library's error messages, one line each: a schema report (``Schema error: #/devices/0/soc_model{...}``)
    as ``devices.0.soc_model: expected integer, got string``, JSON pointers as dotted keys."""
    errors: list[str] = []
    for message in said:
        detail = _SCHEMA_DETAIL.match(message.removeprefix(_SCHEMA_HEADER).strip())
        if detail:
            errors += _described(detail["detail"], _dotted(detail["pointer"]))
        elif message:
            errors.append(_POINTER.sub(lambda match: _dotted(match[1]), message))
    return tuple(errors)


def _described(detail: str, where: str) -> list[str]:
    """A schema report's JSON (``{"type": {"expected": ["integer"], "actual": "string", ...}}``) in words, one entry
    per failed check (the alternatives of an ``anyOf`` each)."""
    try:
        report = json.loads(detail)
    except ValueError:
        return [f"{where}: {detail}"]
    return _failures(report, where) if isinstance(report, dict) else [f"{where}: {detail}"]


def _failures(report: dict, where: str) -> list[str]:
    failures = []
    for keyword, facts in report.items():
        facts = facts if isinstance(facts, dict) else {}
        at = _dotted(str(facts.get("instanceRef", where)).removeprefix("#").replace(".", "/")) \
            if "instanceRef" in facts else where
        nested = facts.get("errors")
        if isinstance(nested, list):
            failures += [failure for error in nested if isinstance(error, dict) for failure in _failures(error, at)]
        elif keyword == "type":
            failures.append(f"{at}: expected {' or '.join(map(str, facts.get('expected', [])))}, "
                            f"got {facts.get('actual')}")
        elif keyword == "enum":
            failures.append(f"{at}: not one of the values the schema allows")
        else:
            failures.append(f"{at}: fails the schema's {keyword!r}")
    return failures


def _dotted(pointer: str) -> str:
    return ".".join(part for part in pointer.split("/") if part) or "(the document)"
