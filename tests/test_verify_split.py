"""Chain == full verification: generated feeds, bit-exact comparison, failures that name what differs."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from genie_build.cli import main
from genie_build.conventions import PART_WEIGHTS_NAME, find_parts
from genie_build.demo.demo import generate_demo
from genie_build.errors import GenieBuildError
from genie_build.split.split import split_graphs
from genie_build.split.verify_split import build_feed, compare_arrays, compare_chain, find_token_input, verify_chain
from demo_shapes import ONE_LAYER, SMALL
from tiny_decoder import make_plan

SHAPE = SMALL
PLAN = make_plan(4, [[0, 1], [2, 3]])


@pytest.fixture(scope="module")
def demo(small_demo: Path) -> Path:
    return small_demo


@pytest.fixture()
def parts(demo: Path, tmp_path: Path) -> dict[str, list[Path]]:
    """Both graphs' parts in one parts folder, fresh per test, since some tests damage them."""
    return split_graphs({kind: demo / f"{kind}.onnx" for kind in ("prompt", "token")}, PLAN, tmp_path / "parts")


def test_feed_covers_every_input_with_its_dtype_and_shape(demo: Path) -> None:
    feed = build_feed(demo / "token.onnx")
    graph = onnx.load(demo / "token.onnx", load_external_data=False).graph
    assert list(feed) == [v.name for v in graph.input]
    for value in graph.input:
        assert feed[value.name].shape == tuple(d.dim_value for d in value.type.tensor_type.shape.dim)
        assert feed[value.name].dtype == helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)


def test_feed_is_deterministic_per_seed_and_in_range(demo: Path) -> None:
    prompt = demo / "prompt.onnx"
    first, again, other = build_feed(prompt), build_feed(prompt), build_feed(prompt, seed=1)
    assert all(np.array_equal(first[name], again[name]) for name in first)
    assert not np.array_equal(first["past_key_0_in"], other["past_key_0_in"])
    ids = first["input_ids"]
    assert ids.min() >= 0 and ids.max() < SHAPE.vocab and len(np.unique(ids)) > 1
    assert np.abs(first["past_value_3_in"]).max() <= 1.0
    assert build_feed(prompt, vocab=3)["input_ids"].max() < 3


def test_vocab_is_found_through_a_cast_of_fp16_weights(tmp_path: Path) -> None:
    generate_demo(dataclasses.replace(ONE_LAYER, vocab=96, weight_dtype="float16"), tmp_path)
    assert find_token_input(onnx.load(tmp_path / "token.onnx", load_external_data=False)) == ("input_ids", 96)


def test_feed_rejects_dynamic_shapes(tmp_path: Path) -> None:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    onnx.save(helper.make_model(graph), tmp_path / "dyn.onnx")
    with pytest.raises(GenieBuildError, match=r"dyn\.onnx: input 'x' has a dynamic shape"):
        build_feed(tmp_path / "dyn.onnx")


@pytest.mark.parametrize("kind", ["prompt", "token"])
def test_chained_parts_match_and_report_every_output(demo: Path, parts: dict[str, list[Path]], kind: str) -> None:
    full = demo / f"{kind}.onnx"
    report = verify_chain(full, parts[kind], build_feed(full))
    assert report.bit_exact
    record = json.loads(json.dumps(report.to_dict()))
    assert record["bit_exact"] is True
    assert [o["name"] for o in record["outputs"]][:3] == ["logits", "past_key_0_out", "past_value_0_out"]
    # each output names the part giving it (layers 0-1 are part 2; layers 2-3 and the head part 3): every part's
    # file is {kind}.onnx, so the part's folder must be named
    for output in record["outputs"]:
        name = output["name"]
        label = "3_of_3" if name == "logits" or name.endswith(("_2_out", "_3_out")) else "2_of_3"
        assert re.findall(r"part_\d_of_3", output["part"]) == [f"part_{label}"], output
    assert all(o["max_abs_diff"] == 0.0 for o in record["outputs"])


def test_changed_weight_in_a_part_fails_naming_graph_and_output(demo: Path, parts: dict[str, list[Path]]) -> None:
    last = parts["prompt"][2]
    head = next(t for t in onnx.load(last, load_external_data=False).graph.initializer if t.name == "lm_head.weight")
    offset = int({e.key: e.value for e in head.external_data}["offset"])
    with open(last.with_name(PART_WEIGHTS_NAME), "r+b") as handle:
        handle.seek(offset)
        handle.write(np.float32(3.0).tobytes())
    full = demo / "prompt.onnx"
    with pytest.raises(GenieBuildError, match=r"prompt\.onnx: chained parts differ .* at output 'logits' "
                                              r"\(from [^)]*part_3_of_3[^)]*\): max abs diff [1-9]"):
        verify_chain(full, parts["prompt"], build_feed(full))


def test_missing_last_part_fails(demo: Path, parts: dict[str, list[Path]]) -> None:
    full = demo / "token.onnx"
    with pytest.raises(GenieBuildError, match="output 'logits' is not given by any part"):
        verify_chain(full, parts["token"][:2], build_feed(full))


