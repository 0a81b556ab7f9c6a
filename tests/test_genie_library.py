"""The vendor's own libraries judge a bundle's configs (the onnxruntime-qnn wheel: libGenie of Genie 2.51 and the HTP
extensions library): every config genie-build writes passes them; every case they refuse fails check-bundle naming the
key, by them and by genie-build's own key table, which agrees with the schemas they embed (read from the installed
libraries here, never stored); Genie's sampler shows why a greedy flag is not enough; and without the wheel
check-bundle says in one line what it skipped."""

from __future__ import annotations

import copy
import ctypes
import json
import os
import re
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime_qnn")

from bundle_helpers import demo_hf_config, edit_json, write_bundle, write_tokenizer  # noqa: E402
from genie_build import qnn_wheel  # noqa: E402
from genie_build.bundle.check_bundle import check_bundle  # noqa: E402
from genie_build.bundle.check_vendor import EXTENSIONS_RULE, GENIE_RULE, RULES as VENDOR_RULES  # noqa: E402
from genie_build.chipsets import CHIPSETS, lookup  # noqa: E402
from genie_build.cli import main  # noqa: E402
from genie_build.bundle.embedding_table import TableEncoding, dialog_embedding  # noqa: E402
from genie_build.genie_config import (GENIE_CONFIG_SECTIONS, GENIE_ROPE_TYPES, ROPE_SCALING_TYPES,  # noqa: E402
                                      make_genie_config, make_htp_backend_ext_config)
from genie_build.htp_extensions import (CONTEXT_KEYS, CORE_KEYS, GROUP_CONTEXT_KEYS, MEMORY_TYPES,  # noqa: E402
                                        PERF_PROFILES)
from genie_build.qnn_wheel import backend_extensions, genie  # noqa: E402
from genie_build.toolchains.base import CompileOptions  # noqa: E402
from genie_build.toolchains.qnn_sdk import backend_extension_config  # noqa: E402

KEY_RULES = {"files", "required-keys", "unknown-key", "rope-style", "htp-extensions", "chipset"}
LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
LONGROPE = {"rope_type": "longrope", "long_factor": [1.5] * 8, "short_factor": [1.0] * 8}
HEAD_DIM_16 = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 4096,
               "original_max_position_embeddings": 1024}


def schemas_in(library: Path) -> list[dict]:
    """The JSON schemas a library embeds, read from its bytes: each a NUL-terminated JSON document declaring
    ``$schema`` (other strings that mention it are not JSON)."""
    data = library.read_bytes()
    found = []
    for match in re.finditer(rb'"\$schema"', data):
        start, end = data.rfind(b"\0", 0, match.start()) + 1, data.find(b"\0", match.start())
        try:
            found.append(json.loads(data[start:end]))
        except ValueError:
            continue
    return found


@cache
def genie_schemas() -> dict[str, dict]:
    return {schema["$id"]: schema for schema in schemas_in(qnn_wheel.library_path(genie.LIBRARY)) if "$id" in schema}


@cache
def extension_schema() -> dict:
    (schema,) = schemas_in(qnn_wheel.library_path(backend_extensions.LIBRARY))
    return schema


def refusal(config: dict) -> genie.GenieRefusal | None:
    return genie.load_genie().dialog_config_refusal(json.dumps(config))


def library_errors(ext_config: dict) -> tuple[str, ...]:
    return backend_extensions.load_htp_extensions().extension_errors(json.dumps(ext_config).encode(), "ext.json")


def bundle_with(tmp_path: Path, config: dict | None = None) -> Path:
    bundle = write_bundle(tmp_path / "bundle")
    if config is not None:
        (bundle / "genie_config.json").write_text(json.dumps(config, indent=2))
    return bundle


def key_findings(bundle: Path, rules: set[str]) -> list:
    return [f for f in check_bundle(bundle, chipset="SM8750") if f.rule in rules and f.severity == "error"]


# --------------------------------------------------------------------------- every config genie-build writes

def _written(tokenizer: Path, hf: dict | None = None, **options) -> dict:
    return make_genie_config({**demo_hf_config(), **(hf or {})}, tokenizer, ["demo_part_1_of_2.bin",
                                                                            "demo_part_2_of_2.bin"],
                             options.pop("context_size", 256), **options)


