"""A model's stored bytes: where an external tensor's data is, opening it inside the model's folder, and the
checks every tensor passes before anything reads it."""

from __future__ import annotations

import contextlib
import math
import os
import re
import stat
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import onnx

from genie_build.errors import GenieBuildError
from genie_build.fileio import open_regular, resolve_inside
from genie_build.onnx_graph.model import FOUR_BIT_TYPES, stored_nbytes
from genie_build.onnx_graph.tensors import StoredTensor, graph_and_subgraphs, model_tensors

__all__ = ["ExternalData", "check_external_data", "external_data", "external_data_files", "model_folders",
           "open_external_data"]

@dataclass(frozen=True)
class ExternalData:
    """Where an external tensor's bytes are: ``path`` as the model names it (its folder / ``location``),
    ``real_path`` with every symlink resolved (checked to be a regular file inside the model's folder), and the
    byte range."""

    location: str
    path: Path
    real_path: Path
    offset: int
    length: int


_DECIMAL = re.compile(r"[0-9]+")


def model_folders(model_path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """The folders a model's external data may lie in: the folder the model is named in, and the folder its
    file really is in (when it is a symlink, as in a Hugging Face hub cache or Snakemake's output cache) --
    the rule onnxruntime applies too."""
    named = Path(model_path).parent
    return named, Path(os.path.realpath(model_path)).parent


def external_data(stored: StoredTensor, model_path: str | os.PathLike[str]) -> ExternalData:
    """Resolve an external tensor's bytes: the one place a ``location``/``offset``/``length`` is read.

    ``location`` must be a relative path inside the model's folder (:func:`model_folders`) once symlinks are
    resolved, naming a regular file; ``offset`` and ``length`` non-negative decimal integers (as onnx's
    ``ExternalDataInfo`` requires) whose range lies within the file and holds exactly the bytes the tensor's
    shape and type need.

    Raises:
        GenieBuildError: naming the model file, the tensor and the problem.
    """
    where = os.fspath(model_path)
    info = {entry.key: entry.value for entry in stored.tensor.external_data}
    location = info.get("location", "")
    parts = PurePosixPath(location).parts
    if not location or "\0" in location or PurePosixPath(location).is_absolute() or ".." in parts:
        raise GenieBuildError(where, f"{stored.what}: external data location {location!r} must be a file name "
                                     "relative to the model's folder")
    numbers = {}
    for key in ("offset", "length"):
        if key in info and not _DECIMAL.fullmatch(info[key]):
            raise GenieBuildError(where, f"{stored.what}: external data {key} {info[key]!r} is not a non-negative "
                                         "integer")
        numbers[key] = int(info[key]) if key in info else None
    path = Path(where).parent / location
    real = _resolve_data_file(stored, where, path, location)
    size = real.stat().st_size
    offset = numbers["offset"] or 0
    length = size - offset if numbers["length"] is None else numbers["length"]
    if offset + max(length, 0) > size or length < 0:
        raise GenieBuildError(where, f"{stored.what}: offset {offset} + length {length} runs past the end of "
                                     f"{path} ({size} bytes; truncated data file?)")
    expected = stored_nbytes(stored.tensor, where, stored.what)
    if length != expected:
        type_name = onnx.TensorProto.DataType.Name(stored.tensor.data_type)
        raise GenieBuildError(where, f"{stored.what}: external length {length} in {path} but shape "
                                     f"{list(stored.tensor.dims)} of {type_name} needs {expected} bytes")
    return ExternalData(location=location, path=path, real_path=real, offset=offset, length=length)


def _resolve_data_file(stored: StoredTensor, where: str, path: Path, location: str) -> Path:
    """The real path of a data file, checked to be inside the model's folder and a regular file."""
    try:
        real = resolve_inside(path, model_folders(where))
    except GenieBuildError as exc:
        raise GenieBuildError(where, f"{stored.what}: external data file {location!r} {exc.problem}") from None
    try:
        status = real.stat()
    except FileNotFoundError:
        raise GenieBuildError(where, f"{stored.what}: external data file {path} not found (copy it next to the "
                                     ".onnx file)") from None
    except OSError as exc:
        raise GenieBuildError(where, f"{stored.what}: external data file {path}: cannot read: "
                                     f"{exc.strerror or exc}") from None
    if not stat.S_ISREG(status.st_mode):
        raise GenieBuildError(where, f"{stored.what}: external data file {path} is not a regular file")
    return real


@contextlib.contextmanager
def open_external_data(stored: StoredTensor, model_path: str | os.PathLike[str]
                       ) -> Iterator[tuple[BinaryIO, ExternalData]]:
    """Open an external tensor's data file (:func:`external_data`, then
    :func:`genie_build.fileio.open_regular` inside the model's folder), positioned at the tensor's first byte.

    Raises:
        GenieBuildError: as :func:`external_data`, or the file cannot be opened.
    """
    ref = external_data(stored, model_path)
    with open_regular(ref.path, inside=model_folders(model_path)) as handle:
        handle.seek(ref.offset)
        yield handle, ref


def check_external_data(model: onnx.ModelProto, path: str | os.PathLike[str]) -> list[Path]:
    """Check every tensor the model stores (:func:`model_tensors`: initializers, node attributes, subgraphs,
    functions) before anything reads it: external data as :func:`external_data` resolves it, inline data holding
    what its shape needs, no initializer name defined twice in one graph, and no sparse initializer (a split
    part could not carry it).

    Args:
        model: the graph, loaded with :func:`load_graph`.
        path: the ``.onnx`` file it came from; data file locations are relative to its folder.

    Returns:
        The external data files, sorted, each once, as the model names them (the inputs of a job reading the
        model's weights: a changed weight must rerun it even if the ``.onnx`` did not change).

    Raises:
        GenieBuildError: naming ``path`` and the tensor: a data file that is missing, not a regular file or
            outside the model's folder, an offset or length that is not a non-negative integer or runs past the
            file's end, a length or inline size that does not match the shape, a duplicate initializer, or a
            sparse initializer.
    """
    where = os.fspath(path)
    _check_unique_initializers(model, where)
    files = set()
    for stored in model_tensors(model):
        if stored.sparse and stored.what.startswith("sparse initializer"):
            raise GenieBuildError(where, f"{stored.what}: sparse initializers are not supported (a split part "
                                         "could not carry it); store the tensor dense")
        if stored.tensor.data_location == onnx.TensorProto.EXTERNAL:
            files.add(external_data(stored, where).path)
        else:
            _check_inline_size(stored, where)
    return sorted(files)


def external_data_files(model: onnx.ModelProto, path: str | os.PathLike[str]) -> list[Path]:
    """The external data files a model's tensors live in (:func:`check_external_data`, which checks them)."""
    return check_external_data(model, path)


def _check_unique_initializers(model: onnx.ModelProto, where: str) -> None:
    for graph in graph_and_subgraphs(model.graph):
        counts = Counter(tensor.name for tensor in graph.initializer)
        counts.update(sparse.values.name for sparse in graph.sparse_initializer)
        repeated = sorted(name for name, count in counts.items() if count > 1)
        if repeated:
            scope = "" if graph is model.graph else f" in subgraph {graph.name!r}"
            raise GenieBuildError(where, f"initializer {repeated[0]!r}{scope} is defined {counts[repeated[0]]} "
                                         f"times{f' (and {len(repeated) - 1} more names)' if len(repeated) > 1 else ''}"
                                         "; every initializer needs its own name")


def _check_inline_size(stored: StoredTensor, where: str) -> None:
    """An inline tensor holds as many values as its shape says (raw bytes, or elements of its typed field)."""
    tensor = stored.tensor
    if tensor.data_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING):
        return
    if tensor.HasField("raw_data"):
        found, expected, what = len(tensor.raw_data), stored_nbytes(tensor, where, stored.what), "bytes"
    else:
        field_name = onnx.helper.tensor_dtype_to_field(tensor.data_type)
        count = math.prod(tensor.dims)
        per_value = 2 if tensor.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128) else 1
        expected = (count + 1) // 2 if tensor.data_type in FOUR_BIT_TYPES else count * per_value
        found, what = len(getattr(tensor, field_name)), f"{field_name} values"
    if found != expected:
        raise GenieBuildError(where, f"{stored.what}: holds {found} {what} but shape {list(tensor.dims)} of "
                                     f"{onnx.TensorProto.DataType.Name(tensor.data_type)} needs {expected}")
