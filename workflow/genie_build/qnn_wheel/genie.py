"""Genie's C API -- ``libGenie.so`` of the ``onnxruntime-qnn`` wheel (Genie 2.51, API 1.21 on x86-64) -- through
ctypes.

What genie-build asks of it: whether Genie accepts a ``genie_config.json`` (``GenieDialogConfig_createFromJson``
parses it with Genie's own JSON reader and validates the dialog against the JSON schemas the library embeds), and
why not, in Genie's words; and, on a bundle whose binaries run on x86 (docs/genie-run.md), a dialog
(``GenieDialog_create``), its token query (``GenieDialog_tokenQuery``) and its perplexity on a text
(``GenieAccuracy``). A refused config is reported on ``std::cerr`` only (its log API binds to a config handle, which
a refused config never gets), so that call runs inside :func:`genie_build.qnn_wheel.native.native_output`; a dialog's
messages come through a log bound to its config (:class:`GenieLog`).

The handles are opaque pointers and every function returns a ``Genie_Status_t`` (int32, 0 on success); the
signatures below are those facts, declared once in :data:`_FUNCTIONS`. The library crashes and hangs on some
bundles: a caller runs a dialog in a child process (:mod:`genie_build.qnn_wheel.dialog_run`).
"""

from __future__ import annotations

import ctypes
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from genie_build.errors import GenieBuildError
from genie_build.qnn_wheel import DISTRIBUTION, WheelInfo, library_path, locate_wheel
from genie_build.qnn_wheel.native import format_message, native_output

__all__ = ["LIBRARY", "LOG_ERROR", "LOG_WARN", "Dialog", "Genie", "GenieFailure", "GenieLog", "GenieRefusal",
           "load_genie"]

LIBRARY = "libGenie.so"
_STATUS = ctypes.c_int32
_HANDLE = ctypes.c_void_p
# GenieLog_Level_t; a dialog's log is kept from INFO up (VERBOSE is the HTP backend's every step)
LOG_ERROR, LOG_WARN, LOG_INFO = 1, 2, 3
# void (handle, const char* fmt, level, uint64 timestamp, va_list args)
_LOG_CALLBACK = ctypes.CFUNCTYPE(None, _HANDLE, ctypes.c_char_p, ctypes.c_int32, ctypes.c_uint64, ctypes.c_void_p)
# void (const uint32* tokens, uint32 count, GenieDialog_SentenceCode_t, const void* userData)
_TOKEN_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32, ctypes.c_int32,
                                   ctypes.c_void_p)
# void (size_t size, const char** allocated): the caller provides the memory Genie copies its JSON into
_ALLOC_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p))
_SENTENCE_COMPLETE = 0  # GenieDialog_SentenceCode_t: the query is whole
# name -> (restype, argtypes): the part of Genie's C API this binding calls
_FUNCTIONS = {
    "Genie_getApiMajorVersion": (ctypes.c_uint32, []),
    "Genie_getApiMinorVersion": (ctypes.c_uint32, []),
    "Genie_getApiPatchVersion": (ctypes.c_uint32, []),
    "GenieDialogConfig_createFromJson": (_STATUS, [ctypes.c_char_p, ctypes.POINTER(_HANDLE)]),
    "GenieDialogConfig_bindLogger": (_STATUS, [_HANDLE, _HANDLE]),
    "GenieDialogConfig_free": (_STATUS, [_HANDLE]),
    "GenieLog_create": (_STATUS, [_HANDLE, _LOG_CALLBACK, ctypes.c_int32, ctypes.POINTER(_HANDLE)]),
    "GenieLog_free": (_STATUS, [_HANDLE]),
    "GenieDialog_create": (_STATUS, [_HANDLE, ctypes.POINTER(_HANDLE)]),
    "GenieDialog_setMaxNumTokens": (_STATUS, [_HANDLE, ctypes.c_uint32]),
    "GenieDialog_tokenQuery": (_STATUS, [_HANDLE, ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32, ctypes.c_int32,
                                         _TOKEN_CALLBACK, ctypes.c_void_p]),
    "GenieDialog_free": (_STATUS, [_HANDLE]),
    "GenieAccuracyConfig_createFromJson": (_STATUS, [ctypes.c_char_p, ctypes.POINTER(_HANDLE)]),
    "GenieAccuracyConfig_free": (_STATUS, [_HANDLE]),
    "GenieAccuracy_createFromDialog": (_STATUS, [_HANDLE, _HANDLE, ctypes.POINTER(_HANDLE)]),
    "GenieAccuracy_compute": (_STATUS, [_HANDLE, _ALLOC_CALLBACK, ctypes.POINTER(ctypes.c_void_p)]),
    "GenieAccuracy_free": (_STATUS, [_HANDLE]),
}
# Genie's log line naming the graphs a dialog loaded: "qnn-htp: Graphs loaded ((AR-n, CL-x): #splits): {(1, 64): 2}"
_GRAPHS_LOADED = re.compile(r"Graphs loaded \(\(AR-n, CL-x\): #splits\): \{(?P<pairs>[^}]*)\}")
_GRAPH_PAIR = re.compile(r"\((?P<ar>\d+), (?P<cl>\d+)\): (?P<parts>\d+)")
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


@dataclass(frozen=True)
class GenieFailure(Exception):
    """A call of a dialog that Genie failed: the call, its status and what Genie logged as errors meanwhile."""

    call: str
    status: int
    errors: tuple[str, ...] = ()

    def __str__(self) -> str:
        said = "; ".join(self.errors) or "Genie logged no error"
        return f"{self.call} returned status {self.status}: {said}"


