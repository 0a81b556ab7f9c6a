"""AIMET quantization encodings: read (0.6.1, 1.0.0 and 2.0.0), validate, slice per part, write.

The in-memory model is version-independent. AIMET semantics for integer encodings:
``q = clamp(round(x / scale) - offset, 0, 2**bw - 1)`` and ``x_hat = (q + offset) * scale``; for a
symmetric encoding ``offset = -2**(bw - 1)``, so the signed value ``q + offset`` lies in
``[-2**(bw-1), 2**(bw-1) - 1]``. A 2.0.0 entry (``output_dtype``, ``y_scale``, ``y_zero_point``) is read
into the same terms: ``offset = -y_zero_point`` for an unsigned dtype, ``-(y_zero_point + 2**(bw-1))``
for a signed one.

Per-channel and per-block layout (``docs/conventions.md`` cites the aimet-onnx source of each rule):
- the channel and block axes of a weight follow the op consuming it (:func:`consumer_layouts`, AIMET's
  ``QuantizationSimModel._get_quantization_axes``): last/second-to-last axis of a MatMul ``[in, out]``
  weight, axis 0/1 of a ``[out, in]`` weight reaching MatMul through a Transpose, of a Gemm weight with
  ``transB=1`` and of a Conv weight; a 1-D tensor (a bias) is per channel along axis 0. Version 2.0.0
  states the axis; 1.0.0 and 0.6.1 do not, and a count never decides it.
- in memory, per-channel scales are listed by channel; per-block scales (and LPBQ's
  ``per_block_int_scale``) channel-major, ``[channels, blocks]`` -- the order 1.0.0 writes for every
  2-D weight.
- LPBQ: per-block scale = ``scale[channel] * per_block_int_scale[channel, block]``; ``bitwidth`` is the
  decompressed width, ``compressed_bitwidth`` the stored one.

Every entry is also kept as read, so a part's slice is written in the version (and with the ``producer``
and other top-level keys) of the file it came from.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import numpy as np

from genie_build.errors import GenieBuildError
from genie_build.fileio import read_json, write_text
from genie_build.genie_contract import KV_TENSOR
from genie_build.onnx_graph import WeightLayout

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
    axis: int | None = None  # the channel axis a 2.0.0 file states; None: the consumer's rule decides


@dataclass(frozen=True)
class Encodings:
    """A whole encodings file: activation and parameter encodings keyed by tensor name.

    ``version`` is the version of the file it was read from; ``header`` its other top-level keys
    (``producer``, ``quantizer_args``, ...) and ``entries`` each entry as read with the encoding read from
    it, keyed by ``(section, name)``. None of them take part in equality, since the content means the same
    in any format.
    """

    activations: dict[str, TensorEncoding] = field(default_factory=dict)
    params: dict[str, TensorEncoding] = field(default_factory=dict)
    quantizer_args: dict = field(default_factory=dict)
    version: str = field(default="1.0.0", compare=False)
    header: dict = field(default_factory=dict, compare=False, repr=False)
    entries: dict[tuple[str, str], Any] = field(default_factory=dict, compare=False, repr=False)

    def of_initializer(self, name: str) -> TensorEncoding | None:
        """The encoding a weight is stored with: its param encoding, else an activation encoding AIMET
        gives the initializer itself (the embedding table, which AIMET quantizes as an activation)."""
        return self.params.get(name) or self.activations.get(name)


SUPPORTED_VERSIONS = ("0.6.1", "1.0.0", "2.0.0")
WRITTEN_VERSION = "1.0.0"
_UNKNOWN_SHOWN = 5  # unknown tensor names quoted in an error

_ENC_TYPE_TO_KIND: dict[str, EncodingKind] = {
    "PER_TENSOR": "per_tensor", "PER_CHANNEL": "per_channel", "PER_BLOCK": "per_block", "LPBQ": "lpbq",
}
_KIND_TO_ENC_TYPE = {kind: enc_type for enc_type, kind in _ENC_TYPE_TO_KIND.items()}
_SECTIONS = (("activation_encodings", "activation"), ("param_encodings", "param"))
_V2_SECTION = "encodings"
_V2_INT_DTYPE = re.compile(r"^(u?)int(\d+)$")
_V2_FLOAT_DTYPES = {"float16": 16, "float32": 32}


@dataclass(frozen=True)
class _Where:
    """The file and the entry in it a parse problem is about, so every error names the tensor."""

    path: str
    entry: str

    def error(self, problem: str) -> GenieBuildError:
        return GenieBuildError(self.path, f"{self.entry}: {problem}")


# ---------------------------------------------------------------------------------------------- reading

def read_encodings(path: str | os.PathLike[str]) -> Encodings:
    """Read an AIMET encodings file, version 0.6.1 (dicts keyed by name) or 1.0.0 (lists with ``name``).

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
        raise GenieBuildError(where, f"encodings version {_short(version)} is not supported "
                                     f"(supported: {', '.join(SUPPORTED_VERSIONS)})")
    quantizer_args = data.get("quantizer_args", {})
    if not isinstance(quantizer_args, dict):
        raise GenieBuildError(where, f"'quantizer_args' is {_json_kind(quantizer_args)}, expected an object")
    entries: dict[tuple[str, str], Any] = {}
    if version == "2.0.0":
        activations, params = _parse_section_v200(where, data, entries)
    else:
        parse_section = _parse_section_v061 if version == "0.6.1" else _parse_section_v100
        activations, params = (parse_section(where, data, key, label, entries) for key, label in _SECTIONS)
    sections = {key for key, _ in _SECTIONS} | {_V2_SECTION}
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
    encodings = {name: _parse_entries_v061(_Where(path, f"{label} encoding {name!r}"), name, value)
                 for name, value in section.items()}
    entries.update(((key, name), (section[name], encoding)) for name, encoding in encodings.items())
    return encodings


