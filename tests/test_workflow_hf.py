"""The workflow with model.hf_checkpoint, from a random-weight Hugging Face checkpoint to a checked Genie bundle, one
part at a time.

For Qwen2, Llama (llama3 RoPE scaling), Mistral, Qwen3 and Phi-3 (Phi-3.5's longrope) checkpoints written by
transformers itself: the plan is made from
config.json when the workflow is parsed, each part is exported by a job of its own and calibrated unit by unit
(aimet-onnx); the default's qnn-htp bundle (parts 2 and 3 compiled by the vendor's HTP compiler and read back by
its libQnnSystem with their graphs' names, SoC and encodings; part 1 the CPU table) passes check-bundle, and the host
run's tokens (the twins in the HTP simulation) equal those of the parts' converted graphs on the CPU (what stands in
for an unsplit model, which this path never makes). On the Qwen2 build: a second run has nothing to
do; a new calibration text or recipe reruns the calibration chain and not the export; a changed shard re-exports
only the part holding its tensors, and recalibrates from that part's first unit on; a checkpoint without weights, or
whose config.json names more layers than its tensors hold, is a config error at parse time.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil

import numpy as np
import onnx
import pytest

from rebuild_helpers import variant_options
from workflow_helpers import (REFERENCE_BUILD, TEST_VARIANTS, copy_workflow, jobs_run, load_json, output_mtimes,
                              read_back_qnn_bundle, run_snakemake, scale_encoding, stated_axes_encodings,
                              write_config)

pytest.importorskip("torch", reason="the export needs torch: pip install --no-deps -r envs/requirements-hf.txt")
pytest.importorskip("transformers")
pytest.importorskip("onnxscript")
if os.environ.get("GENIE_BUILD_REQUIRE_AIMET") == "1":
    import aimet_onnx  # noqa: F401  -- CI installs it: a missing one fails
else:
    pytest.importorskip("aimet_onnx", reason="the calibration needs aimet-onnx (envs/requirements-hf.txt)")

import family_cases  # noqa: E402
import hf_checkpoints  # noqa: E402  (needs torch)

from genie_build.run.run_bundle import PARTS_REFERENCE, TABLE_REFERENCE  # noqa: E402
from genie_build.tokens import text_token_ids  # noqa: E402

pytestmark = [pytest.mark.workflow, pytest.mark.hf]
AR, CONTEXT = 8, 64   # the host run: a 24-token prompt + 16 new tokens
MODEL = "hf"
OUT = f"results/{MODEL}"
NUM_PARTS = 3          # 3 layers: [embedding] [layer 0, layer 1] [layer 2, head]
# Qwen2 builds the default config's qnn-htp bundle, its binaries read back by libQnnSystem; the other families build
# the reference toolchain's: qnn-htp stops at their parts (ops the HTP backend leaves on the CPU, or a graph it
# splits in several)
QNN_HTP_FAMILY = "qwen2"


def _config(workdir, name="test-config.yaml", family=QNN_HTP_FAMILY, **quantize):
    return write_config(workdir, {"model": {"name": MODEL, "hf_checkpoint": "checkpoint"},
                                  "export": {"ar": AR, "context": CONTEXT}, "split": {"num_parts": NUM_PARTS},
                                  "quantize": {"recipe": "w4a16", "num_samples": 4, **quantize},
                                  "convert": {"keep": False},
                                  **({} if family == QNN_HTP_FAMILY else REFERENCE_BUILD)}, name=name)


def _log(result) -> str:
    return result.stdout + result.stderr


def _planned(workdir, config) -> set[str]:
    """The rules a dry run would run."""
    return {rule for rule, _ in jobs_run(run_snakemake(workdir, "-n", config_file=config))}


LAYER_1_WEIGHTS = [f"model.layers.1.{module}.weight" for module in
                   ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
_BUILDS: dict[str, tuple] = {}
# family -> what its checkpoint states beyond the tests' defaults: Phi-3.5's longrope, its original context the
# build's (so Genie and transformers take short_factor) within a max_position_embeddings twice that (attention
# factor sqrt(1 + ln 2 / ln 64))
BUILD_KEYS = {"phi3": {"rope_parameters": {**family_cases.phi3.MODEL_LONGROPE,
                                           "original_max_position_embeddings": CONTEXT},
                       "original_max_position_embeddings": CONTEXT, "context": 2 * CONTEXT}}


def _build(family, tmp_path_factory):
    """A workdir whose default targets were built from a random ``family`` checkpoint (tied, sharded, 3 layers);
    one per family and test session."""
    if family not in _BUILDS:
        root = copy_workflow(tmp_path_factory.mktemp(family))
        hf_checkpoints.make_checkpoint(root / "checkpoint", family, tied=True, max_shard_size="100KB", layers=3,
                                       **BUILD_KEYS.get(family, {}))
        config = _config(root, family=family)
        ran = {rule for rule, _ in jobs_run(run_snakemake(root, "-p", config_file=config))}
        assert {"tokenize_text", "export_part", "calibrate_unit", "part_encodings", "check_plan", "verify_parts"} <= ran
        _BUILDS[family] = family, root, config
    return _BUILDS[family]


@pytest.fixture(scope="module", params=hf_checkpoints.FAMILIES)
def built(request, tmp_path_factory):
    return _build(request.param, tmp_path_factory)


def test_the_checkpoint_becomes_a_bundle_that_passes_check_bundle_and_runs_as_its_parts(built):
    family, workdir, _ = built
    check = load_json(workdir / f"{OUT}/contract_check.json")
    assert check["violations"] == [] and check["graphs"] == {"prompt": {"ar": AR, "cl": CONTEXT},
                                                             "token": {"ar": 1, "cl": CONTEXT}}
    assert len(check["prompt"]) == NUM_PARTS   # the parts together, as one model
    assert load_json(workdir / f"{OUT}/bundle_check.json")["errors"] == 0
    host_run = load_json(workdir / f"{OUT}/host_run.json")
    assert len(host_run["new_ids"]) > 0 and host_run["new_ids"] == host_run["reference_ids"], family
    assert load_json(workdir / f"{OUT}/plan_check.json")["same_parts"]
    if family == QNN_HTP_FAMILY:   # the qnn-htp bundle (part 1 is the CPU table), read back by libQnnSystem
        assert host_run["compared_with"] == PARTS_REFERENCE + TABLE_REFERENCE
        assert read_back_qnn_bundle(workdir / OUT, "w4a16") == {
            f"{MODEL}_part_{index}_of_3.bin": [f"prompt_ar{AR}_cl{CONTEXT}_{index}_of_3",
                                               f"token_ar1_cl{CONTEXT}_{index}_of_3"] for index in (2, 3)}
        # the vendor's Genie ran the bundle (its twins, in the HTP simulation) to the host run's tokens
        genie_run = load_json(workdir / f"{OUT}/genie_run.json")
        assert genie_run["equal_to_host_run"] and genie_run["new_ids"] == host_run["new_ids"], genie_run
    else:
        assert host_run["compared_with"] == PARTS_REFERENCE
    for index in (1, 2, 3):   # every part, each of its graphs, against transformers' modules
        verified = load_json(workdir / f"{OUT}/verify/part_{index}_of_3.json")
        assert verified["reference"].startswith("transformers modules") and set(verified["graphs"]) >= {"prompt",
                                                                                                     "token"}
    genie = load_json(workdir / f"{OUT}/genie_bundle/genie_config.json")
    rope = genie["dialog"]["engine"]["model"]["positional-encoding"]
    assert rope.get("rope-scaling", {}).get("rope-type") == {"llama": "llama3", "phi3": "longrope"}.get(family)
    assert not (workdir / OUT / "source").exists()   # no whole graph is ever made
    # convert.keep false: gone once compiled and run, but for the DLCs (convert.dlc), kept for the vendor's tools
    assert not [path for path in (workdir / OUT / "converted").rglob("*") if path.is_file() and path.suffix != ".dlc"]


def test_long_jobs_say_how_far_they_are(built):
    _, workdir, _ = built
    export_log = (workdir / f"{OUT}/logs/export_part/part_2_of_3.log").read_text()
    assert re.search(r"read \d+ tensor\(s\) from model-\d+-of-\d+\.safetensors", export_log)
    assert "exported" in export_log
    unit_log = (workdir / f"{OUT}/logs/calibrate_unit/w4a16/u2_of_3.log").read_text()
    assert all(f"calibrated window {k} of 4" in unit_log for k in range(1, 5))


def test_only_what_changed_reruns(tmp_path_factory):
    """On the Qwen2 build (the rules are the same for every family); it runs after the bundle checks above."""
    _, workdir, config = _build("qwen2", tmp_path_factory)
    before = output_mtimes(workdir, MODEL)
    assert "Nothing to be done" in _log(run_snakemake(workdir, config_file=config))
    assert output_mtimes(workdir, MODEL) == before

    for changed in (_config(workdir, "w8.yaml", recipe="w8a16"), _config(workdir, "more.yaml", num_samples=5)):
        planned = _planned(workdir, changed)
        assert {"calibrate_unit", "part_encodings"} <= planned and "export_part" not in planned
    corpus = workdir / "resources" / "calibration_corpus.txt"
    corpus.write_text("And it came to pass, when men began to multiply on the face of the earth.\n"
                      + corpus.read_text(encoding="utf-8"), encoding="utf-8")
    new_text = _planned(workdir, config)
    assert "calibrate_unit" in new_text and "export_part" not in new_text
    run_snakemake(workdir, config_file=config)
    after = output_mtimes(workdir, MODEL)
    assert all(after[path] == before[path] for path in before if path.startswith("parts/"))
    assert all(after[path] != before[path] for path in before if path.startswith("calibration/w4a16/u"))

    # the last shard holds the head's tensors (the index lists them), which only the last part reads
    shard = sorted((workdir / "checkpoint").glob("model-*.safetensors"))[-1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01  # the last weight's last byte: the file stays a valid safetensors file
    shard.write_bytes(bytes(data))
    result = run_snakemake(workdir, "-p", config_file=config)
    jobs = jobs_run(result)
    assert {wildcards for rule, wildcards in jobs if rule == "export_part"} == {"part=3_of_3"}
    assert {wildcards for rule, wildcards in jobs if rule == "calibrate_unit"} == {"recipe=w4a16, unit=u3_of_3"}
    exported = output_mtimes(workdir, MODEL)
    assert all(exported[path] == after[path] for path in after if path.startswith(("parts/part_1", "parts/part_2")))
    assert exported["parts/part_3_of_3/weights.onnx.data"] != after["parts/part_3_of_3/weights.onnx.data"]


def test_a_key_only_the_bundle_reads_rebuilds_the_bundle_and_a_budget_of_the_same_units_nothing(tmp_path_factory,
                                                                                                 tmp_path):
    """On a copy of the Qwen2 build, without the host run (its reference, the converted parts, is gone with
    ``convert.keep: false``): ``quantize.unit_memory_mb`` changed so that the units stay the same reruns nothing;
    a new ``eos_token_id`` in config.json rebuilds the bundle (which says it) and its checks, and no part is
    exported, calibrated, converted or compiled again."""
    _, root, _ = _build("qwen2", tmp_path_factory)
    workdir = shutil.copytree(root, tmp_path / "copy", symlinks=True)
    settings = {"model": {"name": MODEL, "hf_checkpoint": "checkpoint"}, "export": {"ar": AR, "context": CONTEXT},
                "split": {"num_parts": NUM_PARTS}, "convert": {"keep": False}, "bundle": {"host_run": False}}
    run_snakemake(workdir, config_file=write_config(
        workdir, {**settings, "quantize": {"recipe": "w4a16", "num_samples": 4}}, name="no-host-run.yaml"))
    budget = write_config(workdir, {**settings, "quantize": {"recipe": "w4a16", "num_samples": 4,
                                                             "unit_memory_mb": 1500}}, name="budget.yaml")
    assert "Nothing to be done" in _log(run_snakemake(workdir, "-n", config_file=budget))

    before = output_mtimes(workdir, MODEL)
    hf_config = workdir / "checkpoint" / "config.json"
    hf_config.write_text(json.dumps({**json.loads(hf_config.read_text()), "eos_token_id": 0}))
    jobs = {rule for rule, _ in jobs_run(run_snakemake(workdir, "-p", config_file=budget))}
    assert jobs == {"check_contract", "bundle", "check_bundle", "all"}
    after = output_mtimes(workdir, MODEL)
    assert not {path for path in before if after[path] != before[path]
                and path.startswith(("parts/", "calibration/", "encodings/", "compiled/", "tokens/"))}
    assert load_json(workdir / f"{OUT}/genie_bundle/genie_config.json")["dialog"]["context"]["eos-token"] == 0


def test_a_short_text_or_a_token_past_the_vocabulary_is_one_line_before_any_unit_or_export(tmp_path_factory,
                                                                                           tmp_path):
    """On a copy of the Qwen2 build: a calibration text shorter than the windows asked stops its tokenize_text job
    (no text is repeated) before any unit runs; a tokenizer with a token past vocab_size, in the held-out text too,
    stops ``snakemake evaluate`` when the workflow is parsed, before any job."""
    _, root, _ = _build("qwen2", tmp_path_factory)
    workdir = shutil.copytree(root, tmp_path / "copy", symlinks=True)
    corpus_tokens = text_token_ids(workdir / "resources" / "calibration_corpus.txt",
                                   workdir / "checkpoint" / "tokenizer.json").size
    result = run_snakemake(workdir, config_file=_config(workdir, "long.yaml", num_samples=100_000), check=False)
    assert result.returncode != 0
    assert {rule for rule, _ in jobs_run(result)} == {"tokenize_text"}
    last = (workdir / f"{OUT}/logs/tokenize_text/calibration.log").read_text().strip().splitlines()[-1]
    assert last == (f"genie-build: error: resources/calibration_corpus.txt: has {corpus_tokens} tokens, calibration "
                    f"(quantize.num_samples: 100000 windows of {AR} tokens) needs {100_000 * AR}: give a longer text")

    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_file(str(workdir / "checkpoint" / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken("<|past|>", special=True)])
    tokenizer.save(str(workdir / "checkpoint" / "tokenizer.json"))
    text = workdir / "resources" / "evaluation_text.txt"
    text.write_text("<|past|>" + text.read_text(encoding="utf-8"), encoding="utf-8")
    result = run_snakemake(workdir, "evaluate", config_file=_config(workdir), check=False)
    assert result.returncode != 0 and not jobs_run(result)
    assert ("config model.hf_checkpoint: checkpoint/tokenizer.json: token '<|past|>' has id 320, beyond the model's "
            "320 logits (ids 0..319), the vocab_size of checkpoint/config.json") in _log(result)
    assert "Traceback" not in _log(result)


def test_variants_of_three_recipes_share_the_export_and_w8a16_is_closer_to_float_than_w4a16(tmp_path_factory, tmp_path):
    """Variants naming their recipe on the Qwen2 build (a copy): ``snakemake all evaluate`` calibrates, converts and
    compiles only the new variants (the export, the split and the w4a16 chain stand), one size table and one
    evaluation compare all of them against the exported float parts, and w8a16 is closer to them than w4a16. The
    evaluation runs the reference toolchain's variants: ``reference`` (w4a16, packed), the same unpacked, w8a16 and
    lpbq."""
    _, root, _ = _build("qwen2", tmp_path_factory)
    workdir = shutil.copytree(root, tmp_path / "copy", symlinks=True)
    variants = {name: variant_options(workdir, name) for name in TEST_VARIANTS}
    config = write_config(workdir, {"model": {"name": MODEL, "hf_checkpoint": "checkpoint"},
                                    "export": {"ar": AR, "context": CONTEXT}, "split": {"num_parts": NUM_PARTS},
                                    "quantize": {"recipe": "w4a16", "num_samples": 4}, "convert": {"keep": False},
                                    "variants": {**variants, "unpacked": REFERENCE_BUILD["variants"]["unpacked"],
                                                 "w8a16": {"recipe": "w8a16", "weights_packing": True},
                                                 "lpbq": {"recipe": "w4a16-lpbq", "weights_packing": True}}},
                          name="recipes.yaml")
    jobs = jobs_run(run_snakemake(workdir, "all", "evaluate", config_file=config))
    calibrated = {wildcards.split(",")[0] for rule, wildcards in jobs if rule == "calibrate_unit"}
    assert calibrated == {"recipe=w8a16", "recipe=w4a16-lpbq"}
    assert not {rule for rule, _ in jobs} & {"export_part", "verify_parts"}
    compiled = {(re.search(r"variant=([^,]+)", wildcards)[1], re.search(r"part=([^,]+)", wildcards)[1])
                for rule, wildcards in jobs if rule == "compile_part"}
    # every part of the new variants; of the reference's, no other variant: the evaluation runs its parts, which
    # it compiles again where convert.keep: false had deleted their converted graphs
    new = {(variant, f"{index}_of_3") for variant in ("unpacked", "w8a16", "lpbq") for index in (1, 2, 3)}
    assert new <= compiled and {variant for variant, _ in compiled - new} <= {"reference"}, compiled

    sizes: dict[str, int] = {}
    for row in csv.DictReader((workdir / OUT / "size_table.csv").read_text().splitlines()):
        sizes[row["variant"]] = sizes.get(row["variant"], 0) + int(row["bytes"])
    assert sizes["w8a16"] > sizes["reference"] and sizes["lpbq"] >= sizes["reference"]
    quality = {variant: load_json(workdir / OUT / "evaluation" / f"{variant}.json")
               for variant in ("unpacked", "reference", "w8a16", "lpbq")}
    table = (workdir / OUT / "evaluation.md").read_text()
    assert all(f"| {variant} |" in table for variant in quality)
    assert len({report["float_perplexity"] for report in quality.values()}) == 1   # one float model
    assert quality["w8a16"]["mean_kl"] < quality["reference"]["mean_kl"] / 4
    assert quality["w8a16"]["top1_agreement"] >= quality["reference"]["top1_agreement"]
    assert quality["reference"] == {**quality["unpacked"], "variant": "reference"}   # one recipe, packed or not

    # one layer's weight scales x4 in the w4a16 chain's encodings: its variants are told apart, the others stand
    unit = next(path for path in sorted((workdir / OUT / "calibration" / "w4a16").glob("u*_of_*.encodings.json"))
                if LAYER_1_WEIGHTS[0] in path.read_text())
    for weight in LAYER_1_WEIGHTS:
        scale_encoding(unit, weight, 4.0)
    run_snakemake(workdir, "evaluate", config_file=config)
    broken = {variant: load_json(workdir / OUT / "evaluation" / f"{variant}.json") for variant in quality}
    assert broken["reference"]["top1_agreement"] < quality["reference"]["top1_agreement"] - 0.1
    assert broken["reference"]["mean_kl"] > 2 * quality["reference"]["mean_kl"]
    assert (broken["w8a16"], broken["lpbq"]) == (quality["w8a16"], quality["lpbq"])


def test_a_weight_quantized_along_the_wrong_axis_is_told_apart_on_a_checkpoint(tmp_path_factory, tmp_path):
    """On a copy of the Qwen2 build: layer 1's o_proj given output channels half 16x what they were, half 1x to 1/16x
    (trained weights' channels differ) in the checkpoint, rebuilt and calibrated by the chain; then its part's
    encodings restated as a 2.0.0 file naming its input axis (square: no count refuses it). The evaluation tells
    the two apart."""
    from safetensors.numpy import load_file, save_file

    from genie_build.encodings import read_encodings

    _, root, _ = _build("qwen2", tmp_path_factory)
    workdir = shutil.copytree(root, tmp_path / "copy", symlinks=True)
    weight = "model.layers.1.self_attn.o_proj.weight"
    shard = workdir / "checkpoint" / load_json(workdir / "checkpoint" / "model.safetensors.index.json")[
        "weight_map"][weight]
    tensors = load_file(shard)
    # the chain calibrates the activations for these weights, so o_proj may also grow to weigh in the residual
    spread = 16 * np.r_[np.ones(32), np.geomspace(1 / 256, 1 / 16, 32)]
    tensors[weight] = tensors[weight] * np.random.default_rng(1).permutation(spread).astype(np.float32)[:, None]
    save_file(tensors, shard, metadata={"format": "pt"})   # torch's [out, in]: a row per output channel
    config = write_config(workdir, {"model": {"name": MODEL, "hf_checkpoint": "checkpoint"},
                                    "export": {"ar": AR, "context": CONTEXT}, "split": {"num_parts": NUM_PARTS},
                                    "quantize": {"recipe": "w4a16", "num_samples": 4}, "convert": {"keep": False},
                                    "evaluate": {"max_windows": 64}}, name="windows.yaml")
    run_snakemake(workdir, "evaluate", config_file=config)
    right = load_json(workdir / OUT / "evaluation" / "reference.json")

    part = next(label for label in ("1_of_3", "2_of_3", "3_of_3")
                if weight in (workdir / OUT / "encodings" / "w4a16" / f"part_{label}" / "prompt.encodings.json")
                .read_text())
    path = workdir / OUT / "encodings" / "w4a16" / f"part_{part}" / "prompt.encodings.json"
    # every exported Linear weight is [out, in] behind a Transpose: its channels run along axis 0
    path.write_text(json.dumps(stated_axes_encodings(read_encodings(path), lambda name: int(name == weight))))
    run_snakemake(workdir, "evaluate", config_file=config)
    wrong = load_json(workdir / OUT / "evaluation" / "reference.json")
    assert right["float_perplexity"] == wrong["float_perplexity"]   # one float model
    assert wrong["top1_agreement"] < right["top1_agreement"] - 0.1
    assert wrong["mean_kl"] > 2 * right["mean_kl"]


def test_a_checkpoint_without_weights_is_a_config_error(tmp_path):
    workdir = copy_workflow(tmp_path)
    hf_checkpoints.make_checkpoint(workdir / "checkpoint", "qwen2")
    for shard in (workdir / "checkpoint").glob("*.safetensors"):
        shard.unlink()
    result = run_snakemake(workdir, "-n", config_file=_config(workdir), check=False)
    assert result.returncode != 0
    assert "config model.hf_checkpoint:" in _log(result)


def test_an_export_context_past_the_models_is_refused_naming_the_key_itself(tmp_path):
    """A setting of the config's own is named as the key it is (not under model.hf_checkpoint)."""
    workdir = copy_workflow(tmp_path)
    hf_checkpoints.make_checkpoint(workdir / "checkpoint", "qwen2")   # max_position_embeddings 64
    config = write_config(workdir, {"model": {"name": MODEL, "hf_checkpoint": "checkpoint"},
                                    "export": {"ar": AR, "context": [CONTEXT, 2 * CONTEXT]}})
    result = run_snakemake(workdir, "-n", config_file=config, check=False)
    assert result.returncode != 0
    lines = [line for line in _log(result).splitlines() if "max_position_embeddings" in line]
    assert lines == [f"config export.context: {2 * CONTEXT} exceeds the model's max_position_embeddings {CONTEXT} "
                     "(checkpoint/config.json)"], _log(result)


def test_a_checkpoint_the_export_cannot_build_is_a_config_error_at_once(tmp_path):
    workdir = copy_workflow(tmp_path)
    checkpoint = hf_checkpoints.make_checkpoint(workdir / "checkpoint", "qwen2")
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 100000}))
    result = run_snakemake(workdir, "-n", config_file=_config(workdir), check=False)
    assert result.returncode != 0
    assert re.search(r"config model\.hf_checkpoint: \S+config\.json: num_hidden_layers is 100000, but the "
                     r"checkpoint's tensors hold layers 0-1", _log(result))


