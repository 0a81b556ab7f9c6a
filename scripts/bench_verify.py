"""The verification of a checkpoint exported part by part, in a baseline tree and in this one: the jobs' summed wall
time and their largest peak RSS, each tree's ``verify-parts`` on the same parts, and the ratio, in one run
(docs/export.md, "The verification").

A random Qwen2 checkpoint (tests/hf_checkpoints.py; ``--shape``), or the one already in ``WORK/checkpoint`` (e.g.
written by ``scripts/bench_checkpoint.py --generate``), is planned into 3 parts and exported part by part at each of
``--context`` (the largest by ``export-part``, the others by ``export-length``), as the workflow does. The baseline
tree (a checkout from before) and this tree then run their jobs one after the other, each under ``/usr/bin/time``,
with ``--threads`` as ``OMP_NUM_THREADS`` (a workflow job's threads); every file the jobs read is read once
beforehand, so both find it in the page cache. A baseline whose ``verify-parts`` checks one graph of every part per
job runs a job per graph kind and length; one that checks a part per job, as this tree, a job per part.
``--repeat`` runs both sets again, alternating, and keeps each job's fastest run.

Usage::

    git worktree add bench/base <commit before the change measured>
    .venv-test/bin/python scripts/bench_verify.py --baseline bench/base --work-dir bench/verify

Needs the Hugging Face extra (envs/requirements-hf.txt).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))
from bench_tokens import TIME  # noqa: E402

AR, NUM_PARTS = 128, 3
SHAPE = {"layers": 8, "hidden": 768, "intermediate": 2048, "heads": 12, "kv_heads": 4, "vocab": 16000}


def timed(command: list[str], tree: Path, work: Path, threads: int | None = None) -> tuple[float, float]:
    """Wall seconds and peak RSS (GB) of ``command`` with ``tree``'s package (and ``threads`` threads if given)."""
    figures = work / "time.txt"
    env = {**os.environ, "PYTHONPATH": str(tree / "workflow")} | ({"OMP_NUM_THREADS": str(threads)} if threads else {})
    result = subprocess.run([TIME, "-f", "%e %M", "-o", str(figures), *command], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    if result.returncode:
        raise SystemExit(f"{' '.join(command[:4])} failed:\n{result.stderr[-2000:]}")
    seconds, kib = figures.read_text().split()[-2:]
    return float(seconds), int(kib) * 1024 / 1e9


def prepare(work: Path, shape: dict, contexts: list[int]):
    """The checkpoint, its plan (written as plan.json) and its parts at every length; returns the plan."""
    import hf_checkpoints
    from genie_build.export.export import export_part
    from genie_build.export.export_length import export_length
    from genie_build.plan.plan_file import write_plan
    from genie_build.plan.shape_plan import plan_from_hf_config

    checkpoint = work / "checkpoint"
    if not checkpoint.exists():
        hf_checkpoints.make_checkpoint(checkpoint, "qwen2", layers=shape["layers"], hidden=shape["hidden"],
                                       intermediate=shape["intermediate"], heads=shape["heads"],
                                       kv_heads=shape["kv_heads"], vocab=shape["vocab"], context=max(contexts))
    plan = plan_from_hf_config(checkpoint / "config.json", recipe="w4a16", ar=AR, context=max(contexts),
                               num_parts=NUM_PARTS)
    write_plan(work / "plan.json", plan)
    for part in plan.parts:
        folder = work / "parts" / part.label
        if not (folder / "prompt.onnx").exists():
            export_part(checkpoint, part, folder, num_parts=NUM_PARTS, ar=AR, context=max(contexts))
        for context in contexts[:-1]:
            if not (folder / f"prompt_cl{context}.onnx").exists():
                export_length(checkpoint, part, folder, num_parts=NUM_PARTS, ar=AR, context=context)
    return plan


def graph_keys(contexts: list[int]) -> list[tuple[str, str, int]]:
    """(key, kind, context) of every graph, those at the largest length keeping the kind's name."""
    return [(kind if context == max(contexts) else f"{kind}_cl{context}", kind, context)
            for context in sorted(contexts, reverse=True) for kind in ("prompt", "token")]


def per_part(tree: Path) -> bool:
    """Whether ``tree``'s verify-parts checks a part per job (it takes ``--part-json``)."""
    return "--part-json" in (tree / "workflow" / "genie_build" / "commands" / "verify_parts.py").read_text()


def jobs(work: Path, plan, contexts: list[int], tree: str, *, part_jobs: bool) -> list[tuple[str, list[str]]]:
    """A tree's verify-parts jobs, (name, command): a job per part, or per graph kind and length."""
    checkpoint, keys = str(work / "checkpoint"), graph_keys(contexts)
    parts = {part.label: work / "parts" / part.label for part in plan.parts}
    if not part_jobs:
        return [(key, [sys.executable, "-m", "genie_build", "verify-parts", "--checkpoint", checkpoint,
                       "--plan", str(work / "plan.json"), "--graph", kind, "--context", str(context),
                       "--parts", *(str(folder / f"{key}.onnx") for folder in parts.values()),
                       "--out", str(work / f"{tree}_{key}.json")]) for key, kind, context in keys]
    return [(part.label, [sys.executable, "-m", "genie_build", "verify-parts", "--checkpoint", checkpoint,
                          "--part-json", json.dumps({k: v for k, v in dataclasses.asdict(part).items()
                                                     if k != "estimated_bytes"}),
                          "--ar", str(AR), "--graphs-json", json.dumps([list(key) for key in keys]),
                          "--paths", *(str(parts[part.label] / f"{key}.onnx") for key, _, _ in keys),
                          "--out", str(work / f"{tree}_{part.label}.json")]) for part in plan.parts]


def warm(work: Path) -> None:
    """Read every file the jobs read once, so every job finds them in the page cache."""
    for path in sorted(work.rglob("*")):
        if path.is_file() and path.suffix in {".onnx", ".data", ".safetensors", ".json"}:
            with open(path, "rb") as handle:
                while handle.read(1 << 24):
                    pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout from before the per-part jobs")
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--context", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--shape", type=json.loads, default={}, help='e.g. {"layers": 4}: replaces SHAPE keys')
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--threads", type=int, help="each job's OMP_NUM_THREADS (a workflow job's threads)")
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if not os.access(TIME, os.X_OK):
        raise SystemExit(f"{TIME} is needed (Debian package 'time')")
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    contexts = sorted(args.context)
    plan = prepare(work, {**SHAPE, **args.shape}, contexts)
    trees = {"before": args.baseline.resolve(), "after": REPO}
    best: dict[str, dict[str, tuple[float, float]]] = {"before": {}, "after": {}}
    for _ in range(args.repeat):
        for tree, root in trees.items():
            warm(work)
            for name, command in jobs(work, plan, contexts, tree, part_jobs=per_part(root)):
                seconds, peak = timed(command, root, work, args.threads)
                old = best[tree].get(name)
                best[tree][name] = (seconds, peak) if old is None or seconds < old[0] else old
                print(f"{tree} {name}: {seconds:.1f} s, {peak:.2f} GB", flush=True)
    totals = {tree: sum(seconds for seconds, _ in figures.values()) for tree, figures in best.items()}
    config = json.loads((work / "checkpoint" / "config.json").read_text())
    report = {"shape": {key: config[key] for key in ("num_hidden_layers", "hidden_size", "intermediate_size",
                                                      "num_attention_heads", "num_key_value_heads", "vocab_size")},
              "contexts": contexts, "parts": NUM_PARTS, "ar": AR, "threads": args.threads,
              "jobs": {tree: {name: {"seconds": s, "peak_gb": p} for name, (s, p) in figures.items()}
                       for tree, figures in best.items()},
              "total_seconds": totals, "ratio": totals["before"] / totals["after"],
              "peak_gb": {tree: max(p for _, p in figures.values()) for tree, figures in best.items()}}
    print(f"\nbefore: {len(best['before'])} jobs, {totals['before']:.1f} s, at most {report['peak_gb']['before']:.2f} GB"
          f"\nafter:  {len(best['after'])} jobs, {totals['after']:.1f} s, at most {report['peak_gb']['after']:.2f} GB"
          f"\nratio:  {report['ratio']:.2f}x")
    if args.report:
        args.report.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
