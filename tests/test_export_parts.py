"""export-part: one part of a Hugging Face checkpoint at a time, from its own tensors, against the whole export split.

For random Qwen2 (float32, sharded; and bfloat16, tied, with the Hub's transformers-4 config.json), Llama 3 (tied,
llama3 RoPE), Qwen3 (tied, head_dim other than hidden / heads), Mistral (sharded) and Phi-3 (bfloat16, fused
qkv_proj and gate_up_proj; and Phi-3.5's longrope in its Hub layout) checkpoints and a plan made from config.json
alone: every part's prompt and token graphs equal the split of the whole export (IO, graph names, every node with
its canonical names, every weight, onnxruntime outputs bit for bit); both graphs of a part read one weights file;
a part reads only its own tensors; each part computes what transformers' modules compute, and the parts chained,
one in memory at a time, what transformers' forward computes (max abs diff within 1e-5, as the whole export).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from genie_build.conventions import INPUT_IDS, LOGITS, MASK, POS_COS, POS_SIN, causal_mask, kv_name, rope_tables
from genie_build.errors import GenieBuildError
from genie_build.export.canonical import canonicalize
from genie_build.hf_config import head_dim, read_rope
from genie_build.plan.shape_plan import part_tensor_names, plan_from_hf_config
from genie_build.split.split import DATA_ALIGNMENT, split_graphs
from genie_build.split.verify_split import build_feed, run_graph

pytestmark = pytest.mark.hf
torch = pytest.importorskip("torch", reason="the export needs torch: pip install --no-deps -r envs/requirements-hf.txt")
pytest.importorskip("transformers")
pytest.importorskip("onnxscript")

import family_cases  # noqa: E402
import hf_checkpoints  # noqa: E402  (needs torch)
from test_export import as_hub_config, _hf_steps  # noqa: E402

from genie_build.export.export import export_checkpoint, export_part, part_files  # noqa: E402
from genie_build.export.verify_parts import PartGraph, verify_part  # noqa: E402

AR, CONTEXT, NUM_PARTS = 8, 32, 3
CASES = {  # name -> (family, tied, max_shard_size, dtype, config.json in the Hub's transformers-4 layout, keys)
    "qwen2-sharded": ("qwen2", False, "100KB", "float32", False, {}),
    "qwen2.5-bf16-hub-config": ("qwen2", True, None, "bfloat16", True, {}),
    "llama3-tied": ("llama", True, None, "float32", False, {}),
    "qwen3-tied": ("qwen3", True, None, "float32", False, {}),
    "mistral-sharded": ("mistral", False, "100KB", "float32", False, {}),
    "phi3-bf16": ("phi3", False, None, "bfloat16", False, {}),
    "phi3.5-longrope-hub-config": ("phi3", False, "100KB", "float32", True,
                                   {"rope_parameters": family_cases.phi3.MODEL_LONGROPE,
                                    "original_max_position_embeddings": 32}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def exported(request, tmp_path_factory):
    """``(case, checkpoint, plan, whole export split into parts, per-part export)``, made once per case."""
    family, tied, shard, dtype, hub_layout, keys = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    checkpoint = hf_checkpoints.make_checkpoint(root / "checkpoint", family, tied=tied, max_shard_size=shard,
                                                dtype=dtype, layers=3, **keys)
    if hub_layout:
        as_hub_config(checkpoint)
    plan = plan_from_hf_config(checkpoint / "config.json", recipe="w4a16", ar=AR, context=CONTEXT,
                               num_parts=NUM_PARTS)
    export_checkpoint(checkpoint, root / "whole", ar=AR, context=CONTEXT)
    split_graphs({kind: root / "whole" / f"{kind}.onnx" for kind in ("prompt", "token")}, plan, root / "split")
    for part in plan.parts:
        export_part(checkpoint, part, root / "parts" / part.label, num_parts=NUM_PARTS, ar=AR, context=CONTEXT)
    return request.param, checkpoint, plan, root / "split", root / "parts"


def _nodes(model: onnx.ModelProto) -> list[tuple]:
    return [(n.op_type, n.name, list(n.input), list(n.output), [a.SerializeToString() for a in n.attribute])
            for n in model.graph.node]


def _io(model: onnx.ModelProto) -> list[list[tuple[str, bytes]]]:
    return [[(v.name, v.type.SerializeToString()) for v in values]
            for values in (model.graph.input, model.graph.output)]


def _weights(model: onnx.ModelProto, folder: Path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t, str(folder)) for t in model.graph.initializer}


def test_each_part_equals_the_split_of_the_whole_export(exported):
    case, _, plan, split, parts = exported
    for part in plan.parts:
        graphs, _ = part_files(parts / part.label)
        for kind, path in graphs.items():
            split_part = split / f"part_{part.label}" / f"{kind}.onnx"
            whole = onnx.load(split_part, load_external_data=False)
            alone = onnx.load(path, load_external_data=False)
            canonicalize(whole.graph)   # the split keeps the whole export's names, which are canonical already
            assert _io(alone) == _io(whole), (case, part.label, kind)
            assert alone.graph.name == whole.graph.name
            assert _nodes(alone) == _nodes(whole), (case, part.label, kind)
            ours, theirs = _weights(alone, path.parent), _weights(whole, split_part.parent)
            assert ours.keys() == theirs.keys()
            assert all(ours[name].dtype == np.float32 and np.array_equal(ours[name], theirs[name]) for name in ours)
            feed = build_feed(path, vocab=None if part.index > 1 else 320)
            expected = run_graph(split_part, feed)
            actual = run_graph(path, feed)
            assert list(actual) == list(expected)
            assert all(actual[name].tobytes() == expected[name].tobytes() for name in expected), (case, part.label)


def test_both_graphs_of_a_part_read_one_weights_file_exported_or_split(exported):
    """One layout for every source: a part exported from the checkpoint and a part split from the whole export."""
    _, _, plan, split, parts = exported
    for folder in [*(parts / part.label for part in plan.parts),
                   *(split / f"part_{part.label}" for part in plan.parts)]:
        graphs, data = part_files(folder)
        assert sorted(p.name for p in data.parent.iterdir()) == sorted([data.name, *(g.name for g in graphs.values())])
        assert data.stat().st_nlink == 1   # a regular file, which ONNX's loader accepts
        checksum = hashlib.sha1(data.read_bytes()).hexdigest()
        layouts = []
        for path in graphs.values():
            model = onnx.load(path, load_external_data=False)
            entries = {t.name: {e.key: e.value for e in t.external_data} for t in model.graph.initializer
                       if t.data_location == onnx.TensorProto.EXTERNAL}   # the split keeps tensors under 1 KiB inline
            assert entries and all(e["location"] == data.name and e["checksum"] == checksum
                       and int(e["offset"]) % DATA_ALIGNMENT == 0 for e in entries.values())
            layouts.append(entries)
        assert layouts[1].items() <= layouts[0].items()   # the token graph's weights are the prompt graph's


def test_a_part_reads_only_its_own_tensors(exported, tmp_path, monkeypatch):
    _, checkpoint, plan, _, _ = exported
    import safetensors

    read: list[str] = []
    real = safetensors.safe_open

    class Recording:
        def __init__(self, *args, **kwargs):
            self.handle = real(*args, **kwargs)

        def __enter__(self):
            self.inner = self.handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

        def get_tensor(self, name):
            read.append(name)
            return self.inner.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Recording)
    part = plan.parts[1]
    export_part(checkpoint, part, tmp_path / "part", num_parts=NUM_PARTS, ar=AR, context=CONTEXT)
    assert sorted(read) == sorted(part_tensor_names(checkpoint / "config.json", part))
    assert all(name.startswith(("model.layers.0.", "model.layers.1.")) for name in read)


def own_graphs(folder: Path) -> list[PartGraph]:
    """A part's prompt and token graphs at the export's context."""
    return [PartGraph(kind, kind, CONTEXT, path) for kind, path in part_files(folder)[0].items()]


def test_each_part_computes_what_transformers_modules_compute(exported, tmp_path):
    case, checkpoint, plan, _, parts = exported
    for part in plan.parts:
        checks = verify_part(checkpoint, part, own_graphs(parts / part.label), ar=AR,
                             out=tmp_path / f"{part.label}.json")
        assert {check.graph for check in checks} == {"prompt", "token"}
        assert all(check.within_tolerance for check in checks)
        report = json.loads((tmp_path / f"{part.label}.json").read_text())
        assert report["reference"].startswith("transformers modules") and len(report["outputs"]) == len(checks)
        if part.output_boundary is None:
            assert max(check.max_abs_reference for check in checks if check.output == LOGITS) > 0.1


def test_a_wrong_weight_in_a_part_is_caught_against_transformers(exported, tmp_path):
    _, checkpoint, plan, _, parts = exported
    broken = tmp_path / "broken"
    source = parts / plan.parts[1].label
    broken.mkdir()
    for path in source.iterdir():
        broken.joinpath(path.name).write_bytes(path.read_bytes())
    graphs, data = part_files(broken)
    model = onnx.load(graphs["prompt"], load_external_data=False)
    weight = next(t for t in model.graph.initializer if t.name.endswith("mlp.down_proj.weight"))
    offset = int(next(e.value for e in weight.external_data if e.key == "offset"))
    values = bytearray(data.read_bytes())
    values[offset:offset + 4] = np.float32(3.0).tobytes()   # one weight of layer 0's MLP
    data.write_bytes(bytes(values))
    with pytest.raises(GenieBuildError, match="differs from transformers' modules") as error:
        verify_part(checkpoint, plan.parts[1], own_graphs(broken), ar=AR, out=tmp_path / "report.json")
    assert str(graphs["prompt"]) in str(error.value)
    assert not (tmp_path / "report.json").exists()


def test_the_chained_parts_equal_transformers_forward(exported):
    """A prompt step from an empty cache then a token step, as Genie runs them: the parts in onnxruntime one at a
    time, each fed the previous part's residual stream, against transformers' whole model with a DynamicCache."""
    case, checkpoint, plan, _, parts = exported
    config = json.loads((checkpoint / "config.json").read_text())
    rope, d = read_rope(config, "config.json"), head_dim(config, "config.json")
    rng = np.random.default_rng(1)
    prompt_ids, next_id = rng.integers(0, config["vocab_size"], (1, AR)), int(rng.integers(0, config["vocab_size"]))
    hf = _hf_steps(checkpoint, prompt_ids, next_id)
    cache = None
    for step, (kind, ids, past_len) in enumerate((("prompt", prompt_ids, 0), ("token", np.array([[next_id]]), AR))):
        ar, past = ids.shape[1], CONTEXT - ids.shape[1]
        cos, sin = rope_tables(d, rope.theta, np.arange(past_len, past_len + ar), rope.scaling)
        values = {INPUT_IDS: ids.astype(np.int32), MASK: causal_mask(ar, CONTEXT, past_len), POS_COS: cos,
                  POS_SIN: sin}
        kv = config["num_key_value_heads"]
        for i in range(config["num_hidden_layers"]):
            keys, vals = np.zeros((1, kv, d, past), np.float32), np.zeros((1, kv, past, d), np.float32)
            if cache is not None:
                keys[..., :past_len], vals[:, :, :past_len] = cache[2 * i], cache[2 * i + 1]
            values[kv_name("key", i, "in")], values[kv_name("value", i, "in")] = keys, vals
        for part in plan.parts:
            values.update(run_graph(part_files(parts / part.label)[0][kind], values))
        entries = [values[kv_name(k, i, "out")] for i in range(config["num_hidden_layers"]) for k in ("key", "value")]
        cache = entries
        hf_logits, hf_kv = hf[step]
        assert np.abs(values[LOGITS] - hf_logits).max() < 1e-5, (case, kind)
        for n, (ours, theirs) in enumerate(zip(entries, hf_kv)):
            ours = ours.transpose(0, 1, 3, 2) if n % 2 == 0 else ours
            assert np.abs(ours - theirs).max() < 1e-5, (case, kind, n)


def test_a_checkpoint_without_a_tensor_of_the_part_names_it(tmp_path):
    checkpoint = hf_checkpoints.make_checkpoint(tmp_path / "checkpoint", "qwen2", layers=2)
    plan = plan_from_hf_config(checkpoint / "config.json", recipe="w4a16", ar=AR, context=CONTEXT, num_parts=2)
    config = json.loads((checkpoint / "config.json").read_text())
    config["num_hidden_layers"] = 3   # the config now names a layer the weights lack
    config.pop("layer_types", None)
    (checkpoint / "config.json").write_text(json.dumps(config))
    bigger = plan_from_hf_config(checkpoint / "config.json", recipe="w4a16", ar=AR, context=CONTEXT, num_parts=2)
    with pytest.raises(GenieBuildError, match="num_hidden_layers is 3, but the checkpoint's tensors hold layers 0-1"
                       ) as error:
        export_part(checkpoint, bigger.parts[-1], tmp_path / "out", num_parts=2, ar=AR, context=CONTEXT)
    assert str(checkpoint) in str(error.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert plan.num_parts == 2


def test_the_command_exits_2_with_one_line(tmp_path):
    checkpoint = hf_checkpoints.make_checkpoint(tmp_path / "checkpoint", "qwen2", layers=1)
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(model_type="gemma2", architectures=["Gemma2ForCausalLM"])
    (checkpoint / "config.json").write_text(json.dumps(config))
    part = {"index": 2, "label": "2_of_2", "pieces": ["layer_0", "head"], "first_layer": 0, "last_layer": 0,
            "input_boundary": "/model/embed_tokens/Gather_output_0", "output_boundary": None}
    for part_json, message in ((json.dumps(part), "'gemma2'"), ("{\"label\": 1}", "--part-json")):
        result = subprocess.run([sys.executable, "-m", "genie_build", "export-part", "--checkpoint", str(checkpoint),
                                 "--part-json", part_json, "--num-parts", "2", "--ar", str(AR), "--context",
                                 str(CONTEXT), "--out-dir", str(tmp_path / "out")], capture_output=True, text=True)
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [result.stderr.strip()]
        assert result.stderr.startswith("genie-build: error:") and message in result.stderr
    assert not (tmp_path / "out").exists()
