"""Plans from shapes (genie_build.plan.shape_plan): a checkpoint's from config.json alone, in either layout transformers
writes and for every family, its pieces weighed by AIMET's rule per weight; the safetensors files each part's
export depends on. (That the rule weighs each piece as the calibrated encodings store it, byte for byte, is
tests/test_calibration_chain.py's, with aimet-onnx.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from genie_build.conventions import EMBED_WEIGHT, LM_HEAD_WEIGHT
from genie_build.errors import GenieBuildError
from genie_build.hf_checkpoint import Checkpoint, tensor_headers, weight_files
from genie_build.hf_config import load_hf_config
from genie_build.plan.plan_file import PartPlan
from genie_build.plan.shape_plan import (part_tensor_names, part_weight_files, piece_floats, plan_checkpoint,
                                         plan_from_hf_config)

REPO = Path(__file__).resolve().parents[1]
# hidden 64, 2 heads (head_dim 32), 1 KV head, intermediate 128, vocab 96, 2 layers, untied, as transformers 5 writes
SMALL = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 2,
         "num_key_value_heads": 1, "intermediate_size": 128, "vocab_size": 96, "num_hidden_layers": 2,
         "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


def write(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({key: value for key, value in {**SMALL, **changes}.items() if value is not None}))
    return path


def per_channel(count: int, channels: int, bits: int) -> int:
    return count * bits // 8 + 4 * channels


def test_each_piece_weighs_what_aimets_rule_stores(tmp_path):
    """Embedding and norms 16-bit per tensor; layer weights 4-bit per output channel; q/k/v biases kept as float16;
    the LM head 8-bit per channel (the planner's byte model: bits / 8 per value, 4 bytes per scale)."""
    plan = plan_from_hf_config(write(tmp_path), recipe="w4a16", ar=8, context=32, num_parts=2)
    embedding = 96 * 64 * 2 + 4
    layer = (per_channel(64 * 64, 64, 4) * 2 + per_channel(64 * 32, 32, 4) * 2     # q, o; k, v
             + per_channel(64 * 128, 128, 4) * 2 + per_channel(128 * 64, 64, 4)    # gate, up; down
             + (64 + 32 + 32) * 2                                                 # q/k/v biases, float16
             + 2 * (64 * 2 + 4))                                                  # two norms, 16-bit
    head = 64 * 2 + 4 + per_channel(64 * 96, 96, 8)
    assert [piece.bytes for piece in plan.pieces] == [embedding, layer, layer, head]
    assert [part.pieces for part in plan.parts] == [("embedding",), ("layer_0", "layer_1", "head")]
    assert plan.graph_ar == {"prompt": 8, "token": 1} and plan.context_length == 32


def test_lpbq_and_w8_weigh_their_own_blocks_and_bits(tmp_path):
    config = write(tmp_path)
    lpbq = plan_from_hf_config(config, recipe="w4a16-lpbq", ar=8, context=32, num_parts=2).pieces[1].bytes
    w8 = plan_from_hf_config(config, recipe="w8a16", ar=8, context=32, num_parts=2).pieces[1].bytes
    # LPBQ: 4-bit values, a float scale per output channel, an 8-bit integer scale per block of 64 inputs
    lpbq_weights = sum(count // 2 + 4 * channels + 1 * channels * (count // channels // 64)
                       for count, channels in ((4096, 64), (4096, 64), (2048, 32), (2048, 32),
                                               (8192, 128), (8192, 128), (8192, 64)))
    assert lpbq == lpbq_weights + (64 + 32 + 32) * 2 + 2 * (64 * 2 + 4)
    w8_weights = sum(per_channel(count, channels, 8) for count, channels in (
        (4096, 64), (4096, 64), (2048, 32), (2048, 32), (8192, 128), (8192, 128), (8192, 64)))
    assert w8 == w8_weights + (64 + 32 + 32) * 2 + 2 * (64 * 2 + 4)


def test_both_config_layouts_and_every_family_plan_alike(tmp_path):
    new = plan_from_hf_config(write(tmp_path), recipe="w4a16", ar=8, context=32, num_parts=2)
    legacy_dir = tmp_path / "legacy"
    legacy_dir.mkdir()
    legacy = plan_from_hf_config(write(legacy_dir, rope_parameters=None, rope_theta=10000.0, rope_scaling=None,
                                       torch_dtype="bfloat16"), recipe="w4a16", ar=8, context=32, num_parts=2)
    assert legacy == new
    llama = plan_from_hf_config(write(tmp_path, model_type="llama", architectures=["LlamaForCausalLM"]),
                                recipe="w4a16", ar=8, context=32, num_parts=2)
    assert llama.pieces[1].bytes == new.pieces[1].bytes - (64 + 32 + 32) * 2   # no q/k/v biases
    qwen3 = plan_from_hf_config(write(tmp_path, model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=16),
                                recipe="w4a16", ar=8, context=32, num_parts=2)
    # head_dim 16: q 2 x 16 = 32 wide, k/v 16; q_norm and k_norm 16-bit per tensor, no biases
    assert qwen3.pieces[1].bytes == (per_channel(64 * 32, 32, 4) + per_channel(32 * 64, 64, 4)
                                     + 2 * per_channel(64 * 16, 16, 4) + 2 * per_channel(64 * 128, 128, 4)
                                     + per_channel(128 * 64, 64, 4) + 2 * (64 * 2 + 4) + 2 * (16 * 2 + 4))


def test_a_tied_head_is_planned_as_the_export_writes_it(tmp_path):
    untied = plan_from_hf_config(write(tmp_path), recipe="w4a16", ar=8, context=32, num_parts=2)
    tied = plan_from_hf_config(write(tmp_path, tie_word_embeddings=True), recipe="w4a16", ar=8, context=32,
                               num_parts=2)
    assert tied == untied   # its own 8-bit lm_head.weight, the table's values
    head = PartPlan(2, "2_of_2", ("layer_0", "layer_1", "head"), 0, 1, "x", None, 0)
    names = part_tensor_names(tmp_path / "config.json", head)
    assert EMBED_WEIGHT in names and LM_HEAD_WEIGHT not in names   # the tied checkpoint stores only the table


def test_qwen2_5_7b_in_six_parts_and_its_units():
    config = REPO / "config" / "hf" / "qwen2_5_7b_instruct.json"
    plan, units = plan_checkpoint(config, {"num_parts": 6}, recipe="w4a16", ar=128, context=4096,
                                  unit_memory_mb=8000)
    assert [(p.first_layer, p.last_layer) for p in plan.parts] == [(None, None), (0, 6), (7, 13), (14, 19),
                                                                   (20, 25), (26, 27)]
    assert len(units) == 17
    floats = piece_floats(config)
    assert floats["embedding"].total == floats["head"].total - 3584 * 4 == 152064 * 3584 * 4
    assert floats["head"].largest == floats["embedding"].largest == 152064 * 3584 * 4   # the final norm is small
    assert floats["layer_0"].largest == 18944 * 3584 * 4   # an MLP projection


def test_bad_settings_name_the_key(tmp_path):
    config = write(tmp_path)
    with pytest.raises(GenieBuildError, match="split.num_parts"):
        plan_from_hf_config(config, recipe="w4a16", ar=8, context=32, num_parts=9)
    with pytest.raises(GenieBuildError, match="quantize.recipe"):
        plan_from_hf_config(config, recipe="w2a16", ar=8, context=32, num_parts=2)
    with pytest.raises(GenieBuildError, match="split.boundaries"):
        plan_checkpoint(config, {"num_parts": 2, "boundaries": ["a", "b"]}, recipe="w4a16", ar=8, context=32,
                        unit_memory_mb=2000)
    with pytest.raises(GenieBuildError, match="model_type 'gpt2'"):
        plan_from_hf_config(write(tmp_path, model_type="gpt2"), recipe="w4a16", ar=8, context=32, num_parts=2)


def write_shards(checkpoint, weight_map):
    """The index and its shards as safetensors headers (one 4-byte tensor each): the tensors each shard holds."""
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    for shard in set(weight_map.values()):
        names = [name for name, holder in weight_map.items() if holder == shard]
        header = json.dumps({name: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
                             for i, name in enumerate(names)}).encode()
        (checkpoint / shard).write_bytes(len(header).to_bytes(8, "little") + header + bytes(4 * len(names)))


def test_a_part_depends_on_the_shards_that_hold_its_tensors(tmp_path):
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    write(checkpoint)
    layer = [f"model.layers.{i}.{name}" for i in range(2) for name in (
        "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight", "self_attn.k_proj.bias",
        "self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.o_proj.weight", "mlp.gate_proj.weight",
        "mlp.up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight")]
    weight_map = {EMBED_WEIGHT: "a.safetensors", **{name: "b.safetensors" for name in layer[:12]},
                  **{name: "c.safetensors" for name in layer[12:]}, "model.norm.weight": "c.safetensors",
                  LM_HEAD_WEIGHT: "d.safetensors"}
    write_shards(checkpoint, weight_map)
    plan = plan_from_hf_config(checkpoint / "config.json", recipe="w4a16", ar=8, context=32, num_parts=3,
                               embedding_alone=True)
    files = {part.label: [p.name for p in part_weight_files(read(checkpoint), part)] for part in plan.parts}
    assert files == {"1_of_3": ["model.safetensors.index.json", "a.safetensors"],
                     "2_of_3": ["model.safetensors.index.json", "b.safetensors"],
                     "3_of_3": ["model.safetensors.index.json", "c.safetensors", "d.safetensors"]}
    del weight_map[LM_HEAD_WEIGHT]
    write_shards(checkpoint, weight_map)
    with pytest.raises(GenieBuildError, match="has no tensor 'lm_head.weight', which part 3_of_3 needs"):
        part_weight_files(read(checkpoint), plan.parts[-1])


def read(checkpoint: Path) -> Checkpoint:
    """The checkpoint as the workflow reads it once, headers included (this one's tensors are placeholders, so
    not checked against config.json)."""
    return Checkpoint(checkpoint, load_hf_config(checkpoint / "config.json"), weight_files(checkpoint),
                      checkpoint / "tokenizer.json", tensor_headers(checkpoint))