def _parse_entries_v061(where: _Where, name: str, entries: Any) -> TensorEncoding:
    """0.6.1 gives a list per tensor: one entry per tensor, or one per channel. ``min``/``max`` are not
    kept: they follow from scale and offset."""
    if not name:
        raise where.error("empty tensor name")
    if not isinstance(entries, list) or not entries:
        raise where.error(f"expected a non-empty list of encodings, got {_short(entries)}")
    channels = [_parse_channel_v061(_Where(where.path, f"{where.entry}[{index}]"), entry)
                for index, entry in enumerate(entries)]
    headers = {channel[:3] for channel in channels}
    if len(headers) > 1:
        raise where.error(f"entries disagree on (dtype, bitwidth, is_symmetric): {sorted(map(repr, headers))}")
    dtype, bitwidth, is_symmetric = channels[0][:3]
    if dtype == "float":
        if len(channels) > 1:
            raise where.error(f"float encoding has {len(channels)} entries, expected 1")
        return TensorEncoding(name=name, dtype="float", bitwidth=bitwidth)
    return _checked(where, TensorEncoding(name=name, dtype="int", bitwidth=bitwidth,
                                          kind="per_channel" if len(channels) > 1 else "per_tensor",
                                          is_symmetric=is_symmetric, scale=tuple(channel[3] for channel in channels),
                                          offset=tuple(channel[4] for channel in channels)))


def _parse_channel_v061(where: _Where, entry: Any) -> tuple[str, int, bool, float | None, int | None]:
    """One 0.6.1 entry as (dtype, bitwidth, is_symmetric, scale, offset); float entries have no scale."""
    if not isinstance(entry, dict):
        raise where.error(f"expected an object, got {_short(entry)}")
    dtype = _choice(where, entry, "dtype", ("int", "float"))
    bitwidth = _bitwidth(where, entry, "bitwidth", dtype)
    if dtype == "float":
        return dtype, bitwidth, False, None, None
    is_symmetric = _field(where, entry, "is_symmetric")
    # AIMET writes the strings "True"/"False"; other writers use JSON booleans.
    if not (isinstance(is_symmetric, bool) or is_symmetric in ("True", "False")):
        raise where.error(f"is_symmetric {_short(is_symmetric)} is not \"True\" or \"False\"")
    if "scale" not in entry and "offset" not in entry and "min" in entry and "max" in entry:
        return (dtype, bitwidth, is_symmetric in ("True", True), *_scale_offset_from_range(where, entry, bitwidth))
    return (dtype, bitwidth, is_symmetric in ("True", True),
            _scale_value(where, "scale", _field(where, entry, "scale")),
            _offset_value(where, "offset", _field(where, entry, "offset"), bitwidth))


