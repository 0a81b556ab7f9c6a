"""The verification of a checkpoint exported part by part, before and after its jobs became one per part: the jobs'
summed wall time and their largest peak RSS, each tree's ``verify-parts`` on the same parts, and the ratio, in one
run (docs/export.md, "The verification").

A random Qwen2 checkpoint (tests/hf_checkpoints.py; ``--shape``) is planned into 3 parts and exported part by part
at each of ``--context`` (the largest by ``export-part``, the others by ``export-length``), as the workflow does.
The baseline tree (a checkout from before, whose ``verify-parts`` checks one graph of every part per job: one job
per graph kind and length) and this tree (one job per part, every graph of it) then run their jobs one after the
other, each under ``/usr/bin/time``; every file the jobs read is read once beforehand, so both find it in the page
cache. ``--repeat`` runs both sets again, alternating, and keeps each job's fastest run.

Usage::

    git worktree add bench/base <commit before the per-part verification>
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


def timed(command: list[str], tree: Path, work: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (GB) of ``command`` with ``tree``'s package."""
    figures = work / "time.txt"
    result = subprocess.run([TIME, "-f", "%e %M", "-o", str(figures), *command], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(tree / "workflow")})
    if result.returncode:
        raise SystemExit(f"{' '.join(command[:4])} failed:\n{result.stderr[-2000:]}")
    seconds, kib = figures.read_text().split()[-2:]
    return float(seconds), int(kib) * 1024 / 1e9


def prepare(work: Path, shape: dict, contexts: list[int]):
    """The checkpoint, its plan (written as plan.json) and its parts at every length; returns the plan."""
    import hf_checkpoints
    from genie_build.export import export_part
    from genie_build.export_length import export_length
    from genie_build.plan_file import write_plan
    from genie_build.shape_plan import plan_from_hf_config

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


def jobs(work: Path, plan, contexts: list[int]) -> dict[str, list[tuple[str, list[str]]]]:
    """Each tree's verify-parts jobs: (name, command)."""
    checkpoint, keys = str(work / "checkpoint"), graph_keys(contexts)
    parts = {part.label: work / "parts" / part.label for part in plan.parts}
    before = [(key, [sys.executable, "-m", "genie_build", "verify-parts", "--checkpoint", checkpoint,
                     "--plan", str(work / "plan.json"), "--graph", kind, "--context", str(context),
                     "--parts", *(str(folder / f"{key}.onnx") for folder in parts.values()),
                     "--out", str(work / f"before_{key}.json")]) for key, kind, context in keys]
    after = [(label, [sys.executable, "-m", "genie_build", "verify-parts", "--checkpoint", checkpoint,
                      "--part-json", json.dumps({k: v for k, v in dataclasses.asdict(part).items()
                                                 if k != "estimated_bytes"}),
                      "--ar", str(AR), "--graphs-json", json.dumps([list(key) for key in keys]),
                      "--paths", *(str(parts[label] / f"{key}.onnx") for key, _, _ in keys),
                      "--out", str(work / f"after_{label}.json")])
             for label, part in ((part.label, part) for part in plan.parts)]
    return {"before": before, "after": after}


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
        for tree, commands in jobs(work, plan, contexts).items():
            warm(work)
            for name, command in commands:
                seconds, peak = timed(command, trees[tree], work)
                old = best[tree].get(name)
                best[tree][name] = (seconds, peak) if old is None or seconds < old[0] else old
                print(f"{tree} {name}: {seconds:.1f} s, {peak:.2f} GB", flush=True)
    totals = {tree: sum(seconds for seconds, _ in figures.values()) for tree, figures in best.items()}
    report = {"shape": {**SHAPE, **args.shape}, "contexts": contexts, "parts": NUM_PARTS, "ar": AR,
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
