"""genie_build.plan.plan, genie_build.plan.plan_file and the ``plan`` command: pieces, balanced contiguous parts,
plan.json."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

from genie_build.cli import main
from genie_build.encodings import Encodings, TensorEncoding, check_graphs_consistent, read_encodings
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import InitializerSpec, load_graph
from genie_build.plan.boundaries import find_boundaries
from genie_build.plan.plan import by_encodings, by_precision, quantized_bytes, weighed_pieces
from genie_build.plan.plan_file import Piece, Plan, read_plan, write_plan
from genie_build.plan.planners import plan_by_max_part_bytes, plan_by_num_parts
from genie_build.plan.precision import Precision
from genie_build.plan.weight_inventory import ModelWeights, Weight, initializer_pieces, weights_from_graph
from genie_build.units import MIB
from scoped_graph import EMBED_OUT, build_scoped_graph, layer_out


def make_pieces(embedding: int, layers: list[int], head: int) -> list[Piece]:
    return [Piece("embedding", "embedding", embedding, output_boundary="b0"),
            *(Piece(f"layer_{i}", "layer", size, i, f"b{i + 1}") for i, size in enumerate(layers)),
            Piece("head", "head", head)]


def part_sizes(plan: Plan) -> list[int]:
    return [part.estimated_bytes for part in plan.parts]


def best_split(sizes: list[int], groups: int) -> tuple[int, int]:
    """Brute force over every split of ``sizes`` into contiguous groups: the least (largest group sum,
    sum of squared group sums), in that order."""
    best = None
    for cuts in itertools.combinations(range(1, len(sizes)), groups - 1):
        bounds = (0, *cuts, len(sizes))
        sums = [sum(sizes[a:b]) for a, b in zip(bounds, bounds[1:])]
        score = (max(sums), sum(total * total for total in sums))
        best = score if best is None else min(best, score)
    return best


def check_invariants(plan: Plan, pieces: list[Piece], embedding_alone: bool) -> None:
    names = [name for part in plan.parts for name in part.pieces]
    assert names == [piece.name for piece in pieces]                        # contiguous, complete, in order
    assert all(part.pieces for part in plan.parts)
    assert plan.parts[-1].pieces[-1] == "head" and len(plan.parts[-1].pieces) >= 2
    if embedding_alone:
        assert plan.parts[0].pieces == ("embedding",)
    else:
        assert plan.parts[0].pieces[:2] == ("embedding", "layer_0")
    assert [part.index for part in plan.parts] == list(range(1, plan.num_parts + 1))
    assert plan.parts[0].input_boundary is None and plan.parts[-1].output_boundary is None
    for before, after in zip(plan.parts, plan.parts[1:]):
        assert before.output_boundary == after.input_boundary is not None
    by_name = {piece.name: piece.bytes for piece in pieces}
    assert all(part.estimated_bytes == sum(by_name[name] for name in part.pieces) for part in plan.parts)


# ------------------------------------------------------------------------------------------- bytes

def encoding(**fields: object) -> TensorEncoding:
    return TensorEncoding(**{"name": "w", "dtype": "int", "bitwidth": 4, **fields})


@pytest.mark.parametrize(("spec", "enc", "expected"), [
    (InitializerSpec("w", (64, 32), "float32", 8192), None, 64 * 32 * 2),                 # fp16 fallback
    (InitializerSpec("s", (3,), "int64", 24), None, 24),                                   # kept as is
    (InitializerSpec("w", (64, 32), "float32", 8192),
     encoding(kind="per_channel", scale=(0.1,) * 32, offset=(-8,) * 32), 64 * 32 // 2 + 4 * 32),
    (InitializerSpec("w", (3, 3), "float32", 36), encoding(scale=(0.1,), offset=(-8,)), 5 + 4),   # rounds up
    (InitializerSpec("w", (64, 32), "float32", 8192), encoding(dtype="float", bitwidth=16), 64 * 32 * 2),
    (InitializerSpec("w", (64, 32), "float32", 8192),
     encoding(kind="lpbq", bitwidth=8, compressed_bitwidth=4, block_size=16, scale=(0.1,) * 32,
              offset=(-128,) * 32, per_block_int_scale=(1,) * 128), 64 * 32 // 2 + 4 * 32 + 128),
])
def test_quantized_bytes(spec: InitializerSpec, enc: TensorEncoding | None, expected: int) -> None:
    assert quantized_bytes(spec, enc) == expected


def four_bit(name: str, channels: int) -> TensorEncoding:
    return TensorEncoding(name, "int", 4, "per_channel", True, (0.01,) * channels, (-8,) * channels)


def encoded_pieces(model: onnx.ModelProto, encodings: Encodings, boundaries: tuple[str, ...]) -> list[Piece]:
    """The plan stage's pieces of a graph weighed with its encodings."""
    return weighed_pieces(weights_from_graph(model, boundaries), by_encodings(encodings))


