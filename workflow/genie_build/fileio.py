"""Atomic outputs: every file is written under a temporary name beside its target and renamed into place,
so an interrupted or failed job never leaves something a later run would take as done."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from genie_build.errors import GenieBuildError

COPY_CHUNK_BYTES = 16 * 1024 * 1024


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


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Build a directory under a temporary name and rename it into place when the block succeeds.

    An existing directory at ``path`` is replaced only after the new one is complete.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(target)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    except OSError as exc:
        raise GenieBuildError(target, f"cannot write: {exc.strerror or exc}") from exc
    try:
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
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise GenieBuildError(target, f"cannot write: {exc.strerror or exc}") from exc
    except GenieBuildError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise _outside_staging(exc, staging, target) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


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


def sha256_file(path: str | os.PathLike[str]) -> str:
    # file_digest reads into one reused buffer: chunks of read() are new objects, each a fresh mapping of memory
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file, turning every failure into a one-line GenieBuildError naming the file."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise GenieBuildError(path, "file not found") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # ValueError covers JSONDecodeError
        raise GenieBuildError(path, f"not valid JSON: {exc}") from None
    except OSError as exc:
        raise GenieBuildError(path, f"cannot read: {exc.strerror or exc}") from None


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
