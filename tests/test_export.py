"""The whole export of a Hugging Face checkpoint -> Genie's prompt (AR-N) and token (AR-1) graphs: the reference the
per-part export is compared with (tests/test_export_parts.py), sharing its wrapper and post-processing.

The proof: the float export, run in onnxruntime with the feeds Genie computes (conventions' rope_tables and
causal_mask), equals transformers' own forward with a DynamicCache: the logits and the new KV entries of the prompt
step (AR tokens from an empty cache) and of the token step after it, for random Qwen2, Llama (llama3 RoPE scaling)
and Qwen3 checkpoints, untied and tied, single-file and sharded. Closing figures (max abs diff over all values of
one step, float32, this box): at most 2.1e-7 on the logits and 1.2e-6 on the KV entries (3584 to 4608 values
compared per prompt step, 448 to 576 per token step); :data:`TOLERANCE` leaves room for other CPUs' summation
order.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from genie_build.conventions import (EMBED_WEIGHT, EMBEDDING_BOUNDARY, INPUT_IDS, LM_HEAD_WEIGHT, LOGITS, MASK,
                                     POS_COS, POS_SIN, causal_mask, kv_name, layer_output, rope_tables)
from genie_build.errors import GenieBuildError
from genie_build.genie_contract import model_violations
from genie_build.hf_config import head_dim, read_rope
from genie_build.onnx_graph import graph_io, load_graph
from genie_build.plan.boundaries import discover_boundaries

pytestmark = pytest.mark.hf
torch = pytest.importorskip("torch", reason="the export needs torch: pip install --no-deps -r envs/requirements-hf.txt")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxscript")

import family_cases  # noqa: E402
import hf_checkpoints  # noqa: E402  (needs torch)
import onnxruntime as ort  # noqa: E402

from genie_build.export.export import export_checkpoint  # noqa: E402
from genie_build.ort_session import cpu_session_options  # noqa: E402

AR, CONTEXT = 8, 32
TOLERANCE = 1e-5  # max abs diff of float32 logits and KV entries, ONNX vs transformers
CASES = {  # name -> (family, tied, max_shard_size, config.json in the Hub's transformers-4 layout)
    "qwen2": ("qwen2", False, None, False),
    "qwen2-tied-sharded": ("qwen2", True, "100KB", False),
    "qwen2.5-hub-config": ("qwen2", True, None, True),
    "llama3-tied": ("llama", True, None, False),
    "llama3.2-hub-config": ("llama", True, None, True),
    "qwen3-tied": ("qwen3", True, None, False),
}


def as_hub_config(checkpoint: Path) -> None:
    """Rewrite config.json as the Hub's Qwen2.5 and Llama 3.2 files state it (transformers 4): ``rope_theta`` and
    ``rope_scaling`` at the top level instead of ``rope_parameters``, ``torch_dtype``, and for Qwen2 a sliding
    window that ``use_sliding_window: false`` turns off; Phi-3.5's longrope as ``type`` with the factor lists and
    ``original_max_position_embeddings`` at the top level."""
    path = checkpoint / "config.json"
    config = json.loads(path.read_text())
    rope = dict(config.pop("rope_parameters"))
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope if rope.get("rope_type", "default") != "default" else None
    if rope.get("rope_type") == "longrope":
        config["original_max_position_embeddings"] = rope["original_max_position_embeddings"]
        config["rope_scaling"] = {"long_factor": rope["long_factor"], "short_factor": rope["short_factor"],
                                  "type": "longrope"}
    config["torch_dtype"] = config.pop("dtype", "float32")
    config.pop("layer_types", None)
    if config["model_type"] == "qwen2":
        config.update(use_sliding_window=False, sliding_window=32768, max_window_layers=21)
    path.write_text(json.dumps(config, indent=2))


@pytest.fixture(scope="module", params=sorted(CASES))
def exported(request, tmp_path_factory) -> tuple[str, Path, Path]:
    """``(case, checkpoint dir, export dir)``, exported once per case."""
    family, tied, shard, hub_layout = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    checkpoint = hf_checkpoints.make_checkpoint(root / "checkpoint", family, tied=tied, max_shard_size=shard)
    if hub_layout:
        as_hub_config(checkpoint)
    export_checkpoint(checkpoint, root / "export", ar=AR, context=CONTEXT)
    assert (checkpoint / "model.safetensors.index.json").is_file() == bool(shard)  # the case is what it says
    return request.param, checkpoint, root / "export"


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), sess_options=cpu_session_options(), providers=["CPUExecutionProvider"])


def _hf_steps(checkpoint: Path, prompt_ids: np.ndarray, next_id: int) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """transformers' logits and new (keys, values) per layer for the prompt step, then the token step."""
    config = json.loads((checkpoint / "config.json").read_text())
    model_class = getattr(transformers, config["architectures"][0])
    model = model_class.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="eager").eval()
    cache = transformers.DynamicCache(config=model.config)
    steps = []
    with torch.no_grad():
        for ids, new in ((prompt_ids, AR), (np.array([[next_id]]), 1)):
            logits = model(input_ids=torch.from_numpy(ids.astype(np.int64)), cache=cache, use_cache=True).logits
            entries = [tensor[:, :, -new:, :].numpy() for layer in cache.layers for tensor in (layer.keys,
                                                                                               layer.values)]
            steps.append((logits.numpy(), entries))
    return steps


