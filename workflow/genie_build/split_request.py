"""The split request (``split.num_parts`` / ``split.max_part_mb``): its rule, checked wherever a request comes in (the
config, ``--split-json``, a :class:`SplitRequest`), and the checked request that
:func:`genie_build.plan.auto_split.plan_request` plans. Imports no more than the CLI's table commands start with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from genie_build.errors import GenieBuildError
from genie_build.units import MIB

__all__ = ["AUTO", "SplitRequest", "check_split_request"]

AUTO = "auto"   # split.num_parts: the fewest parts that map on the device (genie_build.plan.auto_split)


def check_split_request(num_parts: object, max_part_mb: object, where: str) -> None:
    """The split request's rule, wherever one comes in (the config, ``--split-json``, a :class:`SplitRequest`):
    exactly one of ``num_parts`` and ``max_part_mb``, or ``num_parts`` :data:`AUTO` (``max_part_mb`` then an extra
    bound).

    Raises:
        GenieBuildError: naming ``where``, when the rule does not hold.
    """
    if (num_parts is None) == (max_part_mb is None) and num_parts != AUTO:
        raise GenieBuildError(where, "set exactly one of num_parts and max_part_mb (the other to null), got "
                                     f"num_parts={num_parts!r}, max_part_mb={max_part_mb!r}")


@dataclass(frozen=True)
class SplitRequest:
    """A checked split request: ``num_parts`` parts, the fewest of at most ``max_part_bytes`` each, or (``num_parts``
    :data:`AUTO`, ``max_part_bytes`` then an extra bound) the fewest that map on the device; with
    ``embedding_alone`` part 1 is exactly the embedding. :func:`genie_build.plan.auto_split.plan_request` plans it.

    Raises:
        GenieBuildError: the request breaks :func:`check_split_request`.
    """

    num_parts: int | str | None = None
    max_part_bytes: int | None = None
    embedding_alone: bool = True

    def __post_init__(self) -> None:
        check_split_request(self.num_parts, None if self.max_part_bytes is None else self.max_part_bytes / MIB,
                            "split")

    @classmethod
    def from_section(cls, split: Mapping[str, Any]) -> SplitRequest:
        """The request of a ``split`` section (the config's, or :func:`genie_build.cli_args.split_options`'):
        ``num_parts``, ``max_part_mb`` (MiB) and ``embedding_alone`` (default true); its ``boundaries`` are the
        graph's business (:func:`genie_build.plan.boundaries.find_boundaries`)."""
        max_mb = split.get("max_part_mb")
        return cls(split.get("num_parts"), None if max_mb is None else int(max_mb * MIB),
                   split.get("embedding_alone", True))

    @property
    def auto(self) -> bool:
        return self.num_parts == AUTO
