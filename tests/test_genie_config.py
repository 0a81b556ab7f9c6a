"""genie_config.json and htp_backend_ext_config.json: every key Genie requires, one rope style, values from
the HF config and the chipset table, compared structurally with the vendor's own files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bundle_helpers import BOS, EOS, demo_hf_config, write_tokenizer
from genie_build.bundle.check_bundle import check_bundle
from genie_build.errors import GenieBuildError
from genie_build.genie_config import (GENIE_CONFIG_NAME, GENIE_CONFIG_SECTIONS, GENIE_ROPE_TYPES, ROPE_SCALING_TYPES,
                                      make_genie_config, make_htp_backend_ext_config)

VENDOR = Path(__file__).resolve().parent / "data" / "vendor"  # copies, with their source and licence: README.md
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


def key_paths(document: object, prefix: str = "") -> set[str]:
    """Every dotted key path of a JSON document (the structure, without the values)."""
    if not isinstance(document, dict):
        return set()
    paths = set()
    for key, value in document.items():
        paths.add(prefix + key)
        paths |= key_paths(value, prefix + key + ".")
    return paths


def vendor(name: str) -> dict:
    return json.loads((VENDOR / name).read_text())


def llama3_hf_config() -> dict:
    return {"vocab_size": 64, "hidden_size": 3072, "num_attention_heads": 24, "head_dim": 128,
            "rope_theta": 500000.0, "rope_scaling": dict(LLAMA3_SCALING), "bos_token_id": BOS,
            "eos_token_id": [EOS, 2]}


@pytest.fixture()
def tokenizer(tmp_path: Path) -> Path:
    return write_tokenizer(tmp_path / "tokenizer.json")


def test_plain_rope_config_has_the_vendor_structure_without_rope_scaling(tokenizer: Path) -> None:
    config = make_genie_config(demo_hf_config(hidden=64, heads=4), tokenizer, ["m_part_1_of_2.bin",
                                                                                 "m_part_2_of_2.bin"], 256)
    # RoPE as qairt-dev writes it (model.positional-encoding), not as AIHA's older Qwen file (QnnHtp keys)
    rope_scaling = {path for path in key_paths(vendor("llama_v3_2_3b_instruct.json")) if "rope-scaling" in path}
    assert key_paths(config) == key_paths(vendor("llama_v3_2_3b_instruct.json")) - rope_scaling
    qnn_htp = config["dialog"]["engine"]["backend"]["QnnHtp"]
    assert qnn_htp["kv-dim"] == 16 and "pos-id-dim" not in qnn_htp and "rope-theta" not in qnn_htp
    assert config["dialog"]["engine"]["model"]["positional-encoding"] == {"type": "rope", "rope-dim": 8,
                                                                          "rope-theta": 1000000}
    assert config["dialog"]["context"] == {"version": 1, "size": 256, "n-vocab": 64, "bos-token": BOS,
                                           "eos-token": EOS}
    assert config["dialog"]["engine"]["model"]["binary"]["ctx-bins"] == ["m_part_1_of_2.bin", "m_part_2_of_2.bin"]


def test_scaled_rope_config_has_the_llama_vendor_structure_and_the_hf_values(tokenizer: Path) -> None:
    config = make_genie_config(llama3_hf_config(), tokenizer, ["a.bin"], 4096)
    assert key_paths(config) == key_paths(vendor("llama_v3_2_3b_instruct.json"))
    qnn_htp = config["dialog"]["engine"]["backend"]["QnnHtp"]
    assert "pos-id-dim" not in qnn_htp and "rope-theta" not in qnn_htp
    encoding = config["dialog"]["engine"]["model"]["positional-encoding"]
    assert encoding == {"type": "rope", "rope-dim": 64, "rope-theta": 500000,
                        "rope-scaling": {"rope-type": "llama3", "factor": 32.0,  # the HF value, not AIHM's 8.0
                                         "low-freq-factor": 1.0, "high-freq-factor": 4.0,
                                         "original-max-position-embeddings": 8192}}
    assert config["dialog"]["context"]["eos-token"] == [EOS, 2]


def test_transformers5_rope_parameters_give_the_same_config(tokenizer: Path) -> None:
    legacy = llama3_hf_config()
    v5 = {key: value for key, value in legacy.items() if key not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {**LLAMA3_SCALING, "rope_theta": 500000.0}
    assert make_genie_config(v5, tokenizer, ["a.bin"], 4096) == make_genie_config(legacy, tokenizer, ["a.bin"], 4096)
    plain = demo_hf_config()
    plain_v5 = {key: value for key, value in plain.items() if key not in ("rope_theta", "rope_scaling")}
    plain_v5["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0}
    assert make_genie_config(plain_v5, tokenizer, ["a.bin"], 256) == make_genie_config(plain, tokenizer, ["a.bin"], 256)


def test_hf_config_stating_both_rope_styles_is_rejected_naming_the_file(tokenizer: Path) -> None:
    both = {**llama3_hf_config(), "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
    with pytest.raises(GenieBuildError, match=r"^models/config\.json: states both rope styles"):
        make_genie_config(both, tokenizer, ["a.bin"], 256, hf_config_path="models/config.json")


@pytest.mark.parametrize(("change", "message"), [
    ({"bos_token_id": None}, r"^cfg\.json: bos_token_id must be an integer"),
    ({"eos_token_id": []}, r"^cfg\.json: eos_token_id must be"),
    ({"rope_theta": None}, r"^cfg\.json: no rope_theta"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, r"^cfg\.json: rope type 'dynamic' is not supported"),
    ({"rope_scaling": {**LLAMA3_SCALING, "mscale": 1.0}}, r"^cfg\.json: rope scaling parameter 'mscale'"),
    ({"vocab_size": 0}, r"^cfg\.json: vocab_size must be a positive integer"),
])
def test_bad_hf_config_is_rejected_naming_the_file(tokenizer: Path, change: dict, message: str) -> None:
    with pytest.raises(GenieBuildError, match=message):
        make_genie_config({**llama3_hf_config(), **change}, tokenizer, ["a.bin"], 256, hf_config_path="cfg.json")


def test_token_id_missing_from_the_tokenizer_is_rejected_naming_the_tokenizer(tokenizer: Path) -> None:
    with pytest.raises(GenieBuildError, match=r"tokenizer\.json: eos_token_id 40 \(from cfg\.json\) is not an added"):
        make_genie_config({**demo_hf_config(), "eos_token_id": 40}, tokenizer, ["a.bin"], 256,
                          hf_config_path="cfg.json")


def test_missing_or_corrupt_tokenizer_is_named(tmp_path: Path) -> None:
    with pytest.raises(GenieBuildError, match="nope.json: tokenizer not found"):
        make_genie_config(demo_hf_config(), tmp_path / "nope.json", ["a.bin"], 256)
    (tmp_path / "bad.json").write_text('{"model": 3}')
    with pytest.raises(GenieBuildError, match="bad.json: not a tokenizers JSON file"):
        make_genie_config(demo_hf_config(), tmp_path / "bad.json", ["a.bin"], 256)


def test_htp_backend_ext_config_is_the_vendor_template_filled_from_the_chipset_table() -> None:
    template = (VENDOR / "htp_backend_ext_config.json.template").read_text()
    expected = json.loads(template.replace('"<TODO>"', '"v79"').replace("<TODO>", "69"))
    assert make_htp_backend_ext_config("SM8750") == expected
    assert make_htp_backend_ext_config("sm8650")["devices"][0]["soc_model"] == 57
    with pytest.raises(GenieBuildError, match="unknown chipset 'SM0000'"):
        make_htp_backend_ext_config("SM0000")


KEY_RULES = ("required-keys", "unknown-key", "rope-style")


@pytest.mark.parametrize("hf_config", [demo_hf_config(), llama3_hf_config(),
                                       {**llama3_hf_config(), "rope_scaling": {**LLAMA3_SCALING, "rope_type": "yarn",
                                                                               "beta_fast": 32.0, "beta_slow": 1.0}}],
                         ids=["plain", "llama3", "yarn"])
def test_what_the_writer_writes_passes_the_key_rules_check_bundle_reads(tokenizer: Path, tmp_path: Path,
                                                                         hf_config: dict) -> None:
    """GENIE_CONFIG_SECTIONS, beside the writer, is what check-bundle checks by: every key the writer writes is
    one Genie knows, of its type, with every mandatory key present."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / GENIE_CONFIG_NAME).write_text(json.dumps(make_genie_config(hf_config, tokenizer, ["a.bin"], 256)))
    assert [finding for finding in check_bundle(bundle) if finding.rule in KEY_RULES] == []


