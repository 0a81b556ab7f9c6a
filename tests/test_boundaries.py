"""genie_build.plan.boundaries: residual-stream boundaries, explicit or found from node scopes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from genie_build.cli import main
from genie_build.demo.demo import generate_demo
from genie_build.encodings import Encodings
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import check_external_data, check_shared_initializers, load_graph, tensor_shapes
from genie_build.plan.boundaries import embedding_table, find_boundaries, node_layer
from genie_build.plan.plan import by_encodings, weighed_pieces
from genie_build.plan.plan_file import read_plan
from genie_build.quantize.calibrate import calibrate
from demo_shapes import THREE_LAYERS
from genie_build.plan.weight_inventory import weights_from_graph
from hf_export import export_tiny_qwen2
from scoped_graph import EMBED_OUT, NAME_SCOPES_KEY, build_scoped_graph, layer_out

WHERE = "model.onnx"


def expected_boundaries(layers: int) -> tuple[str, ...]:
    return (EMBED_OUT, *(layer_out(i) for i in range(layers)))


# ------------------------------------------------------------------------------------------- discovery

@pytest.mark.parametrize("scope", ["name", "underscore", "metadata"])
def test_discovers_one_boundary_per_cut_in_order(scope: str) -> None:
    """Despite a RoPE tensor, a CSE'd layer-0 tensor and hidden-sized inputs crossing every cut."""
    model = build_scoped_graph(layers=4, scope=scope)
    assert find_boundaries(model, WHERE) == expected_boundaries(4)


def test_single_layer_model() -> None:
    assert find_boundaries(build_scoped_graph(layers=1), WHERE) == expected_boundaries(1)


def test_no_scopes_asks_for_explicit_boundaries() -> None:
    with pytest.raises(GenieBuildError) as excinfo:
        find_boundaries(build_scoped_graph(scope="none"), WHERE)
    assert str(excinfo.value).startswith(f"{WHERE}: no node carries a decoder-layer scope")
    assert "set split.boundaries" in str(excinfo.value)


def test_ambiguous_cut_lists_candidates() -> None:
    """With the RoPE width equal to hidden, the RoPE tensor also looks like the residual stream."""
    model = build_scoped_graph(hidden=8, rope=8)
    with pytest.raises(GenieBuildError) as excinfo:
        find_boundaries(model, WHERE)
    message = str(excinfo.value)
    assert "after the embedding: 2 rank-3 tensors with last dim 8" in message
    assert EMBED_OUT in message and "/model/rotary_emb/Concat_output_0" in message
    assert "set split.boundaries" in message and "\n" not in message


def test_missing_layer_scope_is_reported() -> None:
    model = build_scoped_graph(layers=3)
    for node in model.graph.node:
        if "/layers.1/" in node.name:
            node.name = node.name.replace("/layers.1/", "/block_one/")
    with pytest.raises(GenieBuildError, match=r"no node of layer\(s\) \[1\]"):
        find_boundaries(model, WHERE)


def test_no_embedding_table() -> None:
    model = build_scoped_graph()
    next(node for node in model.graph.node if node.op_type == "Gather").op_type = "GatherElements"
    with pytest.raises(GenieBuildError, match="cannot tell the embedding table.*found none"):
        find_boundaries(model, WHERE)


def test_embedding_table_prefers_the_lookup_of_a_graph_input() -> None:
    """A second rank-2 table gathered by a computed index (like a RoPE table) is not the embedding."""
    model = build_scoped_graph(hidden=8)
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros((16, 4), np.float32), "rope_table"))
    model.graph.node.append(helper.make_node("Gather", ["rope_table", EMBED_OUT], ["unused"]))
    assert embedding_table(model, WHERE).name == "model.embed_tokens.weight"
    model.graph.node.append(helper.make_node("Gather", ["rope_table", "input_ids"], ["unused_2"]))
    with pytest.raises(GenieBuildError, match=r"found \['model.embed_tokens.weight', 'rope_table'\]"):
        embedding_table(model, WHERE)


