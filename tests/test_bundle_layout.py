"""The bundle's layout of a split: with the embedding as a CPU table, part 1 is no context binary and part 2, the first
binary, takes the embedding vectors; with the embedding in a graph, every part is a binary and none takes them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from genie_build.bundle_layout import BundleLayout


@dataclass(frozen=True)
class Part:
    index: int


def test_the_table_stands_for_part_1_and_part_2_takes_the_embeddings():
    layout = BundleLayout("lut")
    assert (layout.table, layout.first_binary) == (True, 2)
    assert [layout.holds(label) for label in ("01_of_03", "02_of_03", "03_of_03")] == [False, True, True]
    assert [layout.takes_embeddings(index) for index in (1, 2, 3)] == [False, True, False]
    assert layout.binaries([Part(1), Part(2), Part(3)]) == [Part(2), Part(3)]


def test_with_the_embedding_in_a_graph_every_part_is_a_binary():
    layout = BundleLayout("graph")
    assert (layout.table, layout.first_binary) == (False, 1)
    assert all(layout.holds(label) for label in ("01_of_02", "02_of_02"))
    assert not any(layout.takes_embeddings(label) for label in ("01_of_02", "02_of_02"))
    assert layout.binaries([Part(1), Part(2)]) == [Part(1), Part(2)]


def test_an_unknown_layout_is_refused():
    with pytest.raises(ValueError, match="bundle.embedding 'table'"):
        BundleLayout("table")
