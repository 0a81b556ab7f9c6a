"""The demo decoder: determinism, ONNX validity, shared initializers, the documented IO, HF Qwen2 equivalence."""

from __future__ import annotations

import json
import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from genie_build import cli
from genie_build.conventions import EMBED_WEIGHT, MASK_MIN, causal_mask, rope_tables
from genie_build.demo import demo
from genie_build.demo.demo import example_inputs, generate_demo, graph_inputs, graph_outputs, shape_from_hf_config
from genie_build.demo.train_tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID
from genie_build.errors import GenieBuildError

import demo_shapes

TINY = demo_shapes.TINY
FILES = ("prompt.onnx", "prompt.onnx.data", "token.onnx", "token.onnx.data", "config.json")
LAYER_WEIGHTS = ("self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
                 "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
                 "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                 "input_layernorm.weight", "post_attention_layernorm.weight")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    generate_demo(TINY, out)
    return out


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def run_graph(path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = session(path)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))


def initializers(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(path)  # with external data: fine for the tiny model
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_generation_is_deterministic(tiny_dir: Path, tmp_path: Path) -> None:
    generate_demo(TINY, tmp_path)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (tiny_dir / name).read_bytes(), name


def test_seed_changes_weights(tiny_dir: Path, tmp_path: Path) -> None:
    generate_demo(dataclasses.replace(TINY, seed=1), tmp_path)
    assert (tmp_path / "prompt.onnx.data").read_bytes() != (tiny_dir / "prompt.onnx.data").read_bytes()


@pytest.mark.parametrize("kind", ["prompt", "token"])
def test_graphs_pass_full_check(tiny_dir: Path, kind: str) -> None:
    onnx.checker.check_model(str(tiny_dir / f"{kind}.onnx"), full_check=True)


def test_prompt_and_token_share_initializers(tiny_dir: Path) -> None:
    prompt, token = initializers(tiny_dir / "prompt.onnx"), initializers(tiny_dir / "token.onnx")
    assert prompt.keys() == token.keys()
    for name, value in prompt.items():
        assert value.dtype == token[name].dtype and np.array_equal(value, token[name]), name


def test_weights_have_hf_names_and_layout(tiny_dir: Path) -> None:
    values = initializers(tiny_dir / "prompt.onnx")
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    expected |= {f"model.layers.{i}.{suffix}" for i in range(TINY.layers) for suffix in LAYER_WEIGHTS}
    assert {name for name in values if not name.startswith("/")} == expected
    d, kv = TINY.head_dim, TINY.kv_heads
    assert values["model.embed_tokens.weight"].shape == (TINY.vocab, TINY.hidden)
    assert values["lm_head.weight"].shape == (TINY.hidden, TINY.vocab)
    assert values["model.layers.1.self_attn.k_proj.weight"].shape == (TINY.hidden, kv * d)   # [in, out]
    assert values["model.layers.1.mlp.down_proj.weight"].shape == (TINY.intermediate, TINY.hidden)
    # Non-trivial values: a norm or bias mix-up must change the outputs (HF comparison below).
    assert 0.9 < values["model.norm.weight"].mean() < 1.1 and values["model.norm.weight"].std() > 0.01
    assert 0 < np.abs(values["model.layers.0.self_attn.q_proj.bias"]).mean() < 0.1


def test_weights_do_not_depend_on_order_or_block_size(tiny_dir: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "WEIGHT_CHUNK_BYTES", 1000)  # many small blocks per tensor
    generate_demo(dataclasses.replace(TINY, layers=3), tmp_path)
    small, bigger = initializers(tiny_dir / "token.onnx"), initializers(tmp_path / "token.onnx")
    for name in ("model.embed_tokens.weight", "model.layers.1.mlp.up_proj.weight", "lm_head.weight"):
        assert np.array_equal(small[name], bigger[name]), name


def test_external_data_is_relative_and_page_aligned(tiny_dir: Path) -> None:
    model = onnx.load(tiny_dir / "prompt.onnx", load_external_data=False)
    external = [{e.key: e.value for e in t.external_data} for t in model.graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL]
    assert len(external) >= 5 * TINY.layers
    assert {info["location"] for info in external} == {"prompt.onnx.data"}
    assert all(int(info["offset"]) % demo.EXTERNAL_DATA_ALIGNMENT == 0 for info in external)


def conventions_io(kind: str) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """The IO table of docs/conventions.md, written out independently of demo.graph_inputs."""
    ar = TINY.ar if kind == "prompt" else 1
    cl, kv, d = TINY.context, TINY.kv_heads, TINY.hidden // TINY.heads
    inputs = {"input_ids": (1, ar), "attention_mask": (1, ar, cl), "position_ids_cos": (1, 1, ar, d // 2),
              "position_ids_sin": (1, 1, ar, d // 2)}
    outputs = {"logits": (1, ar, TINY.vocab)}
    for i in range(TINY.layers):
        inputs |= {f"past_key_{i}_in": (1, kv, d, cl - ar), f"past_value_{i}_in": (1, kv, cl - ar, d)}
        outputs |= {f"past_key_{i}_out": (1, kv, d, ar), f"past_value_{i}_out": (1, kv, ar, d)}
    return inputs, outputs


@pytest.mark.parametrize("kind", ["prompt", "token"])
def test_ort_runs_with_documented_io(tiny_dir: Path, kind: str) -> None:
    inputs, outputs = conventions_io(kind)
    sess = session(tiny_dir / f"{kind}.onnx")
    assert {i.name: tuple(i.shape) for i in sess.get_inputs()} == inputs
    assert {o.name: tuple(o.shape) for o in sess.get_outputs()} == outputs
    assert sess.get_inputs()[0].type == "tensor(int32)"
    assert [s.name for s in graph_inputs(TINY, kind)] == [i.name for i in sess.get_inputs()]
    assert [s.name for s in graph_outputs(TINY, kind)] == [o.name for o in sess.get_outputs()]
    results = run_graph(tiny_dir / f"{kind}.onnx", example_inputs(TINY, kind, 3, np.random.default_rng(0)))
    assert {name: value.shape for name, value in results.items()} == outputs
    assert all(np.isfinite(value).all() and 0.01 < value.std() < 10 for value in results.values())


def test_every_intermediate_has_value_info_and_scoped_node_names(tiny_dir: Path) -> None:
    graph = onnx.load(tiny_dir / "prompt.onnx", load_external_data=False).graph
    typed = {v.name for v in (*graph.value_info, *graph.output)}
    assert all(out in typed for node in graph.node for out in node.output)
    scopes = ("/model/embed_tokens/", "/model/norm/", "/lm_head/",
              *(f"/model/layers.{i}/" for i in range(TINY.layers)))
    assert all(node.name.startswith(scopes) for node in graph.node)
    names = {node.name for node in graph.node}
    assert {"/model/embed_tokens/Gather", "/lm_head/MatMul"} <= names
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.value_info}
    boundaries = ["/model/embed_tokens/Gather_output_0",
                  *(f"/model/layers.{i}/Add_1_output_0" for i in range(TINY.layers))]
    assert all(shapes[name] == [1, TINY.ar, TINY.hidden] for name in boundaries)


def test_causal_mask_layout() -> None:
    m = MASK_MIN
    expected = np.array([[[0, m, m, 0, m], [0, m, m, 0, 0]]], dtype=np.float32)  # past 3 slots, 1 valid
    assert np.array_equal(causal_mask(2, 5, 1), expected)
    assert np.array_equal(causal_mask(1, 4, 3), np.zeros((1, 1, 4), np.float32))
    with pytest.raises(ValueError):
        causal_mask(2, 5, 4)


def test_rope_tables_match_the_formula() -> None:
    cos, sin = rope_tables(TINY.head_dim, TINY.rope_theta, [0, 5, 47])
    d = TINY.head_dim
    angles = np.array([0, 5, 47])[:, None] / TINY.rope_theta ** (np.arange(0, d, 2) / d)[None, :]
    assert cos.shape == sin.shape == (1, 1, 3, d // 2) and cos.dtype == np.float32
    np.testing.assert_allclose(cos[0, 0], np.cos(angles), atol=2e-6)
    np.testing.assert_allclose(sin[0, 0], np.sin(angles), atol=2e-6)


def test_example_inputs_are_deterministic_and_consistent() -> None:
    first = example_inputs(TINY, "prompt", 10, np.random.default_rng(7))
    second = example_inputs(TINY, "prompt", 10, np.random.default_rng(7))
    assert first.keys() == second.keys() and all(np.array_equal(first[k], second[k]) for k in first)
    assert first["input_ids"].dtype == np.int32 and 0 <= first["input_ids"].min() <= first["input_ids"].max() < 300
    assert np.array_equal(first["attention_mask"], causal_mask(TINY.ar, TINY.context, 10))
    assert np.array_equal(first["position_ids_cos"], rope_tables(TINY.head_dim, TINY.rope_theta, np.arange(10, 10 + TINY.ar))[0])


def test_config_json_describes_the_model(tiny_dir: Path) -> None:
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"],
            config["max_position_embeddings"]) == (2, 64, 2, 48)
    assert config["bos_token_id"] == BOS_TOKEN_ID and config["eos_token_id"] == EOS_TOKEN_ID
    assert config["tie_word_embeddings"] is False
    assert shape_from_hf_config(config, TINY.ar) == TINY


def test_the_shape_is_read_from_either_transformers_layout_and_scaled_rope_is_refused() -> None:
    """transformers 5 writes the RoPE base under rope_parameters; the demo's feeds compute plain RoPE only."""
    legacy = demo.hf_config(TINY)
    v5 = {key: value for key, value in legacy.items() if key != "rope_theta"}
    v5["rope_parameters"] = {"rope_type": "default", "rope_theta": legacy["rope_theta"]}
    assert shape_from_hf_config(v5, TINY.ar) == TINY
    scaled = {**v5, "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 16}}
    with pytest.raises(GenieBuildError, match="cfg.json: RoPE scaling 'llama3'"):
        shape_from_hf_config(scaled, TINY.ar, where="cfg.json")


def test_fp16_weights_are_cast_and_close_to_fp32(tiny_dir: Path, tmp_path: Path) -> None:
    generate_demo(dataclasses.replace(TINY, weight_dtype="float16"), tmp_path)
    onnx.checker.check_model(str(tmp_path / "token.onnx"), full_check=True)
    values = initializers(tmp_path / "token.onnx")
    assert values["lm_head.weight"].dtype == np.float16
    assert np.array_equal(values["lm_head.weight"], initializers(tiny_dir / "token.onnx")["lm_head.weight"]
                          .astype(np.float16))
    graph = onnx.load(tmp_path / "token.onnx", load_external_data=False).graph
    assert sum(node.op_type == "Cast" for node in graph.node) == 3 + len(LAYER_WEIGHTS) * TINY.layers
    ratio = (tmp_path / "token.onnx.data").stat().st_size / (tiny_dir / "token.onnx.data").stat().st_size
    assert 0.45 < ratio < 0.6
    feed = example_inputs(TINY, "token", 20, np.random.default_rng(1))
    half, full = run_graph(tmp_path / "token.onnx", feed), run_graph(tiny_dir / "token.onnx", feed)
    np.testing.assert_allclose(half["logits"], full["logits"], atol=2e-2)


@pytest.mark.parametrize("changes, where", [({"hidden": 66}, "demo.hidden"), ({"kv_heads": 3}, "demo.kv_heads"),
                                            ({"ar": 48}, "demo.ar"), ({"layers": 0}, "demo.layers"),
                                            ({"weight_dtype": "bfloat16"}, "demo.weight_dtype")])
def test_invalid_shapes_are_rejected(changes: dict, where: str) -> None:
    with pytest.raises(GenieBuildError) as error:
        dataclasses.replace(TINY, **changes)
    assert error.value.where == where


def test_cli_generates_and_reports_bad_sizes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["generate-demo", "--out-dir", str(tmp_path), "--layers", "1", "--hidden", "32", "--heads", "2",
            "--kv-heads", "1", "--intermediate", "48", "--vocab", "260", "--context", "16", "--ar", "4",
            "--weight-dtype", "float16"]
    assert cli.main(args) == 0
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "float16"
    assert all((tmp_path / name).is_file() for name in FILES)
    assert cli.main([*args, "--heads", "3"]) == 2
    assert "demo.hidden" in capsys.readouterr().err


# --- HF equivalence -----------------------------------------------------------------------------------

def hf_model(model_dir: Path):
    """transformers' Qwen2ForCausalLM built from config.json, holding the ONNX graph's weights."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install --no-deps -r envs/requirements-hf.txt)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install --no-deps -r envs/requirements-hf.txt)")
    config = transformers.Qwen2Config(**json.loads((model_dir / "config.json").read_text()))
    config._attn_implementation = "eager"
    model = transformers.Qwen2ForCausalLM(config).eval()
    # HF weights only; MatMul weights are stored [in, out], HF wants [out, in].
    state = {name: torch.from_numpy(np.array(value.T if value.ndim == 2 and name != EMBED_WEIGHT else value))
             for name, value in initializers(model_dir / "prompt.onnx").items() if not name.startswith("/")}
    model.load_state_dict(state, strict=True)
    return torch, model


@pytest.mark.hf
@pytest.mark.parametrize("kind, past_len", [("prompt", 0), ("prompt", 13), ("token", 30), ("token", 47)])
def test_matches_hf_qwen2(tiny_dir: Path, kind: str, past_len: int) -> None:
    """Logits and new K/V equal HF's for the last AR tokens of a sequence whose first ``past_len``
    tokens are in the cache (HF's own cache, transposed into the Genie layout)."""
    torch, model = hf_model(tiny_dir)
    ar = TINY.ar if kind == "prompt" else 1
    ids = np.random.default_rng(past_len).integers(0, TINY.vocab, size=(1, past_len + ar))
    with torch.no_grad():
        hf = model(input_ids=torch.from_numpy(ids), use_cache=True)
    feed = example_inputs(TINY, kind, past_len, np.random.default_rng(2))   # unused cache slots stay random
    feed["input_ids"] = ids[:, past_len:].astype(np.int32)
    new_keys, new_values = [], []
    for i, layer in enumerate(hf.past_key_values.layers):
        keys, values = layer.keys.numpy(), layer.values.numpy()   # [1, kv, past_len + ar, d]
        feed[f"past_key_{i}_in"][..., :past_len] = keys[:, :, :past_len].transpose(0, 1, 3, 2)
        feed[f"past_value_{i}_in"][:, :, :past_len] = values[:, :, :past_len]
        new_keys.append(keys[:, :, past_len:].transpose(0, 1, 3, 2))
        new_values.append(values[:, :, past_len:])
    ours = run_graph(tiny_dir / f"{kind}.onnx", feed)
    np.testing.assert_allclose(ours["logits"], hf.logits[:, past_len:].numpy(), rtol=0, atol=1e-5)
    for i in range(TINY.layers):
        np.testing.assert_allclose(ours[f"past_key_{i}_out"], new_keys[i], rtol=0, atol=1e-5)
        np.testing.assert_allclose(ours[f"past_value_{i}_out"], new_values[i], rtol=0, atol=1e-5)