def test_parts_out_of_order_fail_naming_the_missing_input(demo: Path, parts: dict[str, list[Path]]) -> None:
    full = demo / "token.onnx"
    with pytest.raises(GenieBuildError, match=r"part_2_of_3/token\.onnx: input\(s\) \['/model/embed_tokens"):
        verify_chain(full, parts["token"][1:], build_feed(full))


def test_compare_arrays_is_bitwise() -> None:
    values = np.array([0.0, 1.5], dtype=np.float32)
    assert compare_arrays("x", "p", values, values.copy()).bit_exact
    wider = compare_arrays("x", "p", values, values.astype(np.float64))
    assert not wider.bit_exact and wider.max_abs_diff == 0.0
    signed_zero = compare_arrays("x", "p", values, np.array([-0.0, 1.5], dtype=np.float32))
    assert not signed_zero.bit_exact
    assert compare_arrays("x", "p", values, values[:1]).max_abs_diff == float("inf")
    assert compare_arrays("x", "p", values, values + np.float32(1e-7)).max_abs_diff > 0


def test_cli_writes_the_report(demo: Path, parts: dict[str, list[Path]], tmp_path: Path) -> None:
    out = tmp_path / "verify" / "prompt.json"
    assert main(["verify-split", "--model", str(demo / "prompt.onnx"), "--parts-dir", str(tmp_path / "parts"),
                 "--graph", "prompt", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["bit_exact"] and len(record["outputs"]) == 1 + 2 * SHAPE.layers
    assert record["parts"] == [str(path) for path in parts["prompt"]]   # the prompt's parts, not the token's beside


def test_cli_fails_on_an_incomplete_set_of_parts(demo: Path, parts: dict[str, list[Path]], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    parts["prompt"][1].unlink()   # the token graph's part 2 is still in that folder: it must not count
    out = tmp_path / "report.json"
    assert main(["verify-split", "--model", str(demo / "prompt.onnx"), "--parts-dir", str(tmp_path / "parts"),
                 "--graph", "prompt", "--out", str(out)]) == 2
    assert ("prompt parts 1_of_3, 3_of_3 are not exactly parts 1_of_3, 2_of_3, 3_of_3 (expected part_01_of_N"
            in capsys.readouterr().err)
    assert not out.exists()


def test_find_parts_orders_by_index(tmp_path: Path) -> None:
    for index in (10, 2, 1, 3, 4, 5, 6, 7, 8, 9, 11):
        (tmp_path / f"part_{index:02d}_of_11").mkdir()
        (tmp_path / f"part_{index:02d}_of_11" / "prompt.onnx").touch()
    found = find_parts(tmp_path, "prompt")
    assert list(found)[:3] == ["01_of_11", "02_of_11", "03_of_11"]
    assert [str(p.relative_to(tmp_path)) for p in found.values()][:3] == [
        "part_01_of_11/prompt.onnx", "part_02_of_11/prompt.onnx", "part_03_of_11/prompt.onnx"]


def test_feed_of_the_wrong_shape_fails_naming_the_graph(demo: Path, parts: dict[str, list[Path]]) -> None:
    full = demo / "prompt.onnx"
    feed = build_feed(full)
    with pytest.raises(GenieBuildError, match=r"prompt\.onnx: onnxruntime cannot run it"):
        verify_chain(full, parts["prompt"], {**feed, "input_ids": feed["input_ids"][:, :1]})


def test_full_graph_and_parts_run_with_the_same_unfolded_options(demo: Path, parts: dict[str, list[Path]],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Equality means the split changed nothing only if both sides run the same kernels: one set of options."""
    used: list[tuple[Path, ort.SessionOptions]] = []
    original = ort.InferenceSession

    def recording_session(path, options, providers):
        used.append((Path(path), options))
        return original(path, options, providers=providers)

    monkeypatch.setattr(ort, "InferenceSession", recording_session)
    full = demo / "prompt.onnx"
    verify_chain(full, parts["prompt"], build_feed(full))
    # whole paths: the full graph and every part are all named prompt.onnx
    assert [path for path, _ in used] == [full, *parts["prompt"]]
    for _, options in used:
        assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        assert options.execution_order == ort.ExecutionOrder.PRIORITY_BASED


def test_float16_weights_chain_bit_exact_and_a_one_ulp_change_is_caught(tmp_path: Path) -> None:
    """Unfolded, float16 weights are cast at run time on both sides; the check still sees the smallest change."""
    generate_demo(dataclasses.replace(SHAPE, weight_dtype="float16"), tmp_path / "demo")
    full = tmp_path / "demo" / "token.onnx"
    chain = split_graphs({"token": full}, PLAN, tmp_path / "parts")["token"]
    assert verify_chain(full, chain, build_feed(full)).bit_exact
    last = chain[-1]
    head = next(t for t in onnx.load(last, load_external_data=False).graph.initializer if t.name == "lm_head.weight")
    assert head.data_type == TensorProto.FLOAT16
    offset = int({e.key: e.value for e in head.external_data}["offset"])
    with open(last.with_name(PART_WEIGHTS_NAME), "r+b") as handle:
        handle.seek(offset)
        value = np.frombuffer(handle.read(2), np.float16)
        handle.seek(offset)
        handle.write(np.nextafter(value, np.float16(np.inf)).tobytes())
    assert not compare_chain(full, chain, build_feed(full)).bit_exact
