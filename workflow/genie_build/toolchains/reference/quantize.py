"""AIMET quantization of weights in numpy, vectorised.

Semantics (see :mod:`genie_build.encodings`): ``q = clamp(round(x / scale) - offset, 0, 2**bw - 1)`` and
``x_hat = (q + offset) * scale``. The functions here return the zero point ``-offset`` instead of the offset,
so that ``x_hat = (q - zero_point) * scale`` reads as ONNX ``DequantizeLinear``. Arithmetic is float32 (the
precision AIMET quantizes in and the precision the scale is stored in) and rounds half to even.

Shapes of the returned scale and zero point ("parameter layout"):

- per tensor: ``()``;
- per channel: ``(C,)``, one entry per index of the channel axis;
- per block and LPBQ: the weight's rank, the channel axis whole, the block axis in blocks, other axes 1
  (:func:`genie_build.encodings.blocked_shape`). For LPBQ the scale is the per-block scale
  ``scale[channel] * per_block_int_scale[channel, block]``, multiplied in float64 and rounded to float32 as
  aimet-onnx does, and values are quantized to the compressed bitwidth, symmetric.
"""

from __future__ import annotations

import math

import numpy as np

from genie_build.encodings import TensorEncoding, blocked_shape
from genie_build.onnx_graph import WeightLayout
from genie_build.errors import GenieBuildError

__all__ = ["BLOCK_VALUES", "blocked_params", "broadcast_params", "dequantize", "lpbq_channel_scale", "params_of_rows",
           "quantize", "row_blocks", "same_rank_params", "stored_bitwidth", "unsigned_dtype"]

# Values per block of rows that quantize works on at once: 16 MiB of float32 temporaries (float64 after the
# int64 offset), instead of several copies of a whole embedding or LM-head table.
BLOCK_VALUES = 4 * 2**20


def stored_bitwidth(enc: TensorEncoding) -> int:
    """The bitwidth the quantized values are stored in: the compressed one for LPBQ."""
    return enc.compressed_bitwidth if enc.kind == "lpbq" else enc.bitwidth


def unsigned_dtype(bitwidth: int) -> np.dtype:
    """The smallest unsigned integer dtype holding ``bitwidth``-bit values."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if bitwidth <= np.iinfo(dtype).bits:
            return np.dtype(dtype)
    raise ValueError(f"no unsigned dtype holds {bitwidth}-bit values")


def quantize(w: np.ndarray, enc: TensorEncoding, layout: WeightLayout | None, *,
             block_values: int = BLOCK_VALUES) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize ``w`` as AIMET does with ``enc``.

    The arithmetic runs on blocks of rows (axis 0) of at most about ``block_values`` values, so memory holds
    ``w``, the codes and one block's float temporaries, not several float copies of the whole tensor; each
    value gets the same float32 operations as on the whole tensor, so the codes are identical.

    Args:
        w: the float weight.
        enc: its integer encoding.
        layout: the axes of a per-channel, per-block or LPBQ encoding
            (:func:`genie_build.encodings.layout_of`); None for a per-tensor one.
        block_values: the size of a block of rows, in values (rounded to whole rows and whole blocks of a
            blocked encoding, at least one of them).

    Returns:
        ``(q, scale, zero_point)``: ``q`` unsigned integers of :func:`unsigned_dtype` (``stored_bitwidth``)
        shaped like ``w``; ``scale`` float32 and ``zero_point`` of q's dtype, both in the parameter layout.

    Raises:
        GenieBuildError: (``where`` = the tensor) a float encoding, a scale count that does not fit ``w``,
            an asymmetric LPBQ encoding, or non-finite weights.
    """
    if enc.dtype != "int":
        raise GenieBuildError(enc.name, f"a {enc.dtype} encoding has no integer quantization")
    w = np.asarray(w)
    scale, offset = _scale_and_offset(enc, w.shape, layout)
    axis = None if layout is None else layout.channel_axis
    bits = stored_bitwidth(enc)
    dtype = unsigned_dtype(bits)
    rows = np.atleast_1d(w)
    q = np.empty(rows.shape, dtype=dtype)
    blocks = row_blocks(rows.shape, scale, axis, block_values)
    # One buffer for every block's arithmetic, in place: fresh temporaries cost page faults and memory traffic, which
    # two converts running side by side share. Subtracting the offset in float32 gives the codes the exact integer
    # arithmetic gives when both the rounded quotient and the offset are below 2**24 in magnitude, and otherwise a
    # value beyond the clip range either way; so float32 for offsets that small, float64 (exact) for wider ones.
    work_dtype = np.float32 if bits <= 16 and np.abs(offset).max(initial=0) < 2**23 else np.float64
    largest = max((block.stop - block.start for block in blocks), default=0) * math.prod(rows.shape[1:])
    buffer = np.empty(largest, dtype=work_dtype)
    for block in blocks:
        x = np.asarray(rows[block], dtype=np.float32)
        if not np.isfinite(x).all():
            raise GenieBuildError(enc.name, "weight holds NaN or infinite values, which cannot be quantized")
        block_scale, block_offset = (params_of_rows(params, rows.shape, axis, block) for params in (scale, offset))
        codes = buffer[:x.size].reshape(x.shape)
        # dtype: the quotient in float32 (AIMET's precision) whichever the buffer's type
        np.divide(x, broadcast_params(block_scale, x.shape, axis), out=codes, dtype=np.float32)
        np.rint(codes, out=codes)
        _require_sign_kept(enc, x, codes, broadcast_params(block_offset, x.shape, axis), bits, block.start)
        np.subtract(codes, broadcast_params(block_offset, x.shape, axis).astype(work_dtype), out=codes)
        np.clip(codes, 0, 2**bits - 1, out=codes)
        q[block] = codes
    return q.reshape(w.shape), scale, (-offset).astype(dtype)


