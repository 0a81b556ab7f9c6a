"""Readers of AIMET encodings files, versions 0.6.1 (dicts keyed by name), 1.0.0 (lists with ``name``) and 2.0.0
(one list of ONNX-style entries), into the one in-memory model (:mod:`genie_build.encodings.model`). Every entry
is kept as read too, so that a slice is written in the version it came in (:mod:`genie_build.encodings.writer`)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from genie_build.encodings.model import (ENC_TYPE_TO_KIND, KIND_TO_ENC_TYPE, SUPPORTED_FLOAT_BITWIDTHS,
                                         SUPPORTED_INT_BITWIDTHS, SUPPORTED_VERSIONS, V1_SECTIONS, V2_SECTION,
                                         Encodings, TensorEncoding, short_repr)
from genie_build.encodings.values import Where, checked
from genie_build.errors import GenieBuildError
from genie_build.fileio import read_json

__all__ = ["parse_encodings", "read_encodings"]

_V2_INT_DTYPE = re.compile(r"^(u?)int(\d+)$")
_V2_FLOAT_DTYPES = {"float16": 16, "float32": 32}


def read_encodings(path: str | os.PathLike[str]) -> Encodings:
    """Read an AIMET encodings file, version 0.6.1 (dicts keyed by name), 1.0.0 (lists with ``name``) or 2.0.0.

    Returns:
        The encodings; ``version`` records the version the file was written in.

    Raises:
        GenieBuildError: the file is missing, not JSON, of another version, or an entry is malformed
            (the message names the tensor).
    """
    return parse_encodings(read_json(path), path)


def parse_encodings(data: Any, path: str | os.PathLike[str]) -> Encodings:
    """Interpret the parsed JSON of an encodings file; ``path`` is only for messages.

    Raises:
        GenieBuildError: as :func:`read_encodings`.
    """
    where = os.fspath(path)
    if not isinstance(data, dict):
        raise GenieBuildError(where, f"top level is {_json_kind(data)}, expected an object with 'version', "
                                     "'activation_encodings' and 'param_encodings'")
    if "version" not in data:
        raise GenieBuildError(where, f"missing 'version' (supported: {', '.join(SUPPORTED_VERSIONS)})")
    version = data["version"]
    if version not in SUPPORTED_VERSIONS:
        raise GenieBuildError(where, f"encodings version {short_repr(version)} is not supported "
                                     f"(supported: {', '.join(SUPPORTED_VERSIONS)})")
    quantizer_args = data.get("quantizer_args", {})
    if not isinstance(quantizer_args, dict):
        raise GenieBuildError(where, f"'quantizer_args' is {_json_kind(quantizer_args)}, expected an object")
    entries: dict[tuple[str, str], Any] = {}
    if version == "2.0.0":
        activations, params = _parse_section_v200(where, data, entries)
    else:
        parse_section = _parse_section_v061 if version == "0.6.1" else _parse_section_v100
        activations, params = (parse_section(where, data, key, label, entries) for key, label in V1_SECTIONS)
    sections = {key for key, _ in V1_SECTIONS} | {V2_SECTION}
    header = {key: value for key, value in data.items() if key not in sections}
    return Encodings(activations=activations, params=params, quantizer_args=quantizer_args, version=version,
                     header=header, entries=entries)


def _section(path: str, data: dict, key: str, container: type) -> Any:
    if key not in data:
        raise GenieBuildError(path, f"missing '{key}'")
    section = data[key]
    if not isinstance(section, container):
        expected = "an object keyed by tensor name" if container is dict else "a list of objects with 'name'"
        raise GenieBuildError(path, f"'{key}' is {_json_kind(section)}, expected {expected} "
                                    f"in version {data['version']}")
    return section


def _parse_section_v061(path: str, data: dict, key: str, label: str, entries: dict) -> dict[str, TensorEncoding]:
    section = _section(path, data, key, dict)
    encodings = {name: _parse_entries_v061(Where(path, f"{label} encoding {name!r}"), name, value)
                 for name, value in section.items()}
    entries.update(((key, name), (section[name], encoding)) for name, encoding in encodings.items())
    return encodings


def _parse_entries_v061(where: Where, name: str, entries: Any) -> TensorEncoding:
    """0.6.1 gives a list per tensor: one entry per tensor, or one per channel. ``min``/``max`` are not
    kept: they follow from scale and offset."""
    if not name:
        raise where.error("empty tensor name")
    if not isinstance(entries, list) or not entries:
        raise where.error(f"expected a non-empty list of encodings, got {short_repr(entries)}")
    channels = [_parse_channel_v061(Where(where.path, f"{where.entry}[{index}]"), entry)
                for index, entry in enumerate(entries)]
    headers = {channel[:3] for channel in channels}
    if len(headers) > 1:
        raise where.error(f"entries disagree on (dtype, bitwidth, is_symmetric): {sorted(map(repr, headers))}")
    dtype, bitwidth, is_symmetric = channels[0][:3]
    if dtype == "float":
        if len(channels) > 1:
            raise where.error(f"float encoding has {len(channels)} entries, expected 1")
        return TensorEncoding(name=name, dtype="float", bitwidth=bitwidth)
    return checked(where, TensorEncoding(name=name, dtype="int", bitwidth=bitwidth,
                                          kind="per_channel" if len(channels) > 1 else "per_tensor",
                                          is_symmetric=is_symmetric, scale=tuple(channel[3] for channel in channels),
                                          offset=tuple(channel[4] for channel in channels)))


def _parse_channel_v061(where: Where, entry: Any) -> tuple[str, int, bool, float | None, int | None]:
    """One 0.6.1 entry as (dtype, bitwidth, is_symmetric, scale, offset); float entries have no scale."""
    if not isinstance(entry, dict):
        raise where.error(f"expected an object, got {short_repr(entry)}")
    dtype = _choice(where, entry, "dtype", ("int", "float"))
    bitwidth = _bitwidth(where, entry, "bitwidth", dtype)
    if dtype == "float":
        return dtype, bitwidth, False, None, None
    is_symmetric = _field(where, entry, "is_symmetric")
    # AIMET writes the strings "True"/"False"; other writers use JSON booleans.
    if not (isinstance(is_symmetric, bool) or is_symmetric in ("True", "False")):
        raise where.error(f"is_symmetric {short_repr(is_symmetric)} is not \"True\" or \"False\"")
    if "scale" not in entry and "offset" not in entry and "min" in entry and "max" in entry:
        return (dtype, bitwidth, is_symmetric in ("True", True), *_scale_offset_from_range(where, entry, bitwidth))
    return (dtype, bitwidth, is_symmetric in ("True", True),
            _scale_value(where, "scale", _field(where, entry, "scale")),
            _offset_value(where, "offset", _field(where, entry, "offset"), bitwidth))


def _scale_offset_from_range(where: Where, entry: dict, bitwidth: int) -> tuple[float, int]:
    """A 0.6.1 entry with only ``min``/``max`` (which the SDK converter accepts): AIMET's grid over them,
    ``scale = (max - min) / (2**bw - 1)``, ``offset = round(min / scale)`` -- the inverse of how AIMET writes
    ``min = offset * scale`` and ``max = min + scale * (2**bw - 1)``."""
    low, high = (_as_float(entry[key]) for key in ("min", "max"))
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high) and low <= 0 <= high < math.inf
                                           and low < high):
        raise where.error(f"min {short_repr(entry['min'])} and max {short_repr(entry['max'])} do not give a range "
                          "holding 0 (and no 'scale'/'offset')")
    scale = (high - low) / (2**bitwidth - 1)
    return scale, _offset_value(where, "offset", round(low / scale), bitwidth)


def _named_entries(path: str, data: dict, key: str, label: str, entries: dict) -> Iterator[tuple[Where, str, dict]]:
    """The entries of a list section (1.0.0, 2.0.0), each with its name; the caller records them.

    Raises:
        GenieBuildError: an entry that is not an object, has no name, or repeats a name.
    """
    for index, entry in enumerate(_section(path, data, key, list)):
        where = Where(path, f"{key}[{index}]")
        if not isinstance(entry, dict):
            raise where.error(f"expected an object, got {short_repr(entry)}")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise where.error(f"missing or empty 'name' (got {short_repr(name)})")
        where = Where(path, f"{label} {name!r}")
        if (key, name) in entries:
            raise where.error(f"appears more than once in '{key}'")
        entries[key, name] = (entry, None)
        yield where, name, entry


def _parse_section_v100(path: str, data: dict, key: str, label: str, entries: dict) -> dict[str, TensorEncoding]:
    encodings = {}
    for where, name, entry in _named_entries(path, data, key, f"{label} encoding", entries):
        encodings[name] = _parse_entry_v100(where, name, entry)
        entries[key, name] = (entry, encodings[name])
    return encodings


def _parse_entry_v100(where: Where, name: str, entry: dict) -> TensorEncoding:
    dtype = _choice(where, entry, "dtype", ("INT", "FLOAT")).lower()
    bitwidth = _bitwidth(where, entry, "bw", dtype)
    kind = ENC_TYPE_TO_KIND[_choice(where, entry, "enc_type", tuple(ENC_TYPE_TO_KIND))]
    if dtype == "float":
        if kind != "per_tensor":
            raise where.error(f"a FLOAT encoding must be PER_TENSOR, got {KIND_TO_ENC_TYPE[kind]}")
        return TensorEncoding(name=name, dtype="float", bitwidth=bitwidth)
    is_symmetric = _field(where, entry, "is_sym")
    if not isinstance(is_symmetric, bool):
        raise where.error(f"is_sym {short_repr(is_symmetric)} is not true or false")
    shift = entry.get("zero_point_shift", [0.0])
    if not isinstance(shift, list) or any(value != 0 for value in shift):
        raise where.error(f"zero_point_shift {short_repr(shift)} is not supported (only a zero shift)")
    scale = _scales(where, _nonempty_list(where, entry, "scale"))
    offset = _offsets(where, _nonempty_list(where, entry, "offset"), bitwidth)
    if len(scale) != len(offset):
        raise where.error(f"{len(scale)} scales but {len(offset)} offsets")
    if kind == "per_tensor" and len(scale) != 1:
        raise where.error(f"PER_TENSOR encoding has {len(scale)} scales, expected 1")
    block_size = compressed_bitwidth = per_block_int_scale = None
    if kind in ("per_block", "lpbq"):
        block_size = _positive_int(where, "block_size", _field(where, entry, "block_size"))
    if kind == "lpbq":
        compressed_bitwidth = _bitwidth(where, entry, "compressed_bw", "int")
        if compressed_bitwidth > bitwidth:
            raise where.error(f"compressed_bw {compressed_bitwidth} exceeds bw {bitwidth}")
        per_block_int_scale = _block_int_scales(where, _nonempty_list(where, entry, "per_block_int_scale"))
        if len(per_block_int_scale) % len(scale):
            raise where.error(f"{len(per_block_int_scale)} per_block_int_scale values are not a whole number of "
                              f"blocks for {len(scale)} channels")
    return checked(where, TensorEncoding(name=name, dtype="int", bitwidth=bitwidth, kind=kind,
                                          is_symmetric=is_symmetric, scale=scale, offset=offset, block_size=block_size,
                                          compressed_bitwidth=compressed_bitwidth,
                                          per_block_int_scale=per_block_int_scale))


def _parse_section_v200(path: str, data: dict, entries: dict) -> tuple[dict[str, TensorEncoding],
                                                                         dict[str, TensorEncoding]]:
    """2.0.0's one list, split as 1.0.0 would: an entry with an ``axis`` (per channel, per block, LPBQ)
    is a parameter's, the others (per tensor, float) activation encodings -- which still apply to an
    initializer they name (:meth:`Encodings.of_initializer`)."""
    activations: dict[str, TensorEncoding] = {}
    params: dict[str, TensorEncoding] = {}
    for where, name, entry in _named_entries(path, data, V2_SECTION, "encoding", entries):
        encoding = checked(where, _parse_entry_v200(where, name, entry))
        entries[V2_SECTION, name] = (entry, encoding)
        (params if encoding.kind != "per_tensor" else activations)[name] = encoding
    return activations, params


def _parse_entry_v200(where: Where, name: str, entry: dict) -> TensorEncoding:
    output_dtype = _field(where, entry, "output_dtype")
    if output_dtype in _V2_FLOAT_DTYPES:
        if "y_scale" in entry:
            raise where.error(f"a scaled {output_dtype} encoding is not supported")
        return TensorEncoding(name=name, dtype="float", bitwidth=_V2_FLOAT_DTYPES[output_dtype])
    match = _V2_INT_DTYPE.match(output_dtype) if isinstance(output_dtype, str) else None
    if match is None or int(match.group(2)) not in SUPPORTED_INT_BITWIDTHS:
        supported = ", ".join(f"{sign}int{bits}" for bits in SUPPORTED_INT_BITWIDTHS for sign in ("", "u"))
        raise where.error(f"output_dtype {short_repr(output_dtype)} is not supported (supported: {supported}, "
                          f"{', '.join(_V2_FLOAT_DTYPES)})")
    signed, bits = not match.group(1), int(match.group(2))
    if "per_block_int_scale" in entry:
        return _parse_lpbq_v200(where, name, entry, signed, bits)
    scale = _v2_array(where, entry, "y_scale", float)
    zero_point = (_v2_array(where, entry, "y_zero_point", int) if "y_zero_point" in entry
                  else np.zeros(scale.shape, dtype=np.int64))
    if zero_point.shape != scale.shape:
        raise where.error(f"y_zero_point of shape {list(zero_point.shape)} does not match y_scale of shape "
                          f"{list(scale.shape)}")
    offsets = -(zero_point + (2 ** (bits - 1) if signed else 0))
    is_symmetric = signed and not zero_point.any()
    common = {"name": name, "dtype": "int", "bitwidth": bits, "is_symmetric": is_symmetric}
    if "axis" not in entry:
        if scale.size != 1:
            raise where.error(f"{scale.size} y_scale values without an 'axis'")
        return TensorEncoding(**common, scale=_scales(where, scale.ravel().tolist()),
                              offset=_offsets(where, offsets.ravel().tolist(), bits))
    axis = _v2_axis(where, entry)
    if "block_size" not in entry:
        return TensorEncoding(**common, kind="per_channel", scale=_scales(where, scale.ravel().tolist()),
                              offset=_offsets(where, offsets.ravel().tolist(), bits), axis=axis)
    block_size = _positive_int(where, "block_size", entry["block_size"])
    channel_axis = _v2_channel_axis(where, scale, axis)
    return TensorEncoding(**common, kind="per_block", block_size=block_size, axis=channel_axis,
                          scale=_scales(where, _channel_major(scale, channel_axis, axis).tolist()),
                          offset=_offsets(where, _channel_major(offsets, channel_axis, axis).tolist(), bits))


def _parse_lpbq_v200(where: Where, name: str, entry: dict, signed: bool, bits: int) -> TensorEncoding:
    """A 2.0.0 LPBQ entry: ``axis`` is the block axis, both scale arrays have the weight's rank, and the
    decompressed width is twice the stored one (aimet-onnx refuses to write any other)."""
    if not signed:
        raise where.error("LPBQ encodings must be symmetric (a signed output_dtype)")
    block_axis = _v2_axis(where, entry)
    block_size = _positive_int(where, "block_size", _field(where, entry, "block_size"))
    int_scale = _v2_array(where, entry, "per_block_int_scale", int)
    float_scale = _v2_array(where, entry, "per_channel_float_scale", float)
    channel_axis = _v2_channel_axis(where, int_scale, block_axis)
    channels = int_scale.shape[channel_axis]
    if float_scale.size != channels:
        raise where.error(f"{float_scale.size} per_channel_float_scale values for {channels} channels")
    decompressed = 2 * bits
    return TensorEncoding(name=name, dtype="int", bitwidth=decompressed, kind="lpbq", is_symmetric=True,
                          scale=_scales(where, float_scale.ravel().tolist()),
                          offset=(-(2 ** (decompressed - 1)),) * channels, block_size=block_size,
                          compressed_bitwidth=bits, axis=channel_axis,
                          per_block_int_scale=_block_int_scales(
                              where, _channel_major(int_scale, channel_axis, block_axis).tolist()))


def _v2_array(where: Where, entry: dict, key: str, kind: type) -> np.ndarray:
    """A number or a (nested, rectangular) list of numbers as an array: float64 or int64."""
    value = _field(where, entry, key)
    try:
        array = np.array(value, dtype=object)
        if array.dtype != object or any(isinstance(item, bool) or not isinstance(item, (int, float))
                                        for item in array.ravel()):
            raise ValueError
        converted = array.astype(np.float64)
    except (ValueError, TypeError):
        raise where.error(f"'{key}' {short_repr(value)} is not a number or a rectangular list of numbers") from None
    if kind is int:
        if not np.all(np.mod(converted, 1) == 0):
            raise where.error(f"'{key}' {short_repr(value)} holds values that are not integers")
        return converted.astype(np.int64)
    return converted


def _v2_axis(where: Where, entry: dict) -> int:
    axis = _field(where, entry, "axis")
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise where.error(f"axis {short_repr(axis)} is not an integer")
    return axis


def _v2_channel_axis(where: Where, blocked: np.ndarray, block_axis: int) -> int:
    """The channel axis of blocked scales laid out like the weight: the other of its first two axes
    (aimet-onnx ``LPBQEncoding.__init__``: ``channel_axis = (block_axis + 1) % 2``)."""
    if blocked.ndim < 2 or not -blocked.ndim <= block_axis < blocked.ndim:
        raise where.error(f"blocked scales of shape {list(blocked.shape)} do not fit axis {block_axis}")
    block_axis %= blocked.ndim
    channel_axis = (block_axis + 1) % 2
    if any(size != 1 for dim, size in enumerate(blocked.shape) if dim not in (channel_axis, block_axis)):
        raise where.error(f"blocked scales of shape {list(blocked.shape)} vary along an axis other than the "
                          f"block axis {block_axis} and the channel axis {channel_axis}")
    return channel_axis


def _channel_major(blocked: np.ndarray, channel_axis: int, block_axis: int) -> np.ndarray:
    """Blocked scales flattened ``[channels, blocks]``, the in-memory order."""
    block_axis %= blocked.ndim
    return np.moveaxis(blocked, (channel_axis, block_axis), (0, 1)).reshape(-1)


def _field(where: Where, entry: dict, key: str) -> Any:
    if key not in entry:
        raise where.error(f"missing '{key}'")
    return entry[key]


def _choice(where: Where, entry: dict, key: str, choices: tuple[str, ...]) -> str:
    value = _field(where, entry, key)
    if not isinstance(value, str) or value not in choices:
        raise where.error(f"{key} {short_repr(value)} is not supported (supported: {', '.join(choices)})")
    return value


def _bitwidth(where: Where, entry: dict, key: str, dtype: str) -> int:
    value = _field(where, entry, key)
    bitwidth = _as_int(value)
    supported = SUPPORTED_INT_BITWIDTHS if dtype == "int" else SUPPORTED_FLOAT_BITWIDTHS
    if bitwidth not in supported:
        raise where.error(f"{key} {short_repr(value)} is not supported for {dtype} "
                          f"(supported: {', '.join(map(str, supported))})")
    return bitwidth


def _nonempty_list(where: Where, entry: dict, key: str) -> list:
    value = _field(where, entry, key)
    if not isinstance(value, list) or not value:
        raise where.error(f"'{key}' must be a non-empty list, got {short_repr(value)}")
    return value


# Per-block encodings hold millions of values: the list checks below first try one pass without a call per
# value, and only fall back to the per-value checks (which convert and name the bad value) when that fails.

def _scales(where: Where, values: list) -> tuple[float, ...]:
    if all(type(value) is float and 0.0 < value < math.inf for value in values):
        return tuple(values)
    return tuple(_scale_value(where, f"scale[{i}]", value) for i, value in enumerate(values))


def _offsets(where: Where, values: list, bitwidth: int) -> tuple[int, ...]:
    lowest = -(2**bitwidth - 1)
    if all(type(value) is int and lowest <= value <= 0 for value in values):
        return tuple(values)
    return tuple(_offset_value(where, f"offset[{i}]", value, bitwidth) for i, value in enumerate(values))


def _block_int_scales(where: Where, values: list) -> tuple[int, ...]:
    if all(type(value) is int and value > 0 for value in values):
        return tuple(values)
    return tuple(_positive_int(where, f"per_block_int_scale[{i}]", value) for i, value in enumerate(values))


def _scale_value(where: Where, what: str, value: Any) -> float:
    number = _as_float(value)
    if number is None or not math.isfinite(number) or number <= 0:
        raise where.error(f"{what} {short_repr(value)} is not a positive finite number")
    return number


def _offset_value(where: Where, what: str, value: Any, bitwidth: int) -> int:
    lowest = -(2**bitwidth - 1)
    number = _as_int(value)
    if number is None or not lowest <= number <= 0:
        raise where.error(f"{what} {short_repr(value)} is not an integer in [{lowest}, 0] for bitwidth {bitwidth}")
    return number


def _positive_int(where: Where, what: str, value: Any) -> int:
    number = _as_int(value)
    if number is None or number <= 0:
        raise where.error(f"{what} {short_repr(value)} is not a positive integer")
    return number


def _as_int(value: Any) -> int | None:
    """An int, or a float with an integral value (some writers emit ``-128.0``); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer too large for a float
        return math.inf


def _json_kind(value: Any) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)
