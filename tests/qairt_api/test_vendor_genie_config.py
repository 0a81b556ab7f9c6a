"""Genie configs against qairt-dev 0.13.0's own Genie config models: ours validates against them, and bundles
whose genie_config.json they wrote (in the vendor's directory layout) pass check-bundle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bundle_helpers import demo_hf_config, synthetic_infos, with_inputs_embeds, write_tokenizer
from genie_build.bundle.check_bundle import check_bundle
from genie_build.bundle.check_vendor import RULES as VENDOR_RULES
from genie_build.bundle.metadata import METADATA_NAME, dump_metadata
from genie_build.genie_config import make_genie_config

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


def vendor_dump(config) -> dict:
    """How qairt-dev writes a Genie config (use_case_exporter.py)."""
    return config.model_dump(by_alias=True, exclude_none=True, mode="json")


@pytest.mark.parametrize("rope_scaling", [None, LLAMA3_SCALING])
def test_our_genie_config_is_a_valid_qairt_genie_config(genie_models, tmp_path, rope_scaling):
    hf_config = {**demo_hf_config(), "rope_scaling": rope_scaling}
    ours = make_genie_config(hf_config, write_tokenizer(tmp_path / "tokenizer.json"),
                             ["demo_part_1_of_2.bin", "demo_part_2_of_2.bin"], 256)
    parsed = genie_models.GenieConfig.model_validate(ours)
    # every key was understood (none dropped, none added by defaults): the model writes back exactly ours
    assert vendor_dump(parsed) == ours
    assert parsed.dialog.engine.model.positional_encoding.rope_dim == 8


@pytest.mark.parametrize("switching", [True, False])
def test_our_graph_switching_key_is_a_valid_qairt_genie_config(genie_models, tmp_path, switching):
    ours = make_genie_config(demo_hf_config(), write_tokenizer(tmp_path / "tokenizer.json"),
                             ["demo_part_1_of_2.bin", "demo_part_2_of_2.bin"], 256, graph_switching=switching)
    parsed = genie_models.GenieConfig.model_validate(ours)
    assert vendor_dump(parsed) == ours
    assert ours["dialog"]["engine"]["backend"]["QnnHtp"]["enable-graph-switching"] is switching


@pytest.mark.parametrize("rope_scaling", [{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
                                          {"rope_type": "linear", "factor": 2.0}])
def test_rope_types_genie_knows_but_qairt_dev_does_not(genie_models, tmp_path, rope_scaling):
    # Genie's Dialog.cpp accepts yarnrope and linear; qairt-dev 0.13.0's RopeType lists neither.
    from pydantic import ValidationError

    hf_config = {**demo_hf_config(), "rope_scaling": rope_scaling}
    ours = make_genie_config(hf_config, write_tokenizer(tmp_path / "tokenizer.json"), ["demo_part_1_of_1.bin"], 256)
    with pytest.raises(ValidationError, match="rope-type"):
        genie_models.GenieConfig.model_validate(ours)


def vendor_bundle(genie_models, directory: Path, model_extras: dict, rope_scaling: dict | None,
                  binary: dict | None = None) -> Path:
    """A bundle in the layout of qairt-dev's directory export, its genie_config.json written by the vendor's models
    with the values genie_dialog_factory.py gives them."""
    g = genie_models
    names = [f"artifacts/split_model_{index}.bin" for index in (1, 2, 3)]
    infos = with_inputs_embeds(synthetic_infos(num_parts=3, cl=4096, prompt_ar=128, padded=False, hidden=3072,
                                               head_dim=128, kv_heads=8, vocab=128256), 3072)
    (directory / "artifacts").mkdir(parents=True)
    write_tokenizer(directory / "artifacts" / "tokenizer.json")
    with open(directory / "artifacts" / "embedding_table.bin", "wb") as table:
        table.truncate(128256 * 3072 * 2)  # ufixed16 [n_vocab][n_embd], sparse: no disk blocks
    (directory / "artifacts" / "tmpk2j4x9.json").write_text(json.dumps({
        "context": [{"weight_sharing_enabled": True}],
        "graphs": [{"O": 3, "graph_names": [graph.name]} for info in infos.values() for graph in info.graphs],
        "devices": [{"device_id": 0, "soc_model": 69, "dsp_arch": "v79",
                     "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 100}]}],
        "memory": {"mem_type": "shared_buffer"}}))
    if binary is None:
        binary = {"ctx-bins": names}
        (directory / METADATA_NAME).write_text(dump_metadata(dict(zip(names, infos.values(), strict=True))))
        for name in names:
            (directory / name).write_bytes(b"placeholder")
    encoding = g.PositionalEncoding(**{"type": "rope", "rope-dim": 64, "rope-theta": 500000.0,
                                       **({"rope-scaling": g.RopeScaling(**rope_scaling)} if rope_scaling else {}),
                                       **model_extras.pop("positional-encoding", {})})
    dialog = g.BasicDialog(
        tokenizer=g.Tokenizer(path="artifacts/tokenizer.json"),
        sampler=g.Sampler(),
        embedding=g.DialogEmbedding(**{"lut-path": "artifacts/embedding_table.bin", "size": 3072,
                                       "datatype": "ufixed16", "quant-param": {"scale": 0.0001, "offset": -32768}}),
        context=g.Context(**{"bos-token": 128000, "eos-token": [128001, 128008, 128009], "n-vocab": 128256,
                             "n-embd": 3072, "size": 4096}),
        engine=g.DialogEngine(**{
            "n-threads": 6,
            "backend": g.EngineBackend(type="QnnHtp", extensions="artifacts/tmpk2j4x9.json", QnnHtp=g.QnnHtpBackend(
                **{"use-mmap": True, "spill-fill-bufsize": 0, "mmap-budget": 40, "poll": True, "cpu-mask": "0x00",
                   "kv-dim": 128})),
            "model": g.EngineModel(**{"type": "binary", "binary": g.ModelBinary(**binary),
                                      "positional-encoding": encoding, **model_extras})}))
    (directory / "genie_config.json").write_text(json.dumps(vendor_dump(g.GenieConfig(dialog=dialog)), indent=2))
    return directory


LLAMA3 = {"rope-type": "llama3", "factor": 32.0, "low-freq-factor": 1.0, "high-freq-factor": 4.0,
          "original-max-position-embeddings": 8192}


def test_a_vendor_llama_bundle_passes(genie_models, tmp_path):
    bundle = vendor_bundle(genie_models, tmp_path / "b", {}, LLAMA3)
    assert json.loads((bundle / "genie_config.json").read_text())["dialog"]["engine"]["model"]["binary"] == {
        "version": 1, "ctx-bins": ["artifacts/split_model_1.bin", "artifacts/split_model_2.bin",
                                   "artifacts/split_model_3.bin"]}
    assert check_bundle(bundle, chipset="SM8750") == []


@pytest.mark.parametrize("rope_type", ["qwen2vl", "qwen3vl", "qwen2vl-mrope", "qwen3vl-mrope"])
def test_a_vendor_qwen_bundle_passes_with_the_rope_types_genie_takes(genie_models, tmp_path, rope_type):
    # the Qwen builders add linear-attention and rope-freqs-type (gen_ai_api/builders/qwen/builder.py); their models
    # also take the bare qwen2vl / qwen3vl, which Genie 2.51 refuses (it wants the -mrope forms)
    bundle = vendor_bundle(genie_models, tmp_path / "b", {"linear-attention": True,
                                                          "positional-encoding": {"rope-freqs-type": "concat"}},
                           {"rope-type": rope_type, "mrope-section": [16, 24, 24]})
    model = json.loads((bundle / "genie_config.json").read_text())["dialog"]["engine"]["model"]
    assert model["linear-attention"] is True and model["positional-encoding"]["rope-freqs-type"] == "concat"
    found = [f for f in check_bundle(bundle, chipset="SM8750") if f.rule not in VENDOR_RULES]
    assert found == [] if rope_type.endswith("-mrope") else [f.rule for f in found] == ["required-keys"]


def test_a_vendor_multi_soc_bundle_passes_with_a_warning(genie_models, tmp_path):
    bundle = vendor_bundle(genie_models, tmp_path / "b", {}, LLAMA3, binary={"fcb": ["artifacts/model.dlc"]})
    findings = check_bundle(bundle)
    assert [(f.rule, f.severity) for f in findings] == [("ctx-bins-exist", "warning")]


def test_what_the_vendor_models_accept_but_genie_rejects_is_still_rejected(genie_models, tmp_path):
    # QnnHtpBackend takes any extra key (extra="allow"); Genie refuses an unknown QnnHtp key.
    bundle = vendor_bundle(genie_models, tmp_path / "b", {}, LLAMA3)
    config = json.loads((bundle / "genie_config.json").read_text())
    config["dialog"]["engine"]["backend"]["QnnHtp"]["debug-tensors"] = True
    genie_models.GenieConfig.model_validate(config)
    (bundle / "genie_config.json").write_text(json.dumps(config))
    assert [f.rule for f in check_bundle(bundle) if f.rule not in VENDOR_RULES] == ["unknown-key"]