def test_encoded_pieces_bytes_per_piece() -> None:
    """hidden 8, inter 16, rope 4, vocab 32: every MatMul weight 4-bit per channel, the rest fp16."""
    model = build_scoped_graph(layers=2, hidden=8, inter=16, rope=4, vocab=32)
    params = {}
    for i in range(2):
        for name, (rows, cols) in {"self_attn.q_proj": (8, 8), "self_attn.k_proj": (8, 4),
                                   "mlp.up_proj": (8, 16), "mlp.down_proj": (8, 16)}.items():
            full = f"model.layers.{i}.{name}.weight"
            params[full] = four_bit(full, cols)
    pieces = encoded_pieces(model, Encodings(params=params), find_boundaries(model, "m.onnx"))
    layer = (64 // 2 + 4 * 8) + (32 // 2 + 4 * 4) + 2 * (128 // 2 + 4 * 16) + 8 * 2 + 1 * 2   # + norm, eps
    assert [(p.name, p.kind, p.layer, p.bytes) for p in pieces] == [
        ("embedding", "embedding", None, 32 * 8 * 2),
        ("layer_0", "layer", 0, layer), ("layer_1", "layer", 1, layer),
        ("head", "head", None, 8 * 2 + 8 * 32 * 2)]
    assert [p.output_boundary for p in pieces] == [EMBED_OUT, layer_out(0), layer_out(1), None]


def _spec_weight(name: str, shape: tuple[int, ...], pieces: set[int]) -> Weight:
    return Weight(InitializerSpec(name, shape, "float32", 4 * int(np.prod(shape))), "layers", frozenset(pieces))


def test_weighed_pieces_sum_each_initializer_into_every_piece_that_owns_it() -> None:
    """From weights and their pieces alone (what the shape-only estimate has): a tied table weighs in the embedding
    and the head, a constant in every layer using it, encodings default to none (fp16 fallback)."""
    model = ModelWeights((_spec_weight("table", (32, 8), {0, 3}), _spec_weight("w0", (8, 16), {1}),
                          _spec_weight("w1", (8, 16), {2})), ("b0", "b1", "b2"),
                         constants=(_spec_weight("eps", (), {1, 2}),))
    pieces = weighed_pieces(model, by_encodings(Encodings(params={"w1": four_bit("w1", 16)})))
    assert [(p.name, p.bytes, p.output_boundary) for p in pieces] == [
        ("embedding", 32 * 8 * 2, "b0"), ("layer_0", 8 * 16 * 2 + 2, "b1"),
        ("layer_1", 8 * 16 // 2 + 4 * 16 + 2, "b2"), ("head", 32 * 8 * 2, None)]
    # a precision rules the weights alone: the constants are the size model's, not the pieces'
    weights_alone = dataclasses.replace(model, constants=())
    assert weighed_pieces(model, by_precision(Precision())) == weighed_pieces(weights_alone, by_precision(Precision()))
    assert pieces != weighed_pieces(weights_alone, by_encodings(Encodings(params={"w1": four_bit("w1", 16)})))


def test_a_graphs_weights_and_constants_are_every_initializer_it_uses_with_its_pieces(small_demo: Path) -> None:
    """The demo's graph: its float tensors are weights, its scalars and Reshape shapes constants, each with the pieces
    using it, and nothing else."""
    model = load_graph(small_demo / "prompt.onnx")
    boundaries = find_boundaries(model, small_demo / "prompt.onnx")
    weights = weights_from_graph(model, boundaries)
    assert {w.spec.name: w.pieces for w in (*weights.weights, *weights.constants)} == initializer_pieces(model,
                                                                                                       boundaries)
    assert weights.constants and all(not w.spec.shape or w.spec.dtype == "int64" for w in weights.constants)
    assert all(w.spec.shape and w.spec.dtype == "float32" for w in weights.weights)
    assert weights.boundaries == boundaries


def test_initializer_pieces_follow_the_data_flow() -> None:
    model = build_scoped_graph(layers=3, tied=True)
    owners = initializer_pieces(model, find_boundaries(model, "m.onnx"))
    assert owners["model.embed_tokens.weight"] == {0, 4}            # tied: Gather and LM head
    assert owners["model.layers.1.mlp.down_proj.weight"] == {2}     # reached through a Transpose
    assert owners["eps"] == {1, 2, 3}                               # shared by every layer
    assert owners["model.norm.weight"] == {4}
    assert "lm_head.weight" not in owners


def test_initializer_pieces_reject_boundaries_out_of_data_flow_order() -> None:
    model = build_scoped_graph(layers=3)
    with pytest.raises(GenieBuildError, match="split.boundaries: boundary 2 .*does not follow boundary 1"):
        initializer_pieces(model, [EMBED_OUT, layer_out(1), layer_out(0), layer_out(2)])
    with pytest.raises(GenieBuildError, match="not computed from the graph inputs"):
        initializer_pieces(model, [EMBED_OUT, "model.norm.weight"])


# ------------------------------------------------------------------------------------------- planning

PIECES = make_pieces(500, [100, 100, 100, 100, 100, 100], 300)


def test_two_parts() -> None:
    plan = plan_by_num_parts(PIECES, 2)
    check_invariants(plan, PIECES, True)
    assert part_sizes(plan) == [500, 900]
    assert plan.parts[1].first_layer == 0 and plan.parts[1].last_layer == 5
    assert plan.parts[0].first_layer is None and plan.parts[0].output_boundary == "b0"


def test_most_parts() -> None:
    plan = plan_by_num_parts(PIECES, 7)
    check_invariants(plan, PIECES, True)
    assert [part.pieces for part in plan.parts[1:]] == [
        ("layer_0",), ("layer_1",), ("layer_2",), ("layer_3",), ("layer_4",), ("layer_5", "head")]
    assert [part.label for part in plan.parts][:2] == ["1_of_7", "2_of_7"]


def test_head_weight_moves_layers_forward() -> None:
    """The head (300) is heavy, so the last part takes fewer layers: 5 x 100 | 100 + 300."""
    plan = plan_by_num_parts(PIECES, 3)
    check_invariants(plan, PIECES, True)
    assert part_sizes(plan) == [500, 500, 400]
    assert plan.parts[2].pieces == ("layer_5", "head")


def test_equal_layers_stay_even() -> None:
    """24 equal layers and a head of 1.5 layers in 4 layer parts: 7/6/6/5 layers, the spare layer first."""
    pieces = make_pieces(80, [10] * 24, 15)
    plan = plan_by_num_parts(pieces, 5)
    assert [(part.first_layer, part.last_layer) for part in plan.parts] == [
        (None, None), (0, 6), (7, 12), (13, 18), (19, 23)]
    assert part_sizes(plan) == [80, 70, 60, 60, 65]


def test_embedding_with_layers() -> None:
    plan = plan_by_num_parts(PIECES, 2, embedding_alone=False)
    check_invariants(plan, PIECES, False)
    assert part_sizes(plan) == [700, 700]
    assert plan.parts[0].first_layer == 0 and not plan.embedding_alone
    assert plan.parts[1].input_boundary == "b2"


@pytest.mark.parametrize(("num_parts", "embedding_alone", "feasible"), [
    (1, True, "feasible: 2..7"), (8, True, "feasible: 2..7"), (0, False, "feasible: 2..6"),
    (7, False, "feasible: 2..6")])
def test_impossible_part_counts_state_the_range(num_parts: int, embedding_alone: bool, feasible: str) -> None:
    with pytest.raises(GenieBuildError) as excinfo:
        plan_by_num_parts(PIECES, num_parts, embedding_alone)
    assert str(excinfo.value).startswith(f"split.num_parts: {num_parts} parts requested")
    assert feasible in str(excinfo.value)


def test_one_layer_without_embedding_alone_cannot_split() -> None:
    with pytest.raises(GenieBuildError, match="no split is possible"):
        plan_by_num_parts(make_pieces(10, [10], 10), 2, embedding_alone=False)


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(0, 1000), min_size=3, max_size=9), data=st.data())
def test_balanced_parts_are_optimal(sizes: list[int], data: st.DataObject) -> None:
    """Against brute force over every contiguous split: no split has a smaller largest (layer) part, and
    none as small is more even."""
    pieces = make_pieces(sizes[0], sizes[1:-1], sizes[-1])
    embedding_alone = data.draw(st.booleans())
    most = len(pieces) - 1 - (0 if embedding_alone else 1)
    num_parts = data.draw(st.integers(2, most)) if most >= 2 else None
    if num_parts is None:
        return
    plan = plan_by_num_parts(pieces, num_parts, embedding_alone)
    check_invariants(plan, pieces, embedding_alone)
    units = [piece.bytes for piece in pieces[1:-1]]
    units[-1] += pieces[-1].bytes
    if embedding_alone:
        groups, layer_parts = num_parts - 1, plan.parts[1:]
    else:
        units[0] += pieces[0].bytes
        groups, layer_parts = num_parts, plan.parts
    sums = [part.estimated_bytes for part in layer_parts]
    assert (max(sums), sum(total * total for total in sums)) == best_split(units, groups)


def test_budget_picks_the_fewest_parts() -> None:
    # units after the embedding (500): 100 x 5, then layer_5 + head = 400
    plan = plan_by_max_part_bytes(PIECES, 500)
    check_invariants(plan, PIECES, True)
    assert plan.num_parts == 3 and part_sizes(plan) == [500, 500, 400]
    assert plan.mode == "max_part_mb" and plan.max_part_bytes == 500
    assert max(part_sizes(plan_by_num_parts(PIECES, 2))) > 500    # one part fewer does not fit
    assert plan_by_max_part_bytes(PIECES, 10**9).num_parts == 2
    light = make_pieces(50, [100] * 6, 300)
    assert part_sizes(plan_by_max_part_bytes(light, 400)) == [50, 300, 200, 400]   # even within the bound


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 1000), min_size=3, max_size=8), budget=st.integers(1, 4000))
def test_budget_is_minimal(sizes: list[int], budget: int) -> None:
    pieces = make_pieces(sizes[0], sizes[1:-1], sizes[-1])
    try:
        plan = plan_by_max_part_bytes(pieces, budget)
    except GenieBuildError:
        units = [sizes[0], *sizes[1:-2], sizes[-2] + sizes[-1]]
        assert max(units) > budget
        return
    assert max(part_sizes(plan)) <= budget
    if plan.num_parts > 2:
        assert max(part_sizes(plan_by_num_parts(pieces, plan.num_parts - 1))) > budget


