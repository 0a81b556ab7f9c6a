"""Genie's conventions (genie_build.conventions): the padding contract of part labels and graph names, the
unsplit graph name, the KV names and the one AR/CL reading every stage uses."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import re

from genie_build.conventions import (KV_TENSOR, PART_LABEL_PATTERN, PART_SUFFIX, UNIT_LABEL_PATTERN, graph_ar,
                                     graph_ar_cl, graph_keys, graph_name, key_kind, kv_name, length_graph_key,
                                     parse_part_label, part_label, piece_names, unit_label, unsplit_graph_name)
from genie_build.errors import GenieBuildError
from genie_build.plan.calibration_units import units_from_dicts


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple
    dtype: str = "float32"


@pytest.mark.parametrize("index, num_parts, label", [(1, 6, "1_of_6"), (1, 11, "01_of_11"), (11, 11, "11_of_11"),
                                                     (7, 100, "007_of_100"), (100, 100, "100_of_100")])
def test_part_label_pads_the_index_to_the_width_of_n(index: int, num_parts: int, label: str) -> None:
    assert part_label(index, num_parts) == label
    assert parse_part_label(label) == (index, num_parts)


@pytest.mark.parametrize("index, num_units, label", [(1, 6, "u1_of_6"), (3, 17, "u03_of_17"), (17, 17, "u17_of_17")])
def test_a_unit_label_is_never_read_as_a_part_label(index: int, num_units: int, label: str) -> None:
    """The calibration chain's units and the parts are both numbered "i of n"; the unit's "u" keeps the wildcards,
    the file names and the logs of the two apart."""
    assert unit_label(index, num_units) == label
    assert re.fullmatch(UNIT_LABEL_PATTERN, label) and not re.fullmatch(PART_LABEL_PATTERN, label)
    assert not re.fullmatch(UNIT_LABEL_PATTERN, part_label(index, num_units))
    with pytest.raises(ValueError, match="not a part label"):
        parse_part_label(label)


def test_a_piece_is_named_by_its_position_and_the_planner_names_it_so() -> None:
    from genie_build.encodings import Encodings
    from genie_build.plan.plan import by_encodings, weighed_pieces
    from genie_build.plan.weight_inventory import ModelWeights
    assert piece_names(2) == ("embedding", "layer_0", "layer_1", "head")
    pieces = weighed_pieces(ModelWeights((), ("b0", "b1", "b2")), by_encodings(Encodings()))
    assert tuple(piece.name for piece in pieces) == piece_names(2)
    assert [piece.kind for piece in pieces] == ["embedding", "layer", "layer", "head"]


def test_a_units_file_with_part_like_labels_is_refused_in_one_line() -> None:
    unit = {"label": "03_of_17", "part": "02_of_06", "pieces": ["layer_0"], "input_boundary": "a",
            "output_boundary": "b", "float_bytes": 4}
    with pytest.raises(GenieBuildError) as excinfo:
        units_from_dicts([unit], "calibration_units.json")
    assert str(excinfo.value) == ("calibration_units.json: calibration unit label '03_of_17' is not of the form "
                                  "u01_of_N (a file written before units had their own labels: delete it to plan "
                                  "again)")
    assert units_from_dicts([{**unit, "label": "u03_of_17"}], "calibration_units.json")[0].label == "u03_of_17"


@pytest.mark.parametrize("num_parts", [9, 10, 11, 100, 101])
def test_name_order_is_part_order(num_parts: int) -> None:
    """Genie assigns graphs to splits by sorting their names, so sorting must not put '10' before '2'."""
    names = [graph_name("prompt", 32, 256, index, num_parts) for index in range(1, num_parts + 1)]
    assert sorted(names) == names
    assert sorted(f"part_{part_label(i, num_parts)}.onnx" for i in range(1, num_parts + 1)) == \
        [f"part_{part_label(i, num_parts)}.onnx" for i in range(1, num_parts + 1)]


@pytest.mark.parametrize("bad", [(0, 6), (7, 6)])
def test_part_label_refuses_an_index_outside_1_to_n(bad: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="outside"):
        part_label(*bad)


@pytest.mark.parametrize("label", ["1of6", "01_of_", "a_of_6", "part_01_of_06"])
def test_parse_part_label_refuses_what_is_not_a_label(label: str) -> None:
    with pytest.raises(ValueError, match="not a part label"):
        parse_part_label(label)


def test_graph_names_whole_and_split() -> None:
    assert unsplit_graph_name("prompt", 32, 256) == "prompt_ar32_cl256"
    assert graph_name("prompt", 32, 256, 1, 11) == "prompt_ar32_cl256_01_of_11"
    assert graph_name("token", 1, 256, 11, 11) == "token_ar1_cl256_11_of_11"
    assert PART_SUFFIX.search(graph_name("token", 1, 256, 3, 11)).groups() == ("03", "11")
    with pytest.raises(ValueError, match="graph kind"):
        unsplit_graph_name("decode", 1, 256)


def test_a_graph_at_another_context_length_is_keyed_by_its_kind_and_length() -> None:
    assert [length_graph_key(kind, 1024) for kind in ("prompt", "token")] == ["prompt_cl1024", "token_cl1024"]
    with pytest.raises(ValueError, match="graph kind"):
        length_graph_key("decode", 1024)


@pytest.mark.parametrize("key, kind", [("prompt", "prompt"), ("token", "token"), ("prompt_cl512", "prompt"),
                                       ("token_cl64", "token")])
def test_a_graph_keys_kind_is_read_back(key: str, kind: str) -> None:
    assert key_kind(key) == kind


@pytest.mark.parametrize("key", ["decode", "prompt_cl", "prompt_clx", "prompt_512", "token_cl64_cl8", ""])
def test_a_key_of_no_kind_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match="is not a kind"):
        key_kind(key)


def test_the_largest_length_keeps_the_kinds_key() -> None:
    assert graph_keys([512, 4096, 1024]) == [(4096, "prompt", "prompt"), (4096, "token", "token"),
                                             (1024, "prompt", "prompt_cl1024"), (1024, "token", "token_cl1024"),
                                             (512, "prompt", "prompt_cl512"), (512, "token", "token_cl512")]
    assert graph_keys([256]) == [(256, "prompt", "prompt"), (256, "token", "token")]


def test_kv_names_are_what_the_kv_pattern_reads() -> None:
    for kind in ("key", "value"):
        for side in ("in", "out"):
            assert KV_TENSOR.match(kv_name(kind, 12, side)).groups() == (kind, "12", side)
    assert kv_name("key", 0, "in") == "past_key_0_in"


def test_graph_ar_is_the_prompt_ar_or_one() -> None:
    assert (graph_ar("prompt", 32), graph_ar("token", 32)) == (32, 1)
    with pytest.raises(ValueError, match="graph kind"):
        graph_ar("decode", 32)


def test_graph_ar_cl_reads_the_tensors_before_the_name() -> None:
    inputs = (_Tensor("input_ids", (1, 16), "int32"), _Tensor("attention_mask", (1, 16, 128)))
    assert graph_ar_cl("prompt_ar32_cl256_1_of_2", inputs, ()) == (16, 128)
    # an embedding-only part: its tensors give AR, only the name gives CL
    embed_only = (_Tensor("input_ids", (1, 16), "int32"),)
    assert graph_ar_cl("prompt_ar16_cl128_1_of_2", embed_only, ()) == (16, 128)
    assert graph_ar_cl("", embed_only, ()) == (16, None)
    assert graph_ar_cl("", (), ()) == (None, None)
