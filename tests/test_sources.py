"""The model's source as one object (genie_build.sources): each kind of config gives its class, the rule files that
make its parts, and one per-part contract -- the same path layout for every source's parts and encodings."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from demo_shapes import SMALL
from genie_build.config import validate_config
from genie_build.errors import GenieBuildError
from genie_build.sources import (DemoSource, EstimateSource, OnnxSource, OnnxToCalibrateSource, SOURCE_ENCODINGS,
                                 source_of)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def config_with(**sections) -> dict:
    return validate_config({**DEFAULT_CONFIG, **sections})


@pytest.fixture
def user_files(small_demo, tmp_path) -> dict:
    """The small demo's graphs as a user's export, with a tokenizer and config.json (the graphs only are read)."""
    for name in ("prompt.onnx", "prompt.onnx.data", "token.onnx", "token.onnx.data", "config.json"):
        shutil.copy(small_demo / name, tmp_path / name)
    (tmp_path / "tokenizer.json").write_text("{}")
    return {"name": "mine", "prompt_onnx": str(tmp_path / "prompt.onnx"), "token_onnx": str(tmp_path / "token.onnx"),
            "tokenizer": str(tmp_path / "tokenizer.json"), "hf_config": str(tmp_path / "config.json")}


def test_the_demo_is_a_demo_source_whose_rules_generate_split_and_slice_it():
    source = source_of(config_with())
    assert type(source) is DemoSource and not source.calibrates
    assert source.rule_files == ("workflow/rules/demo.smk", "workflow/rules/split.smk", "workflow/rules/encodings.smk")
    assert all((REPO / path).is_file() for path in source.rule_files)
    assert source.plan is None and [name for name, _ in source.part_checkpoints] == [
        "plan", "split", "split", "slice_encodings"]
    assert source.encodings == {"prompt": "results/demo/source/prompt.encodings.json",
                                "token": "results/demo/source/token.encodings.json"}


def test_the_demo_calibrated_by_aimet_has_the_chains_rules_and_no_slices():
    source = source_of(config_with(demo={**DEFAULT_CONFIG.get("demo", {}), "calibrator": "aimet"}))
    assert source.calibrates and source.rule_files[-1] == "workflow/rules/calibrate.smk"
    assert "slice_encodings" not in [name for name, _ in source.part_checkpoints]
    assert source.model_checks == ("results/demo/model_check.json", "results/demo/plan_check.json")


def test_graphs_at_several_lengths_are_keyed_by_kind_and_length_the_largest_first():
    source = source_of(config_with(demo={**DEFAULT_CONFIG.get("demo", {}), "context": [128, 256]}))
    assert {key: (graph.kind, graph.context) for key, graph in source.graphs.items()} == {
        "prompt": ("prompt", 256), "token": ("token", 256), "prompt_cl128": ("prompt", 128),
        "token_cl128": ("token", 128)}
    assert source.context_lengths == (128, 256)
    # the graphs at another length read the largest's weights
    assert source.graphs["token_cl128"].data == ("results/demo/source/token.onnx.data",)


def test_every_source_lays_out_its_parts_and_encodings_alike(user_files):
    sources = [source_of(config_with()), source_of(config_with(model=user_files))]
    for source in sources:
        assert source.part_graph("token_cl512", "02_of_06") == f"{source.out}/parts/part_02_of_06/token_cl512.onnx"
        assert source.part_encodings("prompt", "02_of_06", SOURCE_ENCODINGS) == (
            f"{source.out}/encodings/source/part_02_of_06/prompt.encodings.json")
        assert source.part_encodings("token", "02_of_06", "w8a16") == (
            f"{source.out}/encodings/w8a16/part_02_of_06/token.encodings.json")


def test_user_graphs_with_encodings_are_an_onnx_source_and_without_one_to_calibrate(user_files):
    given = source_of(config_with(model={**user_files, "encodings": "enc.json"}))
    assert type(given) is OnnxSource and given.encodings == {"prompt": "enc.json", "token": "enc.json"}
    assert given.rule_files == ("workflow/rules/split.smk", "workflow/rules/encodings.smk")
    to_calibrate = source_of(config_with(model=user_files))
    assert type(to_calibrate) is OnnxToCalibrateSource and to_calibrate.calibrates
    assert to_calibrate.rule_files == ("workflow/rules/split.smk", "workflow/rules/calibrate.smk")
    prompt = to_calibrate.graphs["prompt"]
    assert (prompt.onnx, prompt.data, prompt.ar) == (user_files["prompt_onnx"],
                                                     (str(Path(user_files["prompt_onnx"]).with_suffix(".onnx.data")),),
                                                     SMALL.ar)
    assert to_calibrate.estimate_model == ("--onnx", user_files["prompt_onnx"])


def test_two_user_graphs_at_one_length_are_refused_naming_both(user_files):
    copies = {}
    for kind in ("prompt", "token"):   # the same graph again, under another name (reading the same data file)
        path = user_files[f"{kind}_onnx"]
        copies[kind] = str(shutil.copy(path, path.replace(kind, f"{kind}2")))
    model = {**user_files, **{f"{kind}_onnx": [user_files[f"{kind}_onnx"], copies[kind]] for kind in copies}}
    with pytest.raises(GenieBuildError, match=rf"^config model.prompt_onnx: .*prompt2.onnx and .*prompt.onnx are both "
                                              rf"at context length {SMALL.context}: give one graph per length"):
        source_of(config_with(model=model))


def test_a_config_json_alone_is_an_estimate_source_with_no_graphs_and_no_chain():
    source = source_of(config_with(model={"name": "q", "hf_config": "config/hf/qwen2_5_7b_instruct.json"}))
    assert type(source) is EstimateSource and not source.graphs and not source.calibrates
    assert source.rule_files == () and source.estimate_model == ("--hf-config", "config/hf/qwen2_5_7b_instruct.json")