def test_budget_below_largest_block_names_it() -> None:
    with pytest.raises(GenieBuildError) as excinfo:
        plan_by_max_part_bytes(make_pieces(50, [100] * 6, 3 * MIB), 3 * MIB)
    message = str(excinfo.value)
    assert message.startswith(f"split.max_part_mb: a part limit of {3 * MIB} bytes (3.00 MiB)")
    assert f"largest indivisible block, layer_5+head ({3 * MIB + 100} bytes" in message
    assert "feasible: split.max_part_mb >= 3.01" in message
    with pytest.raises(GenieBuildError, match="block, embedding \\(500 bytes"):
        plan_by_max_part_bytes(PIECES, 450)


# ------------------------------------------------------------------------------------------- plan.json

def test_plan_json_round_trip_and_deterministic(tmp_path: Path) -> None:
    plan = plan_by_max_part_bytes(PIECES, 500)
    write_plan(tmp_path / "a.json", plan)
    write_plan(tmp_path / "b.json", plan_by_max_part_bytes(list(PIECES), 500))
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert read_plan(tmp_path / "a.json") == plan
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["parts"][1] == {"index": 2, "label": "2_of_3",
                                "pieces": ["layer_0", "layer_1", "layer_2", "layer_3", "layer_4"],
                                "first_layer": 0, "last_layer": 4, "input_boundary": "b0",
                                "output_boundary": "b5", "estimated_bytes": 500}


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda d: d.pop("boundaries"), "top level: 'boundaries' is a required property"),
    (lambda d: d["parts"][0].update(estimated_bytes="big"), "parts/0/estimated_bytes: 'big' is not of type"),
    (lambda d: d.update(num_parts=4), "num_parts is 4 but 3 parts are listed"),
    (lambda d: d.update(mode="guess"), "mode: 'guess' is not one of"),
    (lambda d: d["pieces"][0].update(colour="red"), "Additional properties are not allowed"),
])
def test_read_plan_rejects_bad_files(tmp_path: Path, edit, problem: str) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, plan_by_max_part_bytes(PIECES, 500))
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(GenieBuildError) as excinfo:
        read_plan(path)
    assert str(excinfo.value).startswith(f"{path}: not a valid plan:") and problem in str(excinfo.value)