def _require_sign_kept(enc: TensorEncoding, x: np.ndarray, levels: np.ndarray, offset: np.ndarray, bits: int,
                       first_row: int) -> None:
    """Refuse a grid that clips the weight's sign: where the offset is 0 the grid holds no negative value, where it
    is ``-(2**bits - 1)`` no positive one, so a weight rounding to a level of the other sign (``levels``, the
    rounded ``x / scale``) would be stored as 0 -- an ``is_sym`` encoding with offset 0 turns every negative weight
    into 0 this way, and the build would pass.

    Raises:
        GenieBuildError: (``where`` = the tensor) the first such value, its index and the offset.
    """
    top = -(2**bits - 1)
    if not (np.any(offset == 0) or np.any(offset == top)):
        return
    clipped = ((levels < 0) & (offset == 0)) | ((levels > 0) & (offset == top))
    if not clipped.any():
        return
    index = np.unravel_index(int(np.flatnonzero(clipped)[0]), x.shape)
    value, zero_at = x[index], int(offset[index])   # value: a float32 scalar, shown as float32 prints it
    sign, kept = ("negative", "no negative value") if value < 0 else ("positive", "no positive value")
    position = [first_row + int(index[0]), *map(int, index[1:])] if index else []
    fix = (f"a symmetric encoding needs offset {-(2 ** (enc.bitwidth - 1))}" if enc.is_symmetric
           else "the offset must leave room for both signs")
    raise GenieBuildError(enc.name, f"the weight's value {str(value)} at index {position} is {sign}, but the "
                                    f"encoding's grid (offset {zero_at}) holds {kept}: it would be stored as 0, "
                                    f"a grid that clips the weight's sign ({fix})")


def dequantize(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, axis: int | None) -> np.ndarray:
    """``(q - zero_point) * scale`` in float32, parameters in any layout :func:`broadcast_params` accepts."""
    centered = q.astype(np.int64) - broadcast_params(zero_point, q.shape, axis).astype(np.int64)
    return centered.astype(np.float32) * broadcast_params(scale, q.shape, axis).astype(np.float32)