def _scale_offset_from_range(where: _Where, entry: dict, bitwidth: int) -> tuple[float, int]:
    """A 0.6.1 entry with only ``min``/``max`` (which the SDK converter accepts): AIMET's grid over them,
    ``scale = (max - min) / (2**bw - 1)``, ``offset = round(min / scale)`` -- the inverse of how AIMET writes
    ``min = offset * scale`` and ``max = min + scale * (2**bw - 1)``."""
    low, high = (_as_float(entry[key]) for key in ("min", "max"))
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high) and low <= 0 <= high < math.inf
                                           and low < high):
        raise where.error(f"min {_short(entry['min'])} and max {_short(entry['max'])} do not give a range "
                          "holding 0 (and no 'scale'/'offset')")
    scale = (high - low) / (2**bitwidth - 1)
    return scale, _offset_value(where, "offset", round(low / scale), bitwidth)


def _named_entries(path: str, data: dict, key: str, label: str, entries: dict) -> Iterator[tuple[_Where, str, dict]]:
    """The entries of a list section (1.0.0, 2.0.0), each with its name; the caller records them.

    Raises:
        GenieBuildError: an entry that is not an object, has no name, or repeats a name.
    """
    for index, entry in enumerate(_section(path, data, key, list)):
        where = _Where(path, f"{key}[{index}]")
        if not isinstance(entry, dict):
            raise where.error(f"expected an object, got {_short(entry)}")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise where.error(f"missing or empty 'name' (got {_short(name)})")
        where = _Where(path, f"{label} {name!r}")
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


