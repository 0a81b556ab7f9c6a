"""The workflow with model.hf_checkpoint, from a random-weight Hugging Face checkpoint to a checked Genie bundle.

For Qwen2, Llama (llama3 RoPE scaling) and Qwen3 checkpoints written by transformers itself: export_hf_graphs and
quantize_encodings (aimet-onnx) run as stages; the bundle passes check-bundle and the host run's tokens equal the
unsplit model's. On the Qwen2 build: a second run has nothing to do; a new recipe or calibration text reruns the
quantize stage and not the export; a changed safetensors byte re-exports; a checkpoint without weights is a config
error at parse time.
"""

from __future__ import annotations

import os
import re

import pytest

from workflow_helpers import copy_workflow, load_json, output_mtimes, run_snakemake, write_config

pytest.importorskip("torch", reason="the export needs torch: pip install --no-deps -r envs/requirements-hf.txt")
pytest.importorskip("transformers")
pytest.importorskip("onnxscript")
if os.environ.get("GENIE_BUILD_REQUIRE_AIMET") == "1":
    import aimet_onnx  # noqa: F401  -- CI installs it: a missing one fails
else:
    pytest.importorskip("aimet_onnx", reason="the quantize stage needs aimet-onnx (envs/requirements-hf.txt)")

import hf_checkpoints  # noqa: E402  (needs torch)

pytestmark = [pytest.mark.workflow, pytest.mark.hf]
AR, CONTEXT = 8, 64   # the host run: a 24-token prompt + 16 new tokens
MODEL = "hf"
OUT = f"results/{MODEL}"
EXPORTS = [f"{OUT}/source/{name}" for name in ("prompt.onnx", "prompt.onnx.data", "token.onnx", "token.onnx.data")]
ENCODINGS = [f"{OUT}/source/{graph}.encodings.json" for graph in ("prompt", "token")]


def _config(workdir, name="test-config.yaml", **quantize):
    return write_config(workdir, {"model": {"name": MODEL, "hf_checkpoint": "checkpoint"},
                                  "export": {"ar": AR, "context": CONTEXT}, "split": {"num_parts": 2},
                                  "quantize": {"recipe": "w4a16", "num_samples": 4, **quantize}}, name=name)


def _log(result) -> str:
    return result.stdout + result.stderr


def _planned(workdir, config) -> set[str]:
    """The rules a dry run would run."""
    result = run_snakemake(workdir, "-n", config_file=config)
    return set(re.findall(r"^(?:local)?rule (\w+):", _log(result), re.MULTILINE))


_BUILDS: dict[str, tuple] = {}


def _build(family, tmp_path_factory):
    """A workdir whose default targets were built from a random ``family`` checkpoint (tied, sharded); one per
    family and test session."""
    if family not in _BUILDS:
        root = copy_workflow(tmp_path_factory.mktemp(family))
        hf_checkpoints.make_checkpoint(root / "checkpoint", family, tied=True, max_shard_size="100KB")
        config = _config(root)
        ran = set(re.findall(r"^(?:local)?rule (\w+):", _log(run_snakemake(root, "-p", config_file=config)),
                             re.MULTILINE))
        assert {"export_hf_graphs", "quantize_encodings"} <= ran
        _BUILDS[family] = family, root, config
    return _BUILDS[family]


@pytest.fixture(scope="module", params=hf_checkpoints.FAMILIES)
def built(request, tmp_path_factory):
    return _build(request.param, tmp_path_factory)


def test_the_checkpoint_becomes_a_bundle_that_passes_check_bundle_and_runs_as_the_unsplit_model(built):
    family, workdir, _ = built
    check = load_json(workdir / f"{OUT}/contract_check.json")
    assert check["violations"] == [] and check["graphs"] == {"prompt": {"ar": AR, "cl": CONTEXT},
                                                             "token": {"ar": 1, "cl": CONTEXT}}
    assert load_json(workdir / f"{OUT}/bundle_check.json")["errors"] == 0
    host_run = load_json(workdir / f"{OUT}/host_run.json")
    assert len(host_run["new_ids"]) > 0 and host_run["new_ids"] == host_run["unsplit_ids"], family
    genie = load_json(workdir / f"{OUT}/genie_bundle/genie_config.json")
    rope = genie["dialog"]["engine"]["model"]["positional-encoding"]
    assert ("rope-scaling" in rope) == (family == "llama")
    for stage in ("export_hf_graphs", "quantize_encodings"):
        assert (workdir / f"{OUT}/benchmarks/{stage}.tsv").is_file()


def test_only_what_changed_reruns(tmp_path_factory):
    """On the Qwen2 build (the rules are the same for every family); it runs after the bundle checks above."""
    _, workdir, config = _build("qwen2", tmp_path_factory)
    before = output_mtimes(workdir, MODEL)
    assert "Nothing to be done" in _log(run_snakemake(workdir, config_file=config))
    assert output_mtimes(workdir, MODEL) == before

    new_recipe = _planned(workdir, _config(workdir, "w8.yaml", recipe="w8a16"))
    assert "quantize_encodings" in new_recipe and "export_hf_graphs" not in new_recipe
    corpus = workdir / "resources" / "calibration_corpus.txt"
    corpus.write_text("And it came to pass, when men began to multiply on the face of the earth.\n"
                      + corpus.read_text(encoding="utf-8"), encoding="utf-8")
    new_text = _planned(workdir, config)
    assert "quantize_encodings" in new_text and "export_hf_graphs" not in new_text
    run_snakemake(workdir, "-p", *ENCODINGS, config_file=config)
    after = output_mtimes(workdir, MODEL)
    assert all(after[path.removeprefix(f"{OUT}/")] == before[path.removeprefix(f"{OUT}/")] for path in EXPORTS)
    assert all(after[path.removeprefix(f"{OUT}/")] != before[path.removeprefix(f"{OUT}/")] for path in ENCODINGS)

    shard = sorted((workdir / "checkpoint").glob("model-*.safetensors"))[-1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01  # the last weight's last byte: the file stays a valid safetensors file
    shard.write_bytes(bytes(data))
    rerun = run_snakemake(workdir, "-p", *EXPORTS, config_file=config)
    assert "export_hf_graphs" in _log(rerun)
    exported = output_mtimes(workdir, MODEL)
    assert all(exported[f"source/{name}"] != after[f"source/{name}"] for name in ("prompt.onnx.data", "token.onnx.data"))
    assert {"quantize_encodings"} <= _planned(workdir, config)


def test_a_checkpoint_without_weights_is_a_config_error(tmp_path):
    workdir = copy_workflow(tmp_path)
    hf_checkpoints.make_checkpoint(workdir / "checkpoint", "qwen2")
    for shard in (workdir / "checkpoint").glob("*.safetensors"):
        shard.unlink()
    result = run_snakemake(workdir, "-n", config_file=_config(workdir), check=False)
    assert result.returncode != 0
    assert "config model.hf_checkpoint:" in _log(result)
