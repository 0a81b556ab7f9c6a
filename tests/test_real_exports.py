"""Held-out style checks: exports written the way a user writes them with aimet-onnx 2.42 and torch.onnx, taken
through the whole workflow as a user model (not through the demo calibrator), and what comes out compared with
AIMET's own fake-quantized weights.

A user's AIMET export: ``QuantizationSimModel(..., config_file="htp_v79")``, each graph calibrated on its own,
``sim.export(dir, prefix, encoding_version=...)`` (``<prefix>.onnx``, ``<prefix>.data``, ``<prefix>.encodings``),
``encodings: {share_from: prompt}``, and each ``past_*_out`` given its ``past_*_in`` entry (AIMET leaves the new
cache entries without one; Genie needs them equal, as AIMET's LLM recipe ties them).

Skips when aimet-onnx is not installed, unless ``GENIE_BUILD_REQUIRE_AIMET=1`` (set by ``.ci/run``).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from onnx import helper, numpy_helper

from workflow_helpers import (REFERENCE_BUILD, REPO, SMALL_DEMO, assert_host_run_agrees, copy_workflow, load_json,
                              run_snakemake, write_config)

pytestmark = pytest.mark.hf
if os.environ.get("GENIE_BUILD_REQUIRE_AIMET") == "1":
    import aimet_onnx  # noqa: F401  -- CI installs it (envs/requirements-hf.txt): a missing one fails
else:
    pytest.importorskip("aimet_onnx", reason="aimet-onnx is not installed (envs/requirements-hf.txt)")

from aimet_onnx.quantsim import (QuantizationSimModel,  # noqa: E402
                                 set_grouped_blockwise_quantization_for_weights)

GRAPHS = ("prompt", "token")
USER = "user"


def test_every_runtime_requirement_of_the_hf_extra_is_pinned():
    """envs/requirements-hf.txt is installed with --no-deps on top of envs/requirements.txt, so the two must pin
    what their packages need at run time (joblib 1.6 needs cloudpickle: without it ``import aimet_onnx`` fails;
    osqp needs setuptools, which a Python 3.12 venv lacks). onnx2torch is left out on purpose (the file says
    why)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    def pinned(path: Path) -> set[str]:
        return {canonicalize_name(Requirement(line).name) for line in path.read_text().splitlines()
                if line.strip() and not line.startswith(("#", "-"))}

    envs = REPO / "envs"
    extra = pinned(envs / "requirements-hf.txt")
    installed = extra | pinned(envs / "requirements.txt")
    missing = set()
    for name in extra:
        for text in metadata.requires(name) or ():
            requirement = Requirement(text)
            if requirement.marker is None or any(  # on either supported Python
                    requirement.marker.evaluate({"extra": "", "python_version": version,
                                                 "python_full_version": f"{version}.0"})
                    for version in ("3.11", "3.12")):
                missing.add(canonicalize_name(requirement.name))
    assert missing - installed - {"onnx2torch"} == set()


# ---------------------------------------------------------------------------------------------- exports

def demo_sources(out: Path) -> Path:
    """The small demo's float graphs, config.json and tokenizer, as a user's model before quantization."""
    from demo_shapes import demo_shape
    from genie_build.demo.demo import generate_demo

    shape = SMALL_DEMO["demo"]
    generate_demo(demo_shape(shape), out)
    subprocess.run([sys.executable, "-m", "genie_build", "train-tokenizer", "--corpus",
                    str(REPO / "resources" / "tokenizer_corpus.txt"), "--vocab", str(shape["vocab"]),
                    "--out", str(out / "tokenizer.json")], check=True, capture_output=True)
    return out


def demo_feeds(sources: Path, kind: str) -> list[dict]:
    from genie_build.onnx_graph import load_graph
    from genie_build.quantize.calibrate import calibration_feeds, graph_shape

    shape = graph_shape(load_graph(sources / "prompt.onnx"), sources / "prompt.onnx", sources / "config.json")
    return list(calibration_feeds(shape, kind, 2))


