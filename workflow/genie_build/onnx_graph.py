"""Load and check ONNX graphs without their weights.

Everything here reads the graph protobuf only (``load_external_data=False``); weight bytes are touched
only to hash them, streamed in chunks, so memory stays bounded by the graph, not the model.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import Error as ProtobufError
from onnx import numpy_helper

from genie_build.conventions import graph_ar_cl
from genie_build.errors import GenieBuildError
from genie_build.fileio import copy_range, write_json

Dim = int | str | None   # a fixed size, a symbolic name, or unknown
Shape = tuple[Dim, ...]

# Types whose elements are packed two per byte in raw_data.
_FOUR_BIT_TYPES = frozenset({onnx.TensorProto.INT4, onnx.TensorProto.UINT4, onnx.TensorProto.FLOAT4E2M1})
_MAX_LISTED_DIFFERENCES = 3


@dataclass(frozen=True)
class InitializerSpec:
    """An initializer as the graph declares it; ``nbytes`` is the size of its data as stored."""

    name: str
    shape: tuple[int, ...]
    dtype: str            # numpy name: "float32", "int64", "int4", ...
    nbytes: int


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output."""

    name: str
    shape: Shape
    dtype: str


@dataclass(frozen=True)
class GraphIO:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


# ------------------------------------------------------------------------------------------- loading

