"""The workflow with model.hf_checkpoint: the export rule's graphs pass Genie's contract and the shared-weights
check, a second run has nothing to do, a changed safetensors byte re-exports, a checkpoint without weights is a config error at parse time."""

from __future__ import annotations

import pytest

from workflow_helpers import copy_workflow, load_json, output_mtimes, run_snakemake, write_config

pytest.importorskip("torch", reason="the export needs torch: pip install -r envs/requirements-hf.txt")
pytest.importorskip("transformers")
pytest.importorskip("onnxscript")

import hf_checkpoints  # noqa: E402  (needs torch)

pytestmark = pytest.mark.workflow
AR, CONTEXT = 8, 32
MODEL = "hf"
SOURCE_FILES = [f"results/{MODEL}/source/{name}" for name in
                ("prompt.onnx", "prompt.onnx.data", "token.onnx", "token.onnx.data")]
TARGETS = [*SOURCE_FILES, f"results/{MODEL}/contract_check.json", f"results/{MODEL}/model_check.json"]


@pytest.fixture()
def workdir(tmp_path):
    (tmp_path / "work").mkdir()
    root = copy_workflow(tmp_path / "work")
    hf_checkpoints.make_checkpoint(root / "checkpoint", "qwen2", tied=True, max_shard_size="100KB")
    return root


def _log(result) -> str:
    return result.stdout + result.stderr


def _config(workdir):
    return write_config(workdir, {"model": {"name": MODEL, "hf_checkpoint": "checkpoint"},
                                  "export": {"ar": AR, "context": CONTEXT}, "split": {"num_parts": 2}})


def test_the_export_rule_passes_the_contract_reruns_on_a_changed_shard_and_only_then(workdir):
    config = _config(workdir)
    first = run_snakemake(workdir, "-p", *TARGETS, config_file=config)
    assert "export_hf_graphs" in _log(first)
    check = load_json(workdir / f"results/{MODEL}/contract_check.json")
    assert check["violations"] == [] and check["graphs"] == {"prompt": {"ar": AR, "cl": CONTEXT},
                                                             "token": {"ar": 1, "cl": CONTEXT}}
    assert (workdir / f"results/{MODEL}/benchmarks/export_hf_graphs.tsv").is_file()

    before = output_mtimes(workdir, MODEL)
    again = run_snakemake(workdir, "-p", *TARGETS, config_file=config)
    assert "Nothing to be done" in _log(again)
    assert output_mtimes(workdir, MODEL) == before

    shard = sorted((workdir / "checkpoint").glob("model-*.safetensors"))[-1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01  # the last weight's last byte: the file stays a valid safetensors file
    shard.write_bytes(bytes(data))
    rerun = run_snakemake(workdir, "-p", *TARGETS, config_file=config)
    assert "export_hf_graphs" in _log(rerun)
    after = output_mtimes(workdir, MODEL)
    assert all(after[f"source/{name}"] != before[f"source/{name}"] for name in ("prompt.onnx.data", "token.onnx.data"))


def test_a_checkpoint_without_weights_is_a_config_error(workdir):
    for shard in (workdir / "checkpoint").glob("*.safetensors"):
        shard.unlink()
    result = run_snakemake(workdir, "-n", "-p", *TARGETS, config_file=_config(workdir), check=False)
    assert result.returncode != 0
    assert "config model.hf_checkpoint:" in _log(result)
