"""Run the workflow in a scratch copy of the repository, as a user would (``snakemake`` CLI, workflow profile)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKFLOW_FILES = ("Snakefile", "workflow", "profiles", "config", "resources")
# A write_config file as the whole config (snakemake_command puts them last).
CONFIG_OPTIONS = ("--replace-workflow-config", "--configfile")

# A demo small enough for CI: the same code path as the default, a fraction of the time.
SMALL_DEMO = {
    "demo": {"layers": 4, "hidden": 64, "heads": 2, "kv_heads": 1, "intermediate": 128,
             "vocab": 512, "context": 64, "ar": 8, "seed": 0, "weight_dtype": "float32"},
    "split": {"num_parts": 3},
}
# The variants a test config builds unless it names its own: the default config's oracle and A/B baseline
# (reference) and its bundle variant (qnn-htp). The default's other qnn-htp variants differ from qnn-htp only in
# compile options (tests/test_qnn_htp.py compiles them), and tests/test_trained_demo.py builds the default as it is.
TEST_VARIANTS = ("reference", "qnn-htp")
# The reference toolchain alone, for what only it does (its container read back, the host run against the unsplit
# model, the evaluation): the variants unpacked and packed, the packed bundle with the embedding in the graph.
REFERENCE_BUILD = {
    "variants": {name: {"toolchain": "reference", "weights_packing": packing, "optimization_type": 3,
                        "weight_sharing_enabled": True} for name, packing in (("unpacked", False), ("packed", True))},
    "bundle": {"variant": "packed", "embedding": "graph"},
    "report": {"baseline_variant": "unpacked"},
}


def copy_workflow(dest: Path) -> Path:
    """Copy the workflow (not results/ or .snakemake/) into ``dest`` and return it."""
    for name in WORKFLOW_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def write_config(workdir: Path, overrides: dict, name: str = "test-config.yaml") -> Path:
    """A whole config file: the default config with its variants narrowed to TEST_VARIANTS, and ``overrides`` merged
    in one level deep, but for ``variants``, which replace the default's (a test names every variant it builds).
    run_snakemake(config_file=...) runs it in place of config/config.yaml (Snakemake would merge the two)."""
    import yaml

    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    config["variants"] = {name: config["variants"][name] for name in TEST_VARIANTS}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict) and key != "variants":
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    path = workdir / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def snakemake_command(workdir: Path, *args: str, config_file: Path | None = None,
                      cores: int | None = 2) -> tuple[list[str], dict[str, str]]:
    """The one way the tests run Snakemake: ``python -m snakemake --cores 2 [args]`` (no ``--cores`` with
    ``cores=None``, for an executor that sets its own jobs), with ``config_file`` (write_config's) as the whole config
    (last: --configfile takes every word up to the next option), and its environment: Snakemake's cache in
    ``workdir``. Returns (command, environment)."""
    command = [sys.executable, "-m", "snakemake", *(["--cores", str(cores)] if cores else []), *args]
    if config_file is not None:
        command += [*CONFIG_OPTIONS, str(config_file)]
    return command, {**os.environ, "XDG_CACHE_HOME": str(workdir / ".cache")}


def run_snakemake(workdir: Path, *args: str, config_file: Path | None = None, check: bool = True,
                  cores: int | None = 2, timeout: float | None = None) -> subprocess.CompletedProcess:
    """:func:`snakemake_command` run in ``workdir`` to its end (killed after ``timeout`` seconds); output (Snakemake
    logs to stdout) returned; with ``check``, a failed run is an AssertionError holding the end of its log."""
    command, env = snakemake_command(workdir, *args, config_file=config_file, cores=cores)
    result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({result.returncode}):\n"
                             f"{result.stdout[-6000:]}\n{result.stderr[-3000:]}")
    return result


def without_qnn_wheel(folder: Path) -> dict[str, str]:
    """An environment whose interpreters cannot import the onnxruntime-qnn wheel (a module finder in ``folder``'s
    sitecustomize.py refuses it), as on a machine without it."""
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import sys\nclass _Hide:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'onnxruntime_qnn':\n            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, _Hide())\n")
    return {**os.environ, "PYTHONPATH": f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def output_mtimes(workdir: Path, model: str = "demo") -> dict[str, int]:
    """mtime_ns of every file under results/<model>/ except logs and benchmarks (rewritten by every job)."""
    root = workdir / "results" / model
    return {
        str(path.relative_to(root)): path.stat().st_mtime_ns
        for path in root.rglob("*")
        if path.is_file() and path.parts[len(root.parts)] not in ("logs", "benchmarks")
        and path.name != ".snakemake_times.txt"
    }


def changed_since(before: dict[str, int], after: dict[str, int]) -> set[str]:
    return {path for path, mtime in after.items() if before.get(path) != mtime}


def jobs_run(result: subprocess.CompletedProcess) -> list[tuple[str, str]]:
    """(rule, wildcards) of every job a run printed (``snakemake -p``), checkpoints' too."""
    jobs = re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):\n((?:    .*\n)*)", result.stdout + result.stderr, re.MULTILINE)
    return [(rule, (re.search(r"^    wildcards: (.*)$", body, re.MULTILINE) or [None, ""])[1]) for rule, body in jobs]


