"""4-bit values packed two per byte: the first value in the low nibble, the second in the high nibble.
An odd count leaves the last byte's high nibble zero."""

from __future__ import annotations

import numpy as np

__all__ = ["pack_int4", "packed_nbytes", "unpack_int4"]


def packed_nbytes(count: int) -> int:
    """Bytes that ``count`` packed 4-bit values take."""
    return (count + 1) // 2


def pack_int4(values: np.ndarray) -> bytes:
    """Pack integers in ``[0, 15]`` (any shape, read in C order) two per byte, low nibble first.

    Raises:
        ValueError: ``values`` are not integers or lie outside ``[0, 15]``.
    """
    flat = np.asarray(values).ravel()
    if flat.size and (not np.issubdtype(flat.dtype, np.integer) or flat.min() < 0 or flat.max() > 15):
        raise ValueError(f"pack_int4 needs integers in [0, 15], got {flat.dtype} in "
                         f"[{flat.min()}, {flat.max()}]")
    nibbles = np.zeros(2 * packed_nbytes(flat.size), dtype=np.uint8)
    nibbles[:flat.size] = flat
    return (nibbles[0::2] | (nibbles[1::2] << 4)).tobytes()


def unpack_int4(data: bytes, count: int) -> np.ndarray:
    """Inverse of :func:`pack_int4`: ``count`` values (uint8 in ``[0, 15]``) from ``data``.

    Raises:
        ValueError: ``data`` is not exactly ``packed_nbytes(count)`` long.
    """
    if len(data) != packed_nbytes(count):
        raise ValueError(f"{count} packed 4-bit values take {packed_nbytes(count)} bytes, got {len(data)}")
    packed = np.frombuffer(data, dtype=np.uint8)
    nibbles = np.empty(2 * packed.size, dtype=np.uint8)
    nibbles[0::2] = packed & 0x0F
    nibbles[1::2] = packed >> 4
    return nibbles[:count]
