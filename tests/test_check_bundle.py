"""check-bundle: accepts well-formed bundles (ours and the vendor's structure) and rejects each violation of
Genie's load-time rules with a finding naming its rule."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundle_helpers import (demo_hf_config, edit_json, quant, replace_tensor, synthetic_infos, write_bundle,
                            write_tokenizer)
from genie_build.bundle.check_bundle import RULES, Finding, check_bundle, require_valid_bundle
from genie_build.bundle.check_vendor import RULES as VENDOR_RULES
from genie_build.bundle.metadata import METADATA_NAME, dump_metadata
from genie_build.cli import main
from genie_build.errors import GenieBuildError

VENDOR = Path(__file__).resolve().parent / "data" / "vendor"  # copies, with their source and licence: README.md
QWEN_VOCAB = 152064


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]


def rules(findings: list[Finding], severity: str = "error") -> set[str]:
    return {f.rule for f in findings if f.severity == severity}


def table(findings: list[Finding]) -> list[Finding]:
    """The key table's findings: without those of the vendor's libraries (tests/test_genie_library.py has them)."""
    return [f for f in findings if f.rule not in VENDOR_RULES]


@pytest.fixture()
def bundle(tmp_path: Path) -> Path:
    return write_bundle(tmp_path / "bundle")


def test_well_formed_bundle_passes(bundle: Path) -> None:
    assert check_bundle(bundle) == []
    assert check_bundle(bundle, chipset="SM8750") == []
    assert require_valid_bundle(bundle) == []


def test_eleven_parts_with_unpadded_names_are_rejected(tmp_path: Path) -> None:
    padded = write_bundle(tmp_path / "padded", synthetic_infos(num_parts=11))
    assert errors(check_bundle(padded)) == []
    unpadded = write_bundle(tmp_path / "unpadded", synthetic_infos(num_parts=11, padded=False))
    findings = errors(check_bundle(unpadded))
    assert rules(findings) == {"graph-order"} and len(findings) == 2  # one per (AR, CL): prompt and token
    prompt = next(f.message for f in findings if f.message.startswith("AR 32, CL 256"))
    assert "'prompt_ar32_cl256_10_of_11' sorts to split 1 but sits in part 10" in prompt
    assert "not zero-padded" in prompt and "(e.g. '_01_of_11')" in prompt


def test_nine_parts_with_unpadded_names_are_fine(tmp_path: Path) -> None:
    # single digits sort correctly: the rule is about order, not about the spelling
    assert errors(check_bundle(write_bundle(tmp_path / "b", synthetic_infos(num_parts=9, padded=False)))) == []


def test_swapped_soc_model_is_rejected(bundle: Path) -> None:
    edit_json(bundle / "htp_backend_ext_config.json", lambda doc: doc["devices"][0].update(soc_model=57))
    findings = errors(check_bundle(bundle))
    assert rules(findings) == {"chipset"}
    assert "soc_model 57 is SM8650's (v75) but dsp_arch is v79, that of SM8750, SM8735" in findings[0].message
    with_target = errors(check_bundle(bundle, chipset="SM8750"))
    assert rules(with_target) == {"chipset"} and "SM8650" in with_target[0].message


def test_bundle_for_another_chipset_than_intended_is_rejected(tmp_path: Path) -> None:
    other = write_bundle(tmp_path / "b", chipset="SM8650")
    assert check_bundle(other) == []
    assert rules(check_bundle(other, chipset="SM8750")) == {"chipset"}


def test_boundary_tensor_with_different_encodings_on_its_two_sides_is_rejected(tmp_path: Path) -> None:
    infos = synthetic_infos(num_parts=3)
    boundary = "/model/layers.0/Add_1_output_0"  # output of part 2, input of part 3
    other = quant("something else")
    infos = replace_tensor(infos, "demo_part_3_of_3.bin", "prompt_ar32_cl256_3_of_3", boundary, quant=other)
    findings = errors(check_bundle(write_bundle(tmp_path / "b", infos)))
    assert rules(findings) == {"shared-quant"}
    assert boundary in findings[0].message and "prompt_ar32_cl256_3_of_3" in findings[0].message


def test_kv_cache_in_and_out_with_different_encodings_are_rejected(tmp_path: Path) -> None:
    infos = replace_tensor(synthetic_infos(), "demo_part_2_of_3.bin", "token_ar1_cl256_2_of_3", "past_key_0_out",
                           quant=quant("x", 8))
    findings = errors(check_bundle(write_bundle(tmp_path / "b", infos)))
    assert rules(findings) == {"shared-quant"} and "past_key_0_out" in findings[0].message


def test_logits_may_differ_between_graphs(bundle: Path) -> None:
    # the helper gives prompt and token logits different scales; Genie excludes logits from the rule
    metadata = (bundle / METADATA_NAME).read_text()
    assert metadata.count("scale: 0.032") == 1 and metadata.count("scale: 0.001") == 1
    assert check_bundle(bundle) == []


def test_missing_ctx_bin_is_rejected(bundle: Path) -> None:
    (bundle / "demo_part_2_of_3.bin").unlink()
    findings = errors(check_bundle(bundle))
    assert rules(findings) == {"ctx-bins-exist"} and "demo_part_2_of_3.bin" in findings[0].message


def test_unlisted_ctx_bin_is_rejected(bundle: Path) -> None:
    (bundle / "stray.bin").write_bytes(b"x")
    findings = errors(check_bundle(bundle))
    assert rules(findings) == {"ctx-bins-listed"}
    assert "stray.bin" in findings[0].message


def test_both_rope_styles_are_rejected(bundle: Path) -> None:
    # ours writes model.positional-encoding; adding the QnnHtp style as well is what Genie refuses
    edit_json(bundle / "genie_config.json", lambda doc: doc["dialog"]["engine"]["backend"]["QnnHtp"].update(
        {"pos-id-dim": 8, "rope-theta": 1000000}))
    findings = table(errors(check_bundle(bundle)))
    assert rules(findings) == {"rope-style"}
    assert "pos-id-dim and rope-theta" in findings[0].message


def test_context_size_above_the_compiled_one_is_rejected(tmp_path: Path) -> None:
    findings = errors(check_bundle(write_bundle(tmp_path / "b", context_size=512)))
    assert rules(findings) == {"context-size"}
    assert "context.size 512 exceeds the compiled context length 256" in findings[0].message


def test_unknown_qnnhtp_key_is_rejected(bundle: Path) -> None:
    edit_json(bundle / "genie_config.json",
              lambda doc: doc["dialog"]["engine"]["backend"]["QnnHtp"].update({"debug-tensors": True}))
    findings = table(errors(check_bundle(bundle)))
    assert rules(findings) == {"unknown-key"} and "'debug-tensors'" in findings[0].message


@pytest.mark.parametrize(("path", "key"), [
    (("dialog", "context"), "n-vocab"), (("dialog", "engine", "backend", "QnnHtp"), "cpu-mask"),
    (("dialog", "engine"), "n-threads"), (("dialog", "tokenizer"), "version"),
])
def test_missing_mandatory_key_is_rejected(bundle: Path, path: tuple[str, ...], key: str) -> None:
    def drop(doc: dict) -> None:
        for part in path:
            doc = doc[part]
        del doc[key]

    edit_json(bundle / "genie_config.json", drop)
    findings = errors(check_bundle(bundle))
    assert "required-keys" in rules(findings)
    assert any(f"{'.'.join(path)} lacks mandatory key {key!r}" in f.message for f in findings)


def test_wrong_types_and_versions_are_rejected(bundle: Path) -> None:
    def break_types(doc: dict) -> None:
        doc["dialog"]["engine"]["backend"]["QnnHtp"]["use-mmap"] = "true"
        doc["dialog"]["context"]["version"] = 2

    edit_json(bundle / "genie_config.json", break_types)
    messages = [f.message for f in errors(check_bundle(bundle))]
    assert any("QnnHtp.use-mmap must be bool" in m for m in messages)
    assert any("dialog.context.version must be 1" in m for m in messages)


def test_graph_name_without_ar_or_cl_is_rejected(tmp_path: Path) -> None:
    infos = synthetic_infos(num_parts=2)
    info = infos["demo_part_1_of_2.bin"]
    renamed = dataclasses.replace(info.graphs[0], name="embedding_1_of_2")
    infos["demo_part_1_of_2.bin"] = dataclasses.replace(info, graphs=(renamed, info.graphs[1]))
    findings = errors(check_bundle(write_bundle(tmp_path / "b", infos)))
    assert "graph-names" in rules(findings)
    assert any("'embedding_1_of_2': no AR in its name" in f.message for f in findings)


def test_input_ids_and_logits_must_be_at_the_ends(tmp_path: Path) -> None:
    infos = synthetic_infos(num_parts=2)
    infos = replace_tensor(infos, "demo_part_2_of_2.bin", "token_ar1_cl256_2_of_2", "logits", name="scores")
    findings = errors(check_bundle(write_bundle(tmp_path / "b", infos)))
    assert rules(findings) == {"io-ends"} and "token_ar1_cl256_2_of_2" in findings[0].message


def test_kv_dim_must_match_the_cache_tensors(bundle: Path) -> None:
    edit_json(bundle / "genie_config.json",
              lambda doc: doc["dialog"]["engine"]["backend"]["QnnHtp"].update({"kv-dim": 32}))
    findings = errors(check_bundle(bundle))
    assert rules(findings) == {"tensor-dims"} and "kv-dim is 32" in findings[0].message


def test_every_finding_names_a_known_rule(bundle: Path) -> None:
    edit_json(bundle / "genie_config.json", lambda doc: doc["dialog"]["context"].update({"size": 9999}))
    (bundle / "demo_part_1_of_3.bin").unlink()
    findings = check_bundle(bundle)
    assert findings and all(f.rule in RULES and f"[{f.rule}]" in str(f) for f in findings)
    with pytest.raises(GenieBuildError, match=r"\[ctx-bins-exist\]"):
        require_valid_bundle(bundle)


def test_manifest_hash_mismatch_is_rejected(bundle: Path) -> None:
    files = {p.name: {"sha256": "0" * 64} for p in bundle.iterdir()}
    (bundle / "manifest.json").write_text(json.dumps({"files": files}))
    assert rules(check_bundle(bundle)) == {"manifest"}


def test_bundle_without_metadata_needs_readable_binaries(bundle: Path) -> None:
    """The fixture's ctx-bins are neither reference containers nor QNN binaries: without metadata.yaml nothing tells
    their graphs, and the finding says which file and why."""
    (bundle / METADATA_NAME).unlink()
    findings = errors(check_bundle(bundle))
    assert rules(findings) == {"graph-info"}
    assert "demo_part_1_of_3.bin" in findings[0].message and "metadata.yaml" in findings[0].message


def test_missing_genie_config_is_one_finding(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    assert [(f.rule, f.severity) for f in check_bundle(tmp_path / "b")] == [("files", "error")]
    assert [f.rule for f in check_bundle(tmp_path / "nothing")] == ["files"]


def vendor_bundle(directory: Path, config_name: str, prompt_ar: int, vocab: int) -> Path:
    """The vendor's genie config and filled-in HTP template, with ctx-bins described by metadata.yaml."""
    config = json.loads((VENDOR / config_name).read_text())
    names = config["dialog"]["engine"]["model"]["binary"]["ctx-bins"]
    infos = synthetic_infos(num_parts=len(names), cl=4096, prompt_ar=prompt_ar, padded=False, hidden=3072,
                            head_dim=128, kv_heads=8, vocab=vocab)
    directory.mkdir(parents=True)
    (directory / "genie_config.json").write_text(json.dumps(config))
    template = (VENDOR / "htp_backend_ext_config.json.template").read_text()
    (directory / "htp_backend_ext_config.json").write_text(template.replace('"<TODO>"', '"v79"')
                                                            .replace("<TODO>", "69"))
    write_tokenizer(directory / "tokenizer.json")
    (directory / METADATA_NAME).write_text(dump_metadata(dict(zip(names, infos.values()))))
    for name in names:
        (directory / name).write_bytes(b"placeholder")
    return directory