def aimet_user_export(model_path: Path, feeds: list[dict], exports: Path, prefix: str, version: str,
                      recipe: str) -> dict[str, np.ndarray]:
    """Export one graph as a user would and return AIMET's fake-quantized initializers (its truth)."""
    model = onnx.load(model_path)
    sim = QuantizationSimModel(model, param_type="int4", activation_type="int16", config_file="htp_v79")
    if recipe == "lpbq":
        set_grouped_blockwise_quantization_for_weights(sim, ("MatMul", "Gemm"), 4, 8, 32)
    sim.compute_encodings(feeds)
    sim.export(str(exports), prefix, encoding_version=version)
    original = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    truth = {name: quantizer.quantize_dequantize(original[name]) for name, quantizer in sim.qc_quantize_op_dict.items()
             if name in original and name not in sim.param_names and quantizer.enabled}
    sim.fold_param_quantizers()
    truth |= {tensor.name: numpy_helper.to_array(tensor) for tensor in sim.model.model.graph.initializer
              if tensor.name in sim.param_names}
    return truth


def tie_kv_outputs(path: Path) -> None:
    """Give each ``past_*_in`` entry's copy to ``past_*_out`` in the file's own format, as a user does."""
    data = json.loads(path.read_text())
    if data["version"] == "0.6.1":
        section = data["activation_encodings"]
        section.update({name[:-3] + "_out": copy.deepcopy(entry) for name, entry in list(section.items())
                        if re.fullmatch(r"past_(key|value)_\d+_in", name)})
    else:
        key = "encodings" if data["version"] == "2.0.0" else "activation_encodings"
        inputs = {entry["name"]: entry for entry in data[key]
                  if re.fullmatch(r"past_(key|value)_\d+_in", entry["name"])}
        outputs = {name[:-3] + "_out" for name in inputs}
        data[key] = [entry for entry in data[key] if entry["name"] not in outputs]
        data[key] += [{**copy.deepcopy(entry), "name": name[:-3] + "_out"} for name, entry in inputs.items()]
    path.write_text(json.dumps(data, indent=4))


def user_workdir(tmp_path: Path, exports: Path, overrides: dict) -> tuple[Path, Path]:
    (tmp_path / "work").mkdir()
    workdir = copy_workflow(tmp_path / "work")
    shutil.copytree(exports, workdir / "exports")
    model = {"name": USER, "prompt_onnx": "exports/prompt.onnx", "token_onnx": "exports/token.onnx",
             "encodings": {kind: f"exports/{kind}.encodings" for kind in GRAPHS},
             "tokenizer": "exports/tokenizer.json", "hf_config": "exports/config.json"}
    return workdir, write_config(workdir, {**SMALL_DEMO, "model": model, "encodings": {"share_from": "prompt"},
                                           **overrides})


def converted_weights(workdir: Path, kind: str, names: set[str]) -> dict[str, np.ndarray]:
    """The weights the workflow's converted parts of one graph hand their nodes."""
    found = {}
    for part in sorted((workdir / "results" / USER / "converted").glob(f"**/part_*/{kind}.onnx")):
        model = onnx.load(part)
        inferred = onnx.shape_inference.infer_shapes(model).graph
        types = {value.name: value.type.tensor_type.elem_type for value in inferred.value_info}
        wanted = [name for name in sorted(names) if types.get(name)]
        model.graph.ClearField("output")
        model.graph.output.extend(helper.make_tensor_value_info(name, types[name], None) for name in wanted)
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = {value.name: np.zeros(value.shape, helper.tensor_dtype_to_np_dtype(
                     next(i.type.tensor_type.elem_type for i in model.graph.input if i.name == value.name)))
                 for value in session.get_inputs()}
        found |= dict(zip(wanted, session.run(wanted, feeds)))
    return found


