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

import json
import math
import os
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import onnx
from google.protobuf.message import DecodeError

from genie_build.errors import GenieBuildError
from genie_build.fileio import read_json, write_text

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
    """A whole encodings file: activation and parameter encodings keyed by tensor name.

    ``version`` is the version of the file it was read from; it does not take part in equality, since the
    content means the same in either format.
    """

    activations: dict[str, TensorEncoding] = field(default_factory=dict)
    params: dict[str, TensorEncoding] = field(default_factory=dict)
    quantizer_args: dict = field(default_factory=dict)
    version: str = field(default="1.0.0", compare=False)


SUPPORTED_VERSIONS = ("0.6.1", "1.0.0")
WRITTEN_VERSION = "1.0.0"
_UNKNOWN_SHOWN = 5  # unknown tensor names quoted in an error

_ENC_TYPE_TO_KIND: dict[str, EncodingKind] = {
    "PER_TENSOR": "per_tensor", "PER_CHANNEL": "per_channel", "PER_BLOCK": "per_block", "LPBQ": "lpbq",
}
_KIND_TO_ENC_TYPE = {kind: enc_type for enc_type, kind in _ENC_TYPE_TO_KIND.items()}
_SECTIONS = (("activation_encodings", "activation"), ("param_encodings", "param"))


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
    parse_section = _parse_section_v061 if version == "0.6.1" else _parse_section_v100
    activations, params = (parse_section(where, data, key, label) for key, label in _SECTIONS)
    quantizer_args = data.get("quantizer_args", {})
    if not isinstance(quantizer_args, dict):
        raise GenieBuildError(where, f"'quantizer_args' is {_json_kind(quantizer_args)}, expected an object")
    return Encodings(activations=activations, params=params, quantizer_args=quantizer_args, version=version)


def _section(path: str, data: dict, key: str, container: type) -> Any:
    if key not in data:
        raise GenieBuildError(path, f"missing '{key}'")
    section = data[key]
    if not isinstance(section, container):
        expected = "an object keyed by tensor name" if container is dict else "a list of objects with 'name'"
        raise GenieBuildError(path, f"'{key}' is {_json_kind(section)}, expected {expected} "
                                    f"in version {data['version']}")
    return section


def _parse_section_v061(path: str, data: dict, key: str, label: str) -> dict[str, TensorEncoding]:
    section = _section(path, data, key, dict)
    return {name: _parse_entries_v061(_Where(path, f"{label} encoding {name!r}"), name, entries)
            for name, entries in section.items()}


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
    return TensorEncoding(name=name, dtype="int", bitwidth=bitwidth,
                          kind="per_channel" if len(channels) > 1 else "per_tensor", is_symmetric=is_symmetric,
                          scale=tuple(channel[3] for channel in channels),
                          offset=tuple(channel[4] for channel in channels))


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
    return (dtype, bitwidth, is_symmetric in ("True", True),
            _scale_value(where, "scale", _field(where, entry, "scale")),
            _offset_value(where, "offset", _field(where, entry, "offset"), bitwidth))


def _parse_section_v100(path: str, data: dict, key: str, label: str) -> dict[str, TensorEncoding]:
    encodings: dict[str, TensorEncoding] = {}
    for index, entry in enumerate(_section(path, data, key, list)):
        where = _Where(path, f"{key}[{index}]")
        if not isinstance(entry, dict):
            raise where.error(f"expected an object, got {_short(entry)}")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise where.error(f"missing or empty 'name' (got {_short(name)})")
        where = _Where(path, f"{label} encoding {name!r}")
        if name in encodings:
            raise where.error(f"appears more than once in '{key}'")
        encodings[name] = _parse_entry_v100(where, name, entry)
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
    return TensorEncoding(name=name, dtype="int", bitwidth=bitwidth, kind=kind, is_symmetric=is_symmetric,
                          scale=scale, offset=offset, block_size=block_size,
                          compressed_bitwidth=compressed_bitwidth, per_block_int_scale=per_block_int_scale)


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


# ---------------------------------------------------------------------------------------------- writing