def test_vendor_llama_bundle_structure_is_accepted(tmp_path: Path) -> None:
    bundle = vendor_bundle(tmp_path / "llama", "llama_v3_2_3b_instruct.json", 128, 128256)
    assert check_bundle(bundle, chipset="SM8750") == []


def test_vendor_qwen_bundle_is_accepted_with_an_n_vocab_warning(tmp_path: Path) -> None:
    bundle = vendor_bundle(tmp_path / "qwen", "qwen2_5_7b_instruct.json", 128, QWEN_VOCAB)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": QWEN_VOCAB}))
    findings = check_bundle(bundle, hf_config=tmp_path / "config.json")
    assert errors(findings) == []
    assert rules(findings, "warning") == {"n-vocab"}
    assert [f.message for f in findings] == [
        f"context.n-vocab is 131072 but the model's vocab_size ({tmp_path / 'config.json'}) is 152064 wide: Genie "
        "samples only the first n-vocab"]


def vendor_layout_bundle(directory: Path, edit=None) -> Path:
    """The vendor's llama bundle laid out as qairt-dev's directory export writes it (genie_t2t_runner_helper.py):
    genie_config.json at the top, everything else under artifacts/ -- ctx-bins renamed split_model_{i}.bin, the
    tokenizer, an embedding LUT (dialog.embedding), the compile's backend extension under a temp-file name."""
    bundle = vendor_bundle(directory, "llama_v3_2_3b_instruct.json", 128, 128256)
    config = json.loads((bundle / "genie_config.json").read_text())
    old_names = config["dialog"]["engine"]["model"]["binary"]["ctx-bins"]
    new_names = [f"artifacts/split_model_{index}.bin" for index in range(1, len(old_names) + 1)]
    (bundle / "artifacts").mkdir()
    for old, new in zip(old_names, new_names, strict=True):
        (bundle / old).rename(bundle / new)
    metadata = yaml.safe_load((bundle / METADATA_NAME).read_text())
    metadata["model_files"] = {new: metadata["model_files"][old] for old, new in zip(old_names, new_names)}
    for graph in metadata["model_files"][new_names[0]]["graphs"].values():  # the first split takes the LUT's rows
        ids = graph["inputs"].pop("input_ids")
        graph["inputs"] = {"inputs_embeds": {"shape": [*ids["shape"], 3072], "dtype": "uint16"}, **graph["inputs"]}
    (bundle / METADATA_NAME).write_text(yaml.safe_dump(metadata))
    (bundle / "tokenizer.json").rename(bundle / "artifacts" / "tokenizer.json")
    (bundle / "htp_backend_ext_config.json").rename(bundle / "artifacts" / "tmpk2j4x9.json")
    with open(bundle / "artifacts" / "embedding_table.bin", "wb") as table:
        table.truncate(128256 * 3072 * 2)  # ufixed16 [n_vocab][n_embd], sparse: no disk blocks
    dialog = config["dialog"]
    dialog["tokenizer"]["path"] = "artifacts/tokenizer.json"
    dialog["embedding"] = {"version": 1, "type": "lut", "lut-path": "artifacts/embedding_table.bin", "size": 3072,
                           "datatype": "ufixed16", "quant-param": {"scale": 0.0001, "offset": -32768}}
    dialog["engine"]["backend"]["extensions"] = "artifacts/tmpk2j4x9.json"
    dialog["engine"]["model"]["binary"]["ctx-bins"] = new_names
    if edit is not None:
        edit(config)
    (bundle / "genie_config.json").write_text(json.dumps(config))
    return bundle