@pytest.mark.parametrize(("name", "metadata", "layer"), [
    ("/model/layers.12/self_attn/MatMul", None, 12),
    ("/m/model/layers_3/Add_1", None, 3),
    ("node_add_8", "['', 'm', 'm.model', 'm.model.layers.7', 'm.model.layers.7.mlp']", 7),
    ("/model/layers.2/Add", "['', 'm.model.layers.5']", 2),    # the name wins
    ("/players_1/Add", None, None),
    ("/model/norm/Mul", "['', 'm', 'm.model', 'm.model.norm']", None),
])
def test_node_layer(name: str, metadata: str | None, layer: int | None) -> None:
    node = helper.make_node("Add", ["a", "b"], ["c"], name=name)
    if metadata is not None:
        node.metadata_props.add(key=NAME_SCOPES_KEY, value=metadata)
    assert node_layer(node) == layer


def route_table_through(model: onnx.ModelProto, ops: list[str]) -> onnx.ModelProto:
    """Make the embedding Gather read its table through a chain of ``ops`` (in the embedding's scope)."""
    gather = next(node for node in model.graph.node if node.op_type == "Gather")
    source = gather.input[0]
    chain = []
    for index, op in enumerate(ops):
        extra = {"Cast": {"to": onnx.TensorProto.FLOAT}, "Transpose": {"perm": [1, 0]}}.get(op, {})
        inputs = [source, "table_scale"] if op == "DequantizeLinear" else [source]
        output = f"/model/embed_tokens/{op}_{index}_output_0"
        chain.append(helper.make_node(op, inputs, [output], name=f"/model/embed_tokens/{op}_{index}", **extra))
        source = output
    gather.input[0] = source
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(0.1, np.float32), "table_scale"))
    nodes = [*chain, *model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


@pytest.mark.parametrize("ops", [["Cast"], ["Identity"], ["DequantizeLinear"], ["Cast", "Identity"]])
def test_embedding_table_is_found_behind_value_preserving_ops(ops: list[str]) -> None:
    """A float16 table is Cast to float32 before the Gather (generate-demo --weight-dtype float16)."""
    model = route_table_through(build_scoped_graph(layers=3, hidden=8, vocab=32), ops)
    table = embedding_table(model, WHERE)
    assert (table.name, table.shape) == ("model.embed_tokens.weight", (32, 8))
    assert find_boundaries(model, WHERE) == expected_boundaries(3)


def test_a_table_reshaped_before_the_gather_is_not_the_embedding() -> None:
    model = route_table_through(build_scoped_graph(hidden=8, vocab=32), ["Transpose"])
    with pytest.raises(GenieBuildError, match="cannot tell the embedding table.*found none"):
        embedding_table(model, WHERE)


def test_plan_of_a_float16_demo_equals_the_float32_plan(tmp_path: Path) -> None:
    """The whole plan command on fp16-stored weights: same boundaries and piece bytes as the fp32 model
    (quantized weights and the fp16 fallback take the same bytes either way)."""
    plans = {}
    for dtype in ("float32", "float16"):
        source = tmp_path / dtype
        generate_demo(dataclasses.replace(THREE_LAYERS, weight_dtype=dtype), source)
        encodings = [source / f"{kind}.encodings.json" for kind in ("prompt", "token")]
        calibrate(source / "prompt.onnx", source / "token.onnx", *encodings, num_samples=1)
        assert main(["plan", "--prompt", str(source / "prompt.onnx"), "--token", str(source / "token.onnx"),
                     "--encodings-prompt", str(encodings[0]),
                     "--num-parts", "3", "--out", str(source / "plan.json")]) == 0
        plans[dtype] = read_plan(source / "plan.json")
    assert embedding_table(load_graph(tmp_path / "float16" / "prompt.onnx"), WHERE).dtype == "float16"
    assert plans["float16"].boundaries == (EMBED_OUT, *(layer_out(i) for i in range(3)))
    assert plans["float16"] == plans["float32"]


def test_embedding_table_gives_hidden() -> None:
    table = embedding_table(build_scoped_graph(hidden=8, vocab=32), WHERE)
    assert (table.name, table.shape) == ("model.embed_tokens.weight", (32, 8))


# ------------------------------------------------------------------------------------------- explicit

def test_explicit_boundaries_are_used_as_given() -> None:
    """Explicit names work where discovery cannot (no scopes at all)."""
    model = build_scoped_graph(layers=3, scope="none")
    assert find_boundaries(model, WHERE, list(expected_boundaries(3))) == expected_boundaries(3)


@pytest.mark.parametrize(("names", "problem"), [
    ([EMBED_OUT], r"has 1 tensor\(s\); it needs L \+ 1 >= 2"),
    ([EMBED_OUT, layer_out(0), layer_out(0)], r"lists \['/model/layers.0/Add_1_output_0'\] more than once"),
    ([EMBED_OUT, "typo"], r"no node produces \['typo'\]"),
    ([EMBED_OUT, "past_key_0_out"], None),   # rank 3, allowed: only rank is checked
    ([EMBED_OUT, "/model/layers.0/self_attn/Mul_output_0", layer_out(0)], None),
    (["/model/rotary_emb/Concat_output_0", "logits"], None),
    ([EMBED_OUT, "model.embed_tokens.weight"], r"no node produces"),
    ([layer_out(1), layer_out(0)], r"'/model/layers.0/Add_1_output_0' comes before '/model/layers.1/Add_1_output_0'"),
])
def test_explicit_boundaries_are_checked(names: list[str], problem: str | None) -> None:
    model = build_scoped_graph(layers=3)
    if problem is None:
        assert find_boundaries(model, WHERE, names) == tuple(names)
    else:
        with pytest.raises(GenieBuildError, match=f"^{WHERE}: split.boundaries.*{problem}"):
            find_boundaries(model, WHERE, names)


def test_explicit_boundary_must_be_rank_3() -> None:
    model = build_scoped_graph(layers=2)
    extra = helper.make_node("Unsqueeze", [layer_out(0), "axes"], ["rank4"], name="/model/layers.1/Unsqueeze")
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([0]), "axes"))
    model.graph.node.append(extra)
    model.graph.output.append(helper.make_tensor_value_info("rank4", onnx.TensorProto.FLOAT, None))
    assert len(tensor_shapes(model)["rank4"]) == 4
    with pytest.raises(GenieBuildError, match=r"'rank4' has shape \[1, 1, 4, 8\]; a boundary must be the rank-3"):
        find_boundaries(model, WHERE, [EMBED_OUT, "rank4"])


