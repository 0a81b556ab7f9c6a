"""The vendor's Genie runs the bundle on the build box (docs/genie-run.md).

A qnn-htp bundle's binaries share their weights, which only a device runs; each part's twin (``compile_twin``:
the same graphs, names and IO, weights unshared) runs on x86 in the HTP simulation of the ``onnxruntime-qnn``
wheel. The *twin bundle* is the bundle with each ctx-bin replaced by its twin's ``context.bin`` under the ctx-bin's
name, each twin's IO first read back equal to its ctx-bin's, and the bundle's own ``genie_config.json`` changed only
where x86 or a deterministic run needs it (:func:`x86_config`, every change recorded with its reason). Genie's own
``libGenie.so`` then loads it (``GenieDialog_create``) and answers the host run's prompt as a token query, which must
give the host run's tokens; the float model's tokens stand beside them. ``bundle.genie_run`` chooses
(:func:`choose_mode`): ``auto`` generates from a bundle small enough for the simulation and records why it did not
run on a larger one; ``load`` only creates the dialog and reports every (AR, CL) graph it loaded; ``generate`` runs
any bundle. Genie runs in a child process (:mod:`genie_build.qnn_wheel.dialog_run`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from genie_build.bundle.check_bundle import MAX_DOCUMENT_BYTES, require_valid_bundle
from genie_build.conventions import PART_SUFFIX
from genie_build.errors import GenieBuildError
from genie_build.fileio import read_json, write_json
from genie_build.genie_config import GENIE_CONFIG_NAME, load_tokenizer
from genie_build.job_memory import files_mb, genie_mb
from genie_build.toolchains.qnn_htp.twin import TWIN_BINARY, require_same_io

log = logging.getLogger(__name__)

__all__ = ["GENERATE_MAX_MB", "MODES", "SKIPPED", "ConfigChange", "GenieRun", "TwinBundle", "choose_mode",
           "ctx_bin_bytes", "dialog_timeout", "float_tokens", "genie_job_mb", "genie_run", "twin_bundle", "x86_config"]

MODES = ("auto", "generate", "load")
SKIPPED = "skipped"  # the mode auto records for a bundle larger than GENERATE_MAX_MB
# auto: generate (and compute GenieAccuracy) when the bundle's ctx-bins hold at most this many MB, else run nothing.
# The simulation costs about 0.2-0.8 s per MB of binaries per step (a 120 MB 7B-wide layer part: 22-33 s a token,
# 96-107 s a 128-token chunk; the 4.5 MB demo about 2 s a step on 2 loaded cores), so 64 MB is a few minutes for 16
# tokens. Even a load check maps every twin at once (a job of the whole model's size, where every other job holds
# one part), so a larger bundle runs Genie only when the config asks for it.
GENERATE_MAX_MB = 64.0
# The child's timeout guards against a hang, generously: the load, then every step at 4x the rate measured above.
_LOAD_S, _LOAD_S_PER_MB, _STEP_S, _STEP_S_PER_MB = 120.0, 1.0, 10.0, 4.0
_GREEDY_WHY = ("a deterministic run: Genie samples with the bundle's sampler, and 'greedy: true' does not make it "
               "pick the most likely token (Genie 2.51); top-k 1 does")
_SWITCHING_WHY = ("x86's HTP backend refuses it (QNN 2.51: 'Memory Limit Hint is not supported', GenieDialog_create "
                  "status -1); it changes how graphs are loaded, not what they compute")


@dataclass(frozen=True)
class ConfigChange:
    """One key of a bundle file that the twin bundle changes, from ``bundle`` to ``run`` (None: removed), and why."""

    file: str
    key: str
    bundle: Any
    run: Any
    why: str


def x86_config(config: Mapping[str, Any]) -> tuple[dict, list[ConfigChange]]:
    """The bundle's ``genie_config.json`` as Genie gets it on x86, and what changed: the sampler picks the most likely
    token (``top-k: 1``, the only setting measured to make Genie 2.51 pick it; ``greedy: true`` or ``temp: 0`` with a
    larger ``top-k`` are not enough or not measured) and ``enable-graph-switching: true`` goes. Nothing else changes."""
    changed = copy.deepcopy(dict(config))
    dialog, changes = changed["dialog"], []
    sampler = dialog.get("sampler")
    if sampler is None:
        dialog["sampler"] = {"version": 1, "top-k": 1}
        changes.append(ConfigChange(GENIE_CONFIG_NAME, "dialog.sampler", None, dialog["sampler"], _GREEDY_WHY))
    elif sampler.get("top-k") != 1:
        changes.append(ConfigChange(GENIE_CONFIG_NAME, "dialog.sampler.top-k", sampler.get("top-k"), 1, _GREEDY_WHY))
        sampler["top-k"] = 1
    htp = dialog["engine"]["backend"].get("QnnHtp", {})
    if htp.get("enable-graph-switching") is True:
        del htp["enable-graph-switching"]
        changes.append(ConfigChange(GENIE_CONFIG_NAME, "dialog.engine.backend.QnnHtp.enable-graph-switching", True,
                                    None, _SWITCHING_WHY))
    return changed, changes


@dataclass(frozen=True)
class TwinBundle:
    """A twin bundle in ``folder``: the bundle's own config (``dialog``), what changed for x86, each ctx-bin's twin
    and the graphs it holds, and the shipped ctx-bins' bytes."""

    folder: Path
    dialog: Mapping[str, Any]
    changes: tuple[ConfigChange, ...]
    twins: tuple[dict, ...]
    ctx_bin_bytes: int

    @property
    def pairs(self) -> int:
        """The (AR, CL) graphs each ctx-bin holds (one graph each, checked by check-bundle)."""
        return len(self.twins[0]["graphs"])