def test_vendor_directory_layout_is_accepted(tmp_path: Path) -> None:
    assert check_bundle(vendor_layout_bundle(tmp_path / "b"), chipset="SM8750") == []


def test_vendor_qwen_keys_and_rope_types_are_accepted(tmp_path: Path) -> None:
    """The vision models' rope types in the -mrope form Genie 2.51 takes; the bare qwen2vl / qwen3vl (qairt-dev's
    models write them) are refused, naming the type."""
    def qwen_style(config: dict) -> None:
        model = config["dialog"]["engine"]["model"]
        model["linear-attention"] = True
        model["positional-encoding"]["rope-freqs-type"] = "concat"
        model["positional-encoding"]["rope-scaling"] = {"rope-type": "qwen3vl-mrope", "mrope-section": [16, 24, 24]}

    assert check_bundle(vendor_layout_bundle(tmp_path / "b", qwen_style), chipset="SM8750") == []
    for rope_type in ("qwen2vl", "qwen3vl", "qwen2vl-mrope", "qwen3vl-mrope"):
        bundle = vendor_layout_bundle(tmp_path / rope_type, lambda config: config["dialog"]["engine"]["model"][
            "positional-encoding"]["rope-scaling"].update({"rope-type": rope_type}))
        found = table(errors(check_bundle(bundle)))
        assert found == [] if rope_type.endswith("-mrope") else \
            [f"rope-scaling.rope-type {rope_type!r} is not one of" in f.message for f in found] == [True]


