"""The reference toolchain's quantizer (genie_build.toolchains.reference.quantize): AIMET quantization in numpy
against a scalar, one-element-at-a-time reading of the AIMET formula."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from genie_build.encodings import TensorEncoding
from genie_build.onnx_graph import WeightLayout
from genie_build.errors import GenieBuildError
from genie_build.toolchains.reference.quantize import (broadcast_params, dequantize, params_of_rows, quantize,
                                                       row_blocks)

BITWIDTHS = (4, 8, 16)
IN, OUT, BLOCK = 8, 6, 4


def _quantize(w: np.ndarray, enc: TensorEncoding, axis: int | None, **kwargs: int):
    """quantize with the layout of an ``[in, out]`` MatMul weight: blocks along axis 0, channels along the
    last axis, or along ``axis`` for a per-channel encoding."""
    w = np.asarray(w)
    layout = None
    if enc.kind == "per_channel":
        layout = WeightLayout(axis % w.ndim, None if w.ndim < 2 else (axis + 1) % 2)
    elif enc.kind in ("per_block", "lpbq"):
        layout = WeightLayout(1, 0)
    return quantize(w, enc, layout, **kwargs)


def scalar_quantize(x: float, scale: np.float32, offset: int, bitwidth: int) -> int:
    """AIMET: q = clamp(round(x / scale) - offset, 0, 2**bw - 1), float32 division, half to even."""
    return min(max(round(np.float32(x) / scale) - offset, 0), 2**bitwidth - 1)


def scalar_dequantize(q: int, scale: np.float32, offset: int) -> np.float32:
    """AIMET: x_hat = (q + offset) * scale."""
    return np.float32(q + offset) * scale


def element_params(enc: TensorEncoding, index: tuple[int, int], axis: int | None) -> tuple[np.float32, int, int]:
    """(scale, offset, stored bitwidth) of one element, read straight from the encoding's lists."""
    row, column = index
    if enc.kind == "per_tensor":
        return np.float32(enc.scale[0]), enc.offset[0], enc.bitwidth
    if enc.kind == "per_channel":
        channel = index[axis]
        return np.float32(enc.scale[channel]), enc.offset[channel], enc.bitwidth
    block = column * (IN // enc.block_size) + row // enc.block_size  # channel-major: [out, in // block_size]
    if enc.kind == "per_block":
        return np.float32(enc.scale[block]), enc.offset[block], enc.bitwidth
    scale = np.float32(enc.per_block_int_scale[block] * enc.scale[column])  # float64 product, as aimet-onnx
    return scale, -(2 ** (enc.compressed_bitwidth - 1)), enc.compressed_bitwidth


def weight_with_extremes(rng: np.random.Generator, shape: tuple[int, int], reach: float) -> np.ndarray:
    """Random values well past the representable range (so clamping happens) plus exact zeros."""
    w = rng.uniform(-reach, reach, shape).astype(np.float32)
    w.flat[::5] = 0.0
    w.flat[1] = np.float32(reach * 4)
    w.flat[2] = np.float32(-reach * 4)
    return w


def encodings(rng: np.random.Generator, bitwidth: int) -> list[tuple[TensorEncoding, int | None]]:
    """One encoding of every kind (symmetric and asymmetric where AIMET has both) with its channel axis."""
    def scales(count: int) -> tuple[float, ...]:
        return tuple(float(s) for s in rng.uniform(0.01, 0.05, count))

    def offsets(count: int, symmetric: bool) -> tuple[int, ...]:
        if symmetric:
            return (-(2 ** (bitwidth - 1)),) * count
        # strictly inside: a grid ending at 0 clips the sign of the random weights, which quantize refuses
        return tuple(int(o) for o in rng.integers(-(2**bitwidth - 1) + 1, 0, count))

    cases = []
    for symmetric in (True, False):
        cases.append((TensorEncoding("w", "int", bitwidth, "per_tensor", symmetric, scales(1),
                                     offsets(1, symmetric)), None))
        for axis in (0, 1):
            count = (IN, OUT)[axis]
            cases.append((TensorEncoding("w", "int", bitwidth, "per_channel", symmetric, scales(count),
                                         offsets(count, symmetric)), axis))
        blocks = IN // BLOCK * OUT
        cases.append((TensorEncoding("w", "int", bitwidth, "per_block", symmetric, scales(blocks),
                                     offsets(blocks, symmetric), block_size=BLOCK), None))
    cases.append((TensorEncoding("w", "int", bitwidth, "lpbq", True, scales(OUT),
                                 (-(2 ** (bitwidth - 1)),) * OUT, block_size=BLOCK, compressed_bitwidth=4,
                                 per_block_int_scale=tuple(int(v) for v in rng.integers(1, 17, IN // BLOCK * OUT))),
                  None))
    return cases


@pytest.mark.parametrize("bitwidth", BITWIDTHS)
def test_quantize_and_dequantize_match_the_scalar_formula_for_every_kind(bitwidth):
    rng = np.random.default_rng(bitwidth)
    for enc, axis in encodings(rng, bitwidth):
        largest_scale = max(enc.scale) * max(enc.per_block_int_scale or (1,))
        w = weight_with_extremes(rng, (IN, OUT), reach=largest_scale * 2**bitwidth)
        q, scale, zero_point = _quantize(w, enc, axis)
        x_hat = dequantize(q, scale, zero_point, axis)
        for index in itertools.product(range(IN), range(OUT)):
            element_scale, offset, stored_bits = element_params(enc, index, axis)
            expected = scalar_quantize(w[index], element_scale, offset, stored_bits)
            assert q[index] == expected, (enc.kind, enc.is_symmetric, axis, index)
            assert x_hat[index] == scalar_dequantize(expected, element_scale, offset), (enc.kind, index)
        stored_bits = element_params(enc, (0, 0), axis)[2]
        assert q.min() == 0 and q.max() == 2**stored_bits - 1, f"{enc.kind}: the extremes must clamp"


@pytest.mark.parametrize("bitwidth, dtype", [(4, np.uint8), (8, np.uint8), (16, np.uint16)])
def test_values_are_unsigned_and_parameters_have_the_documented_layout(bitwidth, dtype):
    rng = np.random.default_rng(0)
    for enc, axis in encodings(rng, bitwidth):
        q, scale, zero_point = _quantize(np.zeros((IN, OUT), np.float32), enc, axis)
        expected_shape = {"per_tensor": (), "per_channel": ((IN, OUT)[axis or 0],),
                          "per_block": (IN // BLOCK, OUT), "lpbq": (IN // BLOCK, OUT)}[enc.kind]
        assert scale.shape == zero_point.shape == expected_shape
        assert scale.dtype == np.float32
        assert q.dtype == zero_point.dtype == (np.uint8 if enc.kind == "lpbq" else dtype)
        if enc.kind != "lpbq":  # blocked offsets are listed channel-major: [out, in // block_size]
            listed = zero_point.T if enc.kind == "per_block" else zero_point
            np.testing.assert_array_equal(listed.ravel(), -np.asarray(enc.offset))


def test_rounding_is_half_to_even():
    enc = TensorEncoding("w", "int", 8, "per_tensor", True, (1.0,), (-128,))
    q, _, _ = _quantize(np.array([0.5, 1.5, 2.5, -0.5, -1.5]), enc, None)
    assert (q.astype(int) - 128).tolist() == [0, 2, 2, 0, -2]


def test_symmetric_4bit_uses_the_signed_range():
    enc = TensorEncoding("w", "int", 4, "per_tensor", True, (0.1,), (-8,))
    q, _, zero_point = _quantize(np.array([-10.0, -0.8, 0.0, 0.7, 10.0]), enc, None)
    assert (q.astype(int) - int(zero_point)).tolist() == [-8, -8, 0, 7, 7]


def test_32_bit_values_fit_uint32():
    enc = TensorEncoding("b", "int", 32, "per_tensor", True, (1e-6,), (-(2**31),))
    q, _, zero_point = _quantize(np.array([-1.0, 0.0, 1.0, 1e9]), enc, None)
    assert q.dtype == np.uint32 and int(zero_point) == 2**31
    assert (q.astype(np.int64) - 2**31).tolist() == [-1_000_000, 0, 1_000_000, 2**31 - 1]


@pytest.mark.parametrize("enc, axis, problem", [
    (TensorEncoding("w", "int", 4, "per_channel", True, (0.1,) * 5, (-8,) * 5), 1, "5 scale values"),
    (TensorEncoding("w", "int", 4, "per_tensor", True, (0.1, 0.2), (-8, -8)), None, "2 scale values"),
    (TensorEncoding("w", "int", 4, "per_block", True, (0.1,) * 3, (-8,) * 3, block_size=BLOCK), None,
     "3 scale values"),
    (TensorEncoding("w", "int", 4, "per_block", True, (0.1,) * OUT, (-8,) * OUT, block_size=3), None,
     "whole number of blocks"),
    (TensorEncoding("w", "int", 8, "lpbq", False, (0.1,) * OUT, (-128,) * OUT, block_size=BLOCK,
                    compressed_bitwidth=4, per_block_int_scale=(1,) * 12), None, "symmetric"),
    (TensorEncoding("w", "float", 16), None, "no integer quantization"),
])
def test_encodings_that_do_not_fit_raise_naming_the_tensor(enc, axis, problem):
    with pytest.raises(GenieBuildError, match=problem) as caught:
        _quantize(np.zeros((IN, OUT), np.float32), enc, axis)
    assert caught.value.where == "w"


def test_non_finite_weights_raise():
    enc = TensorEncoding("w", "int", 8, "per_tensor", True, (0.1,), (-128,))
    with pytest.raises(GenieBuildError, match="NaN or infinite"):
        _quantize(np.array([1.0, np.nan]), enc, None)


def test_broadcast_params_accepts_every_stored_layout():
    shape = (4, 6)
    per_channel = np.arange(6)
    np.testing.assert_array_equal(broadcast_params(per_channel, shape, 1), np.tile(per_channel, (4, 1)))
    np.testing.assert_array_equal(broadcast_params(np.arange(4), shape, 0), np.repeat(np.arange(4)[:, None], 6, 1))
    blocked = np.arange(12).reshape(2, 6)
    np.testing.assert_array_equal(broadcast_params(blocked, shape, None), np.repeat(blocked, 2, axis=0))
    np.testing.assert_array_equal(broadcast_params(np.array(3), shape, None), np.full(shape, 3))
    np.testing.assert_array_equal(broadcast_params(per_channel.reshape(1, 6), shape, None),
                                  np.tile(per_channel, (4, 1)))
    with pytest.raises(ValueError):
        broadcast_params(np.arange(5), shape, 1)


def whole_tensor_quantize(w: np.ndarray, enc: TensorEncoding, axis: int | None) -> np.ndarray:
    """The codes as quantize computed them before it worked in row blocks: the whole tensor at once."""
    x = np.asarray(w, dtype=np.float32)
    _, scale, zero_point = _quantize(np.zeros_like(x), enc, axis)
    offset = -zero_point.astype(np.int64)
    bits = 4 if enc.kind == "lpbq" else enc.bitwidth
    codes = np.rint(x / broadcast_params(scale, x.shape, axis)) - broadcast_params(offset, x.shape, axis)
    return np.clip(codes, 0, 2**bits - 1).astype(zero_point.dtype)


@pytest.mark.parametrize("block_values", [1, OUT, OUT + 1, 3 * OUT, BLOCK * OUT, IN * OUT, 10**6])
def test_quantizing_in_row_blocks_gives_the_whole_tensor_codes(block_values):
    """Blocks smaller than a row, than a block of a blocked encoding, uneven and whole: same codes."""
    rng = np.random.default_rng(block_values)
    for bitwidth in BITWIDTHS:
        for enc, axis in encodings(rng, bitwidth):
            largest_scale = max(enc.scale) * max(enc.per_block_int_scale or (1,))
            w = weight_with_extremes(rng, (IN, OUT), reach=largest_scale * 2**bitwidth)
            w = w.astype(np.float16) if bitwidth <= 8 else w  # float16 as the large models hold it, where it fits
            q, _, _ = _quantize(w, enc, axis, block_values=block_values)
            assert q.dtype == whole_tensor_quantize(w, enc, axis).dtype
            np.testing.assert_array_equal(q, whole_tensor_quantize(w, enc, axis), err_msg=f"{enc.kind} {axis}")


@pytest.mark.parametrize("shape, axis", [((), None), ((7,), 0), ((5, 3, 4), 1), ((0, 4), None)])
def test_quantizing_in_row_blocks_handles_any_rank(shape, axis):
    rng = np.random.default_rng(1)
    count = 1 if axis is None else shape[axis]
    enc = TensorEncoding("w", "int", 8, "per_tensor" if axis is None else "per_channel", False,
                         tuple(float(s) for s in rng.uniform(0.01, 0.05, count)),
                         tuple(int(o) for o in rng.integers(-255, 1, count)))
    w = rng.uniform(-3, 3, shape).astype(np.float32)
    q, _, _ = _quantize(w, enc, axis, block_values=2)
    assert q.shape == w.shape
    np.testing.assert_array_equal(q, whole_tensor_quantize(w, enc, axis))


def test_non_finite_weights_raise_from_any_row_block():
    enc = TensorEncoding("w", "int", 8, "per_tensor", True, (0.1,), (-128,))
    w = np.zeros((IN, OUT), np.float32)
    w[-1, -1] = np.inf
    with pytest.raises(GenieBuildError, match="NaN or infinite"):
        _quantize(w, enc, None, block_values=OUT)


@pytest.mark.parametrize("params, axis", [(np.arange(8), 0), (np.arange(6), 1), (np.arange(12).reshape(4, 3), None),
                                          (np.array(3), None), (np.arange(8).reshape(8, 1), None)])
def test_row_blocks_cover_the_rows_and_carry_their_parameters(params, axis):
    """Per channel on either axis, blocked (2 rows x 2 columns per entry), per tensor, broadcast."""
    shape = (8, 6)
    whole = broadcast_params(params, shape, axis)
    for block_values in (1, 7, 12, 30, 48, 1000):
        blocks = row_blocks(shape, params, axis, block_values)
        assert [index for block in blocks for index in range(block.start, block.stop)] == list(range(shape[0]))
        for block in blocks:
            rows = (block.stop - block.start, *shape[1:])
            np.testing.assert_array_equal(
                broadcast_params(params_of_rows(params, shape, axis, block), rows, axis), whole[block])


@pytest.mark.parametrize(("offset", "weight", "problem"), [
    (0, [[0.3, -0.2]], "the weight's value -0.2 at index [0, 1] is negative, but the encoding's grid (offset 0) holds "
                       "no negative value: it would be stored as 0, a grid that clips the weight's sign (a symmetric "
                       "encoding needs offset -128)"),
    (-255, [[-0.3], [0.25]], "the weight's value 0.25 at index [1, 0] is positive, but the encoding's grid (offset "
                             "-255) holds no positive value"),
])
def test_a_grid_that_clips_the_weights_sign_is_refused(offset: int, weight: list, problem: str) -> None:
    """is_sym with offset 0 would turn every negative weight into 0 and the build would pass (its host run compares
    the bundle with an unsplit model quantized the same wrong way)."""
    enc = TensorEncoding("w", "int", 8, "per_tensor", offset == 0, (0.01,), (offset,))
    with pytest.raises(GenieBuildError) as caught:
        quantize(np.array(weight, dtype=np.float32), enc, None)
    assert caught.value.where == "w" and caught.value.problem.startswith(problem), caught.value.problem


def test_an_unsigned_grid_takes_a_weight_with_no_negative_value_and_values_that_round_to_zero() -> None:
    """Offset 0 (AIMET's unsigned symmetric) is right for a tensor with no negative value; a tiny negative value
    that rounds to 0 loses nothing."""
    enc = TensorEncoding("w", "int", 8, "per_tensor", True, (0.01,), (0,))
    q, _, zero_point = quantize(np.array([0.0, 0.5, 1.2, -0.004], dtype=np.float32), enc, None)
    assert q.tolist() == [0, 50, 120, 0] and int(zero_point) == 0