def _genie_steps(checkpoint: Path, export: Path, prompt_ids: np.ndarray,
                 next_id: int) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """The exported graphs' logits and new (keys untransposed, values) per layer, fed as Genie feeds them: the
    prompt from an empty cache, the token with the prompt's entries in the first cache slots."""
    config = json.loads((checkpoint / "config.json").read_text())
    rope = read_rope(config, "config.json")
    d, layers = head_dim(config, "config.json"), config["num_hidden_layers"]
    kv = config["num_key_value_heads"]
    steps, cache = [], None
    for kind, ids, past_len in (("prompt", prompt_ids, 0), ("token", np.array([[next_id]]), AR)):
        ar = ids.shape[1]
        cos, sin = rope_tables(d, rope.theta, np.arange(past_len, past_len + ar), rope.scaling)
        feed = {INPUT_IDS: ids.astype(np.int32), MASK: causal_mask(ar, CONTEXT, past_len), POS_COS: cos, POS_SIN: sin}
        past = CONTEXT - ar
        for i in range(layers):
            keys, values = np.zeros((1, kv, d, past), np.float32), np.zeros((1, kv, past, d), np.float32)
            if cache is not None:
                keys[..., :past_len], values[:, :, :past_len] = cache[2 * i], cache[2 * i + 1]
            feed[kv_name("key", i, "in")], feed[kv_name("value", i, "in")] = keys, values
        names = [LOGITS, *(kv_name(kind_, i, "out") for i in range(layers) for kind_ in ("key", "value"))]
        logits, *entries = _session(export / f"{kind}.onnx").run(names, feed)
        cache = entries
        steps.append((logits, [e.transpose(0, 1, 3, 2) if n % 2 == 0 else e for n, e in enumerate(entries)]))
    return steps


def test_the_float_export_equals_transformers_forward(exported):
    case, checkpoint, export = exported
    rng = np.random.default_rng(0)
    vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    prompt_ids, next_id = rng.integers(0, vocab, (1, AR)), int(rng.integers(0, vocab))
    hf, genie = _hf_steps(checkpoint, prompt_ids, next_id), _genie_steps(checkpoint, export, prompt_ids, next_id)
    for step, ((hf_logits, hf_kv), (genie_logits, genie_kv)) in zip(("prompt", "token"), zip(hf, genie)):
        assert genie_logits.shape == hf_logits.shape
        assert np.abs(genie_logits - hf_logits).max() < TOLERANCE, (case, step, "logits")
        assert len(genie_kv) == len(hf_kv)
        for n, (ours, theirs) in enumerate(zip(genie_kv, hf_kv)):
            assert ours.shape == theirs.shape, (case, step, n)
            assert np.abs(ours - theirs).max() < TOLERANCE, (case, step, "key" if n % 2 == 0 else "value", n // 2)
    assert np.abs(hf[0][0]).max() > 0.1  # the logits are not all near zero, so the comparison has teeth


def test_the_exports_follow_genies_contract_and_share_named_weights(exported):
    case, checkpoint, export = exported
    graphs = {kind: load_graph(export / f"{kind}.onnx") for kind in ("prompt", "token")}
    dims, violations = model_violations({kind: (graph_io(m).inputs, graph_io(m).outputs) for kind, m in graphs.items()},
                                        expected={"prompt": (AR, CONTEXT), "token": (1, CONTEXT)})
    assert violations == [] and dims == {"prompt": (AR, CONTEXT), "token": (1, CONTEXT)}
    names = {kind: {t.name for t in m.graph.initializer} for kind, m in graphs.items()}
    assert names["prompt"] == names["token"]
    assert {EMBED_WEIGHT, LM_HEAD_WEIGHT, "model.norm.weight"} <= names["prompt"]
    layers = json.loads((checkpoint / "config.json").read_text())["num_hidden_layers"]
    for kind, model in graphs.items():
        assert model.graph.name == f"{kind}_ar{AR if kind == 'prompt' else 1}_cl{CONTEXT}"
        assert discover_boundaries(model, kind) == (EMBEDDING_BOUNDARY, *(layer_output(i) for i in range(layers)))
        assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer
                   if t.name in (EMBED_WEIGHT, LM_HEAD_WEIGHT))


def test_a_tied_head_is_written_as_its_own_copy_of_the_table(tmp_path):
    checkpoint = hf_checkpoints.make_checkpoint(tmp_path / "checkpoint", "qwen2", tied=True)
    summary = export_checkpoint(checkpoint, tmp_path / "export", ar=AR, context=CONTEXT)
    model = onnx.load(str(tmp_path / "export" / "token.onnx"))
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert summary.tied_lm_head
    np.testing.assert_array_equal(weights[LM_HEAD_WEIGHT], weights[EMBED_WEIGHT])