@dataclass
class GenieLog:
    """A dialog's log, from INFO up: every message handed to ``on_message`` (level, text) as it comes, the errors
    kept, and the graphs Genie reports having loaded."""

    on_message: Callable[[int, str], None] | None = None
    errors: list[str] = field(default_factory=list)
    graphs_loaded: tuple[tuple[int, int, int], ...] | None = None  # (AR, CL, parts), as Genie logs them

    def take(self, level: int, text: str) -> None:
        if level == LOG_ERROR:
            self.errors.append(text)
        found = _GRAPHS_LOADED.search(text)
        if found:
            self.graphs_loaded = tuple((int(pair["ar"]), int(pair["cl"]), int(pair["parts"]))
                                       for pair in _GRAPH_PAIR.finditer(found["pairs"]))
        if self.on_message is not None:
            self.on_message(level, text)

    def failure(self, call: str, status: int, since: int = 0) -> GenieFailure:
        """``call`` failed with ``status``: the errors logged since the ``since``-th."""
        return GenieFailure(call, status, tuple(dict.fromkeys(self.errors[since:])))


class Dialog:
    """A Genie dialog on a bundle (:meth:`Genie.open_dialog`). Genie resolves the bundle's relative paths against
    the working directory, which the caller sets. A dialog runs one query or one accuracy computation: Genie 2.51 on
    x86 hangs now and then on what follows a reset of the dialog (measured: 2 of 6 perplexities over two windows, 0
    of 12 over one), so a caller opens a fresh dialog, in a fresh process, for each."""

    def __init__(self, library: ctypes.CDLL, handle: ctypes.c_void_p, log: GenieLog, keep: tuple = ()) -> None:
        self._library, self._handle, self.log = library, handle, log
        self._keep = keep  # the log callback and the handles the dialog uses, alive as long as it is

    def token_query(self, ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """The tokens Genie generates for the query ``ids`` (Genie prepends ``bos-token`` to a dialog's first query),
        at most ``max_new_tokens``, an end-of-sequence token included.

        Raises:
            GenieFailure: a call returned an error.
        """
        self._call("GenieDialog_setMaxNumTokens", self._handle, max_new_tokens)
        tokens: list[int] = []

        def take(response, count, code, user_data) -> None:  # Genie's callback signature
            tokens.extend(response[index] for index in range(count))

        query = (ctypes.c_uint32 * len(ids))(*ids)
        self._call("GenieDialog_tokenQuery", self._handle, query, len(ids), _SENTENCE_COMPLETE,
                   _TOKEN_CALLBACK(take), None)
        return tokens

    def perplexity(self, dataset: Path) -> float:
        """Genie's perplexity of the dialog's model on the text in ``dataset`` (``GenieAccuracy``, docs/genie-run.md
        says which tokens it scores).

        Raises:
            GenieFailure: a call returned an error, or the answer holds no perplexity.
        """
        config, accuracy = _HANDLE(), _HANDLE()
        text = json.dumps({"type": "perplexity", "dataset": str(dataset)})
        self._call("GenieAccuracyConfig_createFromJson", text.encode(), ctypes.byref(config))
        try:
            self._call("GenieAccuracy_createFromDialog", config, self._handle, ctypes.byref(accuracy))
            buffers: list[ctypes.Array] = []

            def allocate(size, where) -> None:
                buffers.append(ctypes.create_string_buffer(size + 1))
                where[0] = ctypes.addressof(buffers[-1])

            answer = ctypes.c_void_p()
            try:
                self._call("GenieAccuracy_compute", accuracy, _ALLOC_CALLBACK(allocate), ctypes.byref(answer))
            finally:
                self._library.GenieAccuracy_free(accuracy)
            said = ctypes.string_at(answer.value).decode("utf-8", errors="replace") if answer.value else ""
        finally:
            self._library.GenieAccuracyConfig_free(config)
        try:
            return float(json.loads(said)["perplexity"])
        except (ValueError, KeyError, TypeError):
            raise GenieFailure("GenieAccuracy_compute", 0, (f"no perplexity in its answer {said[:200]!r}",)) from None

    def _call(self, name: str, *args) -> None:
        since = len(self.log.errors)
        status = getattr(self._library, name)(*args)
        if status < 0:  # a positive status is a warning (e.g. the context is full); the caller sees the tokens
            raise self.log.failure(name, status, since)


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

    def open_dialog(self, config_text: str, log: GenieLog) -> Dialog:
        """A dialog on the bundle ``config_text`` describes, its messages in ``log``. The dialog lives as long as the
        process: Genie's teardown on x86 crashes now and then, so the caller ends the process instead of freeing it.

        Raises:
            GenieFailure: Genie refuses the config or cannot create the dialog (e.g. a binary it cannot load).
        """
        handle, refusal = self._create_dialog_config(config_text)
        if refusal is not None:
            raise GenieFailure("GenieDialogConfig_createFromJson", refusal.status, refusal.reasons)
        callback = _LOG_CALLBACK(lambda _, template, level, __, arguments:
                                 log.take(level, format_message(template, arguments)))
        log_handle, dialog = _HANDLE(), _HANDLE()
        status = self._library.GenieLog_create(None, callback, LOG_INFO, ctypes.byref(log_handle))
        if status == 0:
            status = self._library.GenieDialogConfig_bindLogger(handle, log_handle)
        if status != 0:
            raise GenieFailure("GenieLog_create", status)
        status = self._library.GenieDialog_create(handle, ctypes.byref(dialog))
        if status != 0 or not dialog.value:
            raise log.failure("GenieDialog_create", status)
        return Dialog(self._library, dialog, log, keep=(callback, handle, log_handle))

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
