"""The reference context binary: several converted graphs linked into one file, their weights stored once
when shared and packed two per byte when they fit 4 bits. ``docs/reference-container.md`` is the format's
specification; in short (integers little-endian)::

    0        magic b"GBREFCTX"
    8        uint32 format version (1)
    12       uint32 reserved (0)
    16       uint64 H, the header's length
    24       header: H bytes of UTF-8 JSON, keys sorted
    24 + H   graph section: each graph's ModelProto, initializer data stripped, back to back
    W        weight section: W is the graph section's end rounded up to 64; header["weight_section"]["bytes"]

Equal inputs give equal bytes. Writing streams one weight at a time through a temporary file, so memory
holds one weight, not the model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from google.protobuf.message import Error as ProtobufError

from genie_build import __version__
from genie_build.errors import GenieBuildError
from genie_build.fileio import atomic_open, copy_range, open_regular
from genie_build.onnx_graph import (StoredTensor, TensorSpec, check_external_data, external_data, graph_io,
                                    load_graph)
from genie_build.toolchains.base import AppliedOptions, CompileOptions, GraphInfo, QuantInfo, TensorInfo
from genie_build.toolchains.graph_edits import IO_ENCODINGS_KEY
from genie_build.toolchains.reference.container_format import (FORMAT_VERSION, MAGIC, PREAMBLE, TOOLCHAIN,
                                                               WEIGHT_SECTION_ALIGNMENT, Layout, padding, read_layout)
from genie_build.toolchains.graph_edits import CONVERTED_FROM_KEY
from genie_build.toolchains.reference.convert import FLOAT_BITWIDTH_KEY, quantized_weights
from genie_build.toolchains.reference.onnx_io import metadata_json, read_initializer, remove_metadata
from genie_build.toolchains.reference.packing import pack_int4, packed_nbytes, unpack_int4
from genie_build.toolchains.reference.quantize import (BLOCK_VALUES, broadcast_params, params_of_rows,
                                                       row_blocks, same_rank_params)
from genie_build.toolchains.reference.records import Quantization, WeightEntry

__all__ = ["ContainerGraph", "load_container", "read_graphs", "stored_nbytes", "write_container"]

# Storage of values kept as they are, by numpy dtype name (the container's "u8"/"f16"/... codes).
_RAW_STORAGE = {"uint8": "u8", "int8": "i8", "uint16": "u16", "int16": "i16", "uint32": "u32", "int32": "i32",
                "uint64": "u64", "int64": "i64", "float16": "f16", "float32": "f32", "float64": "f64",
                "bool": "b8"}
# packed4: 4-bit codes q; packed4_signed: q - zero_point + 8 of wider weights whose q - zero_point is in [-8, 7].
_PACKED_STORAGE = ("packed4", "packed4_signed")
_STRIPPED_TENSOR_FIELDS = ("raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data",
                           "uint64_data", "external_data", "data_location")


@dataclass(frozen=True)
class _Graph:
    """A converted graph to link: its name in the container, its file, its weight-less model."""

    name: str
    path: Path
    model: onnx.ModelProto


# ------------------------------------------------------------------------------------------- writing

def write_container(converted: dict[str, Path], out_path: str | os.PathLike[str], options: CompileOptions) -> None:
    """Link the converted graphs (graph name -> converted ``.onnx``) into one container at ``out_path``.

    With ``options.weight_sharing_enabled`` a tensor that several graphs hold with the same name, dtype,
    shape, bytes and quantization is stored once; with ``options.weights_packing`` quantized weights of
    at most 8 bits whose values fit 4 bits are stored two per byte.

    Raises:
        GenieBuildError: no graphs, a graph file named differently from its key, unreadable weights, or
            graphs converted with different float bitwidths.
    """
    out_path = Path(out_path)
    graphs = [_read_converted(name, Path(path)) for name, path in sorted(converted.items())]
    if not graphs:
        raise GenieBuildError(out_path, "nothing to compile: no graphs given")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryFile(dir=out_path.parent) as weights:
            entries = _write_weight_section(graphs, weights, options)
            weight_bytes = weights.tell()
            structures = [_structure(graph.model) for graph in graphs]
            header = _header(graphs, structures, entries, weight_bytes, options)
            header_bytes = json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
            graph_section_end = PREAMBLE.size + len(header_bytes) + sum(map(len, structures))
            with atomic_open(out_path) as out:
                out.write(PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0, len(header_bytes)))
                out.write(header_bytes)
                for structure in structures:
                    out.write(structure)
                out.write(b"\0" * padding(graph_section_end, WEIGHT_SECTION_ALIGNMENT))
                copy_range(weights, out, 0, weight_bytes)
    except OSError as exc:
        raise GenieBuildError(out_path, f"cannot write: {exc.strerror or exc}") from None


def _read_converted(name: str, path: Path) -> _Graph:
    model = load_graph(path)
    if model.graph.name != name:
        raise GenieBuildError(path, f"holds graph {model.graph.name!r}, but was given as {name!r} "
                                    f"(convert it with --graph-name {name})")
    check_external_data(model, path)
    return _Graph(name=name, path=path, model=model)


def _write_weight_section(graphs: list[_Graph], sink: BinaryIO, options: CompileOptions) -> list[WeightEntry]:
    """Write every graph's initializers to ``sink``, one at a time; return the weight table."""
    entries: list[WeightEntry] = []
    stored: dict[tuple, int] = {}  # index in entries
    # Graphs converted into one folder point at one data file for the weights they share: each byte range is read
    # and hashed once, not once per graph (a part holds two graphs per context length).
    digests: dict[tuple, str] = {}
    for graph in graphs:
        quantized = quantized_weights(graph.model)
        by_name = {tensor.name: tensor for tensor in graph.model.graph.initializer}
        for tensor in graph.model.graph.initializer:
            region = _data_region(tensor, graph.path)
            digest, values = digests.get(region), None
            if digest is None:
                values = read_initializer(tensor, graph.path)
                digest = hashlib.sha256(_bytes_of(values)).hexdigest()
                if region is not None:
                    digests[region] = digest
            quantization = quantized.get(tensor.name)
            key = (tensor.name, _numpy_dtype(tensor).str, tuple(tensor.dims), quantization, digest)
            if options.weight_sharing_enabled and key in stored:
                index = stored[key]
                entries[index] = dataclasses.replace(entries[index], graphs=(*entries[index].graphs, graph.name))
                continue
            if values is None:
                values = read_initializer(tensor, graph.path)
            zero_point = None
            if quantization is not None:
                zero_point = read_initializer(by_name[quantization.zero_point], graph.path)
            storage, payload = _encode(values, quantization, zero_point, options.weights_packing, graph.path)
            sink.write(b"\0" * padding(sink.tell(), 1 if storage in _PACKED_STORAGE else values.dtype.itemsize))
            stored[key] = len(entries)
            entries.append(WeightEntry(name=tensor.name, graphs=(graph.name,), dtype=values.dtype.name,
                                       shape=values.shape, storage=storage,
                                       packable_int4=_packable(values, quantization, zero_point),
                                       offset=sink.tell(), length=len(payload), quantization=quantization))
            sink.write(payload)
    return entries


