"""Split planning: choose contiguous layer ranges per part, balanced by bytes after quantization.

Pure functions on names and sizes; no file I/O except :func:`write_plan` / :func:`read_plan`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    """An indivisible unit of the model for planning: the embedding, one decoder layer, or the head
    (final norm + LM head). ``bytes`` is its weight size after quantization (from shapes + encodings)."""

    name: str            # "embedding", "layer_0" .. "layer_{L-1}", "head"
    kind: str            # "embedding" | "layer" | "head"
    bytes: int
    layer: int | None = None


@dataclass(frozen=True)
class PartPlan:
    """One part: 1-based ``index``; the pieces it holds; the tensors it takes and gives at its cuts."""

    index: int
    label: str                    # "01_of_06"
    pieces: tuple[str, ...]
    first_layer: int | None       # None for an embedding-only part
    last_layer: int | None
    input_boundary: str | None    # None for the first part (it takes input_ids)
    output_boundary: str | None   # None for the last part (it gives logits)
    estimated_bytes: int


@dataclass(frozen=True)
class Plan:
    num_parts: int
    parts: tuple[PartPlan, ...]
    num_layers: int
    boundaries: tuple[str, ...]   # residual-stream tensors: after embedding, after each layer 0..L-1
    embedding_alone: bool
    mode: str                     # "num_parts" | "max_part_mb"