# ------------------------------------------------------------------------------------------- HF export

LAYERS = 3


@pytest.fixture(scope="module")
def hf_graphs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return export_tiny_qwen2(tmp_path_factory.mktemp("hf"), layers=LAYERS)


@pytest.mark.hf
def test_hf_export_boundaries(hf_graphs: tuple[Path, Path]) -> None:
    """A torch dynamo export of transformers' Qwen2: exactly L + 1 rank-3 hidden boundaries, in graph order,
    and the same names in the prompt and token graphs."""
    prompt, token = hf_graphs
    prompt_model = load_graph(prompt)
    found = find_boundaries(prompt_model, prompt)
    assert len(found) == LAYERS + 1
    assert found == find_boundaries(load_graph(token), token)
    assert found[0] == next(node.output[0] for node in prompt_model.graph.node if node.op_type == "Gather")
    shapes = tensor_shapes(prompt_model)
    assert all(shapes[name] == (1, 32, 64) for name in found)
    order = {output: index for index, node in enumerate(prompt_model.graph.node) for output in node.output}
    assert [order[name] for name in found] == sorted(order[name] for name in found)
    # The last boundary feeds the final norm: the nodes reading it are outside every layer.
    readers = [node for node in prompt_model.graph.node if found[-1] in node.input]
    assert readers and all(node_layer(node) is None for node in readers)


@pytest.mark.hf
def test_hf_export_graphs_share_weights_and_plan(hf_graphs: tuple[Path, Path]) -> None:
    prompt, token = hf_graphs
    for path in hf_graphs:
        check_external_data(load_graph(path), path)
    check_shared_initializers(prompt, token)
    model = load_graph(prompt)
    pieces = weighed_pieces(weights_from_graph(model, find_boundaries(model, prompt)), by_encodings(Encodings()))
    layer_bytes = {piece.bytes for piece in pieces if piece.kind == "layer"}
    assert len(layer_bytes) == 1   # identical layers, every weight accounted to its own layer
    vocab, hidden = 256, 64
    assert pieces[0].bytes >= vocab * hidden * 2          # the table, fp16 fallback
    assert pieces[-1].bytes >= vocab * hidden * 2 + hidden * 2   # LM head + final norm