def compare_with_aimet(workdir: Path, kind: str, truth: dict[str, np.ndarray], encodings: Path) -> tuple[int, int]:
    """``(values compared, one-step rounding ties)`` of every quantized weight of ``kind``'s converted parts."""
    from genie_build.encodings import read_encodings

    enc = read_encodings(encodings)
    quantized = {name for name in truth if (e := enc.of_initializer(name)) is not None and e.dtype == "int"
                 and e.bitwidth < 32}
    if load_json(workdir / "results" / USER / "genie_bundle" / "genie_config.json")["dialog"].get("embedding"):
        quantized.discard("model.embed_tokens.weight")   # the table, not a converted graph (test_workflow_embedding)
    ours = converted_weights(workdir, kind, quantized)
    assert ours.keys() == quantized, sorted(quantized - ours.keys())[:5]
    compared = ties = 0
    for name in sorted(quantized):
        encoding = enc.of_initializer(name)
        step = max(encoding.scale) * max(encoding.per_block_int_scale or (1,))
        differ = ours[name] != truth[name]
        if differ.any():
            assert np.abs(ours[name][differ].astype(np.float64) - truth[name][differ]).max() <= step * 1.01, name
        compared += truth[name].size
        ties += int(differ.sum())
    return compared, ties


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return demo_sources(tmp_path_factory.mktemp("demo_src"))


@pytest.mark.workflow
@pytest.mark.parametrize("version, recipe", [("1.0.0", "per_channel"), ("2.0.0", "lpbq")])
def test_an_aimet_user_export_of_the_demo_builds_a_bundle_holding_aimets_weights(demo, version, recipe, tmp_path,
                                                                                  record_property):
    exports = tmp_path / "exports"
    exports.mkdir()
    truth = {kind: aimet_user_export(demo / f"{kind}.onnx", demo_feeds(demo, kind), exports, kind, version, recipe)
             for kind in GRAPHS}
    assert (exports / "prompt.data").is_file() and not (exports / "prompt.onnx.data").exists()
    for kind in GRAPHS:
        tie_kv_outputs(exports / f"{kind}.encodings")
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(demo / name, exports / name)
    workdir, config = user_workdir(tmp_path, exports, {})
    run_snakemake(workdir, config_file=config)
    out = workdir / "results" / USER
    assert load_json(out / "bundle_check.json")["errors"] == 0
    assert_host_run_agrees(load_json(out / "host_run.json"))
    if recipe != "lpbq":   # the qnn-htp bundle: Genie answers as the host run (AIMET's Gather output unencoded)
        genie = load_json(out / "genie_run.json")
        assert genie["equal_to_host_run"] is True, genie.get("difference")
    # share_from: prompt -- the token graph's parts hold the prompt graph's quantized weights too
    compared = ties = 0
    for kind in GRAPHS:
        counts = compare_with_aimet(workdir, kind, truth["prompt"], exports / "prompt.encodings")
        compared, ties = compared + counts[0], ties + counts[1]
    record_property("values_compared", compared)
    record_property("one_step_ties", ties)
    print(f"{version} {recipe}: {compared} values compared, {ties} one-step ties")
    assert compared > 300_000 and ties <= compared // 200   # the layers and the head (the embedding is the table)