WRITTEN = {
    "plain": {},
    "eos list": {"hf": {"eos_token_id": [3, 2]}},
    "short and long context": {"context_size": 64},
    "long context": {"context_size": 32768},
    "llama3": {"hf": {"rope_scaling": LLAMA3}},
    "longrope": {"hf": {**HEAD_DIM_16, "model_type": "phi3", "rope_scaling": LONGROPE}},
    "linear": {"hf": {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}},
    "yarn": {"hf": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                     "original_max_position_embeddings": 4096, "attention_factor": 1.1}}},
    "fractional theta": {"hf": {"rope_theta": 10000.5}},
    "table ufixed16": {"embedding": dialog_embedding(64, TableEncoding(16, 2.5e-4, -32768))},
    "table ufixed8": {"embedding": dialog_embedding(64, TableEncoding(8, 0.01, -128))},
    "table float32": {"embedding": dialog_embedding(64, TableEncoding(32))},
    "graph switching": {"graph_switching": True},
    "no graph switching": {"graph_switching": False},
    "share resources": {"share_resources": True},
    "threads": {"n_threads": 6},
}


@pytest.mark.parametrize("variant", WRITTEN)
def test_every_genie_config_genie_build_writes_passes_genie_and_the_key_table(tmp_path, variant):
    options = copy.deepcopy(WRITTEN[variant])
    config = _written(write_tokenizer(tmp_path / "tokenizer.json"), options.pop("hf", None), **options)
    assert refusal(config) is None
    assert key_findings(bundle_with(tmp_path, config), KEY_RULES | {GENIE_RULE}) == []


# --------------------------------------------------------------------------- what Genie refuses

def _set(path: str, value: object):
    def edit(config: dict) -> None:
        *parents, key = path.split(".")
        target = config
        for parent in parents:
            target = target.setdefault(parent, {})
        target[key] = value
    return edit


def _drop(path: str):
    def edit(config: dict) -> None:
        *parents, key = path.split(".")
        target = config
        for parent in parents:
            target = target[parent]
        del target[key]
    return edit