def load_graph(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Load an ONNX model's graph, leaving external weights on disk.

    Raises:
        GenieBuildError: the file is missing, unreadable, not a protobuf (truncated or corrupt), or holds
            no graph.
    """
    where = os.fspath(path)
    try:
        model = onnx.load(where, load_external_data=False)
    except FileNotFoundError:
        raise GenieBuildError(where, "file not found") from None
    except OSError as exc:
        raise GenieBuildError(where, f"cannot read: {exc.strerror or exc}") from None
    except (ProtobufError, ValueError, RuntimeError) as exc:
        raise GenieBuildError(where, f"not a valid ONNX model (truncated or corrupt file?): {exc}") from None
    if not model.graph.node:
        raise GenieBuildError(where, "not an ONNX model with a graph: it has no nodes (empty or truncated file?)")
    if not model.opset_import:
        raise GenieBuildError(where, "ONNX model has no opset_import (truncated file?)")
    return model


def check_external_data(model: onnx.ModelProto, path: str | os.PathLike[str]) -> None:
    """Check that every external initializer's bytes are where the graph says, with the right length.

    Args:
        model: the graph, loaded with :func:`load_graph`.
        path: the ``.onnx`` file it came from; data file locations are relative to its folder.

    Raises:
        GenieBuildError: a data file is missing or escapes the model's folder, or a tensor's
            offset + length runs past the end of its file, or its length does not match its shape.
    """
    base = Path(path).parent
    sizes: dict[Path, int] = {}
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = external_info(tensor, path)
        data_file = base / info["location"]
        if data_file not in sizes:
            if not data_file.is_file():
                raise GenieBuildError(path, f"initializer {tensor.name!r}: external data file {data_file} "
                                            "not found (copy it next to the .onnx file)")
            sizes[data_file] = data_file.stat().st_size
        file_size = sizes[data_file]
        offset = int(info.get("offset", 0))
        length = int(info.get("length", file_size - offset))
        if offset + length > file_size:
            raise GenieBuildError(path, f"initializer {tensor.name!r}: offset {offset} + length {length} runs "
                                        f"past the end of {data_file} ({file_size} bytes; truncated data file?)")
        expected = _stored_nbytes(tensor)
        if length != expected:
            raise GenieBuildError(path, f"initializer {tensor.name!r}: external length {length} in {data_file} "
                                        f"but shape {list(tensor.dims)} of "
                                        f"{onnx.TensorProto.DataType.Name(tensor.data_type)} needs {expected} bytes")


def external_data_files(model: onnx.ModelProto, path: str | os.PathLike[str]) -> list[Path]:
    """The external data files a graph's initializers live in (sorted, each once), for declaring them as
    inputs of the jobs that read the graph: a changed weight must rerun them even if the ``.onnx`` did not change.

    Raises:
        GenieBuildError: a location is absolute or escapes the model's folder.
    """
    base = Path(path).parent
    return sorted({base / external_info(tensor, path)["location"] for tensor in model.graph.initializer
                   if tensor.data_location == onnx.TensorProto.EXTERNAL})


def external_info(tensor: onnx.TensorProto, path: str | os.PathLike[str]) -> dict[str, str]:
    """An external initializer's ``location``/``offset``/``length`` entries, its location checked to be a file
    name relative to the model's folder (raises GenieBuildError otherwise)."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    if not location or os.path.isabs(location) or ".." in Path(location).parts:
        raise GenieBuildError(path, f"initializer {tensor.name!r}: external data location {location!r} must be "
                                    "a file name relative to the model's folder")
    return info


# ------------------------------------------------------------------------------------------- inspecting

def initializer_specs(model: onnx.ModelProto) -> dict[str, InitializerSpec]:
    """Name, shape, dtype and stored size of every initializer, read from the graph only."""
    return {tensor.name: InitializerSpec(name=tensor.name, shape=tuple(tensor.dims),
                                         dtype=_dtype_name(tensor.data_type), nbytes=_stored_nbytes(tensor))
            for tensor in model.graph.initializer}


def graph_io(model: onnx.ModelProto) -> GraphIO:
    """The graph's real inputs (initializers listed as inputs by old exporters are left out) and outputs."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = tuple(_tensor_spec(value) for value in model.graph.input if value.name not in initializers)
    return GraphIO(inputs=inputs, outputs=tuple(_tensor_spec(value) for value in model.graph.output))


def tensor_shapes(model: onnx.ModelProto) -> dict[str, Shape]:
    """Shapes of every tensor the graph knows: inputs, outputs, value_info and initializers.

    When some node output has no shape recorded, shape inference runs on the weight-less graph (cheap:
    it reads initializer dims, never their data).
    """
    graph = model.graph
    known = {value.name for value in (*graph.input, *graph.output, *graph.value_info)}
    if any(output and output not in known for node in graph.node for output in node.output):
        graph = onnx.shape_inference.infer_shapes(model).graph
    shapes = {value.name: _tensor_spec(value).shape for value in (*graph.input, *graph.output, *graph.value_info)
              if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape")}
    shapes.update((tensor.name, tuple(tensor.dims)) for tensor in graph.initializer)
    return shapes


def _tensor_spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor_type = value.type.tensor_type
    shape = tuple(_dim(dim) for dim in tensor_type.shape.dim)
    return TensorSpec(name=value.name, shape=shape, dtype=_dtype_name(tensor_type.elem_type))


def _dim(dim: onnx.TensorShapeProto.Dimension) -> Dim:
    if dim.HasField("dim_value"):
        return dim.dim_value
    return dim.dim_param or None


def _dtype_name(data_type: int) -> str:
    if data_type == onnx.TensorProto.UNDEFINED:
        return "undefined"
    return onnx.helper.tensor_dtype_to_np_dtype(data_type).name


def _stored_nbytes(tensor: onnx.TensorProto) -> int:
    count = math.prod(tensor.dims)
    if tensor.data_type in _FOUR_BIT_TYPES:
        return (count + 1) // 2
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


# ------------------------------------------------------------------------------------------- sharing

def check_model(prompt_path: str, token_path: str, out: str | os.PathLike[str]) -> dict:
    """The check-model stage: both graphs' weights are all there (:func:`check_external_data`) and the shared
    ones agree (:func:`check_shared_initializers`); writes and returns a summary of what they share.

    Raises:
        GenieBuildError: a weight file is missing or short, or a shared weight differs.
    """
    graphs = {"prompt": load_graph(prompt_path), "token": load_graph(token_path)}
    check_external_data(graphs["prompt"], prompt_path)
    check_external_data(graphs["token"], token_path)
    check_shared_initializers(prompt_path, token_path)
    specs = {kind: initializer_specs(model) for kind, model in graphs.items()}
    shared = sorted(set(specs["prompt"]) & set(specs["token"]))
    summary = {"prompt": prompt_path, "token": token_path, "shared_initializers": len(shared),
               "shared_bytes": sum(specs["prompt"][name].nbytes for name in shared)}
    write_json(out, summary)
    return summary



def check_shared_initializers(prompt_path: str | os.PathLike[str], token_path: str | os.PathLike[str]) -> None:
    """Check that initializers with the same name in both graphs are the same tensor: shape, dtype and value.

    Weight sharing between the prompt and token graphs keys on names, and some exporters reuse a name for
    different constants in the two graphs; values are compared by a streamed sha256 of each tensor's
    bytes, so memory stays bounded by one copy chunk. Run :func:`check_external_data` on both first.

    Raises:
        GenieBuildError: naming both files, the tensor(s) and what differs.
    """
    prompt, token = load_graph(prompt_path), load_graph(token_path)
    prompt_tensors = {tensor.name: tensor for tensor in prompt.graph.initializer}
    differences = []
    for tensor in token.graph.initializer:
        other = prompt_tensors.get(tensor.name)
        if other is None:
            continue
        difference = _tensor_difference(other, prompt_path, tensor, token_path)
        if difference:
            differences.append(f"{tensor.name!r} {difference}")
    if differences:
        listed = "; ".join(differences[:_MAX_LISTED_DIFFERENCES])
        more = len(differences) - _MAX_LISTED_DIFFERENCES
        raise GenieBuildError(token_path, f"{len(differences)} initializer(s) named like ones in {prompt_path} hold "
                                          f"different data: {listed}{f'; and {more} more' if more > 0 else ''}. "
                                          "The prompt and token graphs must share identical weights "
                                          "(export both with the same exporter settings)")


def _tensor_difference(prompt: onnx.TensorProto, prompt_path: str | os.PathLike[str],
                       token: onnx.TensorProto, token_path: str | os.PathLike[str]) -> str | None:
    """How two same-named tensors differ (prompt value first), or None when they are identical."""
    if list(prompt.dims) != list(token.dims):
        return f"has shape {list(prompt.dims)} in the prompt graph but {list(token.dims)} in the token graph"
    if prompt.data_type != token.data_type:
        return (f"has dtype {_dtype_name(prompt.data_type)} in the prompt graph "
                f"but {_dtype_name(token.data_type)} in the token graph")
    if tensor_sha256(prompt, prompt_path) != tensor_sha256(token, token_path):
        return f"has the same shape {list(prompt.dims)} and dtype but different values"
    return None


def tensor_sha256(tensor: onnx.TensorProto, model_path: str | os.PathLike[str]) -> str:
    """sha256 of a tensor's little-endian element bytes, wherever they are stored.

    External data is streamed from its file in chunks; inline data is hashed from the protobuf.
    """
    sink = _DigestSink()
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = external_info(tensor, model_path)
        with open(Path(model_path).parent / info["location"], "rb") as source:
            copy_range(source, sink, int(info.get("offset", 0)), int(info.get("length", _stored_nbytes(tensor))))
    elif tensor.HasField("raw_data"):
        sink.write(tensor.raw_data)
    else:
        # Typed fields (float_data, int64_data, ...) decode to the same bytes raw_data would hold.
        sink.write(numpy_helper.to_array(tensor).tobytes())
    return sink.digest.hexdigest()


class _DigestSink:
    """A write-only file that hashes what :func:`genie_build.fileio.copy_range` streams into it."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()

    def write(self, chunk: bytes) -> None:
        self.digest.update(chunk)


def ar_and_context_length(model: onnx.ModelProto) -> tuple[int, int] | None:
    """(AR, CL) as Genie reads them from the graph's tensors (:func:`genie_build.conventions.graph_ar_cl`).

    Returns None when Genie could not read either of them from the tensors.
    """
    io = graph_io(model)
    ar, context_length = graph_ar_cl("", io.inputs, io.outputs)
    return (ar, context_length) if ar and context_length else None