def _data_region(tensor: onnx.TensorProto, model_path: Path) -> tuple | None:
    """Where an external tensor's bytes are: its data file's real path and range (None for an inline tensor)."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    ref = external_data(StoredTensor(f"initializer {tensor.name!r}", tensor), model_path)
    return (str(ref.real_path), ref.offset, ref.length)


def _numpy_dtype(tensor: onnx.TensorProto) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))


def stored_nbytes(shape: Sequence[int], dtype: str, packed: bool = False) -> int:
    """The bytes one weight-table entry takes (its ``length``): a tensor of ``shape`` and numpy ``dtype``
    stored raw, or, ``packed``, as 4-bit values two per byte (``packed4``, ``packed4_signed``). The writer
    packs quantized values of at most 4 bits whenever packing is on, and wider ones up to 8 bits only
    when their values fit 4 bits. Alignment padding between entries is not included.

    Raises:
        GenieBuildError: the container stores no tensor of ``dtype`` raw.
    """
    count = math.prod(shape)
    if packed:
        return packed_nbytes(count)
    _raw_storage(dtype, "reference container")
    return count * np.dtype(dtype).itemsize


def _encode(values: np.ndarray, quantization: Quantization | None, zero_point: np.ndarray | None, packing: bool,
            where: Path) -> tuple[str, bytes | np.ndarray]:
    """How one tensor is stored: ``(storage, bytes)``."""
    if packing and _packable(values, quantization, zero_point):
        if quantization.bitwidth <= 4:
            return "packed4", pack_int4(values)
        return "packed4_signed", pack_int4(_signed_nibbles(values, quantization, zero_point))
    return _raw_storage(values.dtype.name, where), _bytes_of(values)


def _bytes_of(values: np.ndarray) -> np.ndarray:
    """The values' bytes in C order, as a flat uint8 view: no copy when they are already contiguous (weights are
    hundreds of MB, and ``tobytes`` copied each twice, to hash it and to write it)."""
    return np.ascontiguousarray(values).reshape(-1).view(np.uint8)


def _raw_storage(dtype: str, where: str | os.PathLike[str]) -> str:
    """The storage code of values kept as they are, e.g. ``"u8"``."""
    if dtype not in _RAW_STORAGE:
        raise GenieBuildError(where, f"cannot store a tensor of dtype {dtype} (supported: {', '.join(_RAW_STORAGE)})")
    return _RAW_STORAGE[dtype]


def _packable(values: np.ndarray, quantization: Quantization | None, zero_point: np.ndarray | None) -> bool:
    """The HTP packing rule: 4-bit weights, and "8-bit weights that are in the 4-bit range" (``q - zero
    point`` in [-8, 7]), can be stored as packed 4-bit.

    Each zero point is compared with the extremes of the values it applies to, so no tensor-sized
    temporary is made (an 8-bit embedding table is hundreds of MiB)."""
    if quantization is None or quantization.bitwidth > 8:
        return False
    if quantization.bitwidth <= 4:
        return True
    if not values.size:
        return False
    zero = same_rank_params(zero_point, values.shape, quantization.axis).astype(np.int64)
    low, high = _extremes_per_entry(values, zero.shape)
    return bool((low.astype(np.int64) - zero >= -8).all() and (high.astype(np.int64) - zero <= 7).all())


def _extremes_per_entry(values: np.ndarray, entries: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Min and max of the values each parameter entry applies to, for parameters of same-rank shape
    ``entries`` (:func:`~genie_build.toolchains.reference.quantize.same_rank_params`), both shaped ``entries``."""
    # Dimension d of n values under k entries splits into (k, n // k): entry index, then the values it covers.
    grouped = values.reshape([part for size, count in zip(values.shape, entries) for part in (count, size // count)])
    covered = tuple(range(1, grouped.ndim, 2))
    return grouped.min(axis=covered), grouped.max(axis=covered)


def _signed_nibbles(values: np.ndarray, quantization: Quantization, zero_point: np.ndarray) -> np.ndarray:
    """``q - zero_point + 8`` of :func:`_packable` 8-bit values, as uint8, computed a block of rows at a time."""
    axis, rows = quantization.axis, np.atleast_1d(values)
    nibbles = np.empty(rows.shape, dtype=np.uint8)
    for block in row_blocks(rows.shape, zero_point, axis, BLOCK_VALUES):
        block_zero = params_of_rows(zero_point, rows.shape, axis, block)
        nibbles[block] = rows[block].astype(np.int64) - broadcast_params(block_zero, rows[block].shape, axis) + 8
    return nibbles.reshape(values.shape)


def _structure(model: onnx.ModelProto) -> bytes:
    """The model without initializer data (names, dims and types stay), nor the converter's record of what it
    read (a fact of the build box, not of the binary)."""
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    for tensor in stripped.graph.initializer:
        for field in _STRIPPED_TENSOR_FIELDS:
            tensor.ClearField(field)
    remove_metadata(stripped, CONVERTED_FROM_KEY)
    return stripped.SerializeToString(deterministic=True)


def _header(graphs: list[_Graph], structures: list[bytes], entries: list[WeightEntry], weight_bytes: int,
            options: CompileOptions) -> dict:
    graph_records, offset = [], 0
    for graph, structure in zip(graphs, structures):
        info = _graph_info(graph)
        graph_records.append({"name": info.name, "inputs": [dataclasses.asdict(t) for t in info.inputs],
                              "outputs": [dataclasses.asdict(t) for t in info.outputs], "structure_offset": offset,
                              "structure_length": len(structure)})
        offset += len(structure)
    return {"toolchain": TOOLCHAIN, "tool_version": __version__,
            "applied_options": _applied_options(graphs, entries, options).to_dict(),
            "graphs": graph_records, "graph_section_bytes": offset,
            "weight_section": {"alignment": WEIGHT_SECTION_ALIGNMENT, "bytes": weight_bytes},
            "weights": [entry.to_dict() for entry in entries]}


def _graph_info(graph: _Graph) -> GraphInfo:
    """The graph's IO with the quantization convert recorded for it."""
    io_encodings = metadata_json(graph.model, IO_ENCODINGS_KEY, {})

    def tensor(spec: TensorSpec) -> TensorInfo:
        shape = tuple(dim if isinstance(dim, int) else -1 for dim in spec.shape)
        return TensorInfo(name=spec.name, shape=shape, dtype=spec.dtype, quant=_quant_info(io_encodings.get(spec.name)))

    io = graph_io(graph.model)
    return GraphInfo(name=graph.name, inputs=tuple(map(tensor, io.inputs)), outputs=tuple(map(tensor, io.outputs)))


def _quant_info(encoding: dict | None) -> QuantInfo | None:
    if encoding is None:
        return None
    if encoding["dtype"] == "float":
        return QuantInfo(dtype=f"float{encoding['bitwidth']}", bitwidth=encoding["bitwidth"])
    # AIMET's q is unsigned in [0, 2**bw - 1]; the offset carries the sign.
    return QuantInfo(dtype=f"uint{encoding['bitwidth']}", scale=encoding["scale"], offset=encoding["offset"],
                     bitwidth=encoding["bitwidth"])


def _applied_options(graphs: list[_Graph], entries: list[WeightEntry], options: CompileOptions) -> AppliedOptions:
    """What the container shows was done: packing and sharing are reported as applied when the compile
    applied their rule, with the counts of packable, packed and shared weights so a reader can tell "not
    applied" from "nothing to pack"; the device options are recorded as given (the reference does not tune)."""
    float_bitwidths = sorted({metadata_json(graph.model, FLOAT_BITWIDTH_KEY) for graph in graphs}, key=str)
    if len(float_bitwidths) > 1:
        raise GenieBuildError(graphs[0].path, f"the graphs were converted with different float bitwidths "
                                              f"{float_bitwidths}; convert them alike")
    return AppliedOptions(
        weights_packing=options.weights_packing, packable_weights=sum(entry.packable_int4 for entry in entries),
        packed_weights=sum(entry.storage in _PACKED_STORAGE for entry in entries),
        weight_sharing_enabled=options.weight_sharing_enabled,
        shared_weights=sum(len(entry.graphs) > 1 for entry in entries),
        optimization_type=options.optimization_type, vtcm_mb=options.vtcm_mb, soc_model=options.soc_model,
        dsp_arch=options.dsp_arch, float_bitwidth=float_bitwidths[0])


# ------------------------------------------------------------------------------------------- reading

@dataclass(frozen=True)
class ContainerGraph:
    """One graph of a container, its weights apart: ``model`` has its initializers without data (name, type,
    dims), ``weights`` their values by name. A weight the container stores once for several graphs is one
    array in each of them."""

    model: onnx.ModelProto
    weights: dict[str, np.ndarray]


def read_graphs(path: str | os.PathLike[str], *, inside: Iterable[str | os.PathLike[str]] | None = None
                ) -> dict[str, ContainerGraph]:
    """Every graph of a container, by name, with its weights decoded once per weight-table entry: memory holds
    the weights once, unpacked to their dtype, and no serialized copy of them.

    Args:
        inside: read the file only if it lies inside one of these folders (a bundle's), symlinks resolved.

    Raises:
        GenieBuildError: the file is not a reference container, or is truncated or inconsistent.
    """
    layout = read_layout(path, inside=inside)
    decoded: dict[int, np.ndarray] = {}  # by index in the weight table
    graphs = {}
    with open_regular(path, inside=inside) as handle:
        for graph in layout.header["graphs"]:
            try:
                graphs[graph["name"]] = _read_graph(handle, layout, graph, decoded, path)
            except (ProtobufError, KeyError, TypeError, ValueError) as exc:  # a header that lies about a record
                raise GenieBuildError(path, f"graph {graph.get('name')!r} does not decode as its header says: "
                                            f"{exc!r}") from None
    return graphs


def _read_graph(handle: BinaryIO, layout: Layout, graph: dict, decoded: dict[int, np.ndarray],
                path: str | os.PathLike[str]) -> ContainerGraph:
    """One graph of :func:`read_graphs`: its structure, and its weights decoded (into ``decoded``) unless another
    graph's were the same entry."""
    handle.seek(layout.graph_section_start + graph["structure_offset"])
    model = onnx.ModelProto.FromString(handle.read(graph["structure_length"]))
    indices = {entry.name: index for index, entry in enumerate(layout.weights) if graph["name"] in entry.graphs}
    entries = {name: layout.weights[index] for name, index in indices.items()}
    weights = {}
    for tensor in model.graph.initializer:
        if tensor.name not in entries:
            raise GenieBuildError(path, f"graph {graph['name']!r}: initializer {tensor.name!r} is missing "
                                        "from the weight table")
        index = indices[tensor.name]
        if index not in decoded:
            decoded[index] = _decode(handle, layout, entries, tensor.name)
        weights[tensor.name] = decoded[index]
    return ContainerGraph(model=model, weights=weights)


def load_container(path: str | os.PathLike[str]) -> dict[str, onnx.ModelProto]:
    """Rebuild every graph of a container as a runnable model, weights restored into its initializers.

    Run in onnxruntime, each model computes exactly what the converted ONNX it was compiled from computes.
    It holds each graph's weights in full (a shared weight once per graph); :func:`read_graphs` does not.

    Raises:
        GenieBuildError: the file is not a reference container, or is truncated or inconsistent.
    """
    models = {}
    for name, graph in read_graphs(path).items():
        for tensor in graph.model.graph.initializer:
            tensor.raw_data = graph.weights[tensor.name].tobytes()
        models[name] = graph.model
    return models


def _decode(handle: BinaryIO, layout: Layout, entries: dict[str, WeightEntry], name: str) -> np.ndarray:
    """One tensor's values, unpacked from its storage, with no temporary wider than 2 bytes per value."""
    entry = entries[name]
    handle.seek(layout.weight_section_start + entry.offset)
    payload = handle.read(entry.length)
    shape, dtype = entry.shape, np.dtype(entry.dtype)
    if entry.storage == "packed4":
        return unpack_int4(payload, math.prod(shape)).reshape(shape).astype(dtype, copy=False)
    if entry.storage == "packed4_signed":
        # q - zero_point + 8 of a weight of at most 8 bits: q and the zero point fit int16
        quantization = entry.quantization
        zero_point = _decode(handle, layout, entries, quantization.zero_point).astype(np.int16)
        signed = unpack_int4(payload, math.prod(shape)).reshape(shape).astype(np.int16)
        signed -= 8
        signed += broadcast_params(zero_point, shape, quantization.axis)
        return signed.astype(dtype)
    return np.frombuffer(payload, dtype=dtype).reshape(shape)