@contextlib.contextmanager
def twin_bundle(bundle_dir: str | os.PathLike[str], twins: Sequence[str | os.PathLike[str]]) -> Iterator[TwinBundle]:
    """The bundle with its ctx-bins replaced by their twins, in a temporary folder (links to the bundle's other files
    and to each twin's ``context.bin`` under its ctx-bin's name) that is gone after the block.

    Raises:
        GenieBuildError: the bundle fails check-bundle, not one twin per ctx-bin, or a twin whose graphs or IO
            differ from its ctx-bin's.
    """
    from genie_build.qnn_wheel.dialog_run import CONFIG_NAME

    bundle = Path(bundle_dir)
    require_valid_bundle(bundle)
    config = read_json(bundle / GENIE_CONFIG_NAME, inside=[bundle], max_bytes=MAX_DOCUMENT_BYTES)
    binaries = config["dialog"]["engine"]["model"]["binary"]["ctx-bins"]
    if len(twins) != len(binaries):
        raise GenieBuildError("--twin", f"{len(twins)} twins for the bundle's {len(binaries)} ctx-bins")
    records = tuple({"ctx_bin": name, "twin": os.fspath(twin), "graphs": require_same_io(bundle / name, twin)}
                    for name, twin in zip(binaries, twins))
    run_config, changes = x86_config(config)
    with tempfile.TemporaryDirectory(prefix="genie-run-") as folder:
        root = Path(folder)
        for entry in bundle.iterdir():
            if entry.is_file() and entry.name not in binaries and entry.name != GENIE_CONFIG_NAME:
                (root / entry.name).symlink_to(entry.resolve())
        for name, twin in zip(binaries, twins):
            (root / name).symlink_to((Path(twin) / TWIN_BINARY).resolve())
        write_json(root / CONFIG_NAME, run_config)
        yield TwinBundle(root, config["dialog"], tuple(changes), records, ctx_bin_bytes(bundle))


def ctx_bin_bytes(bundle_dir: str | os.PathLike[str]) -> int:
    """The bytes of the ctx-bins the bundle's ``genie_config.json`` names (the shipped, weight-shared ones)."""
    bundle = Path(bundle_dir)
    config = read_json(bundle / GENIE_CONFIG_NAME, inside=[bundle], max_bytes=MAX_DOCUMENT_BYTES)
    return sum((bundle / name).stat().st_size for name in config["dialog"]["engine"]["model"]["binary"]["ctx-bins"])


def choose_mode(requested: str, size_bytes: int) -> tuple[str, str]:
    """``generate``, ``load`` or :data:`SKIPPED` for ``bundle.genie_run`` (``auto``: by the ctx-bins' size), and
    why."""
    if requested not in MODES:
        raise GenieBuildError("bundle.genie_run", f"{requested!r} is not one of {', '.join(MODES)}")
    if requested != "auto":
        return requested, f"bundle.genie_run: {requested}"
    size = size_bytes / 1e6
    if size <= GENERATE_MAX_MB:
        return "generate", (f"auto: the bundle's ctx-bins hold {size:,.1f} MB; up to {GENERATE_MAX_MB:g} MB Genie "
                            "generates in the HTP simulation in minutes")
    return SKIPPED, (f"auto: the bundle's ctx-bins hold {size:,.1f} MB, more than the {GENERATE_MAX_MB:g} MB Genie "
                     "generates from in minutes in the HTP simulation, and Genie would map every twin at once: not "
                     "run (bundle.genie_run: load for a load check, generate for the token query)")