def write_encodings(path: str | os.PathLike[str], enc: Encodings) -> None:
    """Write ``enc`` atomically as AIMET 1.0.0 in the canonical form of :func:`format_encodings`."""
    write_text(path, format_encodings(enc))


def format_encodings(enc: Encodings) -> str:
    """The canonical AIMET 1.0.0 text of ``enc``: entries sorted by name, one per line.

    Equal encodings give equal bytes, whatever order or version they were read in.
    """
    sections = [f'  "version": "{WRITTEN_VERSION}"']
    for key, encodings in (("activation_encodings", enc.activations), ("param_encodings", enc.params)):
        entries = [f"    {json.dumps(_entry_v100(encodings[name]), allow_nan=False)}" for name in sorted(encodings)]
        sections.append(f'  "{key}": [\n' + ",\n".join(entries) + "\n  ]" if entries else f'  "{key}": []')
    sections.append(f'  "quantizer_args": {json.dumps(enc.quantizer_args, sort_keys=True)}')
    return "{\n" + ",\n".join(sections) + "\n}\n"


def _entry_v100(encoding: TensorEncoding) -> dict[str, Any]:
    if encoding.dtype == "float":
        return {"name": encoding.name, "dtype": "FLOAT", "enc_type": "PER_TENSOR", "bw": encoding.bitwidth}
    entry: dict[str, Any] = {
        "name": encoding.name, "dtype": "INT", "enc_type": _KIND_TO_ENC_TYPE[encoding.kind],
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

@dataclass(frozen=True)
class GraphTensors:
    """The names an ONNX graph (with its subgraphs) uses, read without its external data.

    ``tensor_names``: graph inputs and outputs, node inputs and outputs, initializers.
    ``param_shapes``: initializer name -> shape.
    """

    tensor_names: frozenset[str]
    param_shapes: dict[str, tuple[int, ...]]


def read_graph_tensors(onnx_path: str | os.PathLike[str]) -> GraphTensors:
    """Read the tensor names and initializer shapes of an ONNX model, never loading its weights.

    Raises:
        GenieBuildError: the file is missing, not an ONNX model, or has no nodes.
    """
    try:
        model = onnx.load(onnx_path, format="protobuf", load_external_data=False)
    except FileNotFoundError:
        raise GenieBuildError(onnx_path, "file not found") from None
    except (OSError, DecodeError) as exc:
        raise GenieBuildError(onnx_path, f"cannot read as an ONNX model: {exc}") from None
    if not model.graph.node:
        raise GenieBuildError(onnx_path, "not an ONNX model with a graph: no nodes")
    graphs = list(_graph_and_subgraphs(model.graph))
    param_shapes = {tensor.name: tuple(tensor.dims) for graph in graphs for tensor in graph.initializer}
    param_shapes.update({sparse.values.name: tuple(sparse.dims)
                         for graph in graphs for sparse in graph.sparse_initializer})
    tensor_names = {name for graph in graphs for name in _graph_tensor_names(graph)}
    return GraphTensors(tensor_names=frozenset(tensor_names | set(param_shapes)), param_shapes=param_shapes)


def part_tensor_names(onnx_path: str | os.PathLike[str]) -> tuple[set[str], set[str]]:
    """The tensors a part touches and the initializers it holds: ``(tensor_names, initializer_names)``."""
    tensors = read_graph_tensors(onnx_path)
    return set(tensors.tensor_names), set(tensors.param_shapes)


def _graph_and_subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            subgraphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs
            for subgraph in subgraphs:
                yield from _graph_and_subgraphs(subgraph)


def _graph_tensor_names(graph: onnx.GraphProto) -> Iterator[str]:
    yield from (value.name for value in (*graph.input, *graph.output))
    for node in graph.node:
        yield from (name for name in (*node.input, *node.output) if name)  # "" marks an omitted optional input


def channel_axis(name: str, shape: tuple[int, ...], n_scales: int, consumer_op: str | None = None) -> int:
    """The axis of ``shape`` that ``n_scales`` per-channel scales run along: the axis of that size.

    Ties (a square weight) follow the layout in the module docstring: a Gather table's channels are its
    first matching axis (axis 0 of ``[vocab, hidden]``), anything else's the last (``[in, out]`` MatMul).

    Raises:
        GenieBuildError: no axis of ``shape`` has ``n_scales`` entries (``where`` is the tensor).
    """
    candidates = [axis for axis, size in enumerate(shape) if size == n_scales]
    if not candidates:
        raise GenieBuildError(name, f"{n_scales} per-channel scales match no axis of shape {list(shape)}")
    return candidates[0] if consumer_op == "Gather" else candidates[-1]


def block_grid(name: str, shape: tuple[int, ...], block_size: int) -> tuple[int, int]:
    """``(blocks, channels)`` of a per-block or LPBQ encoding on an ``[in, out]`` MatMul weight.

    Blocks of ``block_size`` run along axis 0; scales are laid out row-major over ``[blocks, channels]``.

    Raises:
        GenieBuildError: the weight is not 2-D or its input axis is not a whole number of blocks.
    """
    if len(shape) != 2:
        raise GenieBuildError(name, f"per-block encodings need an [in, out] weight, got shape {list(shape)}")
    if shape[0] % block_size:
        raise GenieBuildError(name, f"input axis of shape {list(shape)} is not a whole number of "
                                    f"blocks of {block_size}")
    return shape[0] // block_size, shape[1]


def validate_against_model(enc: Encodings, path: str | os.PathLike[str], activation_names: AbstractSet[str],
                           param_shapes: dict[str, tuple[int, ...]]) -> None:
    """Check that ``enc`` (read from ``path``) fits the model: every tensor it names exists, and every
    per-channel or per-block parameter encoding has as many scales as the parameter's shape asks for.

    Args:
        activation_names: every tensor name of the model (:attr:`GraphTensors.tensor_names`).
        param_shapes: the model's initializers and their shapes.

    Raises:
        GenieBuildError: naming ``path``, a few unknown tensors and how many there are; or the first
            parameter whose scale count does not fit.
    """
    unknown = [f"activation {name!r}" for name in sorted(set(enc.activations) - activation_names)]
    unknown += [f"param {name!r}" for name in sorted(set(enc.params) - param_shapes.keys())]
    if unknown:
        shown = ", ".join(unknown[:_UNKNOWN_SHOWN]) + (", ..." if len(unknown) > _UNKNOWN_SHOWN else "")
        raise GenieBuildError(path, f"{len(unknown)} encodings name tensors the model does not have: {shown}")
    for name in sorted(enc.params):
        try:
            _check_scale_count(enc.params[name], param_shapes[name])
        except GenieBuildError as exc:
            raise GenieBuildError(path, f"param encoding {name!r}: {exc.problem}") from None


def _check_scale_count(encoding: TensorEncoding, shape: tuple[int, ...]) -> None:
    if encoding.kind == "per_channel":
        channel_axis(encoding.name, shape, len(encoding.scale))
        return
    if encoding.kind not in ("per_block", "lpbq"):
        return
    blocks, channels = block_grid(encoding.name, shape, encoding.block_size)
    counts = [("scale", len(encoding.scale), blocks * channels)]
    if encoding.kind == "lpbq":  # per-channel float scales times per-block integer scales
        counts = [("scale", len(encoding.scale), channels),
                  ("per_block_int_scale", len(encoding.per_block_int_scale), blocks * channels)]
    for what, found, expected in counts:
        if found != expected:
            raise GenieBuildError(encoding.name, f"{found} {what} values, expected {expected} for shape "
                                                 f"{list(shape)} with block_size {encoding.block_size}")


# ---------------------------------------------------------------------------------------------- slicing

def slice_encodings(enc: Encodings, tensor_names: set[str], initializer_names: set[str]) -> Encodings:
    """The part of ``enc`` one part needs: activation encodings of the tensors it touches, parameter
    encodings of its own initializers."""
    return Encodings(activations={name: e for name, e in enc.activations.items() if name in tensor_names},
                     params={name: e for name, e in enc.params.items() if name in initializer_names},
                     quantizer_args=dict(enc.quantizer_args), version=enc.version)


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
        GenieBuildError: naming the tensor and what differs.
    """
    _require_identical({"the prompt graph": prompt_enc, "the token graph": token_enc})


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