QNN_HTP = "dialog.engine.backend.QnnHtp"
ROPE = "dialog.engine.model.positional-encoding"
EMBEDDING = {"version": 1, "size": 64, "type": "lut", "lut-path": "embedding_table.bin", "datatype": "float32"}
REFUSED = {  # name -> (edit, what the key table's finding names)
    "rope type qwen2vl": (_set(f"{ROPE}.rope-scaling", {"rope-type": "qwen2vl"}), "'qwen2vl'"),
    "rope type qwen3vl": (_set(f"{ROPE}.rope-scaling", {"rope-type": "qwen3vl"}), "'qwen3vl'"),
    "fractional spill-fill-bufsize": (_set(f"{QNN_HTP}.spill-fill-bufsize", 0.5), "spill-fill-bufsize"),
    "negative spill-fill-bufsize": (_set(f"{QNN_HTP}.spill-fill-bufsize", -1), "spill-fill-bufsize"),
    "fractional mmap-budget": (_set(f"{QNN_HTP}.mmap-budget", 1.5), "mmap-budget"),
    "integral float mmap-budget": (_set(f"{QNN_HTP}.mmap-budget", 1.0), "mmap-budget"),
    "negative mmap-budget": (_set(f"{QNN_HTP}.mmap-budget", -4096), "mmap-budget"),
    "engine role in a basic dialog": (_set("dialog.engine.role", "primary"), "'role'"),
    "NaN": (_set("dialog.sampler.temp", float("nan")), "dialog.sampler.temp"),
    "Infinity": (_set(f"{ROPE}.rope-theta", float("inf")), f"{ROPE}.rope-theta"),
    "-Infinity deep in a list": (_set(f"{ROPE}.rope-scaling", {"rope-type": "longrope", "long-factor": [1.0, -1e999]}),
                                 "rope-scaling.long-factor[1]"),
    "embedding version 2": (_set("dialog.embedding", {**EMBEDDING, "version": 2}), "dialog.embedding.version"),
    "embedding unknown key": (_set("dialog.embedding", {**EMBEDDING, "stride": 64}), "'stride'"),
    "unknown top-level key": (_set("dialogue", {}), "'dialogue'"),
    "unknown QnnHtp key": (_set(f"{QNN_HTP}.debug-tensors", True), "'debug-tensors'"),
    "context size as a string": (_set("dialog.context.size", "256"), "dialog.context.size"),
    "context without n-vocab": (_drop("dialog.context.n-vocab"), "'n-vocab'"),
    "negative top-k": (_set("dialog.sampler.top-k", -1), "dialog.sampler.top-k"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_config_genie_refuses_fails_check_bundle_by_genie_and_by_the_key_table_naming_the_key(tmp_path, case):
    edit, named = REFUSED[case]
    bundle = bundle_with(tmp_path)
    edit_json(bundle / "genie_config.json", edit)
    by_genie = key_findings(bundle, {GENIE_RULE})
    by_table = key_findings(bundle, KEY_RULES)
    assert by_genie and all(f.message.startswith("Genie refuses genie_config.json (") for f in by_genie), by_genie
    assert any(named in f.message for f in by_table), by_table
    assert main(["check-bundle", str(bundle)]) == 1


def test_genies_reason_is_one_line_naming_the_key(tmp_path):
    bundle = bundle_with(tmp_path)
    edit_json(bundle / "genie_config.json", _set(f"{QNN_HTP}.spill-fill-bufsize", -1))
    assert [f.message for f in key_findings(bundle, {GENIE_RULE})] == [
        "Genie refuses genie_config.json (refused by Genie's schema): dialog.engine.backend.QnnHtp.spill-fill-bufsize: "
        "instance is below minimum of 0"]


ACCEPTED = {  # keys Genie 2.51 takes that genie-build does not write
    "allow-async-enqueue": _set(f"{QNN_HTP}.allow-async-enqueue", True),
    "batch-multiplier": _set(f"{QNN_HTP}.batch-multiplier", 2),
    "direct-io": _set(f"{QNN_HTP}.direct-io", False),
    "execute-select-graphs": _set(f"{QNN_HTP}.execute-select-graphs", ["prompt_ar32_cl256_1_of_2"]),
    "graph-retention-order": lambda c: (_set(f"{QNN_HTP}.enable-graph-switching", True)(c),
                                        _set(f"{QNN_HTP}.graph-retention-order", [])(c)),
    "multi-nsp-prefill": _set(f"{QNN_HTP}.multi-nsp-prefill", False),
    "context embedding-length": _set("dialog.context.embedding-length", 64),
    "context eot-token": _set("dialog.context.eot-token", 2),
    "engine batching": _set("dialog.engine.batching", {}),
    "positional-encoding prefix": _set(f"{ROPE}.prefix", "past_"),
    "positional-encoding type none": _set(ROPE, {"type": "none"}),
    "partial-rotary-factor": _set(f"{ROPE}.rope-scaling", {"rope-type": "default", "partial-rotary-factor": 1.0}),
    "rope type qwen2vl-mrope": _set(f"{ROPE}.rope-scaling", {"rope-type": "qwen2vl-mrope", "mrope-section": [2, 3, 3]}),
    "rope type proportional": _set(f"{ROPE}.rope-scaling", {"rope-type": "proportional", "factor": 2.0}),
    "max-num-tokens and stop-sequence": lambda c: c["dialog"].update({"max-num-tokens": 64, "stop-sequence": ["\n"]}),
    "sampler greedy with top-k 1": _set("dialog.sampler", {"version": 1, "greedy": True, "top-k": 1}),
}


@pytest.mark.parametrize("case", ACCEPTED)
def test_the_keys_genie_accepts_pass_the_key_table(tmp_path, case):
    bundle = bundle_with(tmp_path)
    edit_json(bundle / "genie_config.json", ACCEPTED[case])
    assert refusal(json.loads((bundle / "genie_config.json").read_text())) is None
    assert key_findings(bundle, KEY_RULES | {GENIE_RULE}) == []


# --------------------------------------------------------------------------- the key table is Genie's schemas

SCHEMA_OF = {  # section -> (schema id, path inside it)
    "dialog": ("urn:genie:schema:dialog", ()),
    "dialog.context": ("urn:genie:schema:dialogContext", ()),
    "dialog.sampler": ("urn:genie:schema:sampler", ()),
    "dialog.tokenizer": ("urn:genie:schema:dialog", ("definitions", "tokenizer")),
    "dialog.engine": ("urn:genie:schema:dialog", ("definitions", "dialogEngineNode")),
    "dialog.engine.backend": ("urn:genie:schema:dialog", ("definitions", "dialogBackend")),
    "dialog.engine.backend.QnnHtp": ("urn:genie:schema:htpBackend", ()),
    "dialog.engine.model": ("urn:genie:schema:dialog", ("definitions", "dialogModel")),
    "dialog.engine.model.binary": ("urn:genie:schema:dialog", ("definitions", "dialogModelBinary")),
    "dialog.engine.model.positional-encoding": ("urn:genie:schema:enginePositionalEncoding", ("definitions", "item")),
    "dialog.engine.model.positional-encoding.rope-scaling": ("urn:genie:schema:enginePositionalEncoding",
                                                             ("definitions", "ropeScaling")),
    "dialog.embedding": ("urn:genie:schema:tokenEmbedding", ()),
}
# What Genie's schemas allow only with another dialog type, backend type or model type than genie-build checks
# (the schemas' allOf branches), and the role it forbids in a basic dialog.
OTHER_TYPES = {"dialog": {"ssd-q1", "lade", "spd", "kv-share", "multistream", "eaglet"},
               "dialog.engine": {"role"}, "dialog.engine.backend": {"QnnGenAiTransformer", "GTE", "QnnGpu"},
               "dialog.engine.model": {"library", "scopgpt-gguf", "checkpoint"}}


# Where the key table takes less than Genie, and why
NARROWER = {("dialog.engine.backend", "extensions"): "str"}  # Genie also takes a list; genie-build checks one file


def _schema_node(where: str) -> tuple[str, dict]:
    schema_id, path = SCHEMA_OF[where]
    node = genie_schemas()[schema_id]
    for step in path:
        node = node[step]
    return schema_id, node


def _resolved(prop: dict, base: str) -> dict:
    """A property with its ``$ref`` followed (``#/...`` within ``base``, ``urn:...#/...`` in another schema), and an
    ``allOf`` by its first member (Genie's dialog narrows the QnnHtp schema so)."""
    while "$ref" in prop or "allOf" in prop and "type" not in prop:
        if "$ref" not in prop:
            prop = prop["allOf"][0]
            continue
        target, _, pointer = prop["$ref"].partition("#")
        base = target or base
        prop = genie_schemas()[base]
        for step in filter(None, pointer.split("/")):
            prop = prop[step]
    return prop


def _type_name(prop: dict) -> str | None:
    """The key table's name of a schema property's type (None: a type the table does not spell)."""
    kind, minimum = prop.get("type"), prop.get("minimum")
    if kind == ["integer", "array"]:
        return "int|int[]"
    if kind == "array" and prop.get("items", {}).get("type") == "string":
        return "str[]"
    names = {"integer": "int", "number": "number", "boolean": "bool", "string": "str", "object": "object"}
    if kind in ("integer", "number") and minimum == 0:
        return f"{names[kind]} >= 0"
    return names.get(kind) if isinstance(kind, str) else None


@pytest.mark.parametrize("where", SCHEMA_OF)
def test_the_key_table_knows_requires_and_types_the_keys_as_genies_embedded_schema(where):
    section, (schema_id, node) = GENIE_CONFIG_SECTIONS[where], _schema_node(where)
    assert set(GENIE_CONFIG_SECTIONS) == set(SCHEMA_OF)
    assert node.get("additionalProperties") is False or where == "dialog.engine.backend.QnnHtp" and \
        genie_schemas()["urn:genie:schema:htpBackend"]["additionalProperties"] is False
    properties = node["properties"]
    assert section.known == set(properties) - OTHER_TYPES.get(where, set())
    assert section.mandatory >= set(node.get("required", ()))  # genie-build may require more (QnnHtp, binary)
    for key, kind in section.types.items():
        expected = NARROWER.get((where, key)) or _type_name(_resolved(properties[key], schema_id))
        assert kind.name == expected, (where, key, properties[key])


def test_the_rope_types_are_genies_and_the_writer_gives_only_those():
    enum = _schema_node("dialog.engine.model.positional-encoding.rope-scaling")[1]["properties"]["rope-type"]["enum"]
    assert set(ROPE_SCALING_TYPES) == set(enum) and set(GENIE_ROPE_TYPES.values()) <= set(enum)


# --------------------------------------------------------------------------- greedy: what Genie's sampler does

def _draws(sampler: dict, logits: np.ndarray, times: int = 24) -> list[int]:
    """Tokens Genie's own sampler (a standalone sampler of libGenie) draws from ``logits``, ``times`` times."""
    library = ctypes.CDLL(str(qnn_wheel.library_path(genie.LIBRARY)))
    config = {"standalone-sampler": {"version": 1, "sampler": sampler, "context": {
        "version": 1, "size": 256, "n-vocab": len(logits), "bos-token": 0, "eos-token": 1}}}
    handle, created = ctypes.c_void_p(), ctypes.c_void_p()
    assert library.GenieSamplerConfig_createFromJson(json.dumps(config).encode(), ctypes.byref(handle)) == 0
    assert library.GenieSampler_create(handle, ctypes.byref(created)) == 0
    drawn: list[int] = []
    callback = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.POINTER(ctypes.c_int32), ctypes.c_void_p,
                                ctypes.c_void_p)(lambda count, tokens, probabilities, data: drawn.append(tokens[0]))
    layout = json.dumps({"dimensions": [1, len(logits)], "data-type": "float32"}).encode()
    for _ in range(times):
        values = logits.copy()  # the sampler works in place
        assert library.GenieSampler_sampleData(created, values.ctypes.data_as(ctypes.c_void_p),
                                               ctypes.c_size_t(values.nbytes), layout, callback, None) == 0
    library.GenieSampler_free(created)
    library.GenieSamplerConfig_free(handle)
    return drawn


def test_genie_ignores_greedy_and_only_top_k_1_or_temp_0_pick_the_most_likely_token():
    logits = (np.random.default_rng(0).normal(size=64) * 2).astype(np.float32)
    bundle_sampler = {"version": 1, "seed": 42, "temp": 0.8, "top-k": 40, "top-p": 0.95}
    sampled = _draws(bundle_sampler, logits)
    assert set(sampled) != {int(logits.argmax())}
    assert _draws({**bundle_sampler, "greedy": True}, logits) == sampled  # the flag changes nothing
    assert set(_draws({**bundle_sampler, "top-k": 1}, logits)) == {int(logits.argmax())}
    assert set(_draws({**bundle_sampler, "temp": 0}, logits)) == {int(logits.argmax())}


@pytest.mark.parametrize(("sampler", "flagged"), [
    ({"greedy": True}, True), ({"greedy": True, "top-k": 1}, False), ({"greedy": True, "temp": 0}, False),
    ({"greedy": False}, False), ({}, False)])
def test_a_greedy_sampler_genie_would_not_honour_is_flagged(tmp_path, sampler, flagged):
    bundle = bundle_with(tmp_path)
    edit_json(bundle / "genie_config.json", lambda c: c["dialog"]["sampler"].update(sampler))
    found = [f for f in check_bundle(bundle) if f.rule == "sampler"]
    assert [f.severity for f in found] == (["warning"] if flagged else [])
    assert not flagged or "Genie ignores it and samples (temp 0.8, top-k 40, top-p 0.95): deterministic output " \
                          "needs top-k 1" in found[0].message


# --------------------------------------------------------------------------- htp_backend_ext_config.json

@pytest.mark.parametrize("chipset", sorted(CHIPSETS))
def test_every_extension_config_genie_build_writes_is_read_cleanly_by_the_library(chipset):
    for share in (False, True):
        assert library_errors(make_htp_backend_ext_config(chipset, share_resources=share)) == ()


@pytest.mark.parametrize("options", [dict(weights_packing=True, optimization_type=3, weight_sharing_enabled=True,
                                          vtcm_mb=0), dict(weights_packing=False, optimization_type=2,
                                                           weight_sharing_enabled=False, vtcm_mb=8)])
def test_the_compile_time_extension_config_is_read_cleanly_by_the_library(options):
    chip = lookup("SM8650")
    config = backend_extension_config(["prompt_ar32_cl256_1_of_2", "token_ar1_cl256_1_of_2"],
                                      CompileOptions(**options, soc_model=chip.soc_model, dsp_arch=chip.dsp_arch))
    assert library_errors(config) == ()


def _core(key: str, value: object):
    return lambda c: c["devices"][0]["cores"][0].update({key: value})


BAD_EXTENSIONS = {  # name -> (edit, what the library's finding names, what the key table's finding names)
    "soc_model as a string": (lambda c: c["devices"][0].update(soc_model="69"), "devices.0.soc_model",
                              "soc_model='69'"),
    "concurrent_deserialization_patch as a bool": (
        lambda c: c["context"].update(concurrent_deserialization_patch=True),
        "context.concurrent_deserialization_patch", "context.concurrent_deserialization_patch must be str"),
    "mem_type ion": (lambda c: c["memory"].update(mem_type="ion"), "memory.mem_type", "memory.mem_type is 'ion'"),
    "perf_profile turbo": (_core("perf_profile", "turbo"), "perf_profile turbo",
                           "devices[0].cores[0].perf_profile is 'turbo'"),
    "unknown key in cores": (_core("boost", 1), "devices/0/cores/0/boost", "devices[0].cores[0] has key 'boost'"),
    "fractional latency": (_core("rpc_control_latency", 1.5), "devices.0.cores.0.rpc_control_latency",
                           "devices[0].cores[0].rpc_control_latency must be int"),
    "NaN": (_core("rpc_control_latency", float("nan")), "not valid JSON",
            "devices[0].cores[0].rpc_control_latency is nan"),
    "share_resources as a string": (lambda c: c.update(groupContext={"share_resources": "yes"}),
                                    "groupContext.share_resources", "groupContext.share_resources must be bool"),
}


@pytest.mark.parametrize("case", BAD_EXTENSIONS)
def test_a_bad_extension_config_fails_check_bundle_by_the_library_and_the_key_table_naming_the_key(tmp_path, case):
    edit, by_library, by_table = BAD_EXTENSIONS[case]
    bundle = bundle_with(tmp_path)
    edit_json(bundle / "htp_backend_ext_config.json", edit)
    findings = [f for f in check_bundle(bundle) if f.severity == "error"]
    library = [f.message for f in findings if f.rule == EXTENSIONS_RULE]
    assert len(library) == 1 and library[0].startswith("htp_backend_ext_config.json: libQnnHtpNetRunExtensions.so "
                                                       "logs errors reading it, after which Genie runs without the "
                                                       "extensions: ") and by_library in library[0], library
    assert any(by_table in f.message for f in findings if f.rule not in VENDOR_RULES), findings


def test_the_extension_key_table_is_the_librarys_schema():
    schema = extension_schema()
    types = {"integer": int, "boolean": bool, "string": str, "object": dict, "array": list}
    context = schema["definitions"]["contextProperties"]["properties"]
    assert CONTEXT_KEYS == {key: types[prop["type"]] for key, prop in context.items()}
    group = schema["properties"]["groupContext"]["properties"]
    assert GROUP_CONTEXT_KEYS == {key: types[prop["type"]] for key, prop in group.items()}
    cores = schema["properties"]["devices"]["items"]["properties"]["cores"]["items"]["properties"]
    assert {key: CORE_KEYS[key] for key in cores} == {key: (dict, list) if "anyOf" in prop else
                                                     types[prop.get("type", "object")] for key, prop in cores.items()}
    assert set(MEMORY_TYPES) == set(schema["properties"]["memory"]["properties"]["mem_type"]["enum"])


def test_each_perf_profile_and_core_key_of_the_table_is_one_the_library_takes():
    base = make_htp_backend_ext_config("SM8750")
    samples = {int: 1, bool: True, str: "burst", dict: {}, (dict, list): []}
    for profile in PERF_PROFILES:
        config = copy.deepcopy(base)
        config["devices"][0]["cores"][0]["perf_profile"] = profile
        assert library_errors(config) == (), profile
    for key, kind in CORE_KEYS.items():
        config = copy.deepcopy(base)
        config["devices"][0]["cores"][0][key] = samples[kind]
        assert library_errors(config) == (), key


# --------------------------------------------------------------------------- which checker ran

@pytest.fixture()
def without_the_wheel(monkeypatch):
    """The wheel's package missing, as on a machine where it is not installed (the locator's real path)."""
    monkeypatch.setattr(qnn_wheel, "_PACKAGE", "onnxruntime_qnn_not_installed")
    qnn_wheel.locate_wheel.cache_clear()
    yield
    qnn_wheel.locate_wheel.cache_clear()


def _check_command(bundle: Path, out: Path, capsys) -> tuple[int, list[str]]:
    code = main(["check-bundle", str(bundle), "--chipset", "SM8750", "--out", str(out)])
    return code, capsys.readouterr().out.splitlines()


def test_check_bundle_says_which_checker_ran_and_records_it(tmp_path, capsys):
    code, lines = _check_command(bundle_with(tmp_path), tmp_path / "bundle_check.json", capsys)
    assert code == 0
    api = genie.load_genie().api_version
    assert f"genie_config.json: checked by libGenie.so (Genie API {api}; onnxruntime-qnn " in lines[0]
    assert lines[0].endswith("and genie-build's key table")
    assert lines[1].startswith("htp_backend_ext_config.json: checked by libQnnHtpNetRunExtensions.so (")
    report = json.loads((tmp_path / "bundle_check.json").read_text())
    assert report["checked_by"]["genie_config.json"]["by"][0].startswith(f"libGenie.so (Genie API {api};")
    assert {GENIE_RULE, EXTENSIONS_RULE} <= set(report["rules_checked"])


def test_without_the_wheel_check_bundle_says_in_one_line_what_it_skipped(tmp_path, capsys, without_the_wheel):
    code, lines = _check_command(bundle_with(tmp_path), tmp_path / "bundle_check.json", capsys)
    assert code == 0
    skipped = [line for line in lines if "skipped" in line]
    assert skipped == [
        f"{name}: checked by genie-build's key table only; {library} skipped: the onnxruntime-qnn wheel is not "
        f"installed for {sys.executable}: pip install -r envs/requirements-qnn.txt"
        for name, library in (("genie_config.json", "libGenie.so"),
                              ("htp_backend_ext_config.json", "libQnnHtpNetRunExtensions.so"))]
    report = json.loads((tmp_path / "bundle_check.json").read_text())
    assert report["checked_by"]["genie_config.json"] == {"by": ["genie-build's key table"],
                                                         "skipped": skipped[0].split(" skipped: ")[1]}
    assert not {GENIE_RULE, EXTENSIONS_RULE} & set(report["rules_checked"])
    # the key table still refuses what Genie refuses
    broken = bundle_with(tmp_path / "broken")
    edit_json(broken / "genie_config.json", _set(f"{QNN_HTP}.spill-fill-bufsize", 0.5))
    code, lines = _check_command(broken, tmp_path / "broken.json", capsys)
    assert code == 1 and any("spill-fill-bufsize must be int >= 0" in line for line in lines)


def test_an_installed_wheel_whose_library_does_not_load_is_an_error_not_a_skip(tmp_path, monkeypatch):
    """The libraries run in a child process: there the wheel's package holds a libGenie.so that is no library."""
    fake = tmp_path / "site" / "onnxruntime_qnn"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "build_and_package_info.py").write_text("qnn_version = '2.51.0'\n")
    (fake / "libGenie.so").write_bytes(b"not a library")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'site'}:{os.environ.get('PYTHONPATH', '')}")
    findings = key_findings(bundle_with(tmp_path), {GENIE_RULE})
    assert [f.message for f in findings] == [
        f"genie_config.json: libGenie.so could not judge it: {fake / 'libGenie.so'}: does not load as Genie's "
        f"library: {fake / 'libGenie.so'}: file too short"]


def test_an_extension_config_the_library_crashes_on_is_a_finding_not_a_crash(tmp_path):
    """The extensions library segfaults on a file whose top level is not an object; check-bundle says so."""
    bundle = bundle_with(tmp_path)
    (bundle / "htp_backend_ext_config.json").write_text("1")
    library = [f.message for f in key_findings(bundle, {EXTENSIONS_RULE})]
    assert library == ["htp_backend_ext_config.json: libQnnHtpNetRunExtensions.so could not judge it: it crashed "
                       "reading it (SIGSEGV)"]
    assert key_findings(bundle, {"chipset"})  # and the key table refuses it too