def genie_job_mb(mode: str, bundle_dir: str | os.PathLike[str], twins: Sequence[str | os.PathLike[str]]) -> int:
    """The memory a job of Genie's run (or its perplexity) is planned with: every twin loaded at once
    (:func:`genie_build.job_memory.genie_mb`), none when ``auto`` skips the bundle; before the bundle is there (a
    dry run), by the twins there are."""
    if (Path(bundle_dir) / GENIE_CONFIG_NAME).is_file() and choose_mode(mode, ctx_bin_bytes(bundle_dir))[0] == SKIPPED:
        return genie_mb(0.0)
    return genie_mb(files_mb(Path(twin) / TWIN_BINARY for twin in twins))


def dialog_timeout(size_bytes: int, steps: int) -> float:
    """Seconds a child may take to load the bundle and run ``steps`` inferences before it counts as hung (``size_bytes``: the bundle's ctx-bins)."""
    size = size_bytes / 1e6
    return _LOAD_S + _LOAD_S_PER_MB * size + steps * (_STEP_S + _STEP_S_PER_MB * size)


@dataclass(frozen=True)
class GenieRun:
    """The stage's result (``genie_run.json``)."""

    bundle: str
    genie: str
    mode: str
    why: str
    twins: tuple[dict, ...]
    config_changes: tuple[ConfigChange, ...]
    graphs_loaded: tuple[dict, ...]
    load_seconds: float
    warnings: tuple[str, ...]
    generation: dict = field(default_factory=dict)  # empty for a load check or a run auto skipped

    def to_dict(self) -> dict:
        return {"bundle": self.bundle, "genie": self.genie, "mode": self.mode, "why": self.why,
                "twins": list(self.twins), "config_changes": [asdict(change) for change in self.config_changes],
                "graphs_loaded": list(self.graphs_loaded), "load_seconds": self.load_seconds,
                **self.generation, "warnings": list(self.warnings)}


def genie_run(bundle_dir: str | os.PathLike[str], twins: Sequence[str | os.PathLike[str]], *, mode: str = "auto",
              prompt: str | os.PathLike[str] | None = None, host_run: str | os.PathLike[str] | None = None,
              float_graphs: Mapping[str, str | os.PathLike[str]] | None = None, strict: bool = False) -> GenieRun:
    """Genie's run of the bundle through its twins: a load check, or the host run's prompt (``prompt``:
    ``host_prompt.json``, its ids and the tokens to generate) as a token query, whose tokens must be ``host_run``'s
    (``host_run.json``, when given); the float model's (``float_graphs``: graph name -> file, every part's graphs)
    stand beside them. With ``auto`` on a bundle too large for the simulation, only why it did not run. Tokens
    that differ from the host run's are a warning in the log and the report (``equal_to_host_run`` false, with the
    difference), an error with ``strict`` (``report.strict``).

    Raises:
        GenieBuildError: a bad bundle or twin, Genie fails, crashes or hangs (one line naming the bundle), Genie's
            graphs are not the bundle's, or (``strict``) its tokens differ from the host run's.
    """
    from genie_build.qnn_wheel.dialog_run import DialogJob, run_dialog
    from genie_build.qnn_wheel.genie import load_genie

    genie = load_genie("Genie's run of a bundle").describe()
    chosen, why = choose_mode(mode, ctx_bin_bytes(bundle_dir))
    if chosen == SKIPPED:
        return GenieRun(bundle=os.fspath(bundle_dir), genie=genie, mode=chosen, why=why, twins=(), config_changes=(),
                        graphs_loaded=(), load_seconds=0.0, warnings=())
    with twin_bundle(bundle_dir, twins) as twin:
        job, asked = DialogJob(str(twin.folder)), {}
        if chosen == "generate":
            if prompt is None:
                raise GenieBuildError("--prompt", "a Genie run that generates answers the host run's prompt: give it")
            asked = read_json(prompt)
            job = DialogJob(str(twin.folder), tuple(asked["prompt_ids"]), asked["new_tokens"])
        steps = 0 if job.query is None else len(job.query) + 1 + job.max_new_tokens
        outcome = run_dialog(job, dialog_timeout(twin.ctx_bin_bytes, steps), where=bundle_dir)
    generation = {}
    if outcome.tokens is not None:
        generation = _generation(bundle_dir, twin.dialog, asked, list(outcome.tokens), outcome.seconds,
                                 None if host_run is None else read_json(host_run), float_graphs, strict)
    return GenieRun(bundle=os.fspath(bundle_dir), genie=genie, mode=chosen,
                    why=why, twins=twin.twins, config_changes=twin.changes,
                    graphs_loaded=_graphs_loaded(outcome.graphs_loaded, twin, bundle_dir),
                    load_seconds=outcome.load_seconds, warnings=outcome.warnings, generation=generation)


