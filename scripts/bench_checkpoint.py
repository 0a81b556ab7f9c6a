"""A Hugging Face checkpoint of Qwen2.5-7B's shape (random bfloat16 weights) to a Genie bundle and its A/B size table
on this machine, every job measured (docs/large-models.md, "A 7B checkpoint").

1. The checkpoint is written shard by shard (the embedding; two decoder layers each; the final norm and the LM
   head), each tensor drawn in float32 chunks into its bfloat16 array, so the writer holds one shard at a time:
   Qwen2.5-7B's shape (28 layers, hidden 3584, intermediate 18944, 28 heads / 4 KV heads, vocab 152,064,
   untied) is 15.2 GB in 16 shards. Its ``config.json`` is ``config/hf/qwen2_5_7b_instruct.json`` with the
   stand-in tokenizer's special ids.
2. The workflow is copied into ``--work-dir`` and run there on it (``model.hf_checkpoint``, the default split,
   recipe and calibration, no host run; targets ``all`` and ``evaluate``), with ``--cores`` and
   ``--resources mem_mb`` of 90% of this machine's memory. As in ``scripts/bench_large.py``, every job records the
   exact peak RSS of its ``genie_build`` process (a ``sitecustomize`` hook), beside Snakemake's sampled
   ``max_rss``; the disk the run uses is sampled every second.
3. For comparison, the whole-model path the per-part path replaces (``export_checkpoint`` then ``calibrate_prompt``
   of the whole prompt graph, still in the package as the tests' reference) runs on a smaller Qwen2 checkpoint in
   the same run; its peak RSS over the checkpoint's float32 bytes, times this checkpoint's, is what it would need
   here.

Usage::

    .venv-test/bin/python scripts/bench_checkpoint.py --work-dir bench/7b [--cores 2] [--report bench/7b.json]
    # several context lengths and the embedding as a CPU table
    .venv-test/bin/python scripts/bench_checkpoint.py --work-dir bench/7b-lengths --context 512 1024 2048 4096 \\
        --embedding lut --no-evaluate --no-whole-path
    .venv-test/bin/python scripts/bench_checkpoint.py --generate DIR [--shape '{"layers": 2}']   # the checkpoint

Needs the Hugging Face extra (envs/requirements-hf.txt) and about 70 GB of disk for the 7B shape.
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
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))
from bench_large import RSS_HOOK, add_missing_benchmarks, finish, subcommand  # noqa: E402
from workflow_helpers import copy_workflow  # noqa: E402

GB = 1e9
QWEN_7B = {"layers": 28, "hidden": 3584, "intermediate": 18944, "heads": 28, "kv_heads": 4, "vocab": 152064}
QWEN_7B_CONFIG = REPO / "config" / "hf" / "qwen2_5_7b_instruct.json"
# The whole-model path measured on: Qwen2 float32, 7 layers, hidden 2048 (2.23 GB), AR 128, CL 2048, 4 windows.
WHOLE_PATH_SHAPE = {"layers": 7, "hidden": 2048, "intermediate": 8192, "heads": 16, "kv_heads": 4, "vocab": 32000}
CHUNK = 1 << 24          # float32 values drawn at a time
TARGET_PEAK = 12 * GB
RULE_COMMANDS = {"plan_hf": "plan-hf", "export_part": "export-part", "export_length": "export-length",
                 "calibrate_unit": "calibrate-unit", "embedding_table": "embedding-table",
                 "part_encodings": "part-encodings", "check_contract": "check-contract", "verify_parts": "verify-parts",
                 "check_plan": "check-plan", "convert_part": "convert", "convert_dlc": "convert-dlc",
                 "compile_part": "compile",
                 "account": "account", "size_table": "size-table", "memory_plan": "memory-plan",
                 "bundle": "bundle", "check_bundle": "check-bundle", "estimate_sizes": "estimate",
                 "evaluate_float": "evaluate-float", "evaluate_variant": "evaluate",
                 "evaluation_table": "evaluation-table"}
STAGES = {"export": ("export_part",), "export of the other lengths": ("export_length",),
          "calibration": ("calibrate_unit", "part_encodings"),
          "convert": ("convert_part", "convert_dlc"), "compile": ("compile_part",), "verification": ("verify_parts",),
          "evaluation": ("evaluate_float", "evaluate_variant", "evaluation_table"),
          "checks and tables": ("plan_hf", "check_contract", "check_plan", "account", "size_table",
                                "memory_plan", "embedding_table", "bundle", "check_bundle")}


# ------------------------------------------------------------------------------------------- the checkpoint

def _with_variants(config_path: Path, variants: dict) -> str:
    """The default config with only ``variants`` (a config file replaces no mapping of the default: it merges)."""
    config = yaml.safe_load(config_path.read_text())
    config["variants"] = variants
    return yaml.safe_dump(config, sort_keys=False)


def tensor_shapes(shape: dict, layers: range) -> dict[str, tuple[int, ...]]:
    """Qwen2's tensors of ``layers`` ([out, in] Linear weights, q/k/v biases), as ``save_pretrained`` names them."""
    hidden, inter, head_dim = shape["hidden"], shape["intermediate"], shape["hidden"] // shape["heads"]
    kv = shape["kv_heads"] * head_dim
    tensors = {}
    for i in layers:
        prefix = f"model.layers.{i}"
        tensors.update({f"{prefix}.input_layernorm.weight": (hidden,),
                        f"{prefix}.post_attention_layernorm.weight": (hidden,),
                        f"{prefix}.self_attn.q_proj.weight": (hidden, hidden),
                        f"{prefix}.self_attn.q_proj.bias": (hidden,),
                        f"{prefix}.self_attn.k_proj.weight": (kv, hidden), f"{prefix}.self_attn.k_proj.bias": (kv,),
                        f"{prefix}.self_attn.v_proj.weight": (kv, hidden), f"{prefix}.self_attn.v_proj.bias": (kv,),
                        f"{prefix}.self_attn.o_proj.weight": (hidden, hidden),
                        f"{prefix}.mlp.gate_proj.weight": (inter, hidden),
                        f"{prefix}.mlp.up_proj.weight": (inter, hidden),
                        f"{prefix}.mlp.down_proj.weight": (hidden, inter)})
    return tensors