@pytest.mark.workflow
def test_a_torch_dynamo_qwen2_quantized_by_aimet_builds_its_size_table_counting_weights_not_stack_traces(tmp_path):
    """An HF Qwen2 exported by torch.onnx (dynamo) and quantized by aimet-onnx does not follow Genie's IO
    contract, so it builds with ``bundle.enabled: false``. torch.onnx annotates every node with its Python
    stack trace (``metadata_props``, here ~700 kB against ~60 kB of 4-bit weights); a device binary holds no
    such thing, so the binaries the size table measures must not either."""
    from hf_export import export_tiny_qwen2
    from transformers import Qwen2Config

    shape = {"layers": 2, "hidden": 64, "heads": 2, "kv_heads": 1, "intermediate": 128, "vocab": 512, "context": 32}
    sources = tmp_path / "hf"
    paths = dict(zip(GRAPHS, export_tiny_qwen2(sources, **shape, prompt_ar=8)))
    stack_traces = sum(len(prop.value) for node in onnx.load(paths["prompt"], load_external_data=False).graph.node
                       for prop in node.metadata_props)
    rng = np.random.default_rng(0)
    exports = tmp_path / "exports"
    exports.mkdir()
    for kind, path in paths.items():
        shapes = {value.name: [dim.dim_value for dim in value.type.tensor_type.shape.dim]
                  for value in onnx.load(path, load_external_data=False).graph.input}
        past = shapes["past_key_0_in"][2]
        feeds = [{"input_ids": rng.integers(0, shape["vocab"], shapes["input_ids"]),
                  "attention_mask": np.ones(shapes["attention_mask"], np.int64),
                  "position_ids": np.arange(past, past + shapes["position_ids"][1])[None],
                  **{name: rng.normal(size=dims).astype(np.float32) for name, dims in shapes.items()
                     if name.startswith("past")}} for _ in range(2)]
        aimet_user_export(path, feeds, exports, kind, "1.0.0", "per_channel")
    config = Qwen2Config(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                         intermediate_size=shape["intermediate"],
                         num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                         num_key_value_heads=shape["kv_heads"], max_position_embeddings=shape["context"],
                         tie_word_embeddings=False)
    (exports / "config.json").write_text(config.to_json_string())
    subprocess.run([sys.executable, "-m", "genie_build", "train-tokenizer", "--corpus",
                    str(REPO / "resources" / "tokenizer_corpus.txt"), "--vocab", str(shape["vocab"]),
                    "--out", str(exports / "tokenizer.json")], check=True, capture_output=True)
    # the reference toolchain with the embedding in the graph: this export feeds position_ids to every part, so
    # its part 2 cannot follow an embedding table (refused in one line), and qnn-htp has no form for the graph's
    # per-channel Gather
    workdir, config_file = user_workdir(tmp_path, exports, {**REFERENCE_BUILD, "split": {"num_parts": 2},
                                                            "bundle": {**REFERENCE_BUILD["bundle"], "enabled": False}})
    run_snakemake(workdir, config_file=config_file)
    out = workdir / "results" / USER
    assert (out / "size_table.md").is_file() and not (out / "genie_bundle").exists()
    for sizes in sorted((out / "sizes").glob("*/part_*.json")):
        part = load_json(sizes)
        assert part["bytes"] - part["weight_bytes"] < stack_traces / 4, (sizes.name, part["bytes"],
                                                                         part["weight_bytes"])


@pytest.mark.workflow
def test_a_plain_aimet_export_with_the_kv_cache_untied_stops_before_converting(demo, tmp_path):
    """AIMET leaves the new cache entries (``past_*_out``, made by data-movement ops) without an encoding; Genie
    refuses a cache whose output is quantized unlike its input. The build stops at slice_encodings, naming the
    tensor and the fix, instead of after compiling every part (check-bundle's shared-quant error)."""
    exports = tmp_path / "exports"
    exports.mkdir()
    for kind in GRAPHS:
        aimet_user_export(demo / f"{kind}.onnx", demo_feeds(demo, kind), exports, kind, "1.0.0", "per_channel")
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(demo / name, exports / name)
    workdir, config = user_workdir(tmp_path, exports, {})
    result = run_snakemake(workdir, config_file=config, check=False)
    assert result.returncode != 0
    out = workdir / "results" / USER
    log = (out / "logs" / "slice_encodings.log").read_text()
    assert "genie-build: error: past_key_0_out: activation encoding is not past_key_0_in's" in log, log
    assert "tie the cache quantizers in AIMET" in log
    assert not (out / "compiled").exists() and not (out / "converted").exists()


