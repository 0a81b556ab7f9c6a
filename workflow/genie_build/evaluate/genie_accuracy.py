"""The bundle's perplexity by Genie itself (``GenieAccuracy`` of the wheel's libGenie.so, docs/genie-run.md), beside
the float model's on the same tokens: a column of the evaluation table.

What Genie scores, measured on the demo's bundles (its perplexity within 0.1% of the same graphs run on the CPU
this way, 1-5% from every other reading): it tokenizes the dataset file with the bundle's tokenizer and, per window
of ``CL`` tokens it finds there, feeds ``bos-token`` and the window's first ``CL - AR - 1`` tokens from an empty cache
and scores its first ``CL - AR`` tokens. Genie 2.51 on x86 hangs now and then between two windows of one dataset
(and after any reset of a dialog), so each window is a dataset of its own, computed by a fresh dialog in a fresh
process; the windows' perplexities combine as the perplexity of all their tokens (each window scores as many).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tokenizers import Tokenizer

from genie_build.errors import GenieBuildError
from genie_build.genie_config import GENIE_CONFIG_NAME, load_tokenizer
from genie_build.run.genie_run import choose_mode, ctx_bin_bytes, dialog_timeout, twin_bundle
from genie_build.tokens import read_tokens

__all__ = ["GeniePerplexity", "GenieWindow", "genie_perplexity", "genie_windows", "window_count"]


@dataclass(frozen=True)
class GenieWindow:
    """One dataset Genie scores: its text, and the tokens Genie scores in it (its first ``CL - AR``)."""

    text: str
    scored: tuple[int, ...]


def window_count(max_windows: int, ar: int, context: int) -> int:
    """Genie's windows to score at least the tokens of the evaluation's ``max_windows`` windows of ``ar`` tokens."""
    return max(1, math.ceil(max_windows * ar / (context - ar)))


def genie_windows(tokenizer: Tokenizer, ids: Sequence[int], ar: int, context: int, count: int,
                  where: str | os.PathLike[str]) -> list[GenieWindow]:
    """At most ``count`` datasets of one Genie window each, cut from a text's token ids: each the text of
    ``context + ar`` consecutive tokens, so that Genie, tokenizing it again, finds one window of ``context`` (the
    margin takes what a cut between two tokens changes). ``where``: the text's tokens, for errors.

    Raises:
        GenieBuildError: a text shorter than one window, or a piece Genie would not read as one window.
    """
    span = context + ar
    windows = []
    for start in range(0, min(count * span, len(ids) - span + 1), span):
        piece = tokenizer.decode([int(token) for token in ids[start:start + span]])
        again = tokenizer.encode(piece, add_special_tokens=False).ids
        if not context <= len(again) < 2 * context:
            raise GenieBuildError(where, f"tokens {start}-{start + span} tokenize again as {len(again)} tokens, "
                                         f"not one window of {context}")
        windows.append(GenieWindow(piece, tuple(again[:context - ar])))
    if not windows:
        raise GenieBuildError(where, f"has {len(ids)} tokens: Genie's perplexity needs at least {span} (one window "
                                     f"of CL {context} and a margin of AR {ar})")
    return windows


@dataclass(frozen=True)
class GeniePerplexity:
    """The stage's result (``evaluation/genie_accuracy.json``): Genie's perplexity and the float model's on the
    tokens Genie scored, or why it was not computed (``skipped``)."""

    variant: str
    genie: str
    mode: str
    why: str
    tokens: str                          # the held-out text's token ids it was cut from
    windows: int = 0
    positions: int = 0
    perplexity: float | None = None
    window_perplexities: tuple[float, ...] = ()
    float_perplexity: float | None = None
    seconds: float = 0.0
    skipped: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def genie_perplexity(bundle_dir: str | os.PathLike[str], twins: Sequence[str | os.PathLike[str]], *, variant: str,
                     tokens_path: str | os.PathLike[str], float_parts: Sequence[str | os.PathLike[str]],
                     max_windows: int, mode: str = "auto") -> GeniePerplexity:
    """Genie's perplexity of the bundle (through its twins) on the held-out text (``tokens_path``: its token ids, as
    ``tokenize-text`` wrote them), and the float model's
    (``float_parts``: its prompt graphs, part order) on the same tokens; for a bundle too large to run in the
    simulation (:func:`genie_build.run.genie_run.choose_mode`), why not.

    Raises:
        GenieBuildError: a bad bundle, twin or text; Genie fails, crashes or hangs (one line naming the bundle).
    """
    from genie_build.evaluate.evaluate import float_nll
    from genie_build.qnn_wheel.dialog_run import DialogJob, run_dialog
    from genie_build.qnn_wheel.genie import load_genie
    from genie_build.run.run_bundle import host_rope

    genie = load_genie("Genie's perplexity").describe()
    chosen, why = choose_mode(mode, ctx_bin_bytes(bundle_dir))
    if chosen != "generate":
        return GeniePerplexity(variant, genie, chosen, why, os.fspath(tokens_path),
                               skipped=why if chosen != "load" else f"a load check only: {why}")
    with twin_bundle(bundle_dir, twins) as twin:
        dialog = twin.dialog
        ar, context, bos = _prompt_ar(twin), dialog["context"]["size"], dialog["context"]["bos-token"]
        if bos < 0:
            raise GenieBuildError(bundle_dir, "has no bos-token: which tokens Genie's perplexity scores then was not "
                                              "measured")
        tokenizer = load_tokenizer(Path(bundle_dir) / dialog["tokenizer"]["path"], inside=[bundle_dir])
        windows = genie_windows(tokenizer, read_tokens(tokens_path), ar, context,
                                window_count(max_windows, ar, context), tokens_path)
        perplexities, seconds = [], 0.0
        with tempfile.TemporaryDirectory(prefix="genie-datasets-") as folder:
            for index, window in enumerate(windows):
                dataset = Path(folder) / f"window_{index}.txt"
                dataset.write_text(window.text, encoding="utf-8")
                outcome = run_dialog(DialogJob(str(twin.folder), dataset=str(dataset)),
                                     dialog_timeout(twin.ctx_bin_bytes, math.ceil((context - ar) / ar)),
                                     where=bundle_dir)
                perplexities.append(outcome.perplexity)
                seconds += outcome.seconds or 0.0
    rope = host_rope(dialog["engine"], Path(bundle_dir) / GENIE_CONFIG_NAME)
    total, count = 0.0, 0
    for window in windows:
        nll, scored = float_nll(float_parts, [bos, *window.scored], rope=rope, where=tokens_path)
        total, count = total + nll, count + scored
    positions = sum(len(window.scored) for window in windows)
    if count != positions:
        raise GenieBuildError(tokens_path, f"the float model scored {count} tokens where Genie scores {positions}: "
                                         f"CL - AR ({context} - {ar}) is not a whole number of AR chunks")
    combined = math.exp(sum(math.log(value) for value in perplexities) / len(perplexities))
    return GeniePerplexity(variant, genie, chosen, why, os.fspath(tokens_path), windows=len(windows),
                           positions=positions, perplexity=combined, window_perplexities=tuple(perplexities),
                           float_perplexity=math.exp(total / count), seconds=round(seconds, 3))


def _prompt_ar(twin) -> int:
    """The widest AR of the bundle's graphs (Genie's perplexity runs its windows on the prompt graph)."""
    from genie_build.conventions import graph_ar_cl

    ars = [graph_ar_cl(name, (), ())[0] for name in twin.twins[0]["graphs"]]
    if None in ars:
        raise GenieBuildError(twin.twins[0]["ctx_bin"], f"graph names {twin.twins[0]['graphs']} do not say their AR")
    return max(ars)
