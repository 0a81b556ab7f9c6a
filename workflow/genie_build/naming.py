"""Part labels and graph names. The index is zero-padded to the width of N so that lexicographic order
is part order: Genie assigns graphs to splits by sorting their names (see the facts file)."""

from __future__ import annotations

import re

GRAPH_KINDS = ("prompt", "token")
_PART_LABEL = re.compile(r"^(\d+)_of_(\d+)$")


def part_label(index: int, num_parts: int) -> str:
    """``part_label(1, 11) == "01_of_11"``; ``index`` is 1-based."""
    if not 1 <= index <= num_parts:
        raise ValueError(f"part index {index} outside 1..{num_parts}")
    width = len(str(num_parts))
    return f"{index:0{width}d}_of_{num_parts}"


def parse_part_label(label: str) -> tuple[int, int]:
    """Inverse of :func:`part_label`: ``"01_of_11" -> (1, 11)``."""
    match = _PART_LABEL.match(label)
    if not match:
        raise ValueError(f"not a part label: {label!r} (expected e.g. '01_of_11')")
    return int(match.group(1)), int(match.group(2))


def graph_name(kind: str, ar: int, cl: int, index: int, num_parts: int) -> str:
    """``graph_name("prompt", 32, 256, 1, 11) == "prompt_ar32_cl256_01_of_11"``."""
    if kind not in GRAPH_KINDS:
        raise ValueError(f"graph kind {kind!r} is not one of {GRAPH_KINDS}")
    return f"{kind}_ar{ar}_cl{cl}_{part_label(index, num_parts)}"