def test_the_embedding_as_a_table_reexports_and_recalibrates_nothing_and_gives_the_same_tokens(tmp_path_factory,
                                                                                                tmp_path):
    """On a copy of the Qwen2 build, with the reference toolchain (its 8-bit per-channel embedding has no HTP form,
    so its qnn-htp bundle has no graph layout): the embedding in the graph, then bundle.embedding: lut reconverts
    the part after the table, takes part 1 out of the bundle, and the host run (the parts after the table, fed from
    it) gives the graph layout's tokens."""
    _, root, _ = _build("qwen2", tmp_path_factory)
    workdir = shutil.copytree(root, tmp_path / "copy", symlinks=True)
    settings = {"model": {"name": MODEL, "hf_checkpoint": "checkpoint"}, "export": {"ar": AR, "context": CONTEXT},
                "split": {"num_parts": NUM_PARTS}, "quantize": {"recipe": "w4a16", "num_samples": 4},
                "convert": {"keep": False}, **REFERENCE_BUILD}
    run_snakemake(workdir, config_file=write_config(workdir, settings, name="graph.yaml"))
    graph_run = load_json(workdir / f"{OUT}/host_run.json")
    lut = write_config(workdir, {**settings, "bundle": {**settings["bundle"], "embedding": "lut"}}, name="lut.yaml")
    switched = jobs_run(run_snakemake(workdir, "-p", config_file=lut))
    ran = {rule for rule, _ in switched}
    assert "bundle" in ran and not ran & {"export_part", "calibrate_unit", "part_encodings"}, ran
    # part 2 takes the table's rows now; part 1 leaves the bundle (part 3's graphs may be converted again for the
    # host run's reference, convert.keep: false having deleted them)
    converted = {wildcards for rule, wildcards in switched if rule == "convert_part_reference"}
    assert any("part=2_of_3" in wildcards for wildcards in converted), converted
    assert not any("part=1_of_3" in wildcards for wildcards in converted), converted
    # the table (made by the copied build, which had it already) is in the bundle
    assert (workdir / f"{OUT}/genie_bundle/embedding_table.bin").read_bytes() == (
        workdir / f"{OUT}/embedding/embedding_table.bin").read_bytes()
    genie = load_json(workdir / f"{OUT}/genie_bundle/genie_config.json")["dialog"]
    assert genie["engine"]["model"]["binary"]["ctx-bins"] == ["hf_part_2_of_3.bin", "hf_part_3_of_3.bin"]
    assert genie["embedding"]["type"] == "lut"
    lut_run = load_json(workdir / f"{OUT}/host_run.json")
    assert lut_run["new_ids"] == lut_run["reference_ids"] == graph_run["new_ids"]


