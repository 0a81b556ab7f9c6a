"""Reading and writing ONNX initializers one at a time, so memory holds one weight, never the model."""

from __future__ import annotations

import json
import os
from typing import BinaryIO

import numpy as np
import onnx
from onnx import numpy_helper

from genie_build.errors import GenieBuildError
from genie_build.fileio import COPY_CHUNK_BYTES
from genie_build.onnx_graph import StoredTensor, check_external_data, load_graph, open_external_data

__all__ = ["ExternalDataWriter", "SharedWeights", "default_opset", "load_external_bytes", "metadata_json",
           "read_initializer", "remove_metadata", "set_metadata_json"]

# Element types stored as little-endian numpy values of the same width, one per element.
_PLAIN_NUMPY_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                                onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16,
                                onnx.TensorProto.UINT16, onnx.TensorProto.INT32, onnx.TensorProto.UINT32,
                                onnx.TensorProto.INT64, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL})
# Element types whose raw bytes are not one numpy element each (packed nibbles, strings).
_UNSUPPORTED_TYPES = frozenset({onnx.TensorProto.INT4, onnx.TensorProto.UINT4, onnx.TensorProto.FLOAT4E2M1,
                                onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED})


def read_initializer(tensor: onnx.TensorProto, model_path: str | os.PathLike[str], what: str = "") -> np.ndarray:
    """The values of one tensor of the model at ``model_path`` (an initializer, or ``what`` says where it is),
    inline or external.

    The graph's proto is left as it was, so loading every weight in turn keeps one of them in memory at a time.
    External bytes are read through :func:`genie_build.onnx_graph.open_external_data` (inside the model's folder,
    a regular file, the range checked); those of a plain numpy type straight into the array: through a proto they
    would be in memory three times at once (the bytes read, the proto's copy, the array).

    Raises:
        GenieBuildError: an element type without a one-element-per-item numpy form (4-bit, string), or
            external data that cannot be read.
    """
    stored = StoredTensor(what or f"initializer {tensor.name!r}", tensor)
    if tensor.data_type in _UNSUPPORTED_TYPES:
        raise GenieBuildError(model_path, f"{stored.what} has element type "
                                          f"{onnx.TensorProto.DataType.Name(tensor.data_type)}, which the "
                                          "reference toolchain does not handle")
    try:
        if tensor.data_location == onnx.TensorProto.EXTERNAL and tensor.data_type in _PLAIN_NUMPY_TYPES:
            return _read_external_array(stored, model_path)
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        if copy.data_location == onnx.TensorProto.EXTERNAL:
            load_external_bytes(StoredTensor(stored.what, copy), model_path)
        return numpy_helper.to_array(copy)
    except (OSError, ValueError, onnx.checker.ValidationError) as exc:
        raise GenieBuildError(model_path, f"cannot read {stored.what}: {exc}") from None


def _read_external_array(stored: StoredTensor, model_path: str | os.PathLike[str]) -> np.ndarray:
    tensor = stored.tensor
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
    count = int(np.prod(tensor.dims, dtype=np.int64))
    with open_external_data(stored, model_path) as (data, _):
        values = np.fromfile(data, dtype=dtype, count=count)
    if values.size != count:
        raise ValueError(f"external data file ends after {values.size} of {count} values")
    return values.astype(dtype.newbyteorder("="), copy=False).reshape(tuple(tensor.dims))


def load_external_bytes(stored: StoredTensor, model_path: str | os.PathLike[str]) -> None:
    """Move an external tensor's bytes into ``raw_data`` (the tensor becomes inline). Read here rather than by
    onnx, which refuses a data file reached through a symlink, as Snakemake's between-workflow cache leaves its
    outputs.

    Raises:
        GenieBuildError: as :func:`genie_build.onnx_graph.external_data`.
    """
    tensor = stored.tensor
    with open_external_data(stored, model_path) as (data, ref):
        tensor.raw_data = data.read(ref.length)
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT


class ExternalDataWriter:
    """Appends tensors to an open data file and makes the initializers that point at them.

    Tensors under ``inline_max_bytes`` stay inside the graph instead, as onnx's own writer does: shape
    inference (onnxruntime's too) reads Reshape shapes and other small constants only from the graph.

    Args:
        handle: the data file, open for binary writing at position 0.
        location: its name relative to the model (what the initializers record).
        alignment: every tensor starts at a multiple of this many bytes.
        inline_max_bytes: smaller tensors stay inline.
    """

    def __init__(self, handle: BinaryIO, location: str, alignment: int = 64, inline_max_bytes: int = 1024) -> None:
        self._handle = handle
        self._location = location
        self._alignment = alignment
        self._inline_max_bytes = inline_max_bytes
        self._end = 0

    def add(self, name: str, array: np.ndarray, *, data_type: int | None = None,
            dims: tuple[int, ...] | None = None) -> onnx.TensorProto:
        """Write ``array`` (unless it is small) and return an initializer called ``name`` holding it.

        ``data_type`` and ``dims`` describe values whose bytes are not one numpy element each (4-bit values packed
        two a byte); by default the array's own type and shape."""
        data = np.asarray(array, order="C")  # not ascontiguousarray: it turns a scalar into shape (1,)
        tensor = onnx.TensorProto(name=name, dims=data.shape if dims is None else dims,
                                  data_type=data_type or onnx.helper.np_dtype_to_tensor_dtype(data.dtype))
        if data.nbytes < self._inline_max_bytes:
            tensor.raw_data = data.astype(data.dtype.newbyteorder("<"), copy=False).tobytes()
            return tensor
        offset = self._end + (-self._end % self._alignment)
        self._handle.write(b"\0" * (offset - self._end))
        self._handle.write(data.reshape(-1).view(np.uint8))  # the array's own bytes: tobytes() would copy them
        self._end = offset + data.nbytes
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self._location), ("offset", str(offset)), ("length", str(data.nbytes))):
            tensor.external_data.add(key=key, value=value)
        return tensor


class SharedWeights:
    """The external tensors of a converted graph that another graph converted into the same folder points at
    instead of storing them again: a part's graphs at every context length, and its token graph, hold the same
    quantized weights as its prompt graph, and a copy each would put 2 x lengths times the part's weights on disk.

    Args:
        model_path: the converted graph (its data file beside it) whose tensors may be shared.

    Raises:
        GenieBuildError: an unreadable graph or data file.
    """

    def __init__(self, model_path: str | os.PathLike[str]) -> None:
        self._path = os.fspath(model_path)
        self.model = load_graph(self._path)
        check_external_data(self.model, self._path)
        self._tensors = {tensor.name: tensor for tensor in self.model.graph.initializer
                         if tensor.data_location == onnx.TensorProto.EXTERNAL}

    @property
    def folder(self) -> str:
        return os.path.dirname(os.path.abspath(self._path))

    def find(self, name: str, array: np.ndarray, *, data_type: int | None = None,
             dims: tuple[int, ...] | None = None) -> onnx.TensorProto | None:
        """An initializer called ``name`` pointing at the shared graph's tensor of that name, if it holds exactly
        ``array`` (type, shape and bytes; ``data_type`` and ``dims`` as for :meth:`ExternalDataWriter.add`); None
        otherwise. Compared a chunk at a time: no second copy of a weight is held."""
        tensor = self._tensors.get(name)
        if (tensor is None or tuple(tensor.dims) != (array.shape if dims is None else tuple(dims))
                or tensor.data_type != (data_type or onnx.helper.np_dtype_to_tensor_dtype(array.dtype))):
            return None
        wanted = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        with open_external_data(StoredTensor(f"initializer {name!r}", tensor), self._path) as (data, ref):
            if ref.length != wanted.size:
                return None
            for start in range(0, ref.length, COPY_CHUNK_BYTES):
                chunk = data.read(min(COPY_CHUNK_BYTES, ref.length - start))
                if chunk != wanted[start:start + len(chunk)].tobytes():
                    return None
        shared = onnx.TensorProto()
        shared.CopyFrom(tensor)
        return shared


def default_opset(model: onnx.ModelProto) -> int:
    """The model's opset version of the default (``ai.onnx``) domain."""
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 1)


def metadata_json(model: onnx.ModelProto, key: str, default: object = None) -> object:
    """The JSON value stored under ``key`` in the model's ``metadata_props`` (``default`` when absent)."""
    for entry in model.metadata_props:
        if entry.key == key:
            return json.loads(entry.value)
    return default


def remove_metadata(model: onnx.ModelProto, key: str) -> None:
    """Drop the entries under ``key`` from the model's ``metadata_props``."""
    kept = [entry for entry in model.metadata_props if entry.key != key]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)


def set_metadata_json(model: onnx.ModelProto, key: str, value: object) -> None:
    """Store ``value`` as canonical JSON under ``key`` in ``metadata_props``, replacing an earlier value."""
    remove_metadata(model, key)
    model.metadata_props.add(key=key, value=json.dumps(value, sort_keys=True, separators=(",", ":")))
