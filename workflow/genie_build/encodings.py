"""AIMET quantization encodings: read (0.6.1 and 1.0.0), validate, write (1.0.0), slice per part.

The in-memory model is version-independent. AIMET semantics for integer encodings:
``q = clamp(round(x / scale) - offset, 0, 2**bw - 1)`` and ``x_hat = (q + offset) * scale``; for a
symmetric encoding ``offset = -2**(bw - 1)``, so the signed value ``q + offset`` lies in
``[-2**(bw-1), 2**(bw-1) - 1]``.

Per-channel and per-block layout (documented here because encodings files do not record an axis):
- per-channel: one scale/offset per output channel. For a MatMul weight stored ``[in, out]`` that is
  the last axis; for a Gather table ``[vocab, hidden]`` it is axis 0 (:func:`channel_axis` decides).
- per-block: blocks of ``block_size`` along the input axis (axis 0 of an ``[in, out]`` MatMul weight),
  scales flattened row-major over ``[in // block_size, out]``.
- LPBQ: per-block scale = ``scale[channel] * per_block_int_scale[block, channel]``; ``bitwidth`` is the
  decompressed width, ``compressed_bitwidth`` the stored one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

EncodingKind = Literal["per_tensor", "per_channel", "per_block", "lpbq"]

SUPPORTED_INT_BITWIDTHS = (4, 8, 16, 32)
SUPPORTED_FLOAT_BITWIDTHS = (16, 32)


@dataclass(frozen=True)
class TensorEncoding:
    """One tensor's encoding. ``scale``/``offset`` have one entry (per tensor) or one per channel/block."""

    name: str
    dtype: Literal["int", "float"]
    bitwidth: int
    kind: EncodingKind = "per_tensor"
    is_symmetric: bool = False
    scale: tuple[float, ...] = ()
    offset: tuple[int, ...] = ()
    block_size: int | None = None
    compressed_bitwidth: int | None = None
    per_block_int_scale: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Encodings:
    """A whole encodings file: activation and parameter encodings keyed by tensor name."""

    activations: dict[str, TensorEncoding] = field(default_factory=dict)
    params: dict[str, TensorEncoding] = field(default_factory=dict)
    quantizer_args: dict = field(default_factory=dict)
    version: str = "1.0.0"