def load_json(path: Path):
    return json.loads(Path(path).read_text())


def scale_encoding(encodings_path: Path, tensor: str, factor: float, section: str = "param_encodings") -> None:
    """Multiply one tensor's encoding scale by ``factor`` in an AIMET 1.0.0 file (the demo's form), in place.

    ``section`` is ``param_encodings`` or ``activation_encodings``.
    """
    encodings = json.loads(Path(encodings_path).read_text())
    entry = next((e for e in encodings[section] if e["name"] == tensor), None)
    if entry is None:
        raise ValueError(f"{encodings_path}: no {section} entry {tensor!r}")
    entry["scale"] = [scale * factor for scale in entry["scale"]]
    Path(encodings_path).write_text(json.dumps(encodings))


def stated_axes_encodings(encodings, axis_of) -> dict:
    """``encodings`` (:class:`genie_build.encodings.Encodings`) as an AIMET 2.0.0 file, which states each per-channel
    weight's axis: ``axis_of(name)``."""
    def entry(encoding) -> dict:
        if encoding.dtype == "float":
            return {"name": encoding.name, "output_dtype": f"float{encoding.bitwidth}"}
        signed = encoding.is_symmetric
        assert not signed or set(encoding.offset) == {-2 ** (encoding.bitwidth - 1)}, encoding
        fields = {"name": encoding.name, "output_dtype": f"{'' if signed else 'u'}int{encoding.bitwidth}"}
        if encoding.kind == "per_tensor":
            return {**fields, "y_scale": encoding.scale[0], **({} if signed else {"y_zero_point": -encoding.offset[0]})}
        assert encoding.kind == "per_channel", encoding
        return {**fields, "y_scale": list(encoding.scale), "axis": axis_of(encoding.name),
                **({} if signed else {"y_zero_point": [-offset for offset in encoding.offset]})}

    return {"version": "2.0.0", "encodings": [entry(encoding) for encoding in (*encodings.activations.values(),
                                                                               *encodings.params.values())]}


def read_back_qnn_bundle(out: Path, encodings: str) -> dict[str, list[str]]:
    """The ctx-bins of the qnn-htp bundle under ``out`` (results/<model>), read back by the vendor's libQnnSystem:
    each name -> its graphs' names, once each is checked to be compiled for SM8750 (soc_model 69, v79) by QNN 2.51
    with every IO tensor of every graph at its part's encoding (``encodings/<encodings>/part_*/<kind>``; the table's
    part 2 takes inputs_embeds at part 1's output encoding), float where they give none, and each graph fed its
    mask, RoPE and KV cache."""
    import pytest

    from genie_build.encodings import read_encodings
    from genie_build.qnn_wheel.system import read_context_binary

    parts = load_json(out / "plan.json")["parts"]
    renamed = {"inputs_embeds": parts[0]["output_boundary"]}
    bundle = out / "genie_bundle"
    read = {}
    for name in load_json(bundle / "genie_config.json")["dialog"]["engine"]["model"]["binary"]["ctx-bins"]:
        binary = read_context_binary(bundle / name)
        assert (binary.soc_model, binary.dsp_arch, binary.build_id[:7]) == (69, "v79", "v2.51.0"), name
        label = name.rsplit("_part_", 1)[1].removesuffix(".bin")
        for graph in binary.graphs:
            kind = graph.info.name.split("_")[0]
            activations = read_encodings(out / "encodings" / encodings / f"part_{label}" /
                                         f"{kind}.encodings.json").activations
            tensors = (*graph.info.inputs, *graph.info.outputs)
            names = {tensor.name for tensor in tensors}
            assert {"attention_mask", "position_ids_cos"} <= names and any(
                name.startswith("past_key_") for name in names), (graph.info.name, names)
            for tensor in tensors:
                enc = activations.get(renamed.get(tensor.name, tensor.name))
                if enc is None:   # no encoding: float, as the encodings say
                    assert tensor.quant is None and tensor.dtype.startswith("float"), tensor
                    continue
                assert (tensor.quant.bitwidth, tensor.quant.offset) == (enc.bitwidth, enc.offset[0]), tensor.name
                assert tensor.quant.scale == pytest.approx(enc.scale[0], rel=1e-6), tensor.name
        read[name] = sorted(graph.info.name for graph in binary.graphs)
    return read


def assert_host_run_agrees(host_run: dict) -> None:
    """The bundle's tokens are the reference's, but for the steps host_run.json lists as near ties (a QNN bundle's
    twins against the QDQ graphs on the CPU: docs/host-run.md)."""
    differ = [step for step, (ours, theirs) in enumerate(zip(host_run["new_ids"], host_run["reference_ids"]))
              if ours != theirs]
    assert len(host_run["new_ids"]) == len(host_run["reference_ids"]), host_run
    assert differ == [tie["step"] for tie in host_run.get("near_ties", [])], host_run