def random_tensor(name: str, dims: tuple[int, ...], rng: np.random.Generator, dtype: np.dtype) -> np.ndarray:
    """Norm weights around 1, biases and weights around 0 (std 0.02, the models' init), drawn in chunks."""
    out = np.empty(int(np.prod(dims)), dtype)
    mean, std = (1.0, 0.1) if "norm" in name else (0.0, 0.02)
    for start in range(0, out.size, CHUNK):
        chunk = rng.standard_normal(min(CHUNK, out.size - start), dtype=np.float32)
        out[start:start + chunk.size] = chunk * np.float32(std) + np.float32(mean)
    return out.reshape(dims)


def write_checkpoint(out: Path, shape: dict, *, dtype: str = "bfloat16", seed: int = 0) -> int:
    """Write a random Qwen2 checkpoint of ``shape`` shard by shard; return its weights' bytes."""
    import ml_dtypes
    from safetensors.numpy import save_file

    from genie_build.demo.train_tokenizer import build_tokenizer
    from genie_build.fileio import write_json, write_text

    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shards = [{"model.embed_tokens.weight": (shape["vocab"], shape["hidden"])},
              *(tensor_shapes(shape, range(i, min(i + 2, shape["layers"]))) for i in range(0, shape["layers"], 2)),
              {"model.norm.weight": (shape["hidden"],), "lm_head.weight": (shape["vocab"], shape["hidden"])}]
    weight_map, total = {}, 0
    for index, tensors in enumerate(shards, start=1):
        name = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        arrays = {tensor: random_tensor(tensor, dims, rng, np_dtype) for tensor, dims in tensors.items()}
        save_file(arrays, str(out / name), metadata={"format": "pt"})
        total += sum(array.nbytes for array in arrays.values())
        weight_map.update(dict.fromkeys(arrays, name))
        del arrays
        print(f"wrote {name} ({index} of {len(shards)})", flush=True)
    write_json(out / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    tokenizer = build_tokenizer(REPO / "resources" / "tokenizer_corpus.txt", shape["vocab"])
    write_text(out / "tokenizer.json", tokenizer.to_str())
    config = json.loads(QWEN_7B_CONFIG.read_text())
    config.update({"num_hidden_layers": shape["layers"], "hidden_size": shape["hidden"],
                   "intermediate_size": shape["intermediate"], "num_attention_heads": shape["heads"],
                   "num_key_value_heads": shape["kv_heads"], "vocab_size": shape["vocab"],
                   "tie_word_embeddings": False, "torch_dtype": dtype, "bos_token_id": 1, "eos_token_id": 2})
    config.pop("max_window_layers", None)
    write_json(out / "config.json", config)
    return total


# ------------------------------------------------------------------------------------------- measuring

def run_measured(command: list[str], **kwargs) -> tuple[float, int, int]:
    """Run ``command``; its wall seconds, exit code and peak RSS (bytes, of the process and its children)."""
    start = time.perf_counter()
    process = subprocess.Popen(command, **kwargs)
    _, status, usage = os.wait4(process.pid, 0)
    return time.perf_counter() - start, os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024


class DiskSampler(threading.Thread):
    """The most disk the file system holding ``path`` had in use beyond its use at the start, sampled each second."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.start_used, self.peak, self.done = path, self._used(path), 0, threading.Event()

    @staticmethod
    def _used(path: Path) -> int:
        usage = shutil.disk_usage(path)
        return usage.total - usage.free

    def run(self) -> None:
        while not self.done.wait(1.0):
            self.peak = max(self.peak, self._used(self.path) - self.start_used)


@dataclass(frozen=True)
class Job:
    rule: str
    wildcards: str
    seconds: float
    sampled_rss: int        # bytes, Snakemake's benchmark max_rss
    peak_rss: int | None    # bytes, the process's own ru_maxrss


def collect_jobs(out: Path, rss_log: Path) -> list[Job]:
    """Every job of the run: its benchmark file and the exact peak RSS of its genie_build command."""
    records = [json.loads(line) for line in rss_log.read_text().splitlines()] if rss_log.exists() else []
    jobs = []
    for tsv in sorted((out / "benchmarks").rglob("*.tsv")):
        parts = tsv.relative_to(out / "benchmarks").with_suffix("").parts
        rule, wildcards = parts[0], "/".join(parts[1:])
        with open(tsv, newline="") as handle:
            row = next(csv.DictReader(handle, delimiter="\t"))
        # the job's command: its outputs' paths name its wildcards as its benchmark's path does (after a '/': the
        # packed variant's paths are not the unpacked one's; before a '.': prompt's are not prompt_cl512's)
        command, key = RULE_COMMANDS.get(rule), "/".join(parts[1:])
        matching = [r for r in records if subcommand(r["argv"]) == command
                    and (not key or any(re.search(rf"/{re.escape(key)}(?:[./]|$)", value)
                                        for option, value in zip(r["argv"], r["argv"][1:])
                                        if option.startswith("--out")))]
        peak = max((r["peak_rss_kib"] * 1024 for r in matching), default=None)
        jobs.append(Job(rule, wildcards, float(row["s"]), int(float(row["max_rss"]) * 2**20), peak))
    return jobs


def whole_path_ratios(work: Path, python: str) -> dict[str, float]:
    """Peak RSS of the whole-model export and calibration over the float32 bytes of the checkpoint they read,
    measured on a smaller checkpoint (:data:`WHOLE_PATH_SHAPE`, float32)."""
    checkpoint = work / "whole-path-checkpoint"
    fp32 = write_checkpoint(checkpoint, WHOLE_PATH_SHAPE, dtype="float32")
    export = work / "whole-path-export"
    steps = {
        "export": ("from genie_build.export.export import export_checkpoint; "
                   f"export_checkpoint({str(checkpoint)!r}, {str(export)!r}, ar=128, context=2048)"),
        "calibration": ("from pathlib import Path; from genie_build.quantize import calibrate_unit as q; "
                        "from genie_build.quantize import calibration_feeds as f; "
                        "from genie_build.plan.recipes import RECIPES; "
                        f"p = Path({str(export / 'prompt.onnx')!r}); c = Path({str(checkpoint / 'config.json')!r}); "
                        "from genie_build.tokens import text_token_ids; "
                        "s = f.feed_shape(q.load_graph(p), p, c); "
                        f"ids = text_token_ids({str(REPO / 'resources' / 'calibration_corpus.txt')!r}, "
                        f"{str(checkpoint / 'tokenizer.json')!r}); "
                        "q.calibrate_prompt(p, RECIPES['w4a16'], f.text_forward_pass(s, ids, 4))"),
    }
    ratios = {}
    for stage, code in steps.items():
        seconds, status, peak = run_measured([python, "-c", code], stdout=subprocess.DEVNULL)
        if status != 0:
            raise SystemExit(f"the whole-model {stage} failed ({status})")
        ratios[stage] = peak / fp32
        print(f"whole-model {stage} of a {fp32 / GB:.2f} GB float32 checkpoint: {seconds:.0f} s, peak "
              f"{peak / GB:.2f} GB ({ratios[stage]:.2f}x)", flush=True)
    shutil.rmtree(checkpoint)
    shutil.rmtree(export)
    return ratios


def markdown(jobs: list[Job]) -> str:
    lines = ["| job | wall s | peak RSS GB | sampled max_rss GB |", "|---|---:|---:|---:|"]
    for job in jobs:
        peak = "n/a" if job.peak_rss is None else f"{job.peak_rss / GB:.2f}"
        lines.append(f"| {job.rule} {job.wildcards} | {job.seconds:,.1f} | {peak} | {job.sampled_rss / GB:.2f} |")
    return "\n".join(lines)


def stage_totals(jobs: list[Job]) -> dict[str, dict[str, float]]:
    totals = {}
    for stage, rules in STAGES.items():
        mine = [job for job in jobs if job.rule in rules]
        totals[stage] = {"jobs": len(mine), "seconds": sum(job.seconds for job in mine),
                         "peak_rss_gb": max(((job.peak_rss or job.sampled_rss) / GB for job in mine), default=0.0)}
    return totals


# ------------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, help="created; holds the checkpoint, the workflow and its results")
    parser.add_argument("--generate", type=Path, metavar="DIR", help="only write the checkpoint to DIR")
    parser.add_argument("--shape", type=json.loads, default={},
                        help="dims to change from Qwen2.5-7B's, as JSON (layers, hidden, intermediate, heads, "
                             "kv_heads, vocab)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--num-parts", type=int, default=6)
    parser.add_argument("--num-samples", type=int,
                        help="calibration windows (default: the workflow's, the windows that hold 2,048 tokens)")
    parser.add_argument("--context", type=int, nargs="+", default=[4096],
                        help="export.context: one length or several, e.g. 512 1024 2048 4096 (default %(default)s)")
    parser.add_argument("--embedding", choices=("graph", "lut"), default="graph", help="bundle.embedding")
    parser.add_argument("--no-evaluate", action="store_true", help="build the bundle only, not the 'evaluate' target")
    parser.add_argument("--dlc", action="store_true",
                        help="convert.dlc: also write every qnn-htp graph's DLC (about 1.1 bytes a weight a graph: "
                             "some 60 GB at 7B with four lengths)")
    parser.add_argument("--variants", nargs="+", default=["reference", "qnn-htp"],
                        help="the default config's variants to build (default %(default)s; the bundle's is qnn-htp)")
    parser.add_argument("--no-whole-path", action="store_true",
                        help="skip the whole-model path's measurement (step 3)")
    parser.add_argument("--report", type=Path, help="write the figures as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    shape = {**QWEN_7B, **args.shape}
    if args.generate:
        print(f"{write_checkpoint(args.generate, shape) / GB:.2f} GB of weights")
        return 0
    if args.work_dir is None:
        parser.error("--work-dir or --generate is needed")
    work = args.work_dir.resolve()
    work.mkdir(parents=True)
    python = sys.executable
    report: dict = {"shape": shape, "cores": args.cores, "num_parts": args.num_parts, "num_samples": args.num_samples,
                    "context": args.context, "embedding": args.embedding, "evaluated": not args.no_evaluate,
                    "variants": args.variants}
    try:
        seconds, status, peak = run_measured([python, __file__, "--generate", str(work / "checkpoint"),
                                              "--shape", json.dumps(shape)])
        if status:
            raise SystemExit("writing the checkpoint failed")
        size = sum(p.stat().st_size for p in (work / "checkpoint").glob("*.safetensors"))
        report["checkpoint"] = {"seconds": seconds, "peak_rss_gb": peak / GB, "bytes": size}
        print(f"checkpoint: {size / GB:.2f} GB in {seconds:.0f} s, peak RSS {peak / GB:.2f} GB", flush=True)

        workflow, hooks, rss_log = work / "workflow", work / "hooks", work / "rss.jsonl"
        workflow.mkdir()
        copy_workflow(workflow)
        add_missing_benchmarks(workflow / "workflow" / "rules")
        hooks.mkdir()
        (hooks / "sitecustomize.py").write_text(RSS_HOOK)
        variants = yaml.safe_load((workflow / "config" / "config.yaml").read_text())["variants"]
        (workflow / "config" / "config.yaml").write_text(_with_variants(workflow / "config" / "config.yaml",
                                                                        {name: variants[name] for name in args.variants}))
        (workflow / "bench.yaml").write_text(json.dumps({
            "model": {"name": "qwen7b", "hf_checkpoint": str(work / "checkpoint")},
            "split": {"num_parts": args.num_parts},
            **({"quantize": {"num_samples": args.num_samples}} if args.num_samples else {}),
            "export": {"context": args.context}, "convert": {"keep": False, "dlc": args.dlc},
            "bundle": {"host_run": False, "embedding": args.embedding}}))
        total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        targets = ["all"] if args.no_evaluate else ["all", "evaluate"]
        command = [python, "-m", "snakemake", *targets, "--cores", str(args.cores), "--configfile",
                   "config/config.yaml",
                   "bench.yaml", "--resources", f"mem_mb={int(total_mb * 0.9)}"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hooks), str(workflow / "workflow")]),
               "GENIE_BENCH_RSS_LOG": str(rss_log)}
        disk = DiskSampler(work)
        disk.start()
        with open(workflow / "snakemake.log", "w") as log:
            seconds, status, _ = run_measured(command, cwd=workflow, env=env, stdout=log, stderr=subprocess.STDOUT)
        disk.done.set()
        disk.join()
        out = workflow / "results" / "qwen7b"
        if status != 0:   # what failed, kept in the report: the work folder is deleted unless --keep
            report["failures"] = failures(workflow / "snakemake.log", out / "logs")
            print("\n".join(report["failures"]))
        jobs = collect_jobs(out, rss_log)
        if not jobs:
            raise SystemExit(f"the workflow ran no job (status {status}): {workflow / 'snakemake.log'}")
        largest = max(jobs, key=lambda job: job.peak_rss or job.sampled_rss)
        report["workflow"] = {"seconds": seconds, "succeeded": status == 0, "disk_peak_gb": disk.peak / GB,
                              "disk_kept_gb": sum(p.stat().st_size for p in work.rglob("*") if p.is_file()) / GB,
                              "largest_job": asdict(largest), "stages": stage_totals(jobs),
                              "jobs": [asdict(job) for job in jobs]}
        print(f"\nworkflow: {seconds / 60:.1f} min, {'succeeded' if status == 0 else 'FAILED'}; disk used at most "
              f"{disk.peak / GB:.1f} GB; largest job {largest.rule} {largest.wildcards} "
              f"{(largest.peak_rss or largest.sampled_rss) / GB:.2f} GB (target: none above {TARGET_PEAK / GB:.0f})")
        for stage, figures in report["workflow"]["stages"].items():
            print(f"  {stage}: {figures['jobs']} jobs, {figures['seconds'] / 60:.1f} min of job time, "
                  f"peak {figures['peak_rss_gb']:.2f} GB")
        print(markdown(jobs))
        # what the run's figures rest on, kept in the report: the work folder is deleted unless --keep
        for key, name in (("size_table", "size_table.md"), ("memory_plan", "memory_plan.md"),
                          ("bundle_check", "bundle_check.json"), ("evaluation", "evaluation.md")):
            if (out / name).exists():
                report[key] = (out / name).read_text()
                print("\n" + report[key])
        if args.no_whole_path:
            return 0 if status == 0 else 1
        fp32 = 2 * size  # the bfloat16 checkpoint in float32, as both paths hold it
        ratios = whole_path_ratios(work, python)
        report["whole_model_path"] = {"ratios": ratios, "float32_bytes": fp32,
                                      "predicted_peak_gb": {k: r * fp32 / GB for k, r in ratios.items()}}
        print("whole-model path here: " + ", ".join(f"{k} {r * fp32 / GB:.0f} GB" for k, r in ratios.items()))
    finally:
        finish(report, args.report, work, args.keep)
    return 0 if report.get("workflow", {}).get("succeeded") else 1


def failures(snakemake_log: Path, logs: Path) -> list[str]:
    """The failed jobs (Snakemake's "Error in rule" lines) and the last lines of every job log that says why."""
    found = [line.strip() for line in snakemake_log.read_text(errors="replace").splitlines()
             if line.startswith("Error in rule")]
    for path in sorted(logs.rglob("*.log")):
        lines = path.read_text(errors="replace").splitlines()
        if any(marker in line for line in lines for marker in ("error", "Traceback", "Killed", "MemoryError")):
            found += [f"{path.relative_to(logs)}:", *(f"    {line}" for line in lines[-15:])]
    return found


if __name__ == "__main__":
    sys.exit(main())
