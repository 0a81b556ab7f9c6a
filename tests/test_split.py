"""Streaming split: valid parts, exact IO, chain == full, one weights file per part with each shared weight stored
once, byte determinism, locality of changes, failures that replace nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from genie_build.cli import main
from genie_build.conventions import PART_WEIGHTS_NAME, find_parts
from genie_build.demo.demo import example_inputs
from genie_build.encodings import Encodings
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import load_graph
from genie_build.plan.boundaries import find_boundaries
from genie_build.plan.plan import by_encodings, weighed_pieces
from genie_build.plan.plan_file import write_plan
from genie_build.plan.planners import plan_by_num_parts
from genie_build.plan.weight_inventory import weights_from_graph
from genie_build.split.split import node_inputs, split_graphs
from genie_build.split.verify_split import build_feed, verify_chain
from demo_shapes import SMALL
from tiny_decoder import EMBED_OUT, build_tiny_decoder, layer_out, make_plan

SHAPE = SMALL
PLAN = make_plan(4, [[0, 1], [2, 3]])   # embedding alone, layers 0-1, layers 2-3 + head
KINDS = ("prompt", "token")


@pytest.fixture(scope="module")
def demo(small_demo: Path) -> Path:
    return small_demo


def split_both(prompt: Path, token: Path, plan, parts_dir: Path) -> dict[str, list[Path]]:
    """Both graphs split as the workflow does (one ``split`` job for the model's graphs), into ``parts_dir``."""
    return split_graphs({"prompt": prompt, "token": token}, plan, parts_dir)


def split_one(model: Path, plan, parts_dir: Path, key: str = "prompt") -> list[Path]:
    return split_graphs({key: model}, plan, parts_dir)[key]


@pytest.fixture(scope="module")
def parts(demo: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    return split_both(demo / "prompt.onnx", demo / "token.onnx", PLAN, tmp_path_factory.mktemp("split") / "parts")


def graph_of(path: Path) -> onnx.GraphProto:
    return onnx.load(path, load_external_data=False).graph


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def listing(root: Path) -> list[str]:
    """Every file and folder under ``root``, hidden ones (a staging folder) included; [] when it is absent."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def external_info(tensor: onnx.TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def stored_bytes(tensor: onnx.TensorProto, model_dir: Path) -> bytes:
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return tensor.raw_data
    info = external_info(tensor)
    with open(model_dir / info["location"], "rb") as handle:
        handle.seek(int(info["offset"]))
        return handle.read(int(info["length"]))


def test_split_writes_both_graphs_and_one_weights_file_into_each_parts_folder(parts: dict[str, list[Path]]) -> None:
    parts_dir = parts["prompt"][0].parent.parent
    # a part's graphs sit in one folder with the one data file they read, and nothing else is left (no staging folder)
    assert sorted(p.name for p in parts_dir.iterdir()) == ["part_1_of_3", "part_2_of_3", "part_3_of_3"]
    for folder in parts_dir.iterdir():
        assert sorted(p.name for p in folder.iterdir()) == ["prompt.onnx", "token.onnx", PART_WEIGHTS_NAME]
    for kind in KINDS:
        assert parts[kind] == [parts_dir / f"part_{i}_of_3" / f"{kind}.onnx" for i in (1, 2, 3)]
        assert list(find_parts(parts_dir, kind).values()) == parts[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_parts_pass_full_check(parts: dict[str, list[Path]], kind: str) -> None:
    for path in parts[kind]:
        onnx.checker.check_model(path, full_check=True)


def test_part_inputs_and_outputs(parts: dict[str, list[Path]]) -> None:
    shared = ["attention_mask", "position_ids_cos", "position_ids_sin"]
    expected = [
        (["input_ids"], [EMBED_OUT]),
        ([EMBED_OUT, *shared, "past_key_0_in", "past_value_0_in", "past_key_1_in", "past_value_1_in"],
         [layer_out(1), "past_key_0_out", "past_value_0_out", "past_key_1_out", "past_value_1_out"]),
        ([layer_out(1), *shared, "past_key_2_in", "past_value_2_in", "past_key_3_in", "past_value_3_in"],
         ["logits", "past_key_2_out", "past_value_2_out", "past_key_3_out", "past_value_3_out"]),
    ]
    for path, (inputs, outputs) in zip(parts["token"], expected):
        graph = graph_of(path)
        assert [v.name for v in graph.input] == inputs
        assert [v.name for v in graph.output] == outputs


@pytest.mark.parametrize("kind", KINDS)
def test_every_part_input_is_read(parts: dict[str, list[Path]], kind: str) -> None:
    for path in parts[kind]:
        graph = graph_of(path)
        read = {name for node in graph.node for name in node_inputs(node)}
        assert [v.name for v in graph.input if v.name not in read] == []


def test_part_graph_names_follow_genie(parts: dict[str, list[Path]]) -> None:
    assert [graph_of(p).name for p in parts["prompt"]] == [f"prompt_ar8_cl64_{i}_of_3" for i in (1, 2, 3)]
    assert graph_of(parts["token"][0]).name == "token_ar1_cl64_1_of_3"


@pytest.mark.parametrize("kind", KINDS)
def test_chain_equals_full_bit_exact(demo: Path, parts: dict[str, list[Path]], kind: str) -> None:
    feed = example_inputs(SHAPE, kind, past_len=5, rng=np.random.default_rng(7))
    report = verify_chain(demo / f"{kind}.onnx", parts[kind], feed)
    assert report.bit_exact
    assert [c.name for c in report.outputs] == ["logits"] + [f"past_{kv}_{i}_out" for i in range(4)
                                                              for kv in ("key", "value")]


def test_external_tensors_are_aligned_relative_and_identical_inline_ones_stay_inline(
        demo: Path, parts: dict[str, list[Path]]) -> None:
    source = {t.name: t for t in graph_of(demo / "prompt.onnx").initializer}
    seen_inline = seen_external = 0
    for path in parts["prompt"]:
        for tensor in graph_of(path).initializer:
            original = source[tensor.name]
            assert tensor.data_location == original.data_location, tensor.name
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                info = external_info(tensor)
                assert info["location"] == PART_WEIGHTS_NAME
                data = (path.parent / info["location"]).read_bytes()
                assert info["checksum"] == hashlib.sha1(data).hexdigest()  # the ONNX key: SHA-1 of the file
                seen_external += 1
            else:
                seen_inline += 1
            assert stored_bytes(tensor, path.parent) == stored_bytes(original, demo), tensor.name
    assert seen_inline and seen_external


def test_data_offsets_are_page_aligned(tmp_path: Path) -> None:
    """The tiny decoder's matrices are 1 KiB, so unpadded offsets would not be multiples of 4096."""
    model = build_tiny_decoder(tmp_path / "m.onnx")
    offsets = [int(external_info(t)["offset"])
               for path in split_one(model, PLAN, tmp_path / "parts")
               for t in graph_of(path).initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert len(offsets) > 10 and all(offset % 4096 == 0 for offset in offsets)


def test_split_is_deterministic(demo: Path, parts: dict[str, list[Path]], tmp_path: Path) -> None:
    split_both(demo / "prompt.onnx", demo / "token.onnx", PLAN, tmp_path / "again")
    assert tree_bytes(tmp_path / "again") == tree_bytes(parts["prompt"][0].parent.parent)


def test_weight_change_in_one_layer_changes_only_its_part(demo: Path, tmp_path: Path) -> None:
    changed = tmp_path / "changed"
    shutil.copytree(demo, changed)
    weight = next(t for t in graph_of(demo / "prompt.onnx").initializer
                  if t.name == "model.layers.3.mlp.down_proj.weight")
    info = external_info(weight)
    with open(changed / info["location"], "r+b") as handle:
        handle.seek(int(info["offset"]))
        handle.write(b"\x01\x02\x03\x04")
    before = split_one(demo / "prompt.onnx", PLAN, tmp_path / "before")
    after = split_one(changed / "prompt.onnx", PLAN, tmp_path / "after")
    same = [tree_bytes_of_part(a) == tree_bytes_of_part(b) for a, b in zip(before, after)]
    assert same == [True, True, False]
    # the workflow's jobs depend on a part's .onnx only: it must change with the part's weights
    assert [a.read_bytes() == b.read_bytes() for a, b in zip(before, after)] == [True, True, False]


def tree_bytes_of_part(onnx_path: Path) -> tuple[bytes, bytes]:
    return onnx_path.read_bytes(), onnx_path.with_name(PART_WEIGHTS_NAME).read_bytes()


def test_bad_plan_adds_nothing_and_keeps_the_existing_parts(demo: Path, tmp_path: Path) -> None:
    bad = dataclasses.replace(PLAN, parts=(
        PLAN.parts[0], dataclasses.replace(PLAN.parts[1], output_boundary="no_such_tensor"),
        dataclasses.replace(PLAN.parts[2], input_boundary="no_such_tensor")))
    parts_dir = tmp_path / "parts"
    with pytest.raises(GenieBuildError, match="no_such_tensor"):
        split_one(demo / "token.onnx", bad, parts_dir, "token")
    assert listing(parts_dir) == []

    # a failed split, of both graphs or of either, keeps every file of the part folders byte for byte
    good = split_both(demo / "prompt.onnx", demo / "token.onnx", PLAN, parts_dir)
    before, names = tree_bytes(parts_dir), listing(parts_dir)
    for models in ({kind: demo / f"{kind}.onnx" for kind in KINDS}, *({kind: demo / f"{kind}.onnx"} for kind in KINDS)):
        with pytest.raises(GenieBuildError):
            split_graphs(models, bad, parts_dir)
        assert tree_bytes(parts_dir) == before and listing(parts_dir) == names
    assert all(paths[0].exists() for paths in good.values())
    assert [p.name for p in tmp_path.iterdir()] == ["parts"]


def test_split_failing_midway_keeps_the_previous_parts_whole(demo: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts 1 and 2 are written before part 3 fails: none of them may replace the previous split's."""
    parts_dir = tmp_path / "parts"
    split_one(demo / "prompt.onnx", PLAN, parts_dir)
    before, names = tree_bytes(parts_dir), listing(parts_dir)
    checked = []

    def fail_on_the_last_part(onnx_path: Path, source_path: Path | None = None) -> None:
        checked.append(onnx_path)
        if len(checked) == 3:
            raise GenieBuildError(onnx_path, "invalid part")

    monkeypatch.setattr("genie_build.split.split.check_part", fail_on_the_last_part)
    changed = tmp_path / "changed"   # another embedding table, so a part 1 that got through would show
    shutil.copytree(demo, changed)
    table = next(t for t in graph_of(demo / "prompt.onnx").initializer if t.name == "model.embed_tokens.weight")
    with open(changed / external_info(table)["location"], "r+b") as handle:
        handle.seek(int(external_info(table)["offset"]))
        handle.write(b"\x01\x02\x03\x04")
    with pytest.raises(GenieBuildError, match="invalid part"):
        split_one(changed / "prompt.onnx", PLAN, parts_dir)
    assert len(checked) == 3
    assert tree_bytes(parts_dir) == before and listing(parts_dir) == names   # no staging folder left either


def test_missing_data_file_fails_naming_it(demo: Path, tmp_path: Path) -> None:
    shutil.copy(demo / "prompt.onnx", tmp_path / "prompt.onnx")
    with pytest.raises(GenieBuildError, match=r"prompt\.onnx\.data"):
        split_one(tmp_path / "prompt.onnx", PLAN, tmp_path / "parts")
    assert listing(tmp_path / "parts") == []


def test_cuts_must_chain(demo: Path, tmp_path: Path) -> None:
    unchained = dataclasses.replace(PLAN, parts=(
        PLAN.parts[0], PLAN.parts[1], dataclasses.replace(PLAN.parts[2], input_boundary=layer_out(0))))
    with pytest.raises(GenieBuildError, match=r"part 3_of_3 takes .*layers\.0.* but part 2_of_3 gives"):
        split_one(demo / "prompt.onnx", unchained, tmp_path / "parts")


def test_cuts_out_of_order_are_rejected(demo: Path, tmp_path: Path) -> None:
    swapped = make_plan(4, [[0, 1], [2, 3]])
    swapped = dataclasses.replace(swapped, parts=(
        dataclasses.replace(swapped.parts[0], output_boundary=layer_out(1)),
        dataclasses.replace(swapped.parts[1], input_boundary=layer_out(1), output_boundary=EMBED_OUT),
        dataclasses.replace(swapped.parts[2], input_boundary=EMBED_OUT)))
    with pytest.raises(GenieBuildError, match="does not depend on the boundary before it"):
        split_one(demo / "prompt.onnx", swapped, tmp_path / "parts")


def test_tensor_crossing_a_cut_is_named(tmp_path: Path) -> None:
    model = build_tiny_decoder(tmp_path / "skip.onnx", skip_from_layer0_into=3)
    with pytest.raises(GenieBuildError, match=r"part 3_of_3 reads '/model/layers\.0/Add_output_0', computed in "
                                              r"part 2_of_3"):
        split_one(model, PLAN, tmp_path / "parts")


def test_if_bodies_reading_outer_scope_are_split_whole(tmp_path: Path) -> None:
    """The If's branches read the MLP output and a bias initializer without listing them as inputs."""
    for kind, ar in (("prompt", 4), ("token", 1)):
        model = build_tiny_decoder(tmp_path / f"{kind}.onnx", ar=ar, if_in_layer=2)
        parts = split_one(model, PLAN, tmp_path / kind, kind)
        for path in parts:
            onnx.checker.check_model(path, full_check=True)
        assert "model.layers.2.mlp.down_proj.bias" in {t.name for t in graph_of(parts[2]).initializer}
        rng = np.random.default_rng(3)
        feed = {v.name: (rng.integers(0, 64, (1, ar)).astype(np.int32) if v.name == "input_ids" else
                         rng.uniform(-1, 1, [d.dim_value for d in v.type.tensor_type.shape.dim]).astype(np.float32))
                for v in graph_of(model).input}
        assert verify_chain(model, parts, feed).bit_exact


def test_single_part_plan_copies_the_whole_graph(tmp_path: Path) -> None:
    model = build_tiny_decoder(tmp_path / "m.onnx")
    whole = make_plan(4, [[0, 1, 2, 3]], embedding_alone=False)
    [part] = split_one(model, whole, tmp_path / "parts")
    source, graph = graph_of(model), graph_of(part)
    assert [v.name for v in graph.input] == [v.name for v in source.input]
    assert [v.name for v in graph.output] == [v.name for v in source.output]
    assert len(graph.node) == len(source.node)


def test_hf_export_splits_bit_exact(hf_qwen2: tuple[Path, Path], tmp_path: Path) -> None:
    """A real transformers Qwen2 export (dynamo), boundaries found from node scopes, planned by
    genie_build.plan.plan."""
    prompt, token = hf_qwen2
    model = load_graph(prompt)
    cuts = find_boundaries(model, prompt)
    plan = plan_by_num_parts(weighed_pieces(weights_from_graph(model, cuts), by_encodings(Encodings())), num_parts=3)
    parts = split_both(prompt, token, plan, tmp_path / "parts")
    for kind, source in (("prompt", prompt), ("token", token)):
        for path in parts[kind]:
            onnx.checker.check_model(path, full_check=True)
        report = verify_chain(source, parts[kind], build_feed(source))
        assert report.bit_exact and len(report.outputs) == 1 + 2 * plan.num_layers


def test_a_parts_graphs_read_one_weights_file_that_stores_each_shared_weight_once(
        demo: Path, parts: dict[str, list[Path]], tmp_path: Path) -> None:
    """The token graph's weights are the prompt graph's (the same names): its parts point at the prompt's bytes in the
    part's one data file, which holds no more than the prompt graph's parts alone would."""
    alone = split_one(demo / "prompt.onnx", PLAN, tmp_path / "alone")
    for prompt, token, prompt_alone in zip(parts["prompt"], parts["token"], alone):
        stored = {t.name: external_info(t) for t in graph_of(prompt).initializer
                  if t.data_location == onnx.TensorProto.EXTERNAL}
        shared = {t.name: external_info(t) for t in graph_of(token).initializer
                  if t.data_location == onnx.TensorProto.EXTERNAL}
        assert shared and set(shared) <= set(stored)
        assert all(shared[name] == stored[name] for name in shared)   # location, offset, length and checksum
        assert (prompt.with_name(PART_WEIGHTS_NAME).read_bytes()
                == prompt_alone.with_name(PART_WEIGHTS_NAME).read_bytes())
        assert prompt.read_bytes() == prompt_alone.read_bytes()


def test_a_weight_of_the_token_graph_alone_is_stored_after_the_prompts(demo: Path, tmp_path: Path) -> None:
    """A token graph holding a weight under a name the prompt graph lacks: the part's data file holds it too, after
    the prompt graph's, and both graphs' parts chain to their whole graph."""
    token = tmp_path / "export" / "token.onnx"
    model = onnx.load(demo / "token.onnx")   # with its weights: the small demo's
    renamed = "lm_head.weight.token"
    for node in model.graph.node:
        node.input[:] = [renamed if name == "lm_head.weight" else name for name in node.input]
    next(t for t in model.graph.initializer if t.name == "lm_head.weight").name = renamed
    token.parent.mkdir()
    onnx.save(model, token, save_as_external_data=True, location="token.onnx.data")
    parts = split_both(demo / "prompt.onnx", token, PLAN, tmp_path / "parts")
    alone = split_one(demo / "prompt.onnx", PLAN, tmp_path / "alone")
    head = next(t for t in graph_of(parts["token"][2]).initializer if t.name == renamed)
    prompt_bytes = alone[2].with_name(PART_WEIGHTS_NAME).stat().st_size
    assert int(external_info(head)["offset"]) >= prompt_bytes
    assert parts["prompt"][2].with_name(PART_WEIGHTS_NAME).stat().st_size > prompt_bytes
    for kind, source in (("prompt", demo / "prompt.onnx"), ("token", token)):
        assert verify_chain(source, parts[kind], build_feed(source)).bit_exact


def test_a_shared_name_holding_another_tensor_fails_naming_both_graphs(demo: Path, tmp_path: Path) -> None:
    token = tmp_path / "export" / "token.onnx"
    model = onnx.load(demo / "token.onnx")
    weight = next(t for t in model.graph.initializer if t.name == "lm_head.weight")
    weight.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weight).T.copy(), weight.name))
    token.parent.mkdir()
    onnx.save(model, token, save_as_external_data=True, location="token.onnx.data")
    with pytest.raises(GenieBuildError, match=r"token\.onnx: weight 'lm_head\.weight' is float32 \[\d+, \d+\], but "
                                              r"float32 \[\d+, \d+\] in .*prompt\.onnx: a model's graphs share"):
        split_both(demo / "prompt.onnx", token, PLAN, tmp_path / "parts")
    assert listing(tmp_path / "parts") == []


def test_cli_splits_from_a_plan_file(demo: Path, tmp_path: Path) -> None:
    write_plan(tmp_path / "plan.json", PLAN)
    assert main(["split", "--plan", str(tmp_path / "plan.json"), "--graph", f"token={demo / 'token.onnx'}",
                 "--parts-dir", str(tmp_path / "parts"), "--out", str(tmp_path / "split.json")]) == 0
    parts = [tmp_path / "parts" / f"part_{i}_of_3" / "token.onnx" for i in (1, 2, 3)]
    assert sorted((tmp_path / "parts").glob("part_*/*.onnx")) == parts
    assert graph_of(parts[0]).name.startswith("token_")
    assert json.loads((tmp_path / "split.json").read_text()) == {"graphs": {"token": [str(p) for p in parts]}}


@pytest.mark.parametrize("graph", ["decode=x.onnx", "prompt_cl=x.onnx", "prompt"])
def test_cli_refuses_a_graph_of_no_kind_in_one_line(tmp_path: Path, graph: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    write_plan(tmp_path / "plan.json", PLAN)
    assert main(["split", "--plan", str(tmp_path / "plan.json"), "--graph", graph,
                 "--parts-dir", str(tmp_path / "parts")]) == 2
    assert capsys.readouterr().err.strip().startswith("genie-build: error: --graph: ")
    assert not (tmp_path / "parts").exists()


def test_a_graph_at_another_length_reads_its_kinds_weights_and_adds_none(demo: Path, parts: dict[str, list[Path]],
                                                                        tmp_path: Path) -> None:
    """A graph at another context length has its own key: its files go beside the kind's, reading the part's data
    file for the weights it shares, and the kinds' own files are the same bytes as without it (adding a length
    changes no part the converts read)."""
    parts_dir = tmp_path / "parts"
    write_plan(tmp_path / "plan.json", PLAN)
    assert main(["split", "--plan", str(tmp_path / "plan.json"), "--graph", f"prompt={demo / 'prompt.onnx'}",
                 f"token={demo / 'token.onnx'}", f"prompt_cl512={demo / 'prompt.onnx'}",
                 "--parts-dir", str(parts_dir)]) == 0
    before = tree_bytes(parts["prompt"][0].parent.parent)
    after = tree_bytes(parts_dir)
    assert sorted(set(after) - set(before)) == [f"part_{i}_of_3/prompt_cl512.onnx" for i in (1, 2, 3)]
    assert {name: after[name] for name in before} == before
    for i in (1, 2, 3):
        part = graph_of(parts_dir / f"part_{i}_of_3" / "prompt_cl512.onnx")
        assert {external_info(t)["location"] for t in part.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL} == {PART_WEIGHTS_NAME}


def test_a_new_plan_or_a_graph_no_longer_given_removes_its_parts(demo: Path, tmp_path: Path) -> None:
    parts_dir = tmp_path / "parts"
    split_both(demo / "prompt.onnx", demo / "token.onnx", PLAN, parts_dir)
    two = make_plan(4, [[0, 1, 2, 3]])   # embedding alone, then the rest
    split_both(demo / "prompt.onnx", demo / "token.onnx", two, parts_dir)
    assert sorted(p.name for p in parts_dir.iterdir()) == ["part_1_of_2", "part_2_of_2"]   # emptied folders go
    assert list(find_parts(parts_dir, "token")) == ["1_of_2", "2_of_2"]
    split_one(demo / "prompt.onnx", two, parts_dir)
    assert sorted(str(p.relative_to(parts_dir)) for p in parts_dir.rglob("*") if p.is_file()) == [
        f"part_{i}_of_2/{name}" for i in (1, 2) for name in ("prompt.onnx", PART_WEIGHTS_NAME)]
