"""Encoding values as they will be stored and computed with: every scale a normal number in the precision the
quantizer computes with, every grid's ends within float32, a symmetric offset where ``is_sym`` says so. The readers
(:mod:`genie_build.encodings.readers`) run :func:`checked` on every integer encoding they read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from genie_build.encodings.model import TensorEncoding
from genie_build.errors import GenieBuildError

__all__ = ["Where", "checked"]


@dataclass(frozen=True)
class Where:
    """The file and the entry in it a parse problem is about, so every error names the tensor."""

    path: str
    entry: str

    def error(self, problem: str) -> GenieBuildError:
        return GenieBuildError(self.path, f"{self.entry}: {problem}")


_FLOAT32 = np.finfo(np.float32)


def checked(where: Where, encoding: TensorEncoding) -> TensorEncoding:
    """``encoding``, once its values hold as they will be stored and computed with: every scale a normal number
    in the precision the quantizer computes with (float32; an LPBQ channel scale is kept in float64 and its block
    scale, ``scale x per_block_int_scale``, computed in float32), every grid's ends within float32 (a dequantized
    weight is float32), and an ``is_sym`` encoding with a symmetric offset.

    A float64 value that is fine can still be 0 (1e-300), subnormal or inf (1e300) in float32: the weight would
    come out all zeros or NaN, and a build would pass with it.

    Raises:
        GenieBuildError: naming the file, the tensor, the value and what it becomes.
    """
    if encoding.dtype != "int":
        return encoding
    scale = np.asarray(encoding.scale, dtype=np.float64)
    if encoding.kind == "lpbq":
        _require_normal(where, scale, np.float64, lambda i: f"scale[{i}]")
        blocks = len(encoding.per_block_int_scale) // len(scale)
        int_scale = np.asarray(encoding.per_block_int_scale, dtype=np.float64).reshape(len(scale), blocks)
        _require_block_int_scales_fit(where, int_scale.ravel(), encoding.bitwidth - encoding.compressed_bitwidth)
        block_scale = (int_scale * scale[:, None]).ravel()
        _require_normal(where, block_scale, np.float32, lambda i: f"scale[{i // blocks}] x per_block_int_scale[{i}]")
        bits = encoding.compressed_bitwidth
        offset = np.full(block_scale.shape, -(2 ** (bits - 1)), dtype=np.float64)
        _require_grid_within_float32(where, block_scale.astype(np.float32), offset, bits,
                                     lambda i: f"scale[{i // blocks}] x per_block_int_scale[{i}]")
        return encoding
    _require_normal(where, scale, np.float32, lambda i: f"scale[{i}]")
    offset = np.asarray(encoding.offset, dtype=np.float64)
    _require_grid_within_float32(where, scale.astype(np.float32), offset, encoding.bitwidth, lambda i: f"scale[{i}]")
    if encoding.is_symmetric:
        _require_symmetric_offsets(where, offset, encoding.bitwidth)
    return encoding


def _require_block_int_scales_fit(where: Where, int_scale: np.ndarray, bits: int) -> None:
    """LPBQ's integer block scales are stored in ``bw - compressed_bw`` bits, as 1 .. 2**bits (AIMET's range); a
    larger one would wrap when stored."""
    bad = np.flatnonzero(int_scale > 2**bits)
    if bad.size:
        index = int(bad[0])
        raise where.error(f"per_block_int_scale[{index}] {int(int_scale[index])} is more than the {2**bits} a "
                          f"{bits}-bit block scale holds (bw - compressed_bw)")


def _require_normal(where: Where, values: np.ndarray, precision: type, what: Callable[[int], str]) -> None:
    """Every value, rounded to ``precision``, is finite and normal (not 0, not subnormal)."""
    info = np.finfo(precision)
    with np.errstate(over="ignore", under="ignore"):
        stored = values.astype(precision)
    bad = np.flatnonzero(~(np.isfinite(stored) & (stored >= info.tiny)))
    if not bad.size:
        return
    index = int(bad[0])
    value, rounded = float(values[index]), stored[index]
    state = "inf" if np.isinf(rounded) else "0" if rounded == 0 else f"subnormal ({float(rounded)!r})"
    name = np.dtype(precision).name
    raise where.error(f"{what(index)} {value!r} is {state} in {name}, the precision it is computed in: a scale must "
                      f"be a normal {name}, between {str(info.tiny)} and {str(info.max)}")


def _require_grid_within_float32(where: Where, scale: np.ndarray, offset: np.ndarray, bits: int,
                                 what: Callable[[int], str]) -> None:
    """The grid's ends, ``offset * scale`` and ``(2**bits - 1 + offset) * scale``, are finite in float32."""
    ends = np.maximum(np.abs(offset), np.abs(2**bits - 1 + offset)) * scale.astype(np.float64)
    bad = np.flatnonzero(ends > float(_FLOAT32.max))
    if bad.size:
        index = int(bad[0])
        raise where.error(f"{what(index)} {float(scale[index])!r} with offset {int(offset[index % offset.size])} "
                          f"reaches {float(ends[index]):.6g}, beyond float32 ({float(_FLOAT32.max):.6g}): the "
                          "dequantized values would be inf")


def _require_symmetric_offsets(where: Where, offset: np.ndarray, bitwidth: int) -> None:
    """``is_sym`` with an offset AIMET's symmetric quantizers can write: ``-2**(bw-1)`` (signed), one more
    (strict symmetric) or 0 (unsigned symmetric, for a tensor with no negative value; a weight that has some is
    refused when converted)."""
    allowed = (-(2 ** (bitwidth - 1)), -(2 ** (bitwidth - 1)) + 1, 0)
    bad = np.flatnonzero(~np.isin(offset, allowed))
    if bad.size:
        index = int(bad[0])
        raise where.error(f"is_sym is true but offset[{index}] is {int(offset[index])}, an asymmetric offset: a "
                          f"symmetric {bitwidth}-bit encoding has offset {allowed[0]} ({allowed[1]} strict, 0 "
                          "unsigned); set is_sym false or fix the offset")