def test_check_kv_cache_tied_names_the_untied_output_and_passes_tied_or_float_caches():
    from dataclasses import replace

    from genie_build.encodings import Encodings, TensorEncoding, check_kv_cache_tied
    from genie_build.errors import GenieBuildError

    cache = TensorEncoding(name="past_key_0_in", dtype="int", bitwidth=8, scale=(0.03,), offset=(-135,))
    names = {"past_key_0_in", "past_key_0_out", "logits"}
    check_kv_cache_tied(Encodings(), names)   # a float cache: nothing to tie
    check_kv_cache_tied(Encodings(activations={"past_key_0_in": cache,
                                               "past_key_0_out": replace(cache, name="past_key_0_out")}), names)
    with pytest.raises(GenieBuildError, match="past_key_0_out: .*it has none, past_key_0_in has one"):
        check_kv_cache_tied(Encodings(activations={"past_key_0_in": cache}), names)
    with pytest.raises(GenieBuildError, match=r"past_key_0_out: .*offset\[0\] -135 vs -125"):
        check_kv_cache_tied(Encodings(activations={"past_key_0_in": cache, "past_key_0_out": replace(
            cache, name="past_key_0_out", offset=(-125,))}), names)


def test_a_0_6_1_file_with_min_and_max_only_reads_as_the_scale_and_offset_aimet_wrote(tmp_path):
    """0.6.1 entries carrying only ``min``/``max`` (the SDK converter accepts them; hand-edited and older files
    have them) give AIMET's own grid: the real export with its scale/offset removed reads back to the same
    offsets and scales within a float rounding, and converts to the same weights."""
    from test_aimet import MODELS

    from genie_build.encodings import read_encodings
    from genie_build.toolchains.reference.convert import convert_model

    rng = np.random.default_rng(3)
    make_model, make_feed = MODELS["linear"]
    model = make_model(rng)
    sim = QuantizationSimModel(model, param_type="int8", activation_type="int16", config_file="htp_v79")
    sim.compute_encodings([make_feed(rng) for _ in range(2)])
    sim.export(str(tmp_path), "model", encoding_version="0.6.1")
    data = json.loads((tmp_path / "model.encodings").read_text())
    for section in ("activation_encodings", "param_encodings"):
        for entries in data[section].values():
            for entry in entries:
                entry.pop("scale", None), entry.pop("offset", None)
    (tmp_path / "range.encodings").write_text(json.dumps(data))
    written, ranged = (read_encodings(tmp_path / name) for name in ("model.encodings", "range.encodings"))
    # 4 weights: the table is an activation encoding, and 0.6.1 has no bias entry
    assert written.params.keys() == ranged.params.keys() and len(written.params) == 4
    for name, encoding in {**written.activations, **written.params}.items():
        other = ranged.of_initializer(name) or ranged.activations[name]
        assert other.offset == encoding.offset, name
        np.testing.assert_allclose(other.scale, encoding.scale, rtol=1e-6, err_msg=name)
    weights = {}
    for name in ("model", "range"):
        convert_model(tmp_path / "model.onnx", tmp_path / f"{name}.encodings", tmp_path / f"{name}_converted.onnx",
                      graph_name="g", float_bitwidth=32)
        converted = onnx.load(tmp_path / f"{name}_converted.onnx")
        weights[name] = {tensor.name: numpy_helper.to_array(tensor) for tensor in converted.graph.initializer
                         if tensor.name.endswith("_quantized")}
    assert weights["model"].keys() == weights["range"].keys() and weights["model"]
    mismatched = sum(int((weights["model"][n] != weights["range"][n]).sum()) for n in weights["model"])
    total = sum(value.size for value in weights["model"].values())
    assert mismatched <= total // 1000, (mismatched, total)


PER_TENSOR_CONFIG = {"defaults": {"ops": {"is_output_quantized": "True"},
                                  "params": {"is_quantized": "True", "is_symmetric": "True"},
                                  "per_channel_quantization": "False"},
                     "params": {"bias": {"is_quantized": "False"}}, "op_type": {}, "supergroups": [],
                     "model_input": {"is_input_quantized": "True"}, "model_output": {}}


