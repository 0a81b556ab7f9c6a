"""Benchmark the streaming split on a multi-GB demo model: wall time and peak RSS, against ``cp -r``.

Generates the demo model with ``python -m genie_build generate-demo`` (skipped when it is already in the
work directory), writes a plan with ``genie_build.plan.plan``, then times ``python -m genie_build split`` (both
graphs, one job) and ``cp -r`` of the same source files, alternating, ``--repeat`` times each. Peak RSS is the
child's own ``ru_maxrss`` (``os.wait4``), so the generator and the other runs do not count.

Page cache: nothing is dropped (that needs root and would disturb other jobs). The source was just
written or read, so both the split and ``cp`` read it warm from the page cache and write the same number
of bytes; the comparison is fair, but neither figure is a cold-disk figure.

Usage::

    .venv/bin/python scripts/bench_split.py --work-dir bench/split [--num-parts 6] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from genie_build.encodings import Encodings
from genie_build.onnx_graph import load_graph
from genie_build.plan.boundaries import find_boundaries
from genie_build.plan.plan import by_encodings, weighed_pieces
from genie_build.plan.plan_file import write_plan
from genie_build.plan.planners import plan_by_num_parts
from genie_build.plan.weight_inventory import weights_from_graph
from genie_build.units import MIB

# 24 layers, hidden 2048, vocab 32000: about 2.7 GB of fp32 weights per graph (prompt and token).
DEMO_SIZE = {"layers": 24, "hidden": 2048, "heads": 16, "kv_heads": 4, "intermediate": 2048,
             "vocab": 32000, "context": 256, "ar": 32}


@dataclass(frozen=True)
class Run:
    seconds: float
    peak_rss_bytes: int


def measure(command: list[str]) -> Run:
    """Run a command; its wall time and its own peak RSS (not its parent's, not earlier children's).

    Raises:
        SystemExit: the command failed.
    """
    start = time.perf_counter()
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, so Popen must not wait again
    if process.returncode:
        raise SystemExit(f"{' '.join(command)} failed with exit code {process.returncode}")
    return Run(seconds, usage.ru_maxrss * 1024)  # Linux reports kilobytes


def genie_build(*args: str) -> list[str]:
    return [sys.executable, "-m", "genie_build", *args]


def ensure_model(model_dir: Path, size: dict[str, int]) -> None:
    if (model_dir / "token.onnx").exists():
        print(f"reusing the model in {model_dir}")
        return
    options = [item for key, value in size.items() for item in (f"--{key.replace('_', '-')}", str(value))]
    run = measure(genie_build("generate-demo", "--out-dir", str(model_dir), *options))
    print(f"generated the model in {run.seconds:.1f} s, peak RSS {run.peak_rss_bytes / MIB:.0f} MB")


def write_bench_plan(model_dir: Path, plan_path: Path, num_parts: int) -> None:
    """Plan by fp32 bytes (no encodings): the split does not depend on how the sizes were estimated."""
    prompt = model_dir / "prompt.onnx"
    model = load_graph(prompt)
    weights = weights_from_graph(model, find_boundaries(model, prompt))
    plan = plan_by_num_parts(weighed_pieces(weights, by_encodings(Encodings())), num_parts)
    write_plan(plan_path, plan)


def source_bytes(model_dir: Path) -> int:
    return sum((model_dir / f"{kind}{ext}").stat().st_size for kind in ("prompt", "token")
               for ext in (".onnx", ".onnx.data"))


def benchmark(model_dir: Path, plan_path: Path, work: Path, repeat: int) -> tuple[list[Run], list[Run]]:
    """Alternate cp and split so that page-cache and writeback state affect both alike."""
    splits, copies = [], []
    copy_dir, parts_dir = work / "cp", work / "parts"
    for _ in range(repeat):
        shutil.rmtree(copy_dir, ignore_errors=True)
        copies.append(measure(["cp", "-r", str(model_dir), str(copy_dir)]))
        shutil.rmtree(copy_dir)
        shutil.rmtree(parts_dir, ignore_errors=True)  # so the timed split does not also delete old parts
        splits.append(measure(genie_build("split", "--plan", str(plan_path), "--graph",
                                          *(f"{kind}={model_dir / f'{kind}.onnx'}" for kind in ("prompt", "token")),
                                          "--parts-dir", str(parts_dir))))   # both graphs, as cp copies both
    return splits, copies


def table(model_bytes: int, num_parts: int, splits: list[Run], copies: list[Run]) -> str:
    split_s = statistics.median(run.seconds for run in splits)
    cp_s = statistics.median(run.seconds for run in copies)
    rss = max(run.peak_rss_bytes for run in splits)
    rows = [("model bytes (prompt + token)", f"{model_bytes:,} ({model_bytes / 1e9:.2f} GB)"),
            ("parts per graph", str(num_parts)),
            (f"split s (median of {len(splits)})", f"{split_s:.1f}"),
            (f"cp -r s (median of {len(copies)})", f"{cp_s:.1f}"),
            ("split / cp", f"{split_s / cp_s:.2f}"),
            ("split peak RSS MB", f"{rss / MIB:.0f}"),
            ("peak RSS / model size", f"{rss / model_bytes:.3f}")]
    return "\n".join(["| measure | value |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default="bench/split", help="model, plan and outputs (default bench/split)")
    parser.add_argument("--num-parts", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each command (default 2)")
    parser.add_argument("--keep", action="store_true", help="keep the model and parts afterwards")
    for key, value in DEMO_SIZE.items():
        parser.add_argument(f"--{key.replace('_', '-')}", dest=key, type=int, default=value)
    args = parser.parse_args(argv)
    work = Path(args.work_dir)
    model_dir = work / "model"
    ensure_model(model_dir, {key: getattr(args, key) for key in DEMO_SIZE})
    write_bench_plan(model_dir, work / "plan.json", args.num_parts)
    splits, copies = benchmark(model_dir, work / "plan.json", work, args.repeat)
    print(table(source_bytes(model_dir), args.num_parts, splits, copies))
    print("runs, s: split", [round(run.seconds, 1) for run in splits], "cp", [round(run.seconds, 1) for run in copies])
    print("page cache: warm for both (source just written or read; nothing dropped)")
    if not args.keep:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
