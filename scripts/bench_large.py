"""Run the whole reference workflow on a multi-GB float16 demo model and tabulate, per job, wall time and peak
RSS next to the size of the data the job handles (``docs/large-models.md``).

The workflow (Snakefile, ``workflow/``, ``config/``, ``resources/``) is copied into ``--scratch`` and run there
with ``snakemake --cores N --keep-going --configfile config/config.yaml large.yaml`` (``large.yaml``: the demo
shape), so nothing lands in the repository's ``results/``. In the copy, every rule without a ``benchmark:`` gets
one (beside its log, ``logs/`` -> ``benchmarks/``), and the package is imported from the copy (``PYTHONPATH``),
so editing the repository during the run changes nothing.

Two peak RSS figures per job:

- ``bench_rss``: Snakemake's ``max_rss`` from the job's benchmark TSV. Snakemake samples every 0.5 s for the
  first 15 s, then every 30 s, so it can miss a short peak of a long job;
- ``peak_rss``: the ``genie_build`` process's own ``ru_maxrss``, written at exit by a ``sitecustomize`` hook
  put on ``PYTHONPATH``; exact. A process the kernel kills (out of memory) records nothing.

Concurrency: ``--cores`` jobs run at once. ``calibrate_demo_encodings`` and ``verify_split`` each run the whole
model in onnxruntime, so they get ``mem_mb`` resources that keep them from running side by side; a job's peak
RSS is its own either way.

Usage::

    .venv/bin/python scripts/bench_large.py --scratch /tmp/genie-large [--cores 2] [--num-parts 6] [--keep]
    .venv/bin/python scripts/bench_large.py --scratch /tmp/genie-large --collect-only   # a kept run, again
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the same workflow copy as the tests
from workflow_helpers import copy_workflow  # noqa: E402

from genie_build.conventions import PART_WEIGHTS_NAME  # noqa: E402

MIB = 1024 * 1024
GIB = 1024 * MIB
# About 2.1 B parameters, 4.2 GB of float16 weights per graph (a 1.5B-class shape with Qwen2's vocabulary).
LARGE_SHAPE = {"layers": 24, "hidden": 2048, "heads": 16, "kv_heads": 4, "intermediate": 8192,
               "vocab": 151936, "context": 256, "ar": 32, "weight_dtype": "float16"}
# Source (two graphs), parts (the weights once), converted, compiled (two variants) and the bundle: about 5.5x
# one graph's weights; ask for a margin above that.
DISK_FACTOR = 8
# Jobs that run the whole model in onnxruntime: give each most of the memory so no two run at once.
WHOLE_MODEL_RULES = ("calibrate", "verify_split")
RSS_TARGET_FACTOR = 2
RSS_FLOOR = 300 * MIB       # the interpreter with numpy/onnx/onnxruntime alone takes 100-200 MiB
SPLIT_TARGET = 300 * MIB
# Rule (the benchmark file's first path component) -> the genie_build subcommand it runs, in workflow order.
COMMANDS = {"generate_demo": "generate-demo", "train_tokenizer": "train-tokenizer",
            "calibrate": "calibrate", "plan": "plan", "split": "split",
            "verify_split": "verify-split", "slice_encodings": "slice-encodings", "convert_part": "convert",
            "compile_part": "compile", "account": "account", "size_table": "size-table",
            "memory_plan": "memory-plan", "bundle": "bundle", "check_bundle": "check-bundle",
            "convert_unsplit": "convert", "compile_unsplit": "compile", "run_bundle": "run-bundle",
            "check_model": "check-model", "check_contract": "check-contract"}
RSS_HOOK = '''\
"""Written by scripts/bench_large.py: record each genie_build process's peak RSS at exit."""
import atexit, json, os, resource, sys, time

_LOG, _START = os.environ.get("GENIE_BENCH_RSS_LOG"), time.time()