@pytest.mark.parametrize("param_type", ["int8", "int4"])
def test_per_tensor_weights_convert_to_aimets_own_in_every_format(param_type, tmp_path):
    """aimet-onnx 2.42's default config quantizes weights per channel; per-tensor weights need a config with
    ``per_channel_quantization: False``. Every format's export converts to AIMET's folded weights."""
    from test_aimet import MODELS, converted_weights, count_one_step_ties, largest_step

    from genie_build.encodings import read_encodings

    rng = np.random.default_rng(7)
    make_model, make_feed = MODELS["linear"]
    model = make_model(rng)
    feeds = [make_feed(rng) for _ in range(2)]
    config = tmp_path / "per_tensor.json"
    config.write_text(json.dumps(PER_TENSOR_CONFIG))
    sim = QuantizationSimModel(model, param_type=param_type, activation_type="int16", config_file=str(config))
    sim.compute_encodings(feeds)
    for version in ("0.6.1", "1.0.0", "2.0.0"):
        (tmp_path / version).mkdir()
        sim.export(str(tmp_path / version), "model", encoding_version=version)
    sim.fold_param_quantizers()
    truth = {tensor.name: numpy_helper.to_array(tensor) for tensor in sim.model.model.graph.initializer
             if tensor.name in sim.param_names}
    weights = ("w_in_out", "w_out_in", "w_square", "w_gemm")
    compared = ties = 0
    for version in ("0.6.1", "1.0.0", "2.0.0"):
        export = tmp_path / version
        encodings = read_encodings(export / "model.encodings")
        assert {encodings.of_initializer(name).kind for name in weights} == {"per_tensor"}
        ours = converted_weights(export / "model.onnx", export / "model.encodings", list(weights), feeds[0],
                                 tmp_path / f"converted_{version}.onnx")
        for name in weights:
            compared += truth[name].size
            ties += count_one_step_ties(ours[name], truth[name], largest_step(export / "model.encodings", name))
    print(f"per tensor {param_type}: {compared} values compared, {ties} one-step ties")
    assert ties <= compared // 1000


@pytest.mark.workflow
def test_float_graphs_without_encodings_are_calibrated_part_by_part(demo, tmp_path):
    """A user's float graphs with no model.encodings: split, then calibrated by the chain (recipe w8a16), without
    ever calibrating the whole model; the bundle passes check-bundle and its host run gives the tokens of the
    parts' converted graphs (there are no whole encodings to convert an unsplit model with)."""
    from genie_build.run.run_bundle import PARTS_REFERENCE, TABLE_REFERENCE

    exports = tmp_path / "exports"
    exports.mkdir()
    for name in ("prompt.onnx", "prompt.onnx.data", "token.onnx", "token.onnx.data", "config.json", "tokenizer.json"):
        shutil.copy(demo / name, exports / name)
    workdir, config = user_workdir(tmp_path, exports, {"quantize": {"recipe": "w8a16", "num_samples": 4}})
    settings = yaml.safe_load(config.read_text())
    del settings["model"]["encodings"]
    config.write_text(yaml.safe_dump(settings))
    result = run_snakemake(workdir, "-p", config_file=config)
    ran = set(re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):", result.stdout + result.stderr, re.MULTILINE))
    assert {"plan", "split", "calibrate_unit", "part_encodings", "check_plan"} <= ran
    assert not {"slice_encodings", "convert_unsplit"} & ran
    out = workdir / "results" / USER
    assert load_json(out / "plan_check.json")["same_parts"]
    assert len(json.loads((out / "calibration_units.json").read_text())["units"]) == SMALL_DEMO["split"]["num_parts"]
    part = json.loads((out / "encodings" / "w8a16" / "part_2_of_3" / "prompt.encodings.json").read_text())
    assert {e["bw"] for e in part["param_encodings"] if e["name"].endswith("up_proj.weight")} == {8}
    assert load_json(out / "bundle_check.json")["errors"] == 0
    host_run = load_json(out / "host_run.json")
    assert host_run["new_ids"] == host_run["reference_ids"]
    assert host_run["compared_with"] == PARTS_REFERENCE + TABLE_REFERENCE

