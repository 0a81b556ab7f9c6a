"""A ``.npy`` file of one array per calibration or evaluation window (``[windows, *window]``), written and read one
window at a time, so that a job's memory holds one window of it whatever the count: the residual stream a unit of
the calibration chain hands to the next, the LM head's logits while its slices are calibrated, the float model's
logits of the evaluation."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np

from genie_build.errors import GenieBuildError
from genie_build.fileio import atomic_open

__all__ = ["WindowFile", "open_windows", "write_windows"]

_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


class _Writer:
    def __init__(self, handle: BinaryIO, windows: int, dtype: np.dtype) -> None:
        self._handle, self._windows, self._dtype = handle, windows, np.dtype(dtype)
        self.written = 0
        self._shape: tuple[int, ...] | None = None

    def append(self, window: np.ndarray) -> None:
        """The next window (every window of one shape, the first one's)."""
        if self._shape is None:
            self._shape = tuple(window.shape)
            np.lib.format.write_array_header_1_0(self._handle, {
                "descr": np.lib.format.dtype_to_descr(self._dtype), "fortran_order": False,
                "shape": (self._windows, *self._shape)})
        if tuple(window.shape) != self._shape or self.written == self._windows:
            raise ValueError(f"window {self.written} of shape {list(window.shape)}: the file holds "
                             f"{self._windows} of {list(self._shape)}")
        self._handle.write(np.ascontiguousarray(window, dtype=self._dtype).tobytes())
        self.written += 1


@contextmanager
def write_windows(path: str | os.PathLike[str], windows: int, dtype: np.dtype | type = np.float32
                  ) -> Iterator[_Writer]:
    """A writer of ``windows`` arrays into ``path``, in order (``append``); the file appears, atomically, only when
    all were written."""
    with atomic_open(path, "wb") as handle:
        writer = _Writer(handle, windows, dtype)
        yield writer
        if writer.written != windows:
            raise ValueError(f"{path}: {writer.written} windows written of {windows}")


class WindowFile:
    """An open window file: its shape and dtype, and one window at a time (:meth:`window`)."""

    def __init__(self, handle: BinaryIO, path: Path) -> None:
        self._handle, self.path = handle, path
        try:
            version = np.lib.format.read_magic(handle)
            read_header = _HEADER_READERS.get(version)
            if read_header is None:
                raise ValueError(f".npy format version {version}")
            shape, fortran, dtype = read_header(handle)
        except (ValueError, OSError) as exc:
            raise GenieBuildError(path, f"not a .npy file: {exc}") from None
        if fortran or not shape or dtype.hasobject:
            raise GenieBuildError(path, f"not an array of windows: shape {list(shape)}, dtype {dtype}")
        self.shape, self.dtype, self._start = tuple(shape), dtype, handle.tell()
        self._count = int(np.prod(self.shape[1:], dtype=np.int64))
        size = os.fstat(handle.fileno()).st_size
        if size != self._start + self.shape[0] * self._count * dtype.itemsize:
            raise GenieBuildError(path, f"holds {size} bytes, not the {list(self.shape)} {dtype} its header says")

    def window(self, index: int) -> np.ndarray:
        """Window ``index`` (a new array; nothing else of the file is read)."""
        self._handle.seek(self._start + index * self._count * self.dtype.itemsize)
        return np.fromfile(self._handle, self.dtype, self._count).reshape(self.shape[1:])


@contextmanager
def open_windows(path: str | os.PathLike[str]) -> Iterator[WindowFile]:
    """A window file written by :func:`write_windows` (or ``np.save``), open for reading window by window.

    Raises:
        GenieBuildError: the file cannot be read, is not a ``.npy`` file or holds fewer bytes than its header says.
    """
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise GenieBuildError(path, f"cannot read it: {exc.strerror}") from None
    with handle:
        yield WindowFile(handle, Path(path))