def broadcast_params(params: np.ndarray, shape: tuple[int, ...], axis: int | None) -> np.ndarray:
    """Expand a scale or zero point to ``shape``.

    Accepts a single value (per tensor), a 1-D array along ``axis`` (per channel), or an array of the same rank
    as ``shape`` whose every dimension is 1 or divides the tensor's (broadcast and blocked layouts; a
    dimension of ``n // k`` entries repeats each entry ``k`` times).

    Raises:
        ValueError: the parameters fit none of these layouts.
    """
    params = same_rank_params(params, shape, axis)
    for dim, (size, count) in enumerate(zip(shape, params.shape)):
        if count not in (1, size):
            params = np.repeat(params, size // count, axis=dim)
    return np.broadcast_to(params, shape)


def same_rank_params(params: np.ndarray, shape: tuple[int, ...], axis: int | None) -> np.ndarray:
    """A scale or zero point in any layout :func:`broadcast_params` accepts, reshaped (not expanded) to the
    rank of ``shape``: dimension ``d`` holds ``k`` entries, each covering ``shape[d] // k`` indices.

    Raises:
        ValueError: the parameters fit no accepted layout.
    """
    params = np.asarray(params)
    if params.size == 1:
        return params.reshape((1,) * len(shape))
    if params.ndim == 1 and len(shape) > 1:
        if axis is None:
            raise ValueError(f"1-D parameters of shape {params.shape} need an axis of shape {shape}")
        params = params.reshape([-1 if dim == axis % len(shape) else 1 for dim in range(len(shape))])
    if params.ndim != len(shape) or any(count not in (1, size) and (count == 0 or size % count)
                                        for size, count in zip(shape, params.shape)):
        raise ValueError(f"parameters of shape {params.shape} do not fit a tensor of shape {shape}")
    return params


def row_blocks(shape: tuple[int, ...], params: np.ndarray, axis: int | None, block_values: int) -> list[slice]:
    """Blocks of rows (axis 0) of a tensor of ``shape`` (at least 1-D), of about ``block_values`` values each,
    cut where the parameters' entries along axis 0 change, so :func:`params_of_rows` can give each block's.

    Raises:
        ValueError: the parameters fit no layout :func:`broadcast_params` accepts.
    """
    rows_per_entry = _rows_per_entry(same_rank_params(params, shape, axis), shape)
    values_per_row = max(1, math.prod(shape[1:]))
    rows = max(1, block_values // values_per_row // rows_per_entry) * rows_per_entry
    return [slice(start, min(start + rows, shape[0])) for start in range(0, shape[0], rows)]


def params_of_rows(params: np.ndarray, shape: tuple[int, ...], axis: int | None, rows: slice) -> np.ndarray:
    """The parameters of rows ``rows`` (a block of :func:`row_blocks`) of a tensor of ``shape``, in the
    same-rank layout of :func:`same_rank_params`."""
    params = same_rank_params(params, shape, axis)
    if params.shape[0] == 1:
        return params
    rows_per_entry = _rows_per_entry(params, shape)
    return params[rows.start // rows_per_entry:-(-rows.stop // rows_per_entry)]


def _rows_per_entry(same_rank: np.ndarray, shape: tuple[int, ...]) -> int:
    """Rows of the tensor that one entry along axis 0 of same-rank parameters covers (1 when they broadcast)."""
    count = same_rank.shape[0]
    return shape[0] // count if count > 1 else 1


def _scale_and_offset(enc: TensorEncoding, shape: tuple[int, ...], layout: WeightLayout | None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """The encoding's scale (float32) and offset (int64) in the parameter layout."""
    scale = np.asarray(enc.scale, dtype=np.float32)
    offset = np.asarray(enc.offset, dtype=np.int64)
    if enc.kind == "per_tensor":
        _require_count(enc, "scale", scale.size, 1, shape)
        return scale.reshape(()), offset.reshape(())
    if layout is None or not 0 <= layout.channel_axis < len(shape):
        raise GenieBuildError(enc.name, f"channel axis {layout and layout.channel_axis} is outside shape "
                                        f"{list(shape)}")
    if enc.kind == "per_channel":
        _require_count(enc, "scale", scale.size, shape[layout.channel_axis], shape)
        return scale, offset
    grid = blocked_shape(enc.name, shape, enc.block_size, layout)
    channels, blocks = grid[layout.channel_axis], grid[layout.block_axis]
    if enc.kind == "per_block":
        _require_count(enc, "scale", scale.size, blocks * channels, shape)
        return blocked_params(scale, grid, layout), blocked_params(offset, grid, layout)
    if not enc.is_symmetric:
        raise GenieBuildError(enc.name, "LPBQ encodings must be symmetric (is_sym true)")
    _require_count(enc, "scale", scale.size, channels, shape)
    _require_count(enc, "per_block_int_scale", len(enc.per_block_int_scale), blocks * channels, shape)
    block_scale = _lpbq_block_scale(enc, grid, layout)
    return block_scale, np.full(grid, -(2 ** (enc.compressed_bitwidth - 1)), dtype=np.int64)


def blocked_params(values: np.ndarray, grid: tuple[int, ...], layout: WeightLayout) -> np.ndarray:
    """Channel-major ``[channels, blocks]`` values (the in-memory order) laid out as ``grid``
    (:func:`genie_build.encodings.blocked_shape`)."""
    channels, blocks = grid[layout.channel_axis], grid[layout.block_axis]
    matrix = np.asarray(values).reshape(channels, blocks)
    if layout.channel_axis > layout.block_axis:
        matrix = matrix.T
    return matrix.reshape(grid)


def lpbq_channel_scale(enc: TensorEncoding, grid: tuple[int, ...], layout: WeightLayout) -> np.ndarray:
    """LPBQ's per-channel float scale, float64 as the file gives it, shaped like ``grid`` with the block
    axis 1."""
    shape = tuple(1 if axis == layout.block_axis else size for axis, size in enumerate(grid))
    return np.asarray(enc.scale, dtype=np.float64).reshape(shape)


def _lpbq_block_scale(enc: TensorEncoding, grid: tuple[int, ...], layout: WeightLayout) -> np.ndarray:
    """LPBQ's per-block scale ``per_block_int_scale * scale[channel]``, laid out as ``grid``: multiplied in
    float64 and rounded to float32, as aimet-onnx's ``LPBQEncoding.scale`` and its quantizer do (a float32
    product differs from it in the last bit for some blocks) and as the converted graph computes it
    from the stored integer and channel scales."""
    int_scale = blocked_params(np.asarray(enc.per_block_int_scale, dtype=np.float64), grid, layout)
    return (int_scale * lpbq_channel_scale(enc, grid, layout)).astype(np.float32)


def _require_count(enc: TensorEncoding, what: str, found: int, expected: int, shape: tuple[int, ...]) -> None:
    if found != expected:
        block = f" with block_size {enc.block_size}" if enc.block_size else ""
        raise GenieBuildError(enc.name, f"{found} {what} values for a {enc.kind} encoding, expected {expected} "
                                        f"for shape {list(shape)}{block}")