def _parse_entry_v100(where: _Where, name: str, entry: dict) -> TensorEncoding:
    dtype = _choice(where, entry, "dtype", ("INT", "FLOAT")).lower()
    bitwidth = _bitwidth(where, entry, "bw", dtype)
    kind = _ENC_TYPE_TO_KIND[_choice(where, entry, "enc_type", tuple(_ENC_TYPE_TO_KIND))]
    if dtype == "float":
        if kind != "per_tensor":
            raise where.error(f"a FLOAT encoding must be PER_TENSOR, got {_KIND_TO_ENC_TYPE[kind]}")
        return TensorEncoding(name=name, dtype="float", bitwidth=bitwidth)
    is_symmetric = _field(where, entry, "is_sym")
    if not isinstance(is_symmetric, bool):
        raise where.error(f"is_sym {_short(is_symmetric)} is not true or false")
    shift = entry.get("zero_point_shift", [0.0])
    if not isinstance(shift, list) or any(value != 0 for value in shift):
        raise where.error(f"zero_point_shift {_short(shift)} is not supported (only a zero shift)")
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
    return _checked(where, TensorEncoding(name=name, dtype="int", bitwidth=bitwidth, kind=kind,
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
    for where, name, entry in _named_entries(path, data, _V2_SECTION, "encoding", entries):
        encoding = _checked(where, _parse_entry_v200(where, name, entry))
        entries[_V2_SECTION, name] = (entry, encoding)
        (params if encoding.kind != "per_tensor" else activations)[name] = encoding
    return activations, params


def _parse_entry_v200(where: _Where, name: str, entry: dict) -> TensorEncoding:
    output_dtype = _field(where, entry, "output_dtype")
    if output_dtype in _V2_FLOAT_DTYPES:
        if "y_scale" in entry:
            raise where.error(f"a scaled {output_dtype} encoding is not supported")
        return TensorEncoding(name=name, dtype="float", bitwidth=_V2_FLOAT_DTYPES[output_dtype])
    match = _V2_INT_DTYPE.match(output_dtype) if isinstance(output_dtype, str) else None
    if match is None or int(match.group(2)) not in SUPPORTED_INT_BITWIDTHS:
        supported = ", ".join(f"{sign}int{bits}" for bits in SUPPORTED_INT_BITWIDTHS for sign in ("", "u"))
        raise where.error(f"output_dtype {_short(output_dtype)} is not supported (supported: {supported}, "
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


def _parse_lpbq_v200(where: _Where, name: str, entry: dict, signed: bool, bits: int) -> TensorEncoding:
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


def _v2_array(where: _Where, entry: dict, key: str, kind: type) -> np.ndarray:
    """A number or a (nested, rectangular) list of numbers as an array: float64 or int64."""
    value = _field(where, entry, key)
    try:
        array = np.array(value, dtype=object)
        if array.dtype != object or any(isinstance(item, bool) or not isinstance(item, (int, float))
                                        for item in array.ravel()):
            raise ValueError
        converted = array.astype(np.float64)
    except (ValueError, TypeError):
        raise where.error(f"'{key}' {_short(value)} is not a number or a rectangular list of numbers") from None
    if kind is int:
        if not np.all(np.mod(converted, 1) == 0):
            raise where.error(f"'{key}' {_short(value)} holds values that are not integers")
        return converted.astype(np.int64)
    return converted


def _v2_axis(where: _Where, entry: dict) -> int:
    axis = _field(where, entry, "axis")
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise where.error(f"axis {_short(axis)} is not an integer")
    return axis


def _v2_channel_axis(where: _Where, blocked: np.ndarray, block_axis: int) -> int:
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


def _field(where: _Where, entry: dict, key: str) -> Any:
    if key not in entry:
        raise where.error(f"missing '{key}'")
    return entry[key]


def _choice(where: _Where, entry: dict, key: str, choices: tuple[str, ...]) -> str:
    value = _field(where, entry, key)
    if not isinstance(value, str) or value not in choices:
        raise where.error(f"{key} {_short(value)} is not supported (supported: {', '.join(choices)})")
    return value


def _bitwidth(where: _Where, entry: dict, key: str, dtype: str) -> int:
    value = _field(where, entry, key)
    bitwidth = _as_int(value)
    supported = SUPPORTED_INT_BITWIDTHS if dtype == "int" else SUPPORTED_FLOAT_BITWIDTHS
    if bitwidth not in supported:
        raise where.error(f"{key} {_short(value)} is not supported for {dtype} "
                          f"(supported: {', '.join(map(str, supported))})")
    return bitwidth


def _nonempty_list(where: _Where, entry: dict, key: str) -> list:
    value = _field(where, entry, key)
    if not isinstance(value, list) or not value:
        raise where.error(f"'{key}' must be a non-empty list, got {_short(value)}")
    return value


# Per-block encodings hold millions of values: the list checks below first try one pass without a call per
# value, and only fall back to the per-value checks (which convert and name the bad value) when that fails.

def _scales(where: _Where, values: list) -> tuple[float, ...]:
    if all(type(value) is float and 0.0 < value < math.inf for value in values):
        return tuple(values)
    return tuple(_scale_value(where, f"scale[{i}]", value) for i, value in enumerate(values))


def _offsets(where: _Where, values: list, bitwidth: int) -> tuple[int, ...]:
    lowest = -(2**bitwidth - 1)
    if all(type(value) is int and lowest <= value <= 0 for value in values):
        return tuple(values)
    return tuple(_offset_value(where, f"offset[{i}]", value, bitwidth) for i, value in enumerate(values))


def _block_int_scales(where: _Where, values: list) -> tuple[int, ...]:
    if all(type(value) is int and value > 0 for value in values):
        return tuple(values)
    return tuple(_positive_int(where, f"per_block_int_scale[{i}]", value) for i, value in enumerate(values))


def _scale_value(where: _Where, what: str, value: Any) -> float:
    number = _as_float(value)
    if number is None or not math.isfinite(number) or number <= 0:
        raise where.error(f"{what} {_short(value)} is not a positive finite number")
    return number


def _offset_value(where: _Where, what: str, value: Any, bitwidth: int) -> int:
    lowest = -(2**bitwidth - 1)
    number = _as_int(value)
    if number is None or not lowest <= number <= 0:
        raise where.error(f"{what} {_short(value)} is not an integer in [{lowest}, 0] for bitwidth {bitwidth}")
    return number


def _positive_int(where: _Where, what: str, value: Any) -> int:
    number = _as_int(value)
    if number is None or number <= 0:
        raise where.error(f"{what} {_short(value)} is not a positive integer")
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


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ---------------------------------------------------------------------------------------------- values as stored

_FLOAT32 = np.finfo(np.float32)


def _checked(where: _Where, encoding: TensorEncoding) -> TensorEncoding:
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


def _require_block_int_scales_fit(where: _Where, int_scale: np.ndarray, bits: int) -> None:
    """LPBQ's integer block scales are stored in ``bw - compressed_bw`` bits, as 1 .. 2**bits (AIMET's range); a
    larger one would wrap when stored."""
    bad = np.flatnonzero(int_scale > 2**bits)
    if bad.size:
        index = int(bad[0])
        raise where.error(f"per_block_int_scale[{index}] {int(int_scale[index])} is more than the {2**bits} a "
                          f"{bits}-bit block scale holds (bw - compressed_bw)")


def _require_normal(where: _Where, values: np.ndarray, precision: type, what: Callable[[int], str]) -> None:
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


def _require_grid_within_float32(where: _Where, scale: np.ndarray, offset: np.ndarray, bits: int,
                                 what: Callable[[int], str]) -> None:
    """The grid's ends, ``offset * scale`` and ``(2**bits - 1 + offset) * scale``, are finite in float32."""
    ends = np.maximum(np.abs(offset), np.abs(2**bits - 1 + offset)) * scale.astype(np.float64)
    bad = np.flatnonzero(ends > float(_FLOAT32.max))
    if bad.size:
        index = int(bad[0])
        raise where.error(f"{what(index)} {float(scale[index])!r} with offset {int(offset[index % offset.size])} "
                          f"reaches {float(ends[index]):.6g}, beyond float32 ({float(_FLOAT32.max):.6g}): the "
                          "dequantized values would be inf")


def _require_symmetric_offsets(where: _Where, offset: np.ndarray, bitwidth: int) -> None:
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


# ---------------------------------------------------------------------------------------------- writing

def write_encodings(path: str | os.PathLike[str], enc: Encodings) -> None:
    """Write ``enc`` atomically in the canonical form of :func:`format_encodings`."""
    write_text(path, format_encodings(enc))


def format_encodings(enc: Encodings) -> str:
    """The canonical text of ``enc``: entries sorted by name, one per line.

    Encodings read from a file are written in that file's version, each entry and top-level key as read
    (the SDK converter reads what AIMET wrote). Encodings made or changed in memory are written as AIMET
    1.0.0. Equal inputs give equal bytes, whatever order the entries were read in.
    """
    as_read = _entries_as_read(enc)
    if as_read is not None:
        return _format_file({**enc.header, "version": enc.version}, as_read, as_dicts=enc.version == "0.6.1")
    producer = {"producer": enc.header["producer"]} if "producer" in enc.header else {}
    return _format_file({"version": WRITTEN_VERSION, "quantizer_args": enc.quantizer_args, **producer},
                        {key: {name: _entry_v100(encodings[name]) for name in encodings}
                         for key, encodings in (("activation_encodings", enc.activations),
                                                ("param_encodings", enc.params))},
                        as_dicts=False)


def _entries_as_read(enc: Encodings) -> dict[str, dict[str, Any]] | None:
    """Each section's entries as read, when every encoding of ``enc`` is still the one read; else None."""
    if enc.version == "2.0.0":
        wanted = {(_V2_SECTION, name): e for name, e in (*enc.activations.items(), *enc.params.items())}
    else:
        wanted = {(key, name): e for key, encodings in (("activation_encodings", enc.activations),
                                                         ("param_encodings", enc.params))
                  for name, e in encodings.items()}
    if not enc.entries or any(enc.entries.get(key, (None, None))[1] != e for key, e in wanted.items()):
        return None
    sections: dict[str, dict[str, Any]] = {key: {} for key in
                                           ((_V2_SECTION,) if enc.version == "2.0.0" else
                                            tuple(key for key, _ in _SECTIONS))}
    for key, name in wanted:
        sections[key][name] = enc.entries[key, name][0]
    return sections


def _format_file(header: dict, sections: dict[str, dict[str, Any]], as_dicts: bool) -> str:
    """``header``'s keys, then each section: an object keyed by name (0.6.1) or a list of entries with a
    ``name`` first; entries sorted by name, one per line."""
    lines = [f'  "version": {json.dumps(header["version"])}']
    for key, entries in sections.items():
        items = []
        for name in sorted(entries):
            entry = entries[name]
            text = (json.dumps(entry) if as_dicts
                    else json.dumps({"name": name, **{k: v for k, v in entry.items() if k != "name"}}))
            items.append(f"    {json.dumps(name)}: {text}" if as_dicts else f"    {text}")
        brackets = "{}" if as_dicts else "[]"
        body = f"{brackets[0]}\n" + ",\n".join(items) + f"\n  {brackets[1]}" if items else brackets
        lines.append(f'  "{key}": {body}')
    lines += [f"  {json.dumps(key)}: {json.dumps(value, sort_keys=True)}"
              for key, value in sorted(header.items()) if key != "version"]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _entry_v100(encoding: TensorEncoding) -> dict[str, Any]:
    if encoding.dtype == "float":
        return {"dtype": "FLOAT", "enc_type": "PER_TENSOR", "bw": encoding.bitwidth}
    entry: dict[str, Any] = {
        "dtype": "INT", "enc_type": _KIND_TO_ENC_TYPE[encoding.kind],
        "bw": encoding.bitwidth, "is_sym": encoding.is_symmetric,
        "scale": encoding.scale, "offset": encoding.offset,
    }
    if encoding.block_size is not None:
        entry["block_size"] = encoding.block_size
    if encoding.compressed_bitwidth is not None:
        entry["compressed_bw"] = encoding.compressed_bitwidth
    if encoding.per_block_int_scale is not None:
        entry["per_block_int_scale"] = encoding.per_block_int_scale
    return entry


# ---------------------------------------------------------------------------------------------- the model

def layout_of(encoding: TensorEncoding, shape: tuple[int, ...],
              consumer_layout: WeightLayout | None) -> WeightLayout | None:
    """The axes ``encoding`` runs along on a tensor of ``shape``: the axis a 2.0.0 file states, else the
    consumer's (:func:`consumer_layouts`). None for a per-tensor encoding.

    Raises:
        GenieBuildError: (``where`` = the tensor) the encoding needs an axis and neither gives one, or the
            stated axis lies outside the shape.
    """
    if encoding.kind == "per_tensor" or encoding.dtype != "int":
        return None
    if encoding.axis is not None:
        if not -len(shape) <= encoding.axis < len(shape):
            raise GenieBuildError(encoding.name, f"axis {encoding.axis} is outside shape {list(shape)}")
        channel = encoding.axis % len(shape)
        if len(shape) == 1:
            return WeightLayout(0, None)
        if consumer_layout is not None and consumer_layout.channel_axis == channel:
            return consumer_layout
        return WeightLayout(channel, (channel + 1) % 2)
    if consumer_layout is None:
        raise GenieBuildError(encoding.name, f"a {encoding.kind} encoding on a weight of shape {list(shape)} "
                                             "whose consumer gives no channel axis (MatMul, Gemm, Conv, "
                                             "ConvTranspose, Gather do); a 2.0.0 file states the axis")
    if (encoding.kind in ("per_block", "lpbq") and len(shape) > 2
            and consumer_layout.channel_axis > consumer_layout.block_axis):
        # aimet-onnx lists such scales block-major in 1.0.0 (it transposes only 2-D ones to [out, in/block])
        raise GenieBuildError(encoding.name, f"a {encoding.kind} encoding without an axis on a weight of shape "
                                             f"{list(shape)} blocked along axis {consumer_layout.block_axis} "
                                             "(a ConvTranspose's) is not supported; export it as 2.0.0")
    return consumer_layout


def blocked_shape(name: str, shape: tuple[int, ...], block_size: int, layout: WeightLayout) -> tuple[int, ...]:
    """The shape of a blocked encoding's scales laid out like the weight: the channel axis whole, the block
    axis in blocks of ``block_size``, every other axis 1.

    Raises:
        GenieBuildError: the tensor has no block axis (1-D) or its block axis is not a whole number of blocks.
    """
    if layout.block_axis is None:
        raise GenieBuildError(name, f"a per-block encoding needs a weight of rank >= 2, got shape {list(shape)}")
    if shape[layout.block_axis] % block_size:
        raise GenieBuildError(name, f"axis {layout.block_axis} of shape {list(shape)} is not a whole number of "
                                    f"blocks of {block_size}")
    return tuple(size if axis == layout.channel_axis else size // block_size if axis == layout.block_axis else 1
                 for axis, size in enumerate(shape))


def block_grid(name: str, shape: tuple[int, ...], block_size: int, layout: WeightLayout) -> tuple[int, int]:
    """``(blocks, channels)`` of a per-block or LPBQ encoding (see :func:`blocked_shape`)."""
    grid = blocked_shape(name, shape, block_size, layout)
    return grid[layout.block_axis], grid[layout.channel_axis]


def validate_against_model(enc: Encodings, path: str | os.PathLike[str], activation_names: AbstractSet[str],
                           param_shapes: dict[str, tuple[int, ...]],
                           param_layouts: Mapping[str, WeightLayout] | None = None) -> None:
    """Check that ``enc`` (read from ``path``) fits the model: every tensor it names exists, and every
    per-channel or per-block encoding of an initializer has as many scales as its shape has along the
    axes its consumer gives (``param_layouts``, :attr:`GraphTensors.param_layouts`; 1-D tensors need none).

    Args:
        activation_names: every tensor name of the model (:attr:`GraphTensors.tensor_names`).
        param_shapes: the model's initializers and their shapes.

    Raises:
        GenieBuildError: naming ``path``, a few unknown tensors and how many there are; or the first
            initializer whose encoding does not fit (tensor, shape, axis and count).
    """
    unknown = [f"activation {name!r}" for name in sorted(set(enc.activations) - activation_names)]
    unknown += [f"param {name!r}" for name in sorted(set(enc.params) - param_shapes.keys())]
    if unknown:
        shown = ", ".join(unknown[:_UNKNOWN_SHOWN]) + (", ..." if len(unknown) > _UNKNOWN_SHOWN else "")
        raise GenieBuildError(path, f"{len(unknown)} encodings name tensors the model does not have: {shown}")
    layouts = param_layouts or {}
    for name in sorted(param_shapes.keys() & (set(enc.params) | set(enc.activations))):
        encoding = enc.of_initializer(name)
        section = "param" if name in enc.params else "activation"
        try:
            check_scale_count(encoding, param_shapes[name], layout_of(encoding, param_shapes[name],
                                                                      layouts.get(name)))
        except GenieBuildError as exc:
            raise GenieBuildError(path, f"{section} encoding {name!r}: {exc.problem}") from None


def check_scale_count(encoding: TensorEncoding, shape: tuple[int, ...], layout: WeightLayout | None) -> None:
    """Require ``encoding``'s scale counts to fit ``shape`` along ``layout`` (from :func:`layout_of`).

    Raises:
        GenieBuildError: (``where`` = the tensor) naming the shape, the axis and the counts.
    """
    if layout is None:
        if encoding.dtype == "int" and len(encoding.scale) != 1:
            raise GenieBuildError(encoding.name, f"{len(encoding.scale)} scales for a per-tensor encoding")
        return
    channels = shape[layout.channel_axis]
    if encoding.kind == "per_channel":
        counts = [("scale", len(encoding.scale), channels)]
    else:
        blocks, _ = block_grid(encoding.name, shape, encoding.block_size, layout)
        counts = [("scale", len(encoding.scale), blocks * channels)]
        if encoding.kind == "lpbq":  # per-channel float scales times per-block integer scales
            counts = [("scale", len(encoding.scale), channels),
                      ("per_block_int_scale", len(encoding.per_block_int_scale), blocks * channels)]
    for what, found, expected in counts:
        if found != expected:
            block = (f", blocks of {encoding.block_size} along axis {layout.block_axis}"
                     if encoding.block_size else "")
            raise GenieBuildError(encoding.name, f"{found} {what} values do not fit shape {list(shape)}: "
                                                 f"{expected} expected for channel axis {layout.channel_axis}"
                                                 f"{block}")


# ---------------------------------------------------------------------------------------------- slicing

def slice_encodings(enc: Encodings, tensor_names: set[str], initializer_names: set[str]) -> Encodings:
    """The part of ``enc`` one part needs: activation encodings of the tensors it touches, parameter
    encodings of its own initializers."""
    activations = {name: e for name, e in enc.activations.items() if name in tensor_names}
    params = {name: e for name, e in enc.params.items() if name in initializer_names}
    kept = activations.keys() | params.keys()
    return replace(enc, activations=activations, params=params, quantizer_args=dict(enc.quantizer_args),
                   entries={key: entry for key, entry in enc.entries.items() if key[1] in kept})


def share_encodings(source: Encodings, target: Encodings, target_names: AbstractSet[str]) -> Encodings:
    """``target`` with ``source``'s encoding for every tensor of ``source`` that the target graph has
    (``target_names``, :attr:`GraphTensors.tensor_names`), as AI Hub gives the token graph the prompt
    graph's encodings.

    Raises:
        GenieBuildError: the two files are of different versions (their entries cannot be mixed).
    """
    if source.version != target.version:
        raise GenieBuildError("encodings.share_from", f"the graphs' encodings are of versions {source.version} "
                                                      f"and {target.version}; sharing needs one version")
    shared = {name: section for name, section in _sections_by_name(source).items() if name in target_names}
    activations, params = dict(target.activations), dict(target.params)
    entries = dict(target.entries)
    for name, section in shared.items():
        for encodings in (activations, params):
            encodings.pop(name, None)
        (params if section == "param" else activations)[name] = source.params.get(name) or source.activations[name]
        for key in [key for key in entries if key[1] == name]:
            del entries[key]
        entries.update((key, entry) for key, entry in source.entries.items() if key[1] == name)
    return replace(target, activations=activations, params=params, entries=entries)


def _sections_by_name(enc: Encodings) -> dict[str, str]:
    return {**{name: "activation" for name in enc.activations}, **{name: "param" for name in enc.params}}


def check_boundary_consistency(slices: dict[str, Encodings]) -> None:
    """Require a tensor that several parts' slices hold (a boundary, the shared RoPE/mask inputs) to have
    identical encodings in all of them.

    Args:
        slices: part label -> that part's encodings.

    Raises:
        GenieBuildError: naming the tensor, both parts and what differs.
    """
    _require_identical({f"part {label}": slices[label] for label in sorted(slices)})


def check_graphs_consistent(prompt_enc: Encodings, token_enc: Encodings) -> None:
    """Require a tensor in both graphs' encodings to have identical encodings: Genie rejects
    "Non-identical quantization parameters found for the same tensor".

    Raises:
        GenieBuildError: naming the tensor and what differs, and the option that shares them instead.
    """
    try:
        _require_identical({"the prompt graph": prompt_enc, "the token graph": token_enc})
    except GenieBuildError as exc:
        raise GenieBuildError(exc.where, f"{exc.problem} (calibrate both graphs together, or set "
                                         "encodings.share_from: prompt to give the token graph the prompt "
                                         "graph's encodings)") from None


def check_kv_cache_tied(enc: Encodings, tensor_names: AbstractSet[str]) -> None:
    """Require each ``past_{key,value}_{i}_out`` of the graph (``tensor_names``) to have the encoding of its
    ``_in``: Genie writes the new cache entries back into the input cache, so it refuses any difference at load
    time. AIMET leaves outputs of data-movement ops (the new entries) without an encoding unless its LLM recipe
    ties the cache quantizers, so a plain export stops here, before anything is converted or compiled.

    Raises:
        GenieBuildError: naming the first untied output, both encodings and the fix.
    """
    for name in sorted(tensor_names):
        match = KV_TENSOR.match(name)
        source_name = f"past_{match.group(1)}_{match.group(2)}_in" if match and match.group(3) == "out" else None
        if source_name not in tensor_names:
            continue
        source, output = enc.activations.get(source_name), enc.activations.get(name)
        expected = replace(source, name=name) if source is not None else None
        if expected == output:
            continue
        describe = (f"it has none, {source_name} has one" if output is None else
                    f"it has one, {source_name} has none" if expected is None else _difference(expected, output))
        raise GenieBuildError(name, f"activation encoding is not {source_name}'s ({describe}); Genie needs the "
                                    "KV cache's output quantized as its input: tie the cache quantizers in AIMET, "
                                    f"or give {name} the entry of {source_name}")


def _require_identical(sources: dict[str, Encodings]) -> None:
    first_seen: dict[tuple[str, str], tuple[str, TensorEncoding]] = {}
    for source, enc in sources.items():
        for section, encodings in (("activation", enc.activations), ("param", enc.params)):
            for name, encoding in encodings.items():
                seen_in, seen = first_seen.setdefault((section, name), (source, encoding))
                if seen != encoding:
                    raise GenieBuildError(name, f"{section} encoding differs between {seen_in} and {source}: "
                                                f"{_difference(seen, encoding)}")


def _difference(first: TensorEncoding, second: TensorEncoding) -> str:
    differences = []
    for spec in fields(TensorEncoding):
        a, b = getattr(first, spec.name), getattr(second, spec.name)
        if a == b:
            continue
        if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
            index = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            differences.append(f"{spec.name}[{index}] {a[index]!r} vs {b[index]!r}")
        else:
            differences.append(f"{spec.name} {_short(a)} vs {_short(b)}")
    return "; ".join(differences)
