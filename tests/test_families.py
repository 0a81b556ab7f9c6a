"""The family registry and the checks a checkpoint passes before any job, without torch.

The registry, docs/export.md's tables and the schema's description name the same families; a checkpoint (its
config.json written as the published ones are, its tensors written with safetensors' numpy writer) that the export
cannot build is refused by check_checkpoint in one line naming the file and the key or tensor: an unknown or refused
family, another architecture, a RoPE kind or a sliding window Genie cannot express, settings that do not fit,
quantized weights other than FP8 with block scales, tensors of another shape or count than config.json implies (at
once, whatever the layer count).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from genie_build.errors import GenieBuildError
from genie_build.families import FAMILIES, REFUSED_FAMILIES
from genie_build.hf_checkpoint import check_checkpoint, tensor_headers
from genie_build.hf_config import head_dim, read_model_shape, stored_tensors
from genie_build.plan.weight_inventory import weights_from_hf_config
from family_cases import FAMILY_CASES
from family_cases.phi3 import LONGROPE

REPO = Path(__file__).resolve().parent.parent
AR, CONTEXT = 8, 64
DIMS = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 320, "max_position_embeddings": 4096, "bos_token_id": 1,
        "eos_token_id": 2, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
# model_type -> the keys its published config.json states beyond the dimensions (tests/family_cases)
PUBLISHED = {name: cases.PUBLISHED for name, cases in FAMILY_CASES.items()}


def test_every_registered_family_has_its_module_of_cases():
    assert set(FAMILY_CASES) == set(FAMILIES)
    assert all(cases.PUBLISHED["architectures"] == [FAMILIES[name].architecture]
               for name, cases in FAMILY_CASES.items())


def _table(section: str) -> list[list[str]]:
    text = (REPO / "docs" / "export.md").read_text()
    body = text[text.index(section):]
    body = body[:body.index("\n## ", 1)]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in body.splitlines()
            if line.startswith("| `")]


def test_the_docs_and_the_schema_name_the_registered_families():
    rows = [row for row in _table("## Supported models") if len(row) == 4 and row[0] != "`model_type`"]
    assert [(row[0].strip("`"), row[1], row[2].strip("`")) for row in rows] == [
        (family.model_type, family.title, family.architecture) for family in FAMILIES.values()]
    refused = {name.strip("` ") for row in _table("## Supported models") if "model_type" in row[0]
               for name in re.findall(r"`(\w+)`", row[0]) if name != "model_type"}
    assert refused == set(REFUSED_FAMILIES)
    schema = yaml.safe_load((REPO / "workflow/genie_build/schema/config.schema.yaml").read_text())
    description = schema["properties"]["model"]["properties"]["hf_checkpoint"]["description"]
    named = re.search(r"of an? (.*?) model", description)[1]
    assert re.split(r", | or ", named) == [family.title for family in FAMILIES.values()]
    assert schema["properties"]["export"]["properties"]["ar"]["minimum"] == 2


def test_every_rope_kind_a_family_carries_has_genie_tables_and_host_tables():
    from genie_build.conventions import rope_tables
    from genie_build.genie_config import GENIE_ROPE_TYPES
    from genie_build.run.run_bundle import HOST_ROPE_TYPES

    examples = {"default": None, "llama3": PUBLISHED["llama"]["rope_scaling"],
                "longrope": {**LONGROPE, "factor": 32.0, "original_max_position_embeddings": 4096}}
    for kind in {kind for family in FAMILIES.values() for kind in family.rope_kinds}:
        scaling = examples[kind]
        cos, _ = rope_tables(16, 10000.0, np.arange(4), scaling)   # raises for a kind it does not compute
        assert cos.shape == (1, 1, 4, 8)
        assert kind == "default" or GENIE_ROPE_TYPES[kind] in HOST_ROPE_TYPES


def write_checkpoint(root: Path, model_type: str, *, shards: int = 1, **changes) -> Path:
    """A checkpoint whose config.json is ``model_type``'s published one at the tests' dimensions (with
    ``changes``; a None value removes the key), its tensors random float32 as config.json implies."""
    config = {"model_type": model_type, **DIMS, **PUBLISHED[model_type]}
    config.update(changes)
    config = {key: value for key, value in config.items() if value is not None or key not in changes}
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    (root / "tokenizer.json").write_text("{}")
    rng = np.random.default_rng(0)
    tensors = {t.name: rng.standard_normal(t.shape).astype(np.float32)
               for t in stored_tensors(read_model_shape(config, "config.json"))}
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(root / "model.safetensors"))
        return root
    groups = [names[i::shards] for i in range(shards)]
    weight_map = {}
    for index, group in enumerate(groups, start=1):
        shard = f"model-{index:05d}-of-{shards:05d}.safetensors"
        save_file({name: tensors[name] for name in group}, str(root / shard))
        weight_map.update(dict.fromkeys(group, shard))
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


def _refusal(root: Path, **settings) -> str:
    with pytest.raises(GenieBuildError) as error:
        check_checkpoint(root, **{"ar": AR, "context": CONTEXT, **settings})
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("model_type", sorted(PUBLISHED))
@pytest.mark.parametrize("tied, shards", [(False, 1), (True, 3)], ids=["untied", "tied-sharded"])
def test_a_published_config_passes_and_its_tensors_are_what_the_inventory_weighs(tmp_path, model_type, tied, shards):
    root = write_checkpoint(tmp_path / "checkpoint", model_type, shards=shards, tie_word_embeddings=tied)
    checkpoint = check_checkpoint(root, ar=AR, context=CONTEXT)
    assert checkpoint.family is FAMILIES[model_type]
    stored = {name: header.shape for name, header in tensor_headers(root).items()}
    weighed = {w.spec.name: w.spec.shape for w in weights_from_hf_config(root / "config.json").weights}
    assert ("lm_head.weight" in stored) is not tied and "lm_head.weight" in weighed
    for name, shape in stored.items():   # the inventory weighs a Linear weight as its MatMul [in, out]
        assert weighed[name] in (shape, shape[::-1]), name
    assert len(weighed) == len(stored) + tied


def test_phi3_fused_projections_are_one_weight_each(tmp_path):
    root = write_checkpoint(tmp_path / "checkpoint", "phi3")
    stored = {name: header.shape for name, header in tensor_headers(root).items()}
    assert stored["model.layers.0.self_attn.qkv_proj.weight"] == (64 + 2 * 32, 64)   # q heads + k and v heads
    assert stored["model.layers.0.mlp.gate_up_proj.weight"] == (2 * 128, 64)
    assert not any("q_proj" in name or "gate_proj" in name for name in stored)


def test_qwen3_without_head_dim_takes_transformers_default(tmp_path):
    config = {"model_type": "qwen3", **DIMS}
    assert head_dim(config, "config.json") == 128 and read_model_shape(config, "config.json").head_dim == 128
    assert head_dim({**config, "model_type": "qwen2"}, "config.json") == 16


# what the start-up checks say of any family's config (on Qwen2's), then of each family's own cases
GENERIC_CASES = [
    ("qwen2", {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, {}, "model_type 'gpt2'"),
    ("qwen2", {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"]}, {}, "soft-caps its logits"),
    ("qwen2", {"model_type": "gemma3_text"}, {}, "RoPE base of their own"),
    ("qwen2", {"architectures": ["Qwen2ForSequenceClassification"]}, {}, "causal LM Qwen2ForCausalLM"),
    ("qwen2", {}, {"ar": 1}, "export.ar: 1 must be at least 2"),
    ("qwen2", {}, {"ar": CONTEXT}, "export.ar"),
    ("qwen2", {"max_position_embeddings": 32}, {}, "export.context: 64 exceeds the model's max_position"),
    ("qwen2", {"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}}, {},
     "quantization_config.quant_method 'bitsandbytes'"),
    ("qwen2", {"quantization_config": {"quant_method": "gptq", "bits": 4}}, {}, "quantization_config.quant_method"),
    ("qwen2", {"quantization_config": {"quant_method": "awq", "bits": 4}}, {}, "quantization_config.quant_method"),
]
FAMILY_SPECIFIC = [(name, *case) for name, cases in FAMILY_CASES.items() for case in cases.CASES]


@pytest.mark.parametrize("model_type, changes, settings, expected", GENERIC_CASES + FAMILY_SPECIFIC)
def test_what_cannot_be_built_is_one_line_before_any_job(tmp_path, model_type, changes, settings, expected):
    root = write_checkpoint(tmp_path / "checkpoint", model_type)
    config = json.loads((root / "config.json").read_text())
    config.update(changes)
    (root / "config.json").write_text(json.dumps(config))
    if expected is None:
        check_checkpoint(root, **{"ar": AR, "context": CONTEXT, **settings})
        return
    message = _refusal(root, **settings)
    assert expected in message
    assert settings and message.startswith("config export.") or str(root / "config.json") in message


def test_mistral_without_sliding_window_has_transformers_window(tmp_path):
    root = write_checkpoint(tmp_path / "checkpoint", "mistral")
    config = json.loads((root / "config.json").read_text())
    del config["sliding_window"]
    (root / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 32768}))
    check_checkpoint(root, ar=AR, context=4096)
    assert "sliding_window 4096 is shorter than export.context 4097" in _refusal(root, context=4097)


def test_a_tensor_of_another_shape_names_the_file_the_tensor_and_both_shapes(tmp_path):
    root = write_checkpoint(tmp_path / "checkpoint", "llama", shards=2)
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    message = _refusal(root)
    assert re.search(r"model-0000[12]-of-00002\.safetensors: tensor 'model\.layers\.0\.mlp\.\w+_proj\.weight' has "
                     r"shape \[\d+, \d+\]; config\.json implies \[\d+, \d+\]", message), message


def test_a_missing_tensor_names_the_index_and_the_tensor(tmp_path):
    root = write_checkpoint(tmp_path / "checkpoint", "qwen3", shards=2)
    index = json.loads((root / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.layers.1.self_attn.k_norm.weight"]
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    shard = next(root.glob("model-*.safetensors"))
    # the header, not the index, says what a shard holds: rewrite the shard without the tensor
    from safetensors.numpy import load_file
    kept = {name: value for name, value in load_file(str(shard)).items()
            if name != "model.layers.1.self_attn.k_norm.weight"}
    save_file(kept, str(shard))
    message = _refusal(root)
    assert "has no tensor 'model.layers.1.self_attn.k_norm.weight'" in message
    assert "model.safetensors.index.json" in message


@pytest.mark.parametrize("layers", [3, 100000, 1])
def test_a_layer_count_other_than_the_tensors_is_refused_at_once(tmp_path, layers):
    root = write_checkpoint(tmp_path / "checkpoint", "qwen2")
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
    started = time.perf_counter()
    message = _refusal(root)
    assert time.perf_counter() - started < 2
    assert f"num_hidden_layers is {layers}, but the checkpoint's tensors hold layers 0-1 (2 in all)" in message


@pytest.mark.parametrize("dtype, quantization, expected", [
    ("int8", None, "is I8, a quantized weight without a quantization_config"),
    ("uint8", None, "is U8, a quantized weight without a quantization_config"),
])
def test_an_integer_weight_without_a_known_scheme_names_quantization_config(tmp_path, dtype, quantization, expected):
    root = write_checkpoint(tmp_path / "checkpoint", "qwen2")
    from safetensors.numpy import load_file
    tensors = load_file(str(root / "model.safetensors"))
    tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"].astype(dtype)
    save_file(tensors, str(root / "model.safetensors"))
    message = _refusal(root)
    assert expected in message and str(root / "model.safetensors") in message
    assert "'model.layers.0.mlp.up_proj.weight'" in message


def _chunk_graph(shape):
    """x -> SplitToSequence(3, axis -1) -> SequenceAt 1 and 0 (torch.chunk(2) as the exporter writes it)."""
    from onnx import TensorProto, helper, numpy_helper

    constant = lambda name, value: helper.make_node(  # noqa: E731
        "Constant", [], [name], value=numpy_helper.from_array(np.array(value, dtype=np.int64)))
    nodes = [constant("size", 3), helper.make_node("SplitToSequence", ["x", "size"], ["seq"], axis=-1),
             constant("one", 1), helper.make_node("SequenceAt", ["seq", "one"], ["up"]),
             constant("zero", 0), helper.make_node("SequenceAt", ["seq", "zero"], ["gate"])]
    graph = helper.make_graph(nodes, "chunk", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4, 3])
                               for name in ("gate", "up")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_a_chunk_is_exported_as_one_split_of_the_same_tensors():
    import onnxruntime as ort

    from genie_build.export.sequence_split import split_without_sequences

    model = _chunk_graph([1, 4, 6])
    x = np.random.default_rng(0).standard_normal((1, 4, 6)).astype(np.float32)
    run = lambda m: ort.InferenceSession(m.SerializeToString()).run(["gate", "up"], {"x": x})  # noqa: E731
    before = run(model)
    split_without_sequences(model.graph)
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("Split") == 1 and set(ops) == {"Constant", "Split"}   # the canonical names drop unread ones
    after = run(model)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert np.array_equal(after[0], x[..., :3]) and np.array_equal(after[1], x[..., 3:])


def test_a_chunk_of_unknown_width_is_refused():
    from genie_build.export.sequence_split import split_without_sequences

    with pytest.raises(GenieBuildError, match="cannot make this SplitToSequence a static Split"):
        split_without_sequences(_chunk_graph([1, 4, None]).graph)
