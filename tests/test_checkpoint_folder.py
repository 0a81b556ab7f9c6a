"""A checkpoint folder read as transformers reads it: the weights file it loads, the tie it applies, the tensors
each shard holds; what it would take silently (one tensor in two shards) refused; headers that cannot be read,
non-finite weights and tensors the model does not have reported against the shard; the Hugging Face cache's
symlinked layout accepted within its repository folder. Each case runs transformers' own ``from_pretrained`` on
the folder and compares it with what the export reads (:func:`genie_build.export.export.part_modules`)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from genie_build.errors import GenieBuildError
from genie_build.hf_checkpoint import check_checkpoint, folder_boundary, tensor_files, tensor_headers, weight_files

AR, CONTEXT = 4, 16
HEAD = "lm_head.weight"
EMBED = "model.embed_tokens.weight"


def _header_file(path: Path, header: bytes, length: int | None = None) -> Path:
    path.write_bytes((len(header) if length is None else length).to_bytes(8, "little") + header)
    return path


@pytest.mark.parametrize("header, length", [
    (b"[" * 100_000 + b"]" * 100_000, None),           # deeply nested JSON: RecursionError in json
    (b'{"w": {"dtype": "F32", "shape": [1], "\xff": 1}}', None),   # not UTF-8
    (b"{}", 1 << 60),                                   # an absurd header length
], ids=["nested", "utf8", "length"])
def test_an_unreadable_header_is_one_line_naming_the_shard(tmp_path, header, length):
    shard = _header_file(tmp_path / "model.safetensors", header, length)
    with pytest.raises(GenieBuildError) as caught:
        tensor_headers(tmp_path)
    assert caught.value.where == str(shard) and "\n" not in str(caught.value)
    assert "header cannot be read" in caught.value.problem


def test_a_tensor_in_two_shards_is_refused_naming_it_and_both(tmp_path):
    entry = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    for name, tensors in (("a.safetensors", ["x", "dup"]), ("b.safetensors", ["dup", "y"])):
        header = json.dumps({tensor: entry for tensor in tensors}).encode()
        (tmp_path / name).write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"x": "a.safetensors", "dup": "a.safetensors", "y": "b.safetensors"}}))
    with pytest.raises(GenieBuildError, match=r"b\.safetensors: holds tensor 'dup', which a\.safetensors holds too"):
        tensor_files(tmp_path)


def test_a_file_leading_outside_the_model_folder_is_refused(tmp_path):
    outside = _header_file(tmp_path / "elsewhere.safetensors", b"{}")
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").symlink_to(outside)
    with pytest.raises(GenieBuildError, match="outside the model folder"):
        weight_files(model)


def test_a_cache_snapshot_is_bounded_by_its_repository_folder(tmp_path):
    snapshot = tmp_path / "models--org--name" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    assert folder_boundary(snapshot) == (tmp_path / "models--org--name").resolve()
    assert folder_boundary(tmp_path) == tmp_path.resolve()


# --- against transformers' own from_pretrained (torch) ------------------------------------------------------

@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    pytest.importorskip("transformers")
    from hf_checkpoints import make_checkpoint
    return make_checkpoint(tmp_path_factory.mktemp("sharded"), "qwen2", max_shard_size="100KB")


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def _transformers_tensors(folder: Path, **kwargs):
    import torch
    import transformers
    model, info = transformers.Qwen2ForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True,
                                                                **kwargs)
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}, info


def _export_tensors(folder: Path):
    from genie_build.export.export import GraphSpan, part_modules
    checkpoint = check_checkpoint(folder, ar=AR, context=CONTEXT)
    layers = checkpoint.config["num_hidden_layers"]
    return {name: tensor for name, tensor in part_modules(checkpoint, GraphSpan.whole(layers)).state_dict().items()}


def _assert_same(exported, loaded):
    import torch
    assert set(exported) <= set(loaded)
    for name, tensor in exported.items():
        assert torch.equal(tensor, loaded[name]), name


def _rewrite(shard: Path, change) -> None:
    from safetensors.torch import load_file, save_file
    tensors = load_file(shard)
    change(tensors)
    save_file(tensors, shard, metadata={"format": "pt"})


@pytest.mark.hf
def test_model_safetensors_beside_an_index_is_the_file_read_as_transformers_does(sharded, tmp_path, caplog):
    from hf_checkpoints import hf_model
    folder = _copy(sharded, tmp_path / "both")
    hf_model("qwen2", seed=7).save_pretrained(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "model.safetensors", folder / "model.safetensors")
    with caplog.at_level(logging.WARNING):
        exported = _export_tensors(folder)
    assert weight_files(folder) == (folder / "model.safetensors",)
    assert "model.safetensors.index.json: not read" in caplog.text
    loaded, _ = _transformers_tensors(folder)
    _assert_same(exported, loaded)
    other, _ = _transformers_tensors(tmp_path / "other")
    _assert_same(exported, other)   # the single file's model, not the shards'


@pytest.mark.hf
def test_a_tied_config_with_its_own_stored_head_reads_the_stored_head_as_transformers_5(sharded, tmp_path, caplog):
    import torch
    folder = _copy(sharded, tmp_path / "tied")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    with caplog.at_level(logging.WARNING):
        exported = _export_tensors(folder)
    assert "tie_word_embeddings is true, but the checkpoint stores lm_head.weight" in caplog.text
    loaded, _ = _transformers_tensors(folder)
    assert not torch.equal(loaded[HEAD], loaded[EMBED])   # transformers kept the stored head
    _assert_same(exported, loaded)
    from genie_build.plan.plan_file import PartPlan
    from genie_build.plan.shape_plan import part_tensor_names
    head = PartPlan(2, "2_of_2", ("head",), None, None, "x", None, 0)
    assert part_tensor_names(folder / "config.json", head, tensor_files(folder)) == ["model.norm.weight", HEAD]


@pytest.mark.hf
def test_a_tensor_in_two_shards_is_refused_where_transformers_takes_one_copy_silently(sharded, tmp_path):
    import torch
    folder = _copy(sharded, tmp_path / "dup")
    holders = tensor_files(folder)
    first, last = sorted(set(holders.values()))[0], sorted(set(holders.values()))[-1]
    name = next(tensor for tensor, path in holders.items() if path == last)
    from safetensors.torch import load_file
    original = load_file(last)[name]
    copy = original + 1
    _rewrite(first, lambda tensors: tensors.__setitem__(name, copy))
    loaded, _ = _transformers_tensors(folder)   # no error: it takes one copy
    assert torch.equal(loaded[name], copy) or torch.equal(loaded[name], original)
    with pytest.raises(GenieBuildError, match=rf"holds tensor '{name}', which {first.name} holds too"):
        check_checkpoint(folder, ar=AR, context=CONTEXT)


@pytest.mark.hf
def test_tensors_the_model_lacks_are_named_in_a_warning_as_transformers_reports_them(sharded, tmp_path, caplog):
    import torch
    folder = _copy(sharded, tmp_path / "extra")
    shard = sorted(set(tensor_files(folder).values()))[0]
    extra = "model.layers.0.mlp.down_proj.bias"
    _rewrite(shard, lambda tensors: tensors.__setitem__(extra, torch.ones(64)))
    with caplog.at_level(logging.WARNING):
        exported = _export_tensors(folder)
    assert f"1 tensor(s) the model does not have are not read" in caplog.text and extra in caplog.text
    loaded, info = _transformers_tensors(folder)
    assert set(info["unexpected_keys"]) == {extra}
    _assert_same(exported, loaded)


@pytest.mark.hf
def test_a_layer_beyond_num_hidden_layers_is_refused(sharded, tmp_path):
    import torch
    folder = _copy(sharded, tmp_path / "deeper")
    shard = sorted(set(tensor_files(folder).values()))[-1]
    _rewrite(shard, lambda tensors: tensors.__setitem__("model.layers.2.input_layernorm.weight", torch.ones(64)))
    with pytest.raises(GenieBuildError, match="num_hidden_layers is 2, but the checkpoint's tensors hold layers 0-2"):
        check_checkpoint(folder, ar=AR, context=CONTEXT)


@pytest.mark.hf
def test_a_nan_weight_is_refused_by_the_export_naming_the_shard_and_the_tensor(sharded, tmp_path):
    from genie_build.export.export import GraphSpan, part_modules
    folder = _copy(sharded, tmp_path / "nan")
    name = "model.layers.1.mlp.up_proj.weight"
    shard = tensor_files(folder)[name]

    def poison(tensors):
        tensors[name][3, 5] = float("nan")
    _rewrite(shard, poison)
    checkpoint = check_checkpoint(folder, ar=AR, context=CONTEXT)   # headers only: the values are the export's
    part_modules(checkpoint, GraphSpan(True, (0,), False))        # a part without it is exported
    with pytest.raises(GenieBuildError) as caught:
        part_modules(checkpoint, GraphSpan(False, (1,), True))
    assert caught.value.where == str(shard)
    assert caught.value.problem.startswith(f"tensor {name!r} holds nan at index [3, 5]")


@pytest.mark.hf
def test_the_hugging_face_cache_layout_of_symlinked_blobs_is_read(sharded, tmp_path):
    import hashlib
    repository = tmp_path / "models--org--tiny"
    snapshot = repository / "snapshots" / "0123abcd"
    (repository / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for source in sorted(sharded.iterdir()):
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        shutil.copy(source, repository / "blobs" / digest)
        (snapshot / source.name).symlink_to(Path("..", "..", "blobs", digest))
    assert all(os.path.islink(snapshot / name) for name in os.listdir(snapshot))
    exported = _export_tensors(snapshot)
    loaded, _ = _transformers_tensors(snapshot)
    _assert_same(exported, loaded)
    assert set(tensor_files(snapshot).values()) <= {snapshot / path.name for path in sharded.iterdir()}
