"""A bundle's configs judged by the vendor's libraries (:mod:`genie_build.qnn_wheel.genie`,
:mod:`genie_build.qnn_wheel.backend_extensions`) in a child process.

Why a child: the libraries meet files nobody checked before them, and they do not all survive it -- the HTP
extensions library segfaults on an extension config whose top level is not an object (``1``, ``"x"``, ``[{}]``).
The calls therefore run in ``python -m genie_build.qnn_wheel.judge``, under an address-space limit, without core
dumps, killed after a timeout; the child prints one JSON line per file as it finishes it, so a crash is told against
the file being read. Whatever goes wrong there is the verdict on that file, never a crash of the caller.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from genie_build.errors import GenieBuildError
from genie_build.fileio import read_regular
from genie_build.qnn_wheel.child import answer_stream, child_environment, limit_resources, signal_name

__all__ = ["ADDRESS_SPACE", "KINDS", "TIMEOUT_S", "Verdict", "judge"]

TIMEOUT_S = 60.0
ADDRESS_SPACE = 4 << 30  # the interpreter, libGenie and libQnnHtp mapped, a 16 MB document parsed: well within
KINDS = ("genie", "extensions")  # genie_config.json by libGenie; an extension config by the HTP extensions library


@dataclass(frozen=True)
class Verdict:
    """What a library said of one file: ``problems``, one line each (none: it takes the file), or why it could not
    judge it (``failed``: the library crashed, hung, or did not load)."""

    problems: tuple[str, ...] = ()
    failed: str | None = None


def judge(bundle: Path, files: Mapping[str, str], max_bytes: int, *, timeout: float = TIMEOUT_S) -> dict[str, Verdict]:
    """The verdict on each file of ``files`` (kind -> its name in ``bundle``, a regular file inside it that is read
    within ``max_bytes``)."""
    command = [sys.executable, "-m", __name__, str(bundle), str(max_bytes),
               *(f"{kind}={name}" for kind, name in files.items())]
    try:
        done = subprocess.run(command, check=False, capture_output=True, timeout=timeout, env=child_environment())
        stdout, ended = done.stdout, _ending(done)
    except subprocess.TimeoutExpired as expired:
        stdout, ended = expired.stdout or b"", f"it gave no answer within {timeout:g} s"
    verdicts = {}
    for line in stdout.decode(errors="replace").splitlines():
        answer = json.loads(line)
        verdicts[answer["kind"]] = Verdict(tuple(answer.get("problems", ())), answer.get("failed"))
    return {kind: verdicts.get(kind, Verdict(failed=ended)) for kind in files}


def _ending(done: subprocess.CompletedProcess[bytes]) -> str:
    if done.returncode < 0:
        return f"it crashed reading it ({signal_name(-done.returncode)})"
    last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
    return f"the judging process failed (exit {done.returncode}): {last[0]}"


def _child_main(argv: list[str]) -> int:
    """``BUNDLE MAX_BYTES KIND=NAME...``: one JSON line per file on the original stdout (the libraries' own prints go
    to stderr), each written before the next file is read."""
    limit_resources(ADDRESS_SPACE)
    bundle, max_bytes = Path(argv[0]), int(argv[1])
    out = answer_stream()
    for item in argv[2:]:
        kind, name = item.split("=", 1)
        try:
            answer = {"kind": kind, "problems": _problems(kind, read_regular(bundle / name, inside=[bundle],
                                                                              max_bytes=max_bytes), name)}
        except GenieBuildError as exc:  # the library does not load, or a call of its interface failed
            answer = {"kind": kind, "failed": str(exc)}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


def _problems(kind: str, text: bytes, name: str) -> list[str]:
    from genie_build.qnn_wheel import backend_extensions, genie

    if kind == "extensions":
        return list(backend_extensions.load_htp_extensions().extension_errors(text, name))
    refusal = genie.load_genie().dialog_config_refusal(text.decode("utf-8"))
    return [] if refusal is None else [f"({refusal.status_name}): {reason}" for reason in refusal.reasons]


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
