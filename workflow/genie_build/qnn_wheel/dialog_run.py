"""A Genie dialog on a bundle, run in a child process: ``python -m genie_build.qnn_wheel.dialog_run``.

Why a child: Genie on x86 crashes on some bundles (a weight-shared binary: "Shared weights buffer isn't supported on
this platform", then SIGSEGV), crashes now and then in its own teardown, and hangs now and then after a dialog reset.
So the dialog is created in a child (no core dumps, killed after a timeout) that does one thing -- load the bundle,
then at most one token query or one perplexity -- and ends without tearing Genie down. The child prints one JSON line
per event as it happens (what it is doing, each error Genie logs, the result), so a crash or a hang is told against
what was under way and with Genie's last error, and never becomes a crash of the caller.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from genie_build.errors import GenieBuildError
from genie_build.qnn_wheel.child import answer_stream, child_environment, limit_resources, signal_name

__all__ = ["CONFIG_NAME", "DialogJob", "DialogOutcome", "run_dialog"]

CONFIG_NAME = "genie_config.json"  # the config Genie is given, in the bundle folder the child works in
_PHASES = {"load": "loading the bundle", "query": "answering the token query", "perplexity": "computing the perplexity"}


@dataclass(frozen=True)
class DialogJob:
    """What the child does in ``bundle`` (its working directory, where Genie finds the files the config names):
    create the dialog of ``bundle/genie_config.json``, then the token query ``query`` (at most ``max_new_tokens``) or
    the perplexity of the text in ``dataset``, or nothing more (a load check)."""

    bundle: str
    query: tuple[int, ...] | None = None
    max_new_tokens: int = 0
    dataset: str | None = None


@dataclass(frozen=True)
class DialogOutcome:
    """What the dialog did: the (AR, CL, parts) Genie logged it loaded, and the tokens or the perplexity asked for,
    with the seconds each took; ``warnings``: Genie's, each once."""

    graphs_loaded: tuple[tuple[int, int, int], ...]
    load_seconds: float
    tokens: tuple[int, ...] | None = None
    perplexity: float | None = None
    seconds: float | None = None
    warnings: tuple[str, ...] = ()


def run_dialog(job: DialogJob, timeout: float, where: str | os.PathLike[str] | None = None) -> DialogOutcome:
    """Run ``job`` in a child process (``where``: what errors call the bundle, default its folder).

    Raises:
        GenieBuildError: one line naming the bundle: Genie failed a call (its status and the errors it logged), the
            child crashed (the signal, what was under way, Genie's last error) or gave no answer within ``timeout``.
    """
    command = [sys.executable, "-m", __name__, json.dumps(asdict(job))]
    try:
        done = subprocess.run(command, check=False, capture_output=True, timeout=timeout, env=child_environment())
        stdout, ended = done.stdout, _ending(done.returncode, done.stderr)
    except subprocess.TimeoutExpired as expired:
        stdout, ended = expired.stdout or b"", f"gave no answer within {timeout:g} s"
    events = [json.loads(line) for line in stdout.decode(errors="replace").splitlines() if line.startswith("{")]
    return _outcome(where or job.bundle, events, ended)


def _outcome(where: str | os.PathLike[str], events: list[dict], ended: str | None) -> DialogOutcome:
    phase = next((event["phase"] for event in reversed(events) if event["event"] == "phase"), "load")
    errors = [event["text"] for event in events if event["event"] == "error"]
    for event in events:
        if event["event"] == "failed":
            raise GenieBuildError(where, f"Genie failed {_PHASES[phase]}: {event['call']} returned status "
                                              f"{event['status']}: {'; '.join(event['errors']) or 'no error logged'}")
    done = next((event for event in events if event["event"] == "done"), None)
    if done is None:
        last = f"; Genie's last error: {errors[-1]}" if errors else ""
        raise GenieBuildError(where, f"Genie {ended or 'ended without an answer'} while {_PHASES[phase]}{last}")
    return DialogOutcome(graphs_loaded=tuple(map(tuple, done["graphs_loaded"])), load_seconds=done["load_seconds"],
                         tokens=None if done.get("tokens") is None else tuple(done["tokens"]),
                         perplexity=done.get("perplexity"), seconds=done.get("seconds"),
                         warnings=tuple(done["warnings"]))


def _ending(returncode: int, stderr: bytes) -> str | None:
    if returncode < 0:
        return f"crashed ({signal_name(-returncode)})"
    if returncode != 0:
        last = stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return f"ended with exit {returncode} ({last[0]})"
    return None


def _child_main(argv: list[str]) -> None:
    """``JOB`` (a :class:`DialogJob` as JSON): one JSON line per event on the original stdout (Genie's own prints go
    to stderr); the process then ends at once, without Genie's teardown."""
    from genie_build.qnn_wheel.genie import LOG_ERROR, LOG_WARN, GenieFailure, GenieLog, load_genie

    limit_resources(None)  # a dialog maps the whole bundle: the job's memory is the workflow's to bound
    out = answer_stream()

    def say(event: str, **fields) -> None:
        out.write(json.dumps({"event": event, **fields}) + "\n")
        out.flush()

    job = DialogJob(**json.loads(argv[0]))
    warnings: dict[str, None] = {}

    def heard(level: int, text: str) -> None:
        if level == LOG_ERROR:
            say("error", text=text)
        elif level == LOG_WARN:
            warnings.setdefault(text)

    os.chdir(job.bundle)
    try:
        say("phase", phase="load")
        started = time.perf_counter()
        genie = load_genie("Genie's run of a bundle")
        dialog = genie.open_dialog(Path(CONFIG_NAME).read_text(encoding="utf-8"), GenieLog(heard))
        result: dict = {"graphs_loaded": dialog.log.graphs_loaded or (),
                        "load_seconds": round(time.perf_counter() - started, 3)}
        started = time.perf_counter()
        if job.query is not None:
            say("phase", phase="query")
            result["tokens"] = dialog.token_query(job.query, job.max_new_tokens)
        elif job.dataset is not None:
            say("phase", phase="perplexity")
            result["perplexity"] = dialog.perplexity(Path(job.dataset))
        result["seconds"] = round(time.perf_counter() - started, 3)
        say("done", **result, warnings=list(warnings))
    except GenieFailure as failure:
        say("failed", call=failure.call, status=failure.status, errors=list(failure.errors))
    except GenieBuildError as exc:  # the library does not load
        say("failed", call="loading libGenie.so", status=-1, errors=[str(exc)])
    sys.stderr.flush()
    os._exit(0)  # Genie's static destructors crash now and then on x86: the answers are out, nothing to tear down


if __name__ == "__main__":
    _child_main(sys.argv[1:])