@pytest.mark.parametrize(("edit", "rule", "text"), [
    (lambda m: m.update({"linear-attention": "yes"}), "required-keys", "linear-attention must be bool"),
    (lambda m: m["positional-encoding"]["rope-scaling"].update({"rope-type": "yarn"}), "required-keys",
     "rope-type 'yarn' is not one of"),
    (lambda m: m.update({"sliding-window": 4096}), "unknown-key", "'sliding-window'"),
    (lambda m: m["binary"].update({"fcb": ["artifacts/model.dlc"]}), "required-keys", "exactly one of"),
    (lambda m: m["binary"].pop("ctx-bins"), "required-keys", "exactly one of"),
    (lambda m: m["binary"].update({"ctx-bins": ["/abs/split_model_1.bin"]}), "ctx-bins-exist", "relative path"),
    (lambda m: m["binary"].update({"ctx-bins": ["../split_model_1.bin"]}), "ctx-bins-exist", "relative path"),
])
def test_vendor_layout_still_rejects_what_genie_rejects(tmp_path: Path, edit, rule, text) -> None:
    bundle = vendor_layout_bundle(tmp_path / "b", lambda config: edit(config["dialog"]["engine"]["model"]))
    findings = errors(check_bundle(bundle))
    assert rule in rules(findings) and any(text in f.message for f in findings if f.rule == rule), findings


