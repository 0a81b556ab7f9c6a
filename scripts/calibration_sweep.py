"""Calibration windows × calibrator on a trained model: agreement, KL, clipping and the chain's time, per recipe.

For each ``quantize.num_samples`` (``--windows``) and ``quantize.calibrator`` (``--calibrators``), a copy of the
workflow builds the demo (its trained weights), or with ``--checkpoint`` a Hugging Face checkpoint (the Llama model
``scripts/train_demo.py --family llama`` trains), calibrated by aimet-onnx's chain under each recipe of ``--recipes``
and evaluates every variant on the held-out text (``evaluate.enabled``; no bundle). It reads each variant's report
(top-1 agreement, mean KL, the share of activation values outside their grids, the weights-only KL) and the chain's
time (the ``calibrate_unit`` jobs' benchmarks, summed), and prints one Markdown table.

Minutes at 7B are computed, not measured: the 7B chain took 16.9 min for 8 windows of 128 tokens with min-max, and a
window costs about 100 s more through its 28 layers (3.5 s a layer, measured on one-layer units of that shape:
docs/large-models.md, "The largest jobs, measured alone"); the table adds that per window beyond 8, scaled by the
calibrator's cost per window against min-max on the demo (the slope of its chain time over the windows, fitted here).

Usage (needs envs/requirements-hf.txt; about 2 minutes a build on 2 cores)::

    .venv-test/bin/python scripts/calibration_sweep.py --work-dir bench/sweep [--windows 4 8 32 128]
    .venv-test/bin/python scripts/calibration_sweep.py --work-dir bench/sweep-llama --checkpoint bench/llama-demo
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
WORKFLOW_FILES = ("Snakefile", "workflow", "profiles", "config", "resources")
# docs/large-models.md: the calibration chain and part encodings at 8 windows, min-max; a window through 28 layers
CHAIN_7B_MINUTES, CHAIN_7B_WINDOWS, WINDOW_7B_MINUTES = 16.9, 8, 28 * 3.5 / 60


def build_config(windows: int, calibrator: str, recipes: list[str], corpus: str | None,
                 checkpoint: Path | None = None, ar: int = 32, context: int = 256) -> dict:
    model = ({"model": {"name": f"sweep_{calibrator}_{windows}"}, "demo": {"calibrator": "aimet"}} if checkpoint is None
             else {"model": {"name": f"sweep_{calibrator}_{windows}", "hf_checkpoint": str(checkpoint.resolve())},
                   "export": {"ar": ar, "context": context}})
    return {**model,
            "variants": {recipe: {"recipe": recipe, "weights_packing": recipe != "w8a16"} for recipe in recipes},
            "report": {"baseline_variant": recipes[0]}, "bundle": {"enabled": False, "variant": recipes[0]},
            "evaluate": {"enabled": True},
            "quantize": {"num_samples": windows, "calibrator": calibrator, **({"corpus": corpus} if corpus else {})}}


def chain_seconds(results: Path, recipe: str) -> float:
    """The calibrate_unit jobs' wall time for ``recipe``, summed (Snakemake's benchmark files)."""
    total = 0.0
    for path in sorted((results / "benchmarks" / "calibrate_unit" / recipe).glob("*.tsv")):
        rows = list(csv.DictReader(path.read_text().splitlines(), delimiter="\t"))
        total += float(rows[0]["s"])
    return total


def run_build(work: Path, config: dict, cores: int) -> Path:
    path = work / f"{config['model']['name']}.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "snakemake", "--cores", str(cores), "--configfile", path.name]
    result = subprocess.run(command, cwd=work, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(work / "workflow")})
    if result.returncode:
        raise SystemExit(f"{path}: snakemake failed:\n{result.stderr[-3000:]}")
    return work / "results" / config["model"]["name"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", required=True, type=Path)
    parser.add_argument("--windows", type=int, nargs="+", default=[4, 8, 32, 128])
    parser.add_argument("--calibrators", nargs="+", default=["min-max", "tf-enhanced", "percentile"])
    parser.add_argument("--recipes", nargs="+", default=["w4a16", "w8a16"])
    parser.add_argument("--corpus", help="calibration text (default: the workflow's, Genesis 1-12)")
    parser.add_argument("--checkpoint", type=Path, help="a Hugging Face checkpoint folder instead of the demo")
    parser.add_argument("--ar", type=int, default=32, help="the checkpoint's prompt AR (the demo's: 32)")
    parser.add_argument("--context", type=int, default=256, help="the checkpoint's context length (the demo's: 256)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--out", type=Path, help="the figures as JSON")
    args = parser.parse_args()

    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        source, target = REPO / name, work / name
        if not target.exists():
            (shutil.copytree if source.is_dir() else shutil.copy2)(source, target)
    rows = []
    for calibrator in args.calibrators:
        for windows in args.windows:
            config = build_config(windows, calibrator, args.recipes, args.corpus, args.checkpoint, args.ar,
                                  args.context)
            results = run_build(work, config, args.cores)
            for recipe in args.recipes:
                report = json.loads((results / "evaluation" / f"{recipe}.json").read_text())
                rows.append({"calibrator": calibrator, "windows": windows, "recipe": recipe,
                             "top1_agreement": report["top1_agreement"], "mean_kl": report["mean_kl"],
                             "clipped_share": report["clipping"]["share"],
                             "weights_only_kl": report["weights_only"]["mean_kl"],
                             "most_clipped": report["clipping"]["tensors"][:1],
                             "chain_seconds": chain_seconds(results, recipe)})
                print(json.dumps(rows[-1]), flush=True)
    per_window = {}
    for calibrator in args.calibrators:   # the slope of the chain's time over the windows, both recipes together
        points = [(row["windows"], row["chain_seconds"]) for row in rows if row["calibrator"] == calibrator]
        per_window[calibrator] = float(np.polyfit(*zip(*points), 1)[0]) if len(set(p[0] for p in points)) > 1 \
            else float("nan")
    base = per_window.get("min-max", float("nan"))
    print("\n| calibrator | windows | recipe | top-1 agreement | mean KL | outside grid | weights-only KL | "
          "chain (s, demo) | minutes at 7B |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        factor = 1.0 if row["calibrator"] == "min-max" else per_window[row["calibrator"]] / base
        minutes = CHAIN_7B_MINUTES + (row["windows"] - CHAIN_7B_WINDOWS) * WINDOW_7B_MINUTES * factor
        row["minutes_at_7b"] = minutes
        print(f"| {row['calibrator']} | {row['windows']} | {row['recipe']} | {row['top1_agreement']:.1%} | "
              f"{row['mean_kl']:.3g} | {row['clipped_share']:.4%} | {row['weights_only_kl']:.3g} | "
              f"{row['chain_seconds']:.0f} | {minutes:.0f} |")
    print("\nper-window chain time on the demo (s): " + ", ".join(f"{k} {v:.2f}" for k, v in per_window.items()))
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "per_window_seconds": per_window}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