def _graphs_loaded(loaded: Sequence[Sequence[int]], twin: TwinBundle, bundle_dir) -> tuple[dict, ...]:
    """Genie's (AR, CL) graphs, each in every ctx-bin as the bundle holds them, or the difference in one line."""
    parts = len(twin.twins)
    graphs = tuple({"ar": ar, "cl": cl, "parts": count} for ar, cl, count in sorted(loaded))
    if len(graphs) != twin.pairs or any(graph["parts"] != parts for graph in graphs):
        raise GenieBuildError(bundle_dir, f"Genie loaded the graphs {[tuple(g.values()) for g in graphs]} (AR, CL, "
                                          f"parts), not {twin.pairs} (AR, CL) pairs in each of the {parts} ctx-bins")
    return graphs


def _generation(bundle_dir, dialog: Mapping[str, Any], asked: Mapping[str, Any], tokens: list[int],
                seconds: float | None, host: Mapping[str, Any] | None,
                float_graphs: Mapping[str, str | os.PathLike[str]] | None, strict: bool) -> dict:
    """The generation's report. Genie was fed the prompt's ids and prepends ``bos-token`` itself: the host run and
    the float model are fed the BOS and the ids, and Genie's tokens must be the host run's."""
    fed = [dialog["context"]["bos-token"]] * (dialog["context"]["bos-token"] >= 0) + list(asked["prompt_ids"])
    tokenizer = load_tokenizer(Path(bundle_dir) / dialog["tokenizer"]["path"], inside=[bundle_dir])
    report = {"prompt": asked["prompt"], "prompt_ids": fed, "new_ids": tokens, "text": tokenizer.decode(tokens),
              "seconds": seconds, "tokens_per_second": _rate(len(tokens), seconds)}
    if host is not None:
        if host["prompt_ids"] != fed:
            raise GenieBuildError(bundle_dir, f"the host run was fed {host['prompt_ids']}, Genie {fed} (its BOS and "
                                              "the prompt's ids): run the host run again")
        report |= {"host_run_ids": host["new_ids"], "equal_to_host_run": tokens == host["new_ids"]}
        if tokens != host["new_ids"]:
            if strict:
                raise GenieBuildError(bundle_dir, _differ(tokens, host["new_ids"]))
            report["difference"] = _differ(tokens, host["new_ids"])
            log.warning("%s: %s (report.strict: true makes it an error)", bundle_dir, report["difference"])
    if float_graphs:
        expected = float_tokens(bundle_dir, float_graphs, fed, asked["new_tokens"])
        report |= {"float_ids": expected, "equal_to_float": expected == tokens}
    return report


def _differ(genie: Sequence[int], host: Sequence[int]) -> str:
    """Genie's tokens against the host run's, in one line: both lists and the first token where they part. The two
    ran the same twins in the same HTP simulation, so only the runtime differs: genie-build's reading of Genie's
    (the BOS, the KV cache, the length switch, the sampler, the table) is wrong, and the host run proves nothing of
    what a phone runs."""
    first = next((index for index, (a, b) in enumerate(zip(genie, host)) if a != b), min(len(genie), len(host)))
    return (f"Genie's tokens {list(genie)} differ from the host run's {list(host)} from new token {first} on: the "
            "host run does not run the bundle as Genie does (docs/genie-run.md)")


def _rate(count: int, seconds: float | None) -> float | None:
    return None if not seconds else round(count / seconds, 2)


def float_tokens(bundle_dir: str | os.PathLike[str], graphs: Mapping[str, str | os.PathLike[str]],
                 prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """The float model's greedy tokens for ``prompt_ids``: ``graphs`` (graph name -> the part's float graph; the
    name says which part) run on the CPU with the bundle's RoPE, stop tokens and context size.

    Raises:
        GenieBuildError: a name that does not say its part, or a graph that cannot be read.
    """
    from genie_build.run.run_bundle import read_graph_file, reference_tokens

    parts: dict[tuple[int, int], dict] = {}
    for name, path in graphs.items():
        match = PART_SUFFIX.search(name)
        if match is None:
            raise GenieBuildError(name, "does not end in _<part>_of_<parts>: which part is it?")
        parts.setdefault((int(match[1]), int(match[2])), {})[name] = read_graph_file(path)
    return reference_tokens(bundle_dir, [parts[key] for key in sorted(parts)], prompt_ids, max_new_tokens)