def test_unlisted_bin_beside_the_listed_ctx_bins_is_rejected(tmp_path: Path) -> None:
    bundle = vendor_layout_bundle(tmp_path / "b")
    (bundle / "artifacts" / "split_model_4.bin").write_bytes(b"stale")
    findings = errors(check_bundle(bundle))
    assert [(f.rule, f.message) for f in findings] == [
        ("ctx-bins-listed", "artifacts/split_model_4.bin is in the bundle but not listed in ctx-bins")]


def test_fcb_bundle_is_accepted_with_a_warning_that_ctx_bin_checks_do_not_apply(tmp_path: Path) -> None:
    def multi_soc(config: dict) -> None:
        config["dialog"]["engine"]["model"]["binary"] = {"version": 1, "fcb": ["artifacts/model.dlc"]}

    bundle = vendor_layout_bundle(tmp_path / "b", multi_soc)
    for path in (bundle / "artifacts").glob("split_model_*.bin"):
        path.unlink()
    (bundle / METADATA_NAME).unlink()
    findings = check_bundle(bundle)
    assert errors(findings) == []
    assert [(f.rule, f.severity) for f in findings] == [("ctx-bins-exist", "warning")]


def test_check_bundle_command_exits_non_zero_on_errors(bundle: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "report.json"
    assert main(["check-bundle", str(bundle), "--chipset", "SM8750", "--out", str(report)]) == 0
    assert "0 errors, 0 warnings" in capsys.readouterr().out
    assert json.loads(report.read_text())["errors"] == 0
    report.unlink()
    shutil.copy(bundle / "demo_part_1_of_3.bin", bundle / "extra.bin")
    assert main(["check-bundle", str(bundle), "--out", str(report)]) == 1
    assert "error [ctx-bins-listed] extra.bin" in capsys.readouterr().out
    assert not report.exists()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.lists(st.sampled_from(["dialog", "context", "engine", "backend", "QnnHtp", "model", "binary",
                                      "ctx-bins", "size", "tokenizer", "path", "n-vocab"]), min_size=1, max_size=5),
       value=st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                          max_leaves=5))
def test_malformed_configs_give_findings_not_tracebacks(bundle: Path, path: list[str], value: object) -> None:
    original = bundle / "genie_config.original"  # the fixture's bundle is shared by all examples
    if not original.exists():
        shutil.copy(bundle / "genie_config.json", original)
    document = json.loads(original.read_text())
    node = document
    for key in path[:-1]:
        child = node.get(key) if isinstance(node, dict) else None
        if not isinstance(child, dict):
            break
        node = child
    node[path[-1]] = value
    (bundle / "genie_config.json").write_text(json.dumps(document))
    assert all(isinstance(f, Finding) for f in check_bundle(bundle))


def test_demo_hf_config_gives_no_vocab_warning(bundle: Path, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(demo_hf_config()))
    assert check_bundle(bundle, hf_config=tmp_path / "config.json") == []


def aihm_metadata(infos: dict, shifted: tuple[str, str] | None = None) -> str:
    """AIHM's metadata.yaml layout: IO per ctx-bin (here the prompt graph's), quantization as scale/zero_point;
    ``shifted`` = (ctx-bin, tensor) whose zero point is off by one in that ctx-bin only."""
    def tensors(file_name: str, items) -> dict:
        return {t.name: {"shape": list(t.shape), "dtype": t.dtype,
                         **({"quantization_parameters": {"scale": t.quant.scale, "zero_point": -t.quant.offset
                                                         + ((file_name, t.name) == shifted)}}
                            if t.quant else {})} for t in items}

    return yaml.safe_dump({"model_files": {name: {"inputs": tensors(name, info.graphs[0].inputs),
                                                  "outputs": tensors(name, info.graphs[0].outputs)}
                                           for name, info in infos.items()}})


