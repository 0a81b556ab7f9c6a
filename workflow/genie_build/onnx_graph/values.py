"""A tensor's values, streamed once from wherever they are stored: their sha256, and that a float weight holds
no NaN or infinity."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import onnx
from onnx import numpy_helper

from genie_build.errors import GenieBuildError
from genie_build.fileio import HashingWriter, copy_range
from genie_build.onnx_graph.external import open_external_data
from genie_build.onnx_graph.tensors import StoredTensor

__all__ = ["FINITE_CHECK_CHUNK", "FLOAT_TYPES", "require_finite", "scan_tensor", "tensor_sha256"]

# Float element types a weight may hold NaN or infinity in.
FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                         onnx.TensorProto.BFLOAT16})


def tensor_sha256(tensor: onnx.TensorProto, model_path: str | os.PathLike[str]) -> str:
    """sha256 of a tensor's little-endian element bytes, wherever they are stored (:func:`scan_tensor`)."""
    return scan_tensor(tensor, model_path, digest=True)


def scan_tensor(tensor: onnx.TensorProto | StoredTensor, model_path: str | os.PathLike[str], *,
                digest: bool = False, finite: bool = False) -> str | None:
    """Stream a tensor's element bytes once: hash them, and/or require a float tensor to be finite.

    External data is streamed from its file in chunks (:func:`open_external_data`); inline data is read from
    the protobuf. Memory stays bounded by one copy chunk.

    Returns:
        The sha256 of the bytes when ``digest``, else None.

    Raises:
        GenieBuildError: (``finite``) naming ``model_path``, the tensor, the first non-finite value and its index;
            or the external data cannot be read.
    """
    stored = tensor if isinstance(tensor, StoredTensor) else StoredTensor(f"initializer {tensor.name!r}", tensor)
    tensor = stored.tensor
    checker = _FiniteChecker(tensor) if finite and tensor.data_type in FLOAT_TYPES else None
    if not digest and checker is None:
        return None
    sink = HashingWriter(hashlib.sha256(), checker)
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        with open_external_data(stored, model_path) as (source, ref):
            copy_range(source, sink, ref.offset, ref.length)
    elif tensor.HasField("raw_data"):
        sink.write(tensor.raw_data)
    else:
        # Typed fields (float_data, int64_data, ...) decode to the same bytes raw_data would hold.
        sink.write(numpy_helper.to_array(tensor).tobytes())
    if checker is not None:
        checker.require_finite(model_path, stored.what)
    return sink.digest.hexdigest() if digest else None


class _FiniteChecker:
    """A write-only sink that reads the float values streaming through it and remembers the first that is NaN or
    infinite (chunks may end inside a value: the rest is carried to the next write)."""

    def __init__(self, tensor: onnx.TensorProto) -> None:
        self.tensor = tensor
        self.dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
        self.carry = b""
        self.seen = 0
        self.first: tuple[int, float] | None = None

    def write(self, data: bytes) -> int:
        """Look at the whole values in ``data`` (with what the last write left over); always takes all of it."""
        if self.first is None:
            buffer = memoryview(self.carry + bytes(data) if self.carry else data).cast("B")
            usable = len(buffer) - len(buffer) % self.dtype.itemsize
            values = np.frombuffer(buffer[:usable], dtype=self.dtype)
            bad = np.flatnonzero(~np.isfinite(values))
            if bad.size:
                self.first = (self.seen + int(bad[0]), float(values[bad[0]]))
            self.seen += values.size
            self.carry = bytes(buffer[usable:])
        return len(data)

    def require_finite(self, model_path: str | os.PathLike[str], what: str) -> None:
        if self.first is not None:
            raise GenieBuildError(model_path, _nonfinite_problem(what, *self.first, tuple(self.tensor.dims)))


FINITE_CHECK_CHUNK = 1 << 22


def require_finite(values: np.ndarray, what: str, where: str | os.PathLike[str]) -> None:
    """Require a float array to hold no NaN or infinity (other arrays pass).

    Raises:
        GenieBuildError: naming ``where``, ``what`` (the tensor), the first bad value and its index.
    """
    if not (np.issubdtype(values.dtype, np.floating) or values.dtype.kind == "V"):
        return
    flat = values.reshape(-1)
    for start in range(0, flat.size, FINITE_CHECK_CHUNK):  # a chunk at a time: a whole-table mask is GBs for a 7B model
        finite = np.isfinite(flat[start:start + FINITE_CHECK_CHUNK])
        if not finite.all():
            index = start + int(np.argmin(finite))
            raise GenieBuildError(where, _nonfinite_problem(what, index, float(flat[index]), values.shape))


def _nonfinite_problem(what: str, index: int, value: float, shape: tuple[int, ...]) -> str:
    position = [int(i) for i in np.unravel_index(index, shape)] if shape else []
    return (f"{what} holds {value} at index {position} (shape {[int(d) for d in shape]}): every float weight "
            "must be finite")
