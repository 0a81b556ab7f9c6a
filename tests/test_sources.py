"""The model's source as one object (genie_build.sources): each kind of config gives its class, behind one per-part
contract that a source class must give in full to be defined -- the same path layout for every source's parts and
encodings; the source's rule files make its parts; a checkpoint is read once, and nothing is written to read it."""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import pytest
import yaml

from demo_shapes import SMALL
from genie_build import fileio, hf_checkpoint
from genie_build.config import validate_config
from genie_build.errors import GenieBuildError
from genie_build.sources import DemoSource, EstimateSource, OnnxSource, SOURCE_ENCODINGS, Source, source_of
from workflow_helpers import copy_workflow, run_snakemake, write_config

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


def test_the_demo_is_a_demo_source_with_its_encodings_or_the_chains():
    source = source_of(config_with())
    assert type(source) is DemoSource and source.plan is None and source.units is None
    assert source.encodings == {"prompt": "results/demo/source/prompt.encodings.json",
                                "token": "results/demo/source/token.encodings.json"}
    calibrated = source_of(config_with(demo={**DEFAULT_CONFIG.get("demo", {}), "calibrator": "aimet"}))
    assert type(calibrated) is DemoSource and calibrated.encodings is None


@pytest.mark.parametrize("demo, made_by, not_made_by", [
    ({}, {"generate_demo", "split", "slice_encodings", "check_model", "verify_split"},
     {"calibrate_unit", "check_plan", "export_part"}),
    ({"calibrator": "aimet"}, {"generate_demo", "split", "calibrate_unit", "check_plan", "check_model"},
     {"slice_encodings", "export_part"}),
])
def test_the_demos_rule_files_generate_and_split_it_and_slice_or_calibrate_its_encodings(tmp_path, demo, made_by,
                                                                                        not_made_by):
    workdir = copy_workflow(tmp_path)
    config = write_config(workdir, {"demo": demo})
    rules = set(run_snakemake(workdir, "--list-rules", config_file=config).stdout.split())
    assert made_by <= rules and not not_made_by & rules


def test_a_source_missing_a_contract_member_is_refused_when_its_class_is_defined():
    with pytest.raises(TypeError, match=r"^Partial does not give the source contract's contract_inputs, "
                                        r"part_float_mb$"):
        class Partial(Source):
            graph_config = plan = units = None

    class Base(Source, abstract=True):   # a base of sources may leave members to its subclasses
        pass

    with pytest.raises(TypeError, match=r"^Whole does not give the source contract's units$"):
        class Whole(Base):
            graph_config = plan = None

            def part_float_mb(self, label: str) -> float:
                return 0.0

            def contract_inputs(self) -> dict:
                return {}


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


def test_user_graphs_are_an_onnx_source_with_their_encodings_or_without_for_the_chain(user_files):
    given = source_of(config_with(model={**user_files, "encodings": "enc.json"}))
    assert type(given) is OnnxSource and given.encodings == {"prompt": "enc.json", "token": "enc.json"}
    to_calibrate = source_of(config_with(model=user_files))
    assert type(to_calibrate) is OnnxSource and to_calibrate.encodings is None
    prompt = to_calibrate.graphs["prompt"]
    assert (prompt.onnx, prompt.data, prompt.ar) == (user_files["prompt_onnx"],
                                                     (str(Path(user_files["prompt_onnx"]).with_suffix(".onnx.data")),),
                                                     SMALL.ar)


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
    assert type(source) is EstimateSource and not source.graphs and source.encodings is None
    assert source.plan is None and source.hf_config == "config/hf/qwen2_5_7b_instruct.json"


@pytest.mark.hf
def test_a_checkpoint_is_read_once_its_config_and_every_shard_header_and_nothing_is_written(tmp_path, monkeypatch):
    """The planner, the part-weight lookup, the tokenizer's check and the graphs' config share one read of the
    checkpoint, whatever its lengths and parts; what it gives is written by its rule file, not by reading it."""
    pytest.importorskip("torch", reason="the checkpoint is written with torch")
    import hf_checkpoints

    checkpoint = hf_checkpoints.make_checkpoint(tmp_path / "checkpoint", "qwen2", layers=4, max_shard_size="100KB")
    shards = sorted(path.name for path in checkpoint.glob("*.safetensors"))
    reads = collections.Counter()

    def counted(read):
        def counting(path, *args, **kwargs):
            reads[Path(path).name] += 1
            return read(path, *args, **kwargs)
        return counting

    monkeypatch.setattr(fileio, "open_regular", counted(fileio.open_regular))
    monkeypatch.setattr(hf_checkpoint, "_safetensors_header", counted(hf_checkpoint._safetensors_header))
    monkeypatch.chdir(tmp_path)
    source = source_of(config_with(model={"name": "c", "hf_checkpoint": "checkpoint"},
                                   export={"ar": 8, "context": [32, 64]}, split={"num_parts": 4}))
    assert source.plan.num_parts == 4 and len(shards) > 4
    assert {name: reads[name] for name in ("config.json", "model.safetensors.index.json", *shards)} == {
        "config.json": 1, "model.safetensors.index.json": 1, **{shard: 1 for shard in shards}}
    assert not (tmp_path / "results").exists()
