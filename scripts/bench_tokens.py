"""A calibration unit's time and peak RSS on a large calibration text, with the text tokenized by every unit (a
baseline checkout of genie-build from before ``tokenize-text``) and with the text tokenized once by its own job,
each unit reading only its windows (docs/quantize.md, "The calibration text").

A random Qwen2 checkpoint of 3 layers (tests/hf_checkpoints.py, its 320-token tokenizer) is planned into 3 parts
and exported; the text is ``resources/calibration_corpus.txt`` repeated to ``--text-mb`` MB (tokenizing costs the
same per byte whatever the text says). The first two units of the chain (the embedding, then two decoder layers fed
its stream) are calibrated by each tree's ``calibrate-unit``, one process each, measured (wall time, and the peak
RSS of the process and its children); the ``tokenize-text`` job that replaces the per-unit tokenizing is measured
once, each under ``/usr/bin/time``. Ratios are of the same run.

Usage::

    git worktree add bench/base <commit before tokenize-text>
    .venv-test/bin/python scripts/bench_tokens.py --baseline bench/base --work-dir bench/tokens [--text-mb 20]

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
from bench_large import finish  # noqa: E402

AR, CONTEXT, NUM_SAMPLES, NUM_PARTS = 128, 512, 8, 3
MB = 1_000_000
TIME = "/usr/bin/time"


def unit_command(tree: Path, work: Path, unit, units, text_args: list[str], out: Path) -> list[str]:
    """``calibrate-unit`` of ``unit`` in ``tree``: its part's graph, the stream of the unit before it (if any)."""
    index = units.index(unit)
    before = ["--boundary-in", str(out / f"unit_{units[index - 1].label}.npy")] if index else []
    return [sys.executable, "-m", "genie_build", "calibrate-unit",
            "--part-graph", str(work / "parts" / unit.part / "prompt.onnx"),
            "--part-units-json", json.dumps([dataclasses.asdict(u) for u in units if u.part == unit.part]),
            "--unit", unit.label, *before, "--hf-config", str(work / "checkpoint" / "config.json"), *text_args,
            "--recipe", "w4a16", "--num-samples", str(NUM_SAMPLES), "--ar", str(AR), "--context", str(CONTEXT),
            "--out-encodings", str(out / f"unit_{unit.label}.json"), "--out-boundary", str(out / f"unit_{unit.label}.npy")]


def measured(command: list[str], tree: Path, what: str, work: Path) -> dict:
    """Wall time and peak RSS of ``command`` run by ``/usr/bin/time`` (a process this script forked would start
    from this script's own peak: Linux keeps a process's peak RSS across ``exec``)."""
    if not os.access(TIME, os.X_OK):
        raise SystemExit(f"{TIME} is needed (Debian package 'time')")
    env = {**os.environ, "PYTHONPATH": str(tree / "workflow")}
    figures = work / "time.txt"
    result = subprocess.run([TIME, "-f", "%e %M", "-o", str(figures), *command], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    if result.returncode:
        raise SystemExit(f"{what} failed ({result.returncode}): {result.stderr[-2000:]}")
    seconds, kilobytes = figures.read_text().split()[-2:]
    print(f"{what}: {float(seconds):.1f} s, peak RSS {int(kilobytes) * 1024 / MB:.0f} MB", flush=True)
    return {"seconds": float(seconds), "peak_rss_mb": int(kilobytes) * 1024 / MB}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of genie-build before tokenize-text")
    parser.add_argument("--work-dir", type=Path, required=True, help="created; removed afterwards unless --keep")
    parser.add_argument("--text-mb", type=float, default=20)
    parser.add_argument("--report", type=Path, help="write the figures as JSON here")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    import hf_checkpoints  # needs torch

    from genie_build.export.export import export_part
    from genie_build.plan.shape_plan import plan_checkpoint

    work = args.work_dir.resolve()
    work.mkdir(parents=True)
    baseline = args.baseline.resolve()
    report: dict = {"text_mb": args.text_mb, "ar": AR, "num_samples": NUM_SAMPLES}
    try:
        checkpoint = hf_checkpoints.make_checkpoint(work / "checkpoint", "qwen2", layers=3, context=CONTEXT)
        plan, units = plan_checkpoint(checkpoint / "config.json", {"num_parts": NUM_PARTS}, recipe="w4a16", ar=AR,
                                      context=CONTEXT, unit_memory_mb=10240)
        for part in plan.parts:
            export_part(checkpoint, part, work / "parts" / part.label, num_parts=NUM_PARTS, ar=AR, context=CONTEXT)
        corpus = (REPO / "resources" / "calibration_corpus.txt").read_text(encoding="utf-8")
        text = work / "text.txt"
        text.write_text(corpus * int(args.text_mb * MB // len(corpus.encode()) + 1), encoding="utf-8")
        report["text_bytes"] = text.stat().st_size
        tokens = work / "calibration.npy"
        report["tokenize_text"] = measured(
            [sys.executable, "-m", "genie_build", "tokenize-text", "--text", str(text),
             "--tokenizer", str(checkpoint / "tokenizer.json"), "--hf-config", str(checkpoint / "config.json"),
             "--needed", str(AR * NUM_SAMPLES), "--use", "calibration", "--out", str(tokens)], REPO, "tokenize-text", work)
        for name, tree, text_args in (
                ("every unit tokenizes", baseline, ["--tokenizer", str(checkpoint / "tokenizer.json"),
                                                    "--corpus", str(text)]),
                ("tokenized once", REPO, ["--tokens", str(tokens)])):
            out = work / name.replace(" ", "_")
            out.mkdir()
            report[name] = [measured(unit_command(tree, work, unit, units, text_args, out), tree,
                                     f"{name}: unit {unit.label}", work) for unit in units[:2]]
        for index in range(2):
            before, after = report["every unit tokenizes"][index], report["tokenized once"][index]
            ratios = {key: after[key] / before[key] for key in before}
            report.setdefault("ratios", []).append(ratios)
            print(f"unit {units[index].label}: time x{ratios['seconds']:.3f}, peak RSS x{ratios['peak_rss_mb']:.3f}")
    finally:
        finish(report, args.report, work, args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