def test_the_rope_types_the_writer_gives_are_ones_genie_takes() -> None:
    assert set(GENIE_ROPE_TYPES.values()) <= set(ROPE_SCALING_TYPES)


def test_every_typed_key_is_a_key_genie_knows() -> None:
    for where, section in GENIE_CONFIG_SECTIONS.items():
        known = section.mandatory | (section.optional or set(section.types))
        assert set(section.types) <= known, where


@pytest.mark.parametrize("switching", [True, False])
def test_graph_switching_is_written_only_when_set_and_passes_the_key_rules(tokenizer: Path, tmp_path: Path,
                                                                          switching: bool) -> None:
    unset = make_genie_config(demo_hf_config(), tokenizer, ["a.bin"], 256)
    config = make_genie_config(demo_hf_config(), tokenizer, ["a.bin"], 256, graph_switching=switching)
    qnn_htp = config["dialog"]["engine"]["backend"]["QnnHtp"]
    assert "enable-graph-switching" not in unset["dialog"]["engine"]["backend"]["QnnHtp"]
    assert qnn_htp == {**unset["dialog"]["engine"]["backend"]["QnnHtp"], "enable-graph-switching": switching}
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / GENIE_CONFIG_NAME).write_text(json.dumps(config))
    assert [finding for finding in check_bundle(bundle) if finding.rule in KEY_RULES] == []