def test_aihm_metadata_layout_gets_the_tensor_checks_and_a_warning(tmp_path: Path) -> None:
    infos = synthetic_infos(num_parts=3)
    bundle = write_bundle(tmp_path / "b", infos)
    (bundle / METADATA_NAME).write_text(aihm_metadata(infos))
    findings = check_bundle(bundle)
    assert errors(findings) == [] and rules(findings, "warning") == {"graph-info"}
    (bundle / METADATA_NAME).write_text(aihm_metadata(infos, ("demo_part_2_of_3.bin",
                                                              "/model/embed_tokens/Gather_output_0")))
    assert rules(check_bundle(bundle)) == {"shared-quant"}


def test_a_2d_mask_is_read_as_genie_reads_it_and_worded_as_genie_needs(tmp_path: Path) -> None:
    """The HF dynamo export's ``attention_mask [1, CL]`` in a middle part: Genie reads AR 1 from it (elements /
    largest dim), so the prompt graph lands beside the token graph; every finding says so in Genie's terms."""
    infos = replace_tensor(synthetic_infos(num_parts=3), "demo_part_2_of_3.bin", "prompt_ar32_cl256_2_of_3",
                           "attention_mask", shape=(1, 256))
    findings = errors(check_bundle(write_bundle(tmp_path / "b", infos)))
    messages = {f.rule: [g.message for g in findings if g.rule == f.rule] for f in findings}
    assert messages["graph-names"] == [
        "graph 'prompt_ar32_cl256_2_of_3': Genie reads AR 1 from attention_mask [1, 256] (its elements / its "
        "largest dim), but the name says AR 32; Genie needs attention_mask [1, AR, CL] = [1, 32, 256]"]
    assert messages["graph-order"][:1] == [
        "AR 1, CL 256: a ctx-bin holds more than one graph Genie reads as AR 1, CL 256 (prompt_ar32_cl256_2_of_3, "
        "token_ar1_cl256_2_of_3); Genie stops with 'duplicate graph found'"]
    # read as AR 1, the prompt graph's cache and boundary shapes are what Genie's validateModel then rejects
    assert messages["graph-order"][1:] == ["AR 32, CL 256: graphs in 2 of 3 ctx-bins; every part needs one"]
    assert any(m.startswith("graph 'prompt_ar32_cl256_2_of_3': past_value_0_out is [1, 2, 32, 16]")
               and "Genie takes only the 1 new token" in m for m in messages["tensor-shapes"])
    assert "graph-names" not in rules(check_bundle(write_bundle(tmp_path / "ok", synthetic_infos(num_parts=3))))


def test_tensor_shapes_rule_uses_the_contract(tmp_path: Path) -> None:
    infos = replace_tensor(synthetic_infos(num_parts=3), "demo_part_3_of_3.bin", "token_ar1_cl256_3_of_3",
                           "past_value_1_out", shape=(1, 2, 256, 16))
    findings = errors(check_bundle(write_bundle(tmp_path / "b", infos)))
    assert rules(findings) == {"tensor-shapes"} and len(findings) == 1
    assert findings[0].message == (
        "graph 'token_ar1_cl256_3_of_3': past_value_1_out is [1, 2, 256, 16] (Genie reads it as [2, 256, 16]): it "
        "holds the whole cache, 256 entries where Genie takes only the 1 new token; Genie needs [*, AR, kv_dim] = "
        "[*, 1, 16] (kv_dim = head dim 16)")


# --- hostile bundles: read only regular files inside the bundle, bounded, never a link out --------------------

def check_bundle_command(bundle: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m genie_build check-bundle`` as a user runs it, with 60 s and 4 GB of address space: a checker that
    follows /dev/zero, waits on a FIFO or allocates a header's claimed length fails here instead of taking the box."""
    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 * 1024**3, 4 * 1024**3))

    return subprocess.run([sys.executable, "-m", "genie_build", "check-bundle", str(bundle), *args],
                          capture_output=True, text=True, timeout=60, preexec_fn=limit_memory)


