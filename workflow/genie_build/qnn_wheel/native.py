"""What the wheel's native libraries say while they run, as text: their writes to stdout and stderr, and the
``printf``-style messages they hand to a log callback.

libGenie prints why it refuses a config to ``std::cerr`` only (its log API is bound to a config handle, which a
refused config never gets); libQnnHtp prints a notice on stdout when it loads. :func:`native_output` captures both
file descriptors for the duration of a call, so that neither reaches the user's terminal or a job's log unasked.
The descriptors are process-wide: callers run one native call at a time (the checks are single-threaded).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["CapturedOutput", "MAX_MESSAGE_BYTES", "format_message", "native_output"]

MAX_MESSAGE_BYTES = 4096  # one log message; the libraries' are a line or a JSON fragment
_LIBC = ctypes.CDLL(None)
_LIBC.fflush.argtypes = [ctypes.c_void_p]
_LIBC.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]


@dataclass
class CapturedOutput:
    """What native code wrote to fds 1 and 2 inside :func:`native_output`, readable once the block has ended."""

    text: str = field(default="")


@contextlib.contextmanager
def native_output() -> Iterator[CapturedOutput]:
    """Send fds 1 and 2 to a temporary file for the block; its text is in the yielded object afterwards."""
    captured = CapturedOutput()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    with tempfile.TemporaryFile() as sink:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield captured
        finally:
            _LIBC.fflush(None)  # C stdio buffers, before the descriptors go back
            for fd, original in zip((1, 2), saved):
                os.dup2(original, fd)
                os.close(original)
            sink.seek(0)
            captured.text = sink.read().decode("utf-8", errors="replace")


def format_message(template: bytes, arguments: int | None) -> str:
    """A log callback's ``(const char* fmt, va_list args)`` as text (x86-64: a ``va_list`` argument is a pointer).

    Call it inside the callback: the ``va_list`` is valid only there."""
    buffer = ctypes.create_string_buffer(MAX_MESSAGE_BYTES)
    _LIBC.vsnprintf(buffer, MAX_MESSAGE_BYTES, template, arguments)
    return " ".join(buffer.value.decode("utf-8", errors="replace").split())
