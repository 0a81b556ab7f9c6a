"""Atomic outputs, and bounded inputs.

Every file is written under a temporary name beside its target and renamed into place, so an interrupted or
failed job never leaves something a later run would take as done.

Every file a user or a bundle hands us is opened through :func:`open_regular`: only a regular file (a FIFO would
block the reader, ``/dev/zero`` never ends), of at most a given size, and -- for files found through a folder, such
as a model's external data or a bundle's files -- only one whose real path (symlinks resolved) lies inside that
folder. A reader therefore never reads outside the folder it was pointed at, nor more than it allows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from genie_build.errors import GenieBuildError
from genie_build.units import GIB, MIB

__all__ = ["COPY_CHUNK_BYTES", "HashingWriter", "atomic_directory", "atomic_open", "copy_range", "is_json_int",
           "is_json_number", "open_regular", "read_json", "read_regular", "read_text", "regular_file_size",
           "resolve_inside", "sha256_file", "staging_directory", "write_bytes", "write_json", "write_text"]

COPY_CHUNK_BYTES = 16 * MIB
# The largest JSON document read whole (encodings of a 7B model with per-block scales are a few hundred MB; parsing
# takes about ten times the file's size in memory, so a larger one could not be held anyway).
MAX_JSON_BYTES = 2 * GIB


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish_mode(path: str | os.PathLike[str], base_mode: int) -> None:
    """mkstemp/mkdtemp create private files (0600/0700); give the result the modes a plain open() would."""
    os.chmod(path, base_mode & ~_current_umask())


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[Any]:
    """Open a temporary file beside ``path``; on success fsync and rename it over ``path``.

    Raises:
        GenieBuildError: the file could not be written (disk full, file too large, permissions).
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(target)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise GenieBuildError(target, f"cannot write: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        _publish_mode(tmp, 0o666)
        os.replace(tmp, target)
    except OSError as exc:
        _unlink_quietly(tmp)
        raise GenieBuildError(target, f"cannot write: {exc.strerror or exc}") from exc
    except BaseException:
        _unlink_quietly(tmp)
        raise


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_open(path, "wb") as handle:
        handle.write(data)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_open(path, "w") as handle:
        handle.write(text)


def write_json(path: str | os.PathLike[str], obj: Any, *, unless_same: bool = False) -> bool:
    """Write ``obj`` as JSON; with ``unless_same``, not when the file already holds those bytes (a file the workflow
    writes when it is parsed keeps its mtime, so Snakemake sees it unchanged).

    Returns:
        Whether the file was written.
    """
    text = json.dumps(obj, indent=2, sort_keys=False) + "\n"
    if unless_same:
        try:
            if Path(path).read_text(encoding="utf-8") == text:
                return False
        except (OSError, UnicodeDecodeError):
            pass   # absent or unreadable: written anew
    write_text(path, text)
    return True


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Build a directory under a temporary name and rename it into place when the block succeeds.

    An existing directory at ``path`` is replaced only after the new one is complete.
    """
    target = Path(path)
    with staging_directory(target.parent, target.name, mirrors=target) as staging:
        yield staging
        _publish_mode(staging, 0o777)
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, target)


@contextlib.contextmanager
def staging_directory(folder: str | os.PathLike[str], name: str, *, mirrors: str | os.PathLike[str]
                      ) -> Iterator[Path]:
    """A temporary directory ``folder/.<name>.<8 random characters>.tmp`` for a writer to fill before it moves what
    it wrote into place, removed when the block ends. A writer killed mid-write leaves only such a directory, which
    no reader takes for output and the next writer of ``name`` removes.

    Args:
        mirrors: the path the staging directory stands in for: an error naming a path inside it names the path
            under ``mirrors`` instead, and an ``OSError`` becomes ``GenieBuildError(mirrors, "cannot write: …")``.
    """
    target, mirrors = Path(folder) / name, Path(mirrors)
    created = [parent for parent in (target.parent, *target.parent.parents) if not parent.exists()]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(target)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=target.parent))
    except OSError as exc:
        raise GenieBuildError(mirrors, f"cannot write: {exc.strerror or exc}") from exc
    done = False
    try:
        yield staging
        done = True
    except OSError as exc:
        raise GenieBuildError(mirrors, f"cannot write: {exc.strerror or exc}") from exc
    except GenieBuildError as exc:
        raise _outside_staging(exc, staging, mirrors) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if not done:
            _remove_empty(created)


def _remove_empty(folders: list[Path]) -> None:
    """A writer that failed leaves no folder it made for its output (an empty ``parts/`` would look like a split
    that ran)."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def copy_range(src: BinaryIO, dst: BinaryIO, offset: int, length: int) -> None:
    """Copy ``length`` bytes of ``src`` starting at ``offset`` in chunks, so memory stays bounded."""
    src.seek(offset)
    remaining = length
    while remaining > 0:
        chunk = src.read(min(COPY_CHUNK_BYTES, remaining))
        if not chunk:
            raise GenieBuildError(getattr(src, "name", "<stream>"),
                                  f"ends {remaining} bytes early (wanted {length} bytes at offset {offset})")
        dst.write(chunk)
        remaining -= len(chunk)


class HashingWriter:
    """A write-only file that feeds what is written to ``digest`` and, given a ``sink``, writes it on there (to
    hash bytes while :func:`copy_range` streams them)."""

    def __init__(self, digest: hashlib._Hash, sink: BinaryIO | None = None) -> None:
        self.digest = digest
        self.sink = sink

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return len(data) if self.sink is None else self.sink.write(data)

    def tell(self) -> int:
        """The sink's position (a writer without a sink has none)."""
        return self.sink.tell()


def sha256_file(path: str | os.PathLike[str], *, inside: Iterable[str | os.PathLike[str]] | None = None,
                max_bytes: int | None = None) -> str:
    """sha256 of a regular file (:func:`open_regular`, with its ``inside`` and ``max_bytes``), streamed.

    Raises:
        GenieBuildError: as :func:`open_regular`.
    """
    # file_digest reads into one reused buffer: chunks of read() are new objects, each a fresh mapping of memory
    with open_regular(path, inside=inside, max_bytes=max_bytes) as handle:
        try:
            return hashlib.file_digest(handle, "sha256").hexdigest()
        except OSError as exc:
            raise GenieBuildError(path, f"cannot read: {exc.strerror or exc}") from None


def resolve_inside(path: str | os.PathLike[str], roots: Iterable[str | os.PathLike[str]]) -> Path:
    """The real path of ``path`` (every symlink resolved), required to lie inside one of ``roots`` (each resolved
    too).

    Raises:
        GenieBuildError: naming ``path``, when its real path is outside every root.
    """
    try:
        real = Path(os.path.realpath(path))
        folders = [Path(os.path.realpath(root)) for root in roots]
    except ValueError as exc:  # a NUL in the path
        raise GenieBuildError(path, f"cannot read: {exc}") from None
    if not any(real == folder or folder in real.parents for folder in folders):
        shown = " or ".join(str(folder) for folder in dict.fromkeys(folders))
        raise GenieBuildError(path, f"resolves to {real}, outside {shown}: nothing outside the folder is read")
    return real


@contextlib.contextmanager
def open_regular(path: str | os.PathLike[str], *, inside: Iterable[str | os.PathLike[str]] | None = None,
                 max_bytes: int | None = None) -> Iterator[BinaryIO]:
    """Open a file for binary reading only if it is a regular file of at most ``max_bytes`` bytes and, with
    ``inside``, only if its real path lies inside one of those folders (:func:`resolve_inside`).

    The file is opened without blocking (a FIFO would wait for a writer forever) and judged by ``fstat`` of what
    was opened, so a file swapped after the check is judged as it is; with ``inside`` the resolved path is opened
    without following a link in its last component.

    Raises:
        GenieBuildError: naming ``path``: missing, unreadable, not a regular file (a directory, FIFO, device or
            socket), larger than ``max_bytes``, or outside ``inside``.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    target: str | os.PathLike[str] = path
    if inside is not None:
        target = resolve_inside(path, inside)
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(target, flags)
    except FileNotFoundError:
        raise GenieBuildError(path, "file not found") from None
    except OSError as exc:
        raise GenieBuildError(path, f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # a NUL in the path
        raise GenieBuildError(path, f"cannot read: {exc}") from None
    try:
        _require_regular(path, os.fstat(fd), max_bytes)
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle


def _require_regular(path: str | os.PathLike[str], status: os.stat_result, max_bytes: int | None) -> None:
    if not stat.S_ISREG(status.st_mode):
        kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                 (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
        kind = next((name for test, name in kinds if test(status.st_mode)), "not a file")
        raise GenieBuildError(path, f"is {kind}, not a regular file")
    if max_bytes is not None and status.st_size > max_bytes:
        raise GenieBuildError(path, f"is {status.st_size} bytes, more than the {max_bytes} such a file may have")


def regular_file_size(path: str | os.PathLike[str], *, inside: Iterable[str | os.PathLike[str]] | None = None,
                      max_bytes: int | None = None) -> int:
    """The size of a file :func:`open_regular` accepts, read from what it opened (nothing of the file is read).

    Raises:
        GenieBuildError: as :func:`open_regular`.
    """
    with open_regular(path, inside=inside, max_bytes=max_bytes) as handle:
        return os.fstat(handle.fileno()).st_size


def read_regular(path: str | os.PathLike[str], *, inside: Iterable[str | os.PathLike[str]] | None = None,
                 max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` bytes (:func:`open_regular`); never more than the
    size it had when opened, even if it grows.

    Raises:
        GenieBuildError: as :func:`open_regular`.
    """
    with open_regular(path, inside=inside, max_bytes=max_bytes) as handle:
        try:
            return handle.read(os.fstat(handle.fileno()).st_size)
        except OSError as exc:
            raise GenieBuildError(path, f"cannot read: {exc.strerror or exc}") from None


def read_text(path: str | os.PathLike[str], *, inside: Iterable[str | os.PathLike[str]] | None = None,
              max_bytes: int) -> str:
    """:func:`read_regular` decoded as UTF-8.

    Raises:
        GenieBuildError: as :func:`open_regular`, or not UTF-8 text.
    """
    try:
        return read_regular(path, inside=inside, max_bytes=max_bytes).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GenieBuildError(path, f"not UTF-8 text: {exc}") from None


def read_json(path: str | os.PathLike[str], *, inside: Iterable[str | os.PathLike[str]] | None = None,
              max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Read a JSON file (:func:`read_regular`), turning every failure into a one-line GenieBuildError naming the
    file."""
    data = read_regular(path, inside=inside, max_bytes=max_bytes)
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # ValueError covers JSONDecodeError and UnicodeDecodeError
        raise GenieBuildError(path, f"not valid JSON: {exc}") from None


def is_json_int(value: object) -> bool:
    """A JSON integer: an int that is not a bool (``True`` is an int to Python, not to a JSON reader)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_json_number(value: object) -> bool:
    """A JSON number: an int or a float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _remove_stale_temporaries(target: Path) -> None:
    """Remove what a writer killed mid-write (SIGKILL, power cut) left beside ``target``: the mkstemp/mkdtemp
    ``.<name>.<8 random characters>.tmp`` and a swapped-out ``.<name>.old``. One job writes a given output at a
    time (Snakemake), so any that exist are stale."""
    stale = re.compile(rf"\.{re.escape(target.name)}\.(?:[a-z0-9_]{{8}}\.tmp|old)")
    for path in target.parent.iterdir():
        if stale.fullmatch(path.name):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                _unlink_quietly(str(path))


def _outside_staging(error: GenieBuildError, staging: Path, target: Path) -> GenieBuildError:
    """``error`` naming the final path instead of the staging directory it was raised in (which is gone)."""
    where = Path(error.where)
    if where == staging or staging in where.parents:
        return GenieBuildError(target / where.relative_to(staging), error.problem)
    return error