def finding_lines(result: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return [line for line in result.stdout.splitlines() if line.startswith(("error ", "warning "))]


def replace_with(path: Path, kind: str) -> None:
    """Swap a bundle file for a hostile stand-in: a link to /dev/zero, a FIFO, or a sparse file of 2**40 bytes."""
    path.unlink()
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        with open(path, "wb") as handle:
            handle.truncate(2**40)


@pytest.mark.parametrize("name", ["genie_config.json", "manifest.json", "metadata.yaml", "tokenizer.json",
                                  "htp_backend_ext_config.json", "demo_part_2_of_3.bin"])
@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "huge"])
def test_a_hostile_stand_in_for_any_bundle_file_is_a_finding_in_bounded_time_and_memory(
        bundle: Path, name: str, kind: str) -> None:
    (bundle / "manifest.json").write_text(json.dumps({"files": {}}))
    replace_with(bundle / name, kind)
    result = check_bundle_command(bundle)
    assert result.returncode == 1
    lines = finding_lines(result)
    assert lines and lines[0].startswith("error [") and name in "\n".join(lines), lines


def test_a_ctx_bin_header_claiming_2_to_the_40_bytes_is_refused_before_it_is_read(bundle: Path) -> None:
    from genie_build.toolchains.reference.container_format import FORMAT_VERSION, MAGIC, PREAMBLE
    (bundle / METADATA_NAME).unlink()  # graphs then come from the containers themselves
    for path in bundle.glob("*.bin"):
        path.write_bytes(PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0, 2**40) + b"{}")
    lines = finding_lines(check_bundle_command(bundle))
    assert len(lines) == 3 and all(line.startswith("error [graph-info] ") for line in lines)
    assert lines[0] == (f"error [graph-info] demo_part_1_of_3.bin: its header length {2**40} is more than the file "
                        "holds (26 bytes) or than a header may have (268435456); without metadata.yaml the graph checks "
                        "need the binaries themselves")


