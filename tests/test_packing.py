"""4-bit packing: two values per byte, low nibble first, bit-exact round trip."""

from __future__ import annotations

import numpy as np
import pytest

from genie_build.toolchains.reference.packing import pack_int4, packed_nbytes, unpack_int4


@pytest.mark.parametrize("count", [0, 1, 2, 3, 16, 999, 1000])
def test_round_trip_is_bit_exact_including_0_15_and_odd_counts(count):
    values = np.random.default_rng(count).integers(0, 16, count).astype(np.uint8)
    values[: min(count, 2)] = [0, 15][: min(count, 2)]
    packed = pack_int4(values)
    assert len(packed) == packed_nbytes(count) == (count + 1) // 2
    np.testing.assert_array_equal(unpack_int4(packed, count), values)


def test_low_nibble_first_and_odd_count_padded_with_zero():
    assert pack_int4(np.array([1, 2, 3], np.uint8)) == bytes([0x21, 0x03])
    assert pack_int4(np.array([[15, 0], [0, 15]], np.uint8)) == bytes([0x0F, 0xF0])


def test_any_integer_dtype_in_range_packs():
    assert pack_int4(np.array([7, 8], np.int64)) == pack_int4(np.array([7, 8], np.uint8))


@pytest.mark.parametrize("values", [np.array([16]), np.array([-1]), np.array([0.5])])
def test_values_outside_4_bits_are_refused(values):
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        pack_int4(values)


def test_unpack_refuses_a_wrong_length():
    with pytest.raises(ValueError, match="take 2 bytes"):
        unpack_int4(b"\x00", 3)
