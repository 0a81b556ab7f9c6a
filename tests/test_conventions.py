"""Genie's conventions (genie_build.conventions): the padding contract of part labels and graph names, the
unsplit graph name, the KV names and the one AR/CL reading every stage uses."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from genie_build.conventions import (KV_TENSOR, PART_SUFFIX, graph_ar, graph_ar_cl, graph_name, kv_name,
                                     parse_part_label, part_label, unsplit_graph_name)


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
