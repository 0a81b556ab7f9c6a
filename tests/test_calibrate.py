"""Calibrated encodings of the demo model: coverage, shared tensors, parameter quantization, AIMET numbers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from genie_build import cli
from genie_build.conventions import EMBED_WEIGHT
from genie_build.demo.demo import generate_demo
from genie_build.encodings import Encodings, TensorEncoding, read_encodings
from genie_build.errors import GenieBuildError
from genie_build.plan.recipes import RECIPES, precision_of
from genie_build.quantize.calibrate import (BUILTIN_PRECISION, activation_encoding, calibrate, calibration_feeds,
                                            merge_ranges, symmetric_per_channel, tie_kv_cache)

import demo_shapes

TINY = demo_shapes.TINY
MATMUL_WEIGHTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                  "mlp.up_proj", "mlp.down_proj")


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = tmp_path_factory.mktemp("calibrated")
    generate_demo(TINY, model_dir)
    calibrate(model_dir / "prompt.onnx", model_dir / "token.onnx", model_dir / "prompt.encodings.json",
              model_dir / "token.encodings.json", num_samples=3)
    return model_dir


def encodings(model_dir: Path, kind: str) -> Encodings:
    return read_encodings(model_dir / f"{kind}.encodings.json")


def fake_quantize(values: np.ndarray, encoding: TensorEncoding, axis: int) -> np.ndarray:
    """AIMET: ``q = clamp(round(x / scale) - offset, 0, 2**bw - 1)``, ``x_hat = (q + offset) * scale``."""
    shape = [1] * values.ndim
    shape[axis] = -1
    scale = np.asarray(encoding.scale).reshape(shape)
    offset = np.asarray(encoding.offset).reshape(shape)
    q = np.clip(np.round(values / scale) - offset, 0, 2 ** encoding.bitwidth - 1)
    return (q + offset) * scale


@pytest.mark.parametrize("kind", ["prompt", "token"])
def test_every_float_activation_is_encoded(calibrated: Path, kind: str) -> None:
    graph = onnx.load(calibrated / f"{kind}.onnx", load_external_data=False).graph
    expected = {out for node in graph.node for out in node.output}
    expected |= {value.name for value in graph.input if value.name != "input_ids"}
    activations = encodings(calibrated, kind).activations
    assert set(activations) == expected
    assert all(e.dtype == "int" and e.bitwidth == 16 and e.kind == "per_tensor" and not e.is_symmetric
               for e in activations.values())


def test_params_are_the_matmul_weights_embedding_and_head(calibrated: Path) -> None:
    params = encodings(calibrated, "prompt").params
    expected = {f"model.layers.{i}.{w}.weight" for i in range(TINY.layers) for w in MATMUL_WEIGHTS}
    assert set(params) == expected | {"model.embed_tokens.weight", "lm_head.weight"}
    q_proj = params["model.layers.0.self_attn.q_proj.weight"]
    assert (q_proj.bitwidth, q_proj.kind, q_proj.is_symmetric, len(q_proj.scale)) == (4, "per_channel", True, 64)
    assert set(q_proj.offset) == {-8}
    assert len(params["model.layers.1.mlp.down_proj.weight"].scale) == TINY.hidden        # output channels
    assert len(params["model.layers.1.self_attn.k_proj.weight"].scale) == TINY.kv_heads * TINY.head_dim
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert (params[name].bitwidth, len(params[name].scale), set(params[name].offset)) == (8, TINY.vocab, {-128})


def test_shared_tensors_have_identical_encodings(calibrated: Path) -> None:
    prompt, token = encodings(calibrated, "prompt"), encodings(calibrated, "token")
    shared = prompt.activations.keys() & token.activations.keys()
    assert "/model/layers.1/Add_1_output_0" in shared and "logits" in shared
    assert all(prompt.activations[name] == token.activations[name] for name in shared)
    assert prompt.params == token.params
    # Genie also wants a layer's KV cache input and output quantized alike.
    for i in range(TINY.layers):
        for what in ("key", "value"):
            assert prompt.activations[f"past_{what}_{i}_in"].scale == prompt.activations[f"past_{what}_{i}_out"].scale


def test_quantized_weights_are_within_half_a_step(calibrated: Path) -> None:
    model = onnx.load(calibrated / "token.onnx")
    weights = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    for name, encoding in encodings(calibrated, "token").params.items():
        axis = 0 if name == "model.embed_tokens.weight" else -1
        values = weights[name]
        error = np.abs(fake_quantize(values, encoding, axis) - values)
        steps = np.asarray(encoding.scale).reshape((-1, 1) if axis == 0 else (1, -1))
        assert np.all(error <= steps / 2 * (1 + 1e-9)), name
        # The largest weight of a channel lands exactly on the top level: scale = max|w| / (2**(bw-1) - 1).
        top = np.abs(values).max(axis=1 if axis == 0 else 0)
        np.testing.assert_allclose(top, np.asarray(encoding.scale) * (2 ** (encoding.bitwidth - 1) - 1))


def test_activation_ranges_cover_the_calibration_runs(calibrated: Path) -> None:
    activations = encodings(calibrated, "prompt").activations
    sess = ort.InferenceSession(str(calibrated / "prompt.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    for feed in calibration_feeds(TINY, "prompt", 3):
        values = dict(zip(names, sess.run(None, feed))) | {"attention_mask": feed["attention_mask"]}
        for name, value in values.items():
            (scale,), (offset,) = activations[name].scale, activations[name].offset
            # Rounding the offset (as AIMET does) moves the grid by at most half a step.
            low, high = (offset - 0.5) * scale, (offset + 2 ** 16 - 1 + 0.5) * scale
            assert low <= value.min() and value.max() <= high, name
    mask = activations["attention_mask"]
    assert mask.offset[0] == -65535 and mask.scale[0] == pytest.approx(50 / 65535)


def test_activation_encoding_follows_aimet() -> None:
    encoding = activation_encoding("t", -1.0, 3.0)
    assert encoding.scale[0] == pytest.approx(4 / 65535) and encoding.offset == (-16384,)
    positive = activation_encoding("t", 2.0, 5.0)     # widened to include 0
    assert positive.offset == (0,) and positive.scale[0] == pytest.approx(5 / 65535)
    zero = activation_encoding("t", 0.0, 0.0)
    assert zero.scale[0] > 0 and zero.offset == (0,)


def test_symmetric_per_channel_numbers() -> None:
    values = np.array([[0.7, -0.1, 0.0], [-1.4, 0.2, 0.0]], dtype=np.float32)
    by_column = symmetric_per_channel("w", values, -1, 4)
    np.testing.assert_allclose(by_column.scale, [0.2, 0.2 / 7, 0.0], atol=1e-9)
    assert by_column.scale[2] > 0 and by_column.offset == (-8, -8, -8)
    by_row = symmetric_per_channel("w", values, 0, 8)
    np.testing.assert_allclose(by_row.scale, [0.7 / 127, 1.4 / 127], rtol=1e-6)


def test_range_helpers() -> None:
    merged = merge_ranges({"a": (-1.0, 1.0), "b": (0.0, 2.0)}, {"a": (-3.0, 0.5), "c": (1.0, 1.0)})
    assert merged == {"a": (-3.0, 1.0), "b": (0.0, 2.0), "c": (1.0, 1.0)}
    tied = tie_kv_cache({"past_key_3_in": (-1.0, 1.0), "past_key_3_out": (-2.0, 0.5), "past_value_3_in": (0.0, 4.0),
                         "logits": (-9.0, 9.0)})
    assert tied == {"past_key_3_in": (-2.0, 1.0), "past_key_3_out": (-2.0, 1.0), "past_value_3_in": (0.0, 4.0),
                    "logits": (-9.0, 9.0)}


def test_calibration_is_deterministic(calibrated: Path, tmp_path: Path) -> None:
    assert cli.main(["calibrate", "--model-dir", str(calibrated), "--num-samples", "3",
                     "--out-prompt", str(tmp_path / "p.json"), "--out-token", str(tmp_path / "t.json")]) == 0
    assert (tmp_path / "p.json").read_bytes() == (calibrated / "prompt.encodings.json").read_bytes()
    assert (tmp_path / "t.json").read_bytes() == (calibrated / "token.encodings.json").read_bytes()


def test_fp16_weights_are_params_not_activations(tmp_path: Path) -> None:
    generate_demo(dataclasses.replace(TINY, layers=1, weight_dtype="float16"), tmp_path)
    calibrate(tmp_path / "prompt.onnx", tmp_path / "token.onnx", tmp_path / "p.json", tmp_path / "t.json",
              num_samples=1)
    result = read_encodings(tmp_path / "t.json")
    assert len(result.params) == len(MATMUL_WEIGHTS) + 2
    assert not any(name.endswith("/Cast_output_0") for name in result.activations)
    assert "logits" in result.activations


def test_mismatched_config_is_reported(calibrated: Path, tmp_path: Path) -> None:
    config = json.loads((calibrated / "config.json").read_text()) | {"num_key_value_heads": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(GenieBuildError) as error:
        calibrate(calibrated / "prompt.onnx", calibrated / "token.onnx", tmp_path / "p.json", tmp_path / "t.json",
                  hf_config_path=tmp_path / "config.json")
    assert error.value.where == str(calibrated / "prompt.onnx") and "past_key_0_in" in error.value.problem
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("args", [["--prompt", "a.onnx"], ["--model-dir", "m", "--token", "t.onnx"],
                                  ["--model-dir", "nowhere", "--num-samples", "0"]])
def test_cli_rejects_bad_arguments(tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture) -> None:
    out = ["--out-prompt", str(tmp_path / "p.json"), "--out-token", str(tmp_path / "t.json")]
    assert cli.main(["calibrate", *args, *out]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_low_memory_session_options_give_the_same_encodings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Priority order and no arena (so float16 weights are cast one at a time) change no byte of the result."""
    generate_demo(dataclasses.replace(TINY, layers=1, weight_dtype="float16"), tmp_path)
    used: list[ort.SessionOptions] = []
    original = ort.InferenceSession

    def recording_session(model, options, providers):
        used.append(options)
        return original(model, options, providers=providers)

    monkeypatch.setattr(ort, "InferenceSession", recording_session)
    calibrate(tmp_path / "prompt.onnx", tmp_path / "token.onnx", tmp_path / "p.json", tmp_path / "t.json",
              num_samples=2)
    assert used and all(options.execution_order == ort.ExecutionOrder.PRIORITY_BASED
                        and not options.enable_cpu_mem_arena for options in used)

    def default_order_session(model, options, providers):
        options.execution_order, options.enable_cpu_mem_arena = ort.ExecutionOrder.DEFAULT, True
        return original(model, options, providers=providers)

    monkeypatch.setattr(ort, "InferenceSession", default_order_session)
    calibrate(tmp_path / "prompt.onnx", tmp_path / "token.onnx", tmp_path / "p0.json", tmp_path / "t0.json",
              num_samples=2)
    assert (tmp_path / "p.json").read_bytes() == (tmp_path / "p0.json").read_bytes()
    assert (tmp_path / "t.json").read_bytes() == (tmp_path / "t0.json").read_bytes()


def test_the_builtin_calibrator_is_w4a16_but_for_the_embedding_table() -> None:
    """The builtin calibrator's precision shares the named recipe w4a16's decoder weights, LM head and
    activations; aimet-onnx's w4a16 gives the table 16 bits per tensor, the builtin calibrator 8 per vocab row."""
    w4a16 = precision_of(RECIPES["w4a16"])
    same = ("layers", "lm_head", "activations", "granularity", "block_size")
    assert [getattr(BUILTIN_PRECISION, key) for key in same] == [getattr(w4a16, key) for key in same]
    table = next(rule for rule in w4a16.overrides if rule.pattern == EMBED_WEIGHT)
    assert (table.bitwidth, table.granularity) == (16, "per_tensor")
    assert (BUILTIN_PRECISION.embedding, BUILTIN_PRECISION.granularity) == (8, "per_channel")