def _record():
    if sys.argv and sys.argv[0].endswith(os.path.join("genie_build", "__main__.py")):
        with open(_LOG, "a") as log:
            log.write(json.dumps({"argv": sys.argv[1:], "seconds": time.time() - _START,
                                  "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}) + "\\n")


if _LOG:
    atexit.register(_record)
    _os_exit = os._exit

    def _exit_recorded(code):   # the commands that load the vendor's libraries leave through os._exit
        _record()
        _os_exit(code)

    os._exit = _exit_recorded
'''
_RULE_HEADER = re.compile(r"^(?:rule|checkpoint) (\w+):", re.MULTILINE)
_CACHE_DIRECTIVE = re.compile(r"^    cache: .*\n", re.MULTILINE)


@dataclass(frozen=True)
class Job:
    rule: str
    wildcards: tuple[str, ...]
    seconds: float
    bench_rss: int            # bytes, Snakemake's sampled max_rss
    peak_rss: int | None      # bytes, the process's ru_maxrss (None: no record matched)
    handled: str              # what the job reads
    handled_bytes: int

    @property
    def verdict(self) -> str:
        rss = self.peak_rss or self.bench_rss
        if self.rule == "split":
            return "ok" if rss < SPLIT_TARGET else "over 300 MiB"
        if rss <= max(RSS_TARGET_FACTOR * self.handled_bytes, RSS_FLOOR):
            return "ok"
        return f"**{rss / self.handled_bytes:.1f}x**"


# ------------------------------------------------------------------------------------------- set-up

def add_missing_benchmarks(rules_dir: Path) -> list[str]:
    """Give every rule with a ``log:`` and no ``benchmark:`` one beside its log, dropping its ``cache:``, unless its
    job writes its own (``--benchmark``); return those rules' names.

    Raises:
        SystemExit: a rule's log is not a one-line ``.../logs/....log`` path (the patch would guess).
    """
    patched = []
    for path in sorted(rules_dir.glob("*.smk")):
        text = path.read_text()
        headers = list(_RULE_HEADER.finditer(text))
        pieces, end = [], len(text)
        for header, following in reversed(list(zip(headers, [*headers[1:], None]))):
            block = text[header.start():following.start() if following else end]
            writes_its_own = "--benchmark {params.benchmark" in block   # a cacheable rule's job writes its TSV
            if "\n    log:\n" in block and "\n    benchmark:\n" not in block and not writes_its_own:
                log_value = block.split("\n    log:\n", 1)[1].split("\n", 1)[0]
                if "/logs/" not in log_value or '.log"' not in log_value:
                    raise SystemExit(f"{path}: rule {header.group(1)}: cannot derive a benchmark path from "
                                     f"{log_value}")
                bench_value = log_value.replace("/logs/", "/benchmarks/").replace('.log"', '.tsv"')
                # Snakemake refuses benchmark: on a cacheable rule; this run does not use the cache.
                block = _CACHE_DIRECTIVE.sub("", block)
                block = block.replace(f"\n    log:\n{log_value}\n",
                                      f"\n    log:\n{log_value}\n    benchmark:\n{bench_value}\n", 1)
                patched.append(header.group(1))
            pieces.append(block)
            end = header.start()
        path.write_text(text[:end] + "".join(reversed(pieces)))
    return sorted(patched)


def run_workflow(workflow: Path, shape: dict, cores: int, num_parts: int, hook_dir: Path,
                 rss_log: Path) -> tuple[float, bool]:
    """``snakemake --cores N --keep-going`` on the demo of ``shape``: its wall time in seconds, and whether
    every job succeeded (``workflow/snakemake.log`` says which failed)."""
    total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MIB
    whole_model_mb = int(total_mb * 0.6)
    # A config file, not --config demo='{...}': Snakemake 9 reads --config values with YAML's BaseLoader, so
    # nested numbers arrive as strings and fail the schema.
    overrides = workflow / "large.yaml"
    overrides.write_text(json.dumps({"demo": shape, "split": {"num_parts": num_parts}}))
    command = [sys.executable, "-m", "snakemake", "--cores", str(cores), "--keep-going",
               "--configfile", "config/config.yaml", overrides.name, "--resources", f"mem_mb={int(total_mb * 0.9)}",
               "--set-resources", *(f"{rule}:mem_mb={whole_model_mb}" for rule in WHOLE_MODEL_RULES)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook_dir), str(workflow / "workflow")]),
           "GENIE_BENCH_RSS_LOG": str(rss_log)}
    start = time.perf_counter()
    with open(workflow / "snakemake.log", "w") as log:
        result = subprocess.run(command, cwd=workflow, env=env, stdout=log, stderr=subprocess.STDOUT)
    return time.perf_counter() - start, result.returncode == 0


def failed_jobs(workflow: Path) -> list[str]:
    """The rules Snakemake reports as failed."""
    log = (workflow / "snakemake.log").read_text()
    return sorted(set(re.findall(r"^Error in rule (\w+):", log, re.MULTILINE)))


# ------------------------------------------------------------------------------------------- collection

def handled(out: Path, rule: str, wildcards: tuple[str, ...]) -> tuple[str, int]:
    """What a job reads, and its size: the part for per-part jobs, the model for whole-model jobs."""
    def size(*patterns: str) -> int:
        return sum(path.stat().st_size for pattern in patterns for path in out.glob(pattern) if path.is_file())

    part = wildcards[-1] if wildcards else ""
    if rule in ("generate_demo", "calibrate"):
        return "model (one graph's weights)", size("source/prompt.onnx.data")
    if rule == "check_model":
        return "model, both graphs", size("source/*.onnx.data")
    if rule == "split":
        return "model, both graphs", size("source/*.onnx.data")
    if rule == "plan":
        return "graphs, no weights", size("source/*.onnx")
    if rule == "check_contract":
        return "graphs without weights, tokenizer, config.json", size("source/*.onnx", "source/tokenizer.json",
                                                                       "source/config.json")
    if rule == "verify_split":
        return f"{wildcards[0]} model", size(f"source/{wildcards[0]}.onnx.data")
    if rule == "slice_encodings":
        return "encodings, both graphs", size("source/*.encodings.json")
    if rule == "convert_part":   # wildcards: encodings, converter, part, graph
        return f"part {wildcards[2]}", size(f"parts/part_{wildcards[2]}/{PART_WEIGHTS_NAME}")
    if rule == "compile_part":
        return f"part {part}, converted, both graphs", size(f"converted/*/part_{part}/*.onnx.data")
    if rule == "account":
        return f"{wildcards[0]} binary {part}", size(f"compiled/{wildcards[0]}/part_{part}.bin")
    if rule in ("bundle", "check_bundle"):
        return "bundle", size("genie_bundle/*")
    if rule == "convert_unsplit":
        return f"{wildcards[0]} model", size(f"source/{wildcards[0]}.onnx.data")
    if rule == "compile_unsplit":
        return "model, converted, both graphs", size("unsplit/*.onnx.data")
    if rule == "run_bundle":
        # It runs the bundle, then the unsplit binary (--compare-with): the whole model, one after the other.
        return "model (one graph's weights)", size("source/prompt.onnx.data")
    if rule in ("size_table", "memory_plan"):
        return "accounting records", size("sizes/*/*.json")
    return "tokenizer corpus", (out.parents[1] / "resources" / "tokenizer_corpus.txt").stat().st_size


def subcommand(argv: list[str]) -> str | None:
    """The genie_build command of a command line, after the global options (``--benchmark TSV``, ``-v``)."""
    for index, arg in enumerate(argv):
        if not arg.startswith("-") and (index == 0 or argv[index - 1] != "--benchmark"):
            return arg
    return None


def peak_of(rule: str, wildcards: tuple[str, ...], records: list[dict]) -> int | None:
    """The exact peak RSS of the job's genie_build process: the record of its subcommand whose command
    line names all its wildcards (a convert or compile of the whole model writes under ``unsplit/``, one of a part
    does not)."""
    command = COMMANDS.get(rule)
    for record in records:
        line = " ".join(record["argv"])
        if (subcommand(record["argv"]) == command and all(value in line for value in wildcards)
                and (command not in ("convert", "compile") or ("/unsplit/" in line) == rule.endswith("_unsplit"))):
            return record["peak_rss_kib"] * 1024
    return None


def collect(out: Path, rss_log: Path) -> list[Job]:
    """Every job that wrote a benchmark file, in workflow order."""
    records = [json.loads(line) for line in rss_log.read_text().splitlines()] if rss_log.exists() else []
    jobs = []
    for tsv in sorted((out / "benchmarks").rglob("*.tsv")):
        relative = tsv.relative_to(out / "benchmarks").with_suffix("").parts
        rule, wildcards = relative[0], tuple(part.removeprefix("part_") for part in relative[1:])
        with open(tsv, newline="") as handle:
            row = next(csv.DictReader(handle, delimiter="\t"))
        what, nbytes = handled(out, rule, wildcards)
        jobs.append(Job(rule, wildcards, float(row["s"]), int(float(row["max_rss"]) * MIB),
                        peak_of(rule, wildcards, records), what, nbytes))
    order = list(COMMANDS)
    return sorted(jobs, key=lambda job: (order.index(job.rule) if job.rule in order else len(order), job.wildcards))


def markdown(jobs: list[Job]) -> str:
    """The jobs as the table of ``docs/large-models.md``."""
    lines = ["| job | wall s | handles | MiB | bench max_rss MiB | peak RSS MiB | peak / handled | verdict |",
             "|---|---:|---|---:|---:|---:|---:|---|"]
    for job in jobs:
        name = "/".join((job.rule, *job.wildcards))
        peak = "n/a" if job.peak_rss is None else f"{job.peak_rss / MIB:,.0f}"
        ratio = f"{(job.peak_rss or job.bench_rss) / job.handled_bytes:.2f}" if job.handled_bytes else "n/a"
        lines.append(f"| {name} | {job.seconds:,.1f} | {job.handled} | {job.handled_bytes / MIB:,.1f} | "
                     f"{job.bench_rss / MIB:,.0f} | {peak} | {ratio} | {job.verdict} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- main

def finish(report: dict, report_path: Path | None, work: Path, keep: bool) -> None:
    """A benchmark's epilogue, whether it succeeded or not: its figures written (when asked), its work folder
    deleted (unless kept)."""
    if report_path:
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(report, indent=1))
    if not keep:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scratch", type=Path, required=True, help="work directory, created (must not exist)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--num-parts", type=int, default=6)
    parser.add_argument("--shape", type=json.loads, default=LARGE_SHAPE, help="demo.* keys as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (default: delete it)")
    parser.add_argument("--report", type=Path, help="also write the jobs as JSON here")
    parser.add_argument("--collect-only", action="store_true",
                        help="only tabulate the jobs of an earlier run kept in --scratch")
    args = parser.parse_args(argv)
    args.scratch = args.scratch.resolve()  # the jobs run in the copied workflow, and write the peak log by this path
    workflow, hooks, rss_log = args.scratch / "workflow", args.scratch / "hooks", args.scratch / "rss.jsonl"
    if args.collect_only:
        print(markdown(collect(workflow / "results" / "demo", rss_log)))
        print(f"\nfailed: {', '.join(failed_jobs(workflow)) or 'none'}")
        return 0

    shape = {**LARGE_SHAPE, **args.shape}
    params = shape["vocab"] * shape["hidden"] * 2 + shape["layers"] * (
        2 * shape["hidden"] ** 2 + 2 * shape["hidden"] * shape["hidden"] // shape["heads"] * shape["kv_heads"]
        + 3 * shape["hidden"] * shape["intermediate"])
    model_bytes = params * (2 if shape["weight_dtype"] == "float16" else 4)
    args.scratch.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.scratch.parent).free
    if free < DISK_FACTOR * model_bytes:
        raise SystemExit(f"{args.scratch.parent}: {free / GIB:.1f} GiB free, the run needs about "
                         f"{DISK_FACTOR * model_bytes / GIB:.1f} GiB")
    workflow.mkdir(parents=True)
    copy_workflow(workflow)
    patched = add_missing_benchmarks(workflow / "workflow" / "rules")
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(RSS_HOOK)
    print(f"model: {params / 1e9:.2f} B parameters, {model_bytes / GIB:.2f} GiB per graph; "
          f"benchmark added to: {', '.join(patched) or 'none'}", flush=True)
    try:
        seconds, succeeded = run_workflow(workflow, shape, args.cores, args.num_parts, hooks, rss_log)
        jobs, failed = collect(workflow / "results" / "demo", rss_log), failed_jobs(workflow)
        print(f"whole workflow: {seconds / 60:.1f} min wall; failed: {', '.join(failed) or 'none'}\n")
        print(markdown(jobs))
        if args.report:
            args.report.write_text(json.dumps({"shape": shape, "seconds": seconds, "rules_patched": patched,
                                               "failed": failed, "jobs": [job.__dict__ for job in jobs]}, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(args.scratch)
    return 0 if succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