def test_llama3_scaling_changes_the_rope_tables_the_export_is_compared_with():
    """Without this the llama3 case above would pass with plain tables too."""
    scaled = rope_tables(16, 500000.0, np.arange(AR, 2 * AR), family_cases.llama.MODEL_ROPE)
    plain = rope_tables(16, 500000.0, np.arange(AR, 2 * AR))
    assert np.abs(scaled[1] - plain[1]).max() > 1e-2


def test_llama3_tables_equal_transformers_rotary_embedding():
    model = hf_checkpoints.hf_model("llama", context=64)
    positions = torch.arange(40).unsqueeze(0)
    cos, sin = model.model.rotary_emb(torch.zeros(1, 40, 64), positions)
    ours = rope_tables(16, 500000.0, np.arange(40), family_cases.llama.MODEL_ROPE)
    np.testing.assert_allclose(ours[0][0, 0], cos[0, :, :8].numpy(), atol=1e-6)
    np.testing.assert_allclose(ours[1][0, 0], sin[0, :, :8].numpy(), atol=1e-6)


# --- bad checkpoints: one line naming the file, nothing written ---------------------------------------------

@pytest.fixture()
def checkpoint(tmp_path) -> Path:
    return hf_checkpoints.make_checkpoint(tmp_path / "checkpoint", "qwen2", layers=1)


def _edit_config(checkpoint: Path, **changes) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(changes)
    (checkpoint / "config.json").write_text(json.dumps(config))


def _export_error(checkpoint: Path, out: Path, **settings) -> str:
    with pytest.raises(GenieBuildError) as error:
        export_checkpoint(checkpoint, out, **{"ar": AR, "context": CONTEXT, **settings})
    assert not out.exists() or not any(out.iterdir()), "a failed export left files"
    return str(error.value)


def test_an_unsupported_architecture_names_the_supported_ones(checkpoint, tmp_path):
    _edit_config(checkpoint, model_type="gpt2", architectures=["GPT2LMHeadModel"])
    message = _export_error(checkpoint, tmp_path / "out")
    assert "config.json" in message and "'gpt2'" in message
    assert all(name in message for name in ("Qwen2ForCausalLM", "LlamaForCausalLM", "Qwen3ForCausalLM"))


def test_an_unsupported_rope_type_is_refused(checkpoint, tmp_path):
    _edit_config(checkpoint, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0})
    assert "rope type 'yarn'" in _export_error(checkpoint, tmp_path / "out")


@pytest.mark.parametrize("damage, named", [
    (lambda ck: (ck / "tokenizer.json").unlink(), "tokenizer.json"),
    (lambda ck: (ck / "model.safetensors").unlink(), "model.safetensors"),
    (lambda ck: (ck / "config.json").unlink(), "config.json"),
    (lambda ck: (ck / "config.json").write_text("{not json"), "config.json"),
    (lambda ck: (ck / "config.json").write_text("[1, 2]"), "config.json"),
    (lambda ck: ((ck / "model.safetensors").unlink(),   # an index is read only without model.safetensors
                 (ck / "model.safetensors.index.json").write_text('{"weight_map": {"a": "gone.safetensors"}}')),
     "model.safetensors.index.json"),
    (lambda ck: (ck / "model.safetensors").write_bytes(b"truncated"), "checkpoint"),
])
def test_a_broken_checkpoint_is_one_line_naming_the_file(checkpoint, tmp_path, damage, named):
    damage(checkpoint)
    message = _export_error(checkpoint, tmp_path / "out")
    assert named in message and "\n" not in message


def test_ar_and_context_are_checked(checkpoint, tmp_path):
    assert "export.ar" in _export_error(checkpoint, tmp_path / "out", ar=CONTEXT)
    assert "export.context" in _export_error(checkpoint, tmp_path / "out", context=4096)


def test_a_failure_in_the_second_graph_leaves_no_file(checkpoint, tmp_path, monkeypatch):
    import genie_build.export.export as export

    real = export._exported_graph

    def fail_on_token(module, shape, kind, pieces, name):
        if kind == "token":
            raise GenieBuildError(name, "disk full")
        return real(module, shape, kind, pieces, name)

    monkeypatch.setattr(export, "_exported_graph", fail_on_token)
    out = tmp_path / "out"
    out.mkdir()
    (out / "prompt.onnx").write_text("an older export")
    with pytest.raises(GenieBuildError, match="disk full"):
        export.export_checkpoint(checkpoint, out, ar=AR, context=CONTEXT)
    assert sorted(p.name for p in out.iterdir()) == ["prompt.onnx"]
    assert (out / "prompt.onnx").read_text() == "an older export"


def test_the_cli_does_not_import_torch_unless_exporting():
    code = ("import sys; from genie_build.cli import build_parser; build_parser(); "
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False False"