# ------------------------------------------------------------------------------------------- command

def write_encodings(path: Path, params: dict[str, int]) -> Path:
    """A 1.0.0 encodings file with per-tensor int encodings of the given bitwidths."""
    entries = [{"name": name, "dtype": "INT", "enc_type": "PER_TENSOR", "bw": bits, "is_sym": True,
                "scale": [0.01], "offset": [-(2 ** (bits - 1))]} for name, bits in params.items()]
    path.write_text(json.dumps({"version": "1.0.0", "activation_encodings": [], "param_encodings": entries}))
    return path


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    prompt, token = tmp_path / "prompt.onnx", tmp_path / "token.onnx"
    build_scoped_graph(prompt, layers=4, ar=4)
    build_scoped_graph(token, layers=4, ar=1)
    params = {f"model.layers.{i}.mlp.up_proj.weight": 4 for i in range(4)}
    return {"prompt": prompt, "token": token,
            "enc": write_encodings(tmp_path / "prompt.encodings.json", params),
            "enc_token": write_encodings(tmp_path / "token.encodings.json", params)}


def plan_args(inputs: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["plan", "--prompt", str(inputs["prompt"]), "--token", str(inputs["token"]),
            "--encodings-prompt", str(inputs["enc"]), "--out", str(out), *extra]


@pytest.mark.parametrize("command", ["plan with encodings", "plan with a recipe", "estimate"])
def test_planning_reads_each_graph_once(inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        command: str) -> None:
    """The graphs' structure is read once per command, whichever rule weighs the pieces: the checks, the
    boundaries, the weights and the IO dimensions all come from the one read."""
    import genie_build.onnx_graph.model as graph_model

    reads: collections.Counter[str] = collections.Counter()
    read_regular = graph_model.read_regular
    monkeypatch.setattr(graph_model, "read_regular",
                        lambda path, **kwargs: reads.update([Path(path).name]) or read_regular(path, **kwargs))
    args = {"plan with encodings": plan_args(inputs, tmp_path / "plan.json", "--skip-weight-check"),
            "plan with a recipe": ["plan", "--prompt", str(inputs["prompt"]), "--token", str(inputs["token"]),
                                   "--recipe", "w4a16", "--unit-memory-mb", "2000", "--skip-weight-check",
                                   "--out-units", str(tmp_path / "units.json"), "--out", str(tmp_path / "plan.json")],
            "estimate": ["estimate", "--onnx", str(inputs["prompt"]), "--out-dir", str(tmp_path / "predicted")]}
    assert main([*args[command], "--num-parts", "auto"]) == 0
    assert reads == ({"prompt.onnx": 1} if command == "estimate" else {"prompt.onnx": 1, "token.onnx": 1})


def test_command_writes_plan(inputs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "results" / "plan.json"
    assert main(plan_args(inputs, out, "--num-parts", "3")) == 0
    plan = read_plan(out)
    assert plan.num_parts == 3 and plan.num_layers == 4 and plan.embedding_alone
    assert plan.boundaries == (EMBED_OUT, *(layer_out(i) for i in range(4)))
    up_proj = 8 * 16 // 2 + 4   # 4-bit per tensor, from the encodings file
    assert plan.pieces[1].bytes == up_proj + (64 + 32 + 128 + 8 + 1) * 2


def test_command_budget_and_embedding_with_layers(inputs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    assert main(plan_args(inputs, out, "--max-part-mb", "1", "--embedding-with-layers")) == 0
    plan = read_plan(out)
    assert plan.num_parts == 2 and plan.max_part_bytes == MIB and plan.parts[0].pieces[0] == "embedding"


def test_command_explicit_boundaries(inputs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    names = [EMBED_OUT, *(layer_out(i) for i in range(4))]
    assert main(plan_args(inputs, out, "--num-parts", "5", "--boundaries", *names)) == 0
    assert read_plan(out).parts[2].input_boundary == layer_out(0)


def zero_the_token_graphs_lm_head(token: Path) -> Path:
    """Make the token graph's LM head differ from the prompt graph's (same name and shape, other values)."""
    model = onnx.load(token)
    model.graph.initializer[-1].CopyFrom(numpy_helper.from_array(
        np.zeros((8, 32), dtype=np.float32), model.graph.initializer[-1].name))
    token.with_name("token.onnx.data").unlink()
    onnx.save(model, token, save_as_external_data=True, location="token.onnx.data", size_threshold=0)
    return token


def test_command_rejects_differing_weights(inputs: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    token = zero_the_token_graphs_lm_head(inputs["token"])
    out = tmp_path / "plan.json"
    assert main(plan_args(inputs, out, "--num-parts", "3")) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"genie-build: error: {token}: 1 initializer(s)") and "'lm_head.weight'" in error
    assert "\n" not in error and not out.exists()


def test_differing_param_encodings_are_refused_once_by_the_encodings_stage(inputs: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    """The plan weighs the pieces with the prompt graph's encodings; whether the two graphs' encodings agree is
    checked in one place, slice-graph-encodings' check_graphs_consistent (tests/test_encodings.py runs its command)."""
    write_encodings(inputs["enc_token"], {"model.layers.0.mlp.up_proj.weight": 8})
    assert main(plan_args(inputs, tmp_path / "plan.json", "--num-parts", "3")) == 0
    with pytest.raises(GenieBuildError, match=r"^model\.layers\.0\.mlp\.up_proj\.weight: param encoding differs "
                                              "between the prompt graph and the token graph"):
        check_graphs_consistent(read_encodings(inputs["enc"]), read_encodings(inputs["enc_token"]))


def test_command_rejects_missing_data_file(inputs: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    inputs["token"].with_name("token.onnx.data").unlink()
    assert main(plan_args(inputs, tmp_path / "plan.json", "--num-parts", "3")) == 2
    assert "token.onnx.data not found" in capsys.readouterr().err


def test_command_reports_infeasible_request(inputs: dict[str, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(plan_args(inputs, tmp_path / "plan.json", "--num-parts", "9")) == 2
    assert "feasible: 2..5" in capsys.readouterr().err


def test_check_model_takes_over_the_weight_check_the_workflow_skips_in_plan(inputs: dict[str, Path], tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    token = zero_the_token_graphs_lm_head(inputs["token"])
    assert main(plan_args(inputs, tmp_path / "plan.json", "--num-parts", "3", "--skip-weight-check")) == 0
    out = tmp_path / "model_check.json"
    assert main(["check-model", "--prompt", str(inputs["prompt"]), "--token", str(token), "--out", str(out)]) == 2
    assert "'lm_head.weight'" in capsys.readouterr().err and not out.exists()


def test_an_initializer_with_only_an_activation_encoding_weighs_what_it_is_stored_as() -> None:
    """AIMET encodes the embedding table as an activation (here 8-bit per tensor): the plan counts it so."""
    model = build_scoped_graph(layers=2, hidden=8, inter=16, rope=4, vocab=32)
    boundaries = find_boundaries(model, "m.onnx")
    table = TensorEncoding("model.embed_tokens.weight", "int", 8, scale=(0.1,), offset=(-128,))
    plain = encoded_pieces(model, Encodings(), boundaries)
    encoded = encoded_pieces(model, Encodings(activations={table.name: table}), boundaries)
    assert plain[0].bytes - encoded[0].bytes == 32 * 8 * 2 - (32 * 8 + 4)   # fp16 fallback -> 8-bit + one scale
