"""The bundle's layout of a split: which parts are context binaries of the bundle, which part takes the embedding
vectors, and the first binary. With ``bundle.embedding: lut`` part 1 (the embedding alone) is a table Genie reads on
the CPU, not a context, and part 2, the first binary, takes ``inputs_embeds``; with ``graph`` every part is a context
and part 1 takes the token ids. Read by the planner, the estimate, the bundle and the rules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from genie_build.conventions import EMBEDDING_LAYOUTS, parse_part_label

__all__ = ["BundleLayout"]


class _Part(Protocol):
    @property
    def index(self) -> int: ...


_P = TypeVar("_P", bound=_Part)


@dataclass(frozen=True)
class BundleLayout:
    """The layout ``bundle.embedding`` (one of :data:`genie_build.conventions.EMBEDDING_LAYOUTS`) gives a split."""

    embedding: str = "graph"

    def __post_init__(self) -> None:
        if self.embedding not in EMBEDDING_LAYOUTS:
            raise ValueError(f"bundle.embedding {self.embedding!r} is not one of {EMBEDDING_LAYOUTS}")

    @property
    def table(self) -> bool:
        """Whether part 1 is the embedding table on the CPU."""
        return self.embedding == "lut"

    @property
    def first_binary(self) -> int:
        """The index of the first part that is a context binary of the bundle."""
        return 2 if self.table else 1

    def holds(self, part: int | str) -> bool:
        """Whether the part (index, or label ``"2_of_5"``) is a context binary of the bundle."""
        return _index(part) >= self.first_binary

    def takes_embeddings(self, part: int | str) -> bool:
        """Whether the part takes the embedding vectors (``inputs_embeds``): the first binary after the table."""
        return self.table and _index(part) == self.first_binary

    def binaries(self, parts: Sequence[_P]) -> list[_P]:
        """The parts (anything with an ``index``) that are context binaries of the bundle, in order."""
        return [part for part in parts if self.holds(part.index)]


def _index(part: int | str) -> int:
    return part if isinstance(part, int) else parse_part_label(part)[0]