def test_a_second_context_length_exports_only_its_graphs_and_the_host_run_switches_to_the_same_tokens(
        tmp_path_factory):
    """On the Qwen2 build: export.context [32, 64] exports each part's graphs at 32 beside those at 64 (no export
    of those, no calibration), each binary of the qnn-htp bundle (parts 2 and 3) holds both, and the host run starts
    at 32, moves to 64 and gives the single-length bundle's tokens."""
    _, workdir, config = _build("qwen2", tmp_path_factory)
    run_snakemake(workdir, config_file=config)  # up to date after the tests before this one
    single = load_json(workdir / f"{OUT}/host_run.json")
    two = write_config(workdir, {"model": {"name": MODEL, "hf_checkpoint": "checkpoint"},
                                 "export": {"ar": AR, "context": [32, CONTEXT]}, "split": {"num_parts": NUM_PARTS},
                                 "quantize": {"recipe": "w4a16", "num_samples": 4}, "convert": {"keep": False}},
                       name="lengths.yaml")
    try:
        ran = jobs_run(run_snakemake(workdir, "-p", config_file=two))
        rules = {rule for rule, _ in ran}
        assert not rules & {"export_part", "calibrate_unit", "part_encodings", "tokenize_text"}, ran
        assert sorted(wildcards for rule, wildcards in ran if rule == "export_length") == [
            f"part={index}_of_3, length=32" for index in (1, 2, 3)]
        # each part's graphs are checked together: a new length re-checks every part (a job each)
        assert {wildcards for rule, wildcards in ran if rule == "verify_parts"} == {
            f"part={index}_of_3" for index in (1, 2, 3)}
        out = workdir / OUT
        for index in (1, 2, 3):
            part = out / "parts" / f"part_{index}_of_3"
            assert sorted(path.name for path in part.glob("*.onnx.data")) == ["weights.onnx.data"]
        for index in (2, 3):   # the parts that are converted and compiled: part 1 is the CPU table
            part = out / "parts" / f"part_{index}_of_3"
            record = load_json(out / "sizes" / "qnn-htp" / f"part_{index}_of_3.json")
            assert len(record["graphs"]) == 4
            # one data file: the other graphs take each weight as the prompt graph's convert made it, not quantized
            for graph in ("token", "prompt_cl32", "token_cl32"):
                logs = next((out / "logs" / "convert_part").glob(f"w4a16/reference-*/part_{index}_of_3"))
                taken = re.search(r"(\d+) of \d+ weights taken", (logs / f"{graph}.log").read_text())
                external = [t for t in onnx.load(part / f"{graph}.onnx", load_external_data=False).graph.initializer
                            if t.data_location == onnx.TensorProto.EXTERNAL]
                assert external and int(taken.group(1)) == len(external), graph
        assert load_json(out / "bundle_check.json")["errors"] == 0
        assert read_back_qnn_bundle(out, "w4a16") == {
            f"{MODEL}_part_{index}_of_3.bin": sorted(f"{kind}_ar{ar}_cl{cl}_{index}_of_3" for cl in (32, CONTEXT)
                                                     for kind, ar in (("prompt", AR), ("token", 1)))
            for index in (2, 3)}
        run = load_json(out / "host_run.json")
        assert run["new_ids"] == run["reference_ids"] == single["new_ids"]
        lengths = [graph["cl"] for graph in run["graph_runs"]]
        assert lengths[0] == 32 and lengths[-1] == CONTEXT, run["graph_runs"]
    finally:
        run_snakemake(workdir, config_file=config)  # back to one length for any test after this one