def test_links_out_of_the_bundle_are_findings_and_never_followed(bundle: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("demo_part_2_of_3.bin", "tokenizer.json"):
        (bundle / name).rename(outside / name)
        (bundle / name).symlink_to(outside / name)
    lines = finding_lines(check_bundle_command(bundle))
    assert f"error [ctx-bins-exist] ctx-bin 'demo_part_2_of_3.bin' resolves to {outside / 'demo_part_2_of_3.bin'}, " \
           f"outside {bundle}: nothing outside the folder is read" in lines
    assert any(line.startswith("error [files] tokenizer file 'tokenizer.json' (dialog.tokenizer.path) resolves to "
                               f"{outside / 'tokenizer.json'}, outside") for line in lines), lines


@pytest.mark.parametrize("path", ["/etc/hostname", "../secret.txt", "../../etc/hostname"])
@pytest.mark.parametrize("key", ["dialog.tokenizer.path", "dialog.engine.backend.extensions"])
def test_tokenizer_and_extension_paths_must_stay_inside_the_bundle(bundle: Path, key: str, path: str) -> None:
    def point_outside(config: dict) -> None:
        *parents, last = key.split(".")
        node = config
        for part in parents:
            node = node[part]
        node[last] = path

    edit_json(bundle / "genie_config.json", point_outside)
    lines = finding_lines(check_bundle_command(bundle))
    assert any(f"{path!r} ({key}) must be a relative path inside the bundle" in line for line in lines), lines


def test_a_manifest_cannot_confirm_a_guess_about_a_file_outside_the_bundle(bundle: Path, tmp_path: Path) -> None:
    """Listing an outside file with its true or a false hash gives the same finding: nothing outside is read."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the guess")
    outcomes = []
    for digest in (hashlib.sha256(b"the guess").hexdigest(), "0" * 64):
        for name in ("../secret.txt", str(secret)):
            (bundle / "manifest.json").write_text(json.dumps({"files": {name: {"sha256": digest}}}))
            outcomes.append([line for line in finding_lines(check_bundle_command(bundle)) if "[manifest]" in line
                             and "secret" in line])
    assert outcomes[0] == outcomes[2] and outcomes[1] == outcomes[3]
    assert outcomes[0] == ["error [manifest] manifest.json lists '../secret.txt', which must be a relative path inside "
                           "the bundle"]


def test_n_vocab_wider_than_the_logits_is_an_error_and_a_tokenizer_id_past_them_too(bundle: Path, tmp_path: Path
                                                                                  ) -> None:
    """n-vocab 4096 for 64 logits: the bundle would fail when run (the field's 'n-vocab: 4096 for 2048 logits')."""
    edit_json(bundle / "genie_config.json", lambda config: config["dialog"]["context"].update({"n-vocab": 4096}))
    lines = finding_lines(check_bundle_command(bundle))
    assert "error [n-vocab] context.n-vocab is 4096 but the logits of graph 'prompt_ar32_cl256_3_of_3' is 64 wide: " \
           "Genie would read past them" in lines
    edit_json(bundle / "genie_config.json", lambda config: config["dialog"]["context"].update({"n-vocab": 64}))
    write_tokenizer(bundle / "tokenizer.json", 65)
    assert finding_lines(check_bundle_command(bundle)) == [
        "error [n-vocab] tokenizer token 'w64' has id 64, beyond the logits' 64 entries"]


def test_metadata_with_yaml_aliases_is_refused_before_it_is_walked(bundle: Path) -> None:
    levels = ["a0: &a0 [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    (bundle / METADATA_NAME).write_text("\n".join(levels) + "\nmodel_files: {x: {inputs: *a8, outputs: *a8}}\n")
    assert finding_lines(check_bundle_command(bundle)) == [
        "error [graph-info] metadata.yaml: uses a YAML alias (*name): metadata.yaml must spell every entry out"]


def test_parts_holding_their_graphs_at_several_context_lengths_pass(tmp_path: Path) -> None:
    infos = synthetic_infos(cls=(128, 256))
    assert {graph.name for graph in infos["demo_part_2_of_3.bin"].graphs} == {
        "prompt_ar32_cl128_2_of_3", "token_ar1_cl128_2_of_3", "prompt_ar32_cl256_2_of_3", "token_ar1_cl256_2_of_3"}
    assert check_bundle(write_bundle(tmp_path / "bundle", infos)) == []


def test_a_part_missing_a_context_length_is_rejected(tmp_path: Path) -> None:
    infos = synthetic_infos(cls=(128, 256))
    part = infos["demo_part_2_of_3.bin"]
    infos["demo_part_2_of_3.bin"] = dataclasses.replace(part, graphs=tuple(g for g in part.graphs
                                                                            if "_cl128_" not in g.name))
    found = errors(check_bundle(write_bundle(tmp_path / "bundle", infos)))
    assert [(f.rule, f.message) for f in found] == [
        ("graph-order", f"AR {ar}, CL 128: graphs in 2 of 3 ctx-bins; every part needs one") for ar in (1, 32)]


def test_two_graphs_of_one_ar_and_cl_in_a_ctx_bin_are_rejected(tmp_path: Path) -> None:
    infos = synthetic_infos(cls=(128, 256))
    part = infos["demo_part_2_of_3.bin"]
    twin = next(g for g in part.graphs if g.name == "token_ar1_cl128_2_of_3")
    infos["demo_part_2_of_3.bin"] = dataclasses.replace(part, graphs=(*part.graphs, dataclasses.replace(
        twin, name="token_ar1_cl128_2_of_3_copy")))
    messages = [f.message for f in errors(check_bundle(write_bundle(tmp_path / "bundle", infos)))
                if f.rule == "graph-order"]
    assert messages == ["AR 1, CL 128: a ctx-bin holds more than one graph Genie reads as AR 1, CL 128 "
                        "(token_ar1_cl128_2_of_3, token_ar1_cl128_2_of_3_copy); Genie stops with "
                        "'duplicate graph found'"]


@pytest.mark.parametrize("switching, severity", [(True, ["error"]), (False, []), (None, [])])
def test_graph_switching_with_shared_resources_is_an_error(tmp_path: Path, switching, severity) -> None:
    bundle = write_bundle(tmp_path / "bundle", synthetic_infos(cls=(128, 256)))
    edit_json(bundle / "htp_backend_ext_config.json", lambda c: c.update(groupContext={"share_resources": True}))

    def qnn_htp(config: dict) -> None:
        section = config["dialog"]["engine"]["backend"]["QnnHtp"]
        section["allow-async-init"] = True
        if switching is not None:
            section["enable-graph-switching"] = switching

    edit_json(bundle / "genie_config.json", qnn_htp)
    found = [f for f in check_bundle(bundle) if f.rule == "htp-extensions"]
    assert [f.severity for f in found] == severity
    assert all("groupContext.share_resources is true and so is QnnHtp enable-graph-switching" in f.message
               for f in found)


def test_graph_switching_must_be_a_bool(bundle: Path) -> None:
    edit_json(bundle / "genie_config.json",
              lambda c: c["dialog"]["engine"]["backend"]["QnnHtp"].update({"enable-graph-switching": "yes"}))
    assert [(f.rule, f.message) for f in table(check_bundle(bundle))] == [
        ("required-keys", "dialog.engine.backend.QnnHtp.enable-graph-switching must be bool, got 'yes'")]
