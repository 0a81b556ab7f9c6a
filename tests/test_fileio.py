"""Atomic outputs: a failure never leaves a file or directory at the final path, nor a temporary beside it."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest

from genie_build import fileio
from genie_build.errors import GenieBuildError


def test_atomic_open_failure_leaves_nothing(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError):
        with fileio.atomic_open(target, "w") as handle:
            handle.write("half")
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_atomic_open_keeps_old_file_until_success(tmp_path):
    target = tmp_path / "out.txt"
    fileio.write_text(target, "old")
    with pytest.raises(RuntimeError):
        with fileio.atomic_open(target, "w") as handle:
            handle.write("new")
            raise RuntimeError
    assert target.read_text() == "old"
    fileio.write_text(target, "new")
    assert target.read_text() == "new"


def test_outputs_get_umask_modes_not_private_ones(tmp_path):
    old = os.umask(0o022)
    try:
        fileio.write_bytes(tmp_path / "f.bin", b"x")
        with fileio.atomic_directory(tmp_path / "d") as staging:
            (staging / "inner").write_text("y")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.bin").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755


def test_atomic_directory_replaces_only_on_success(tmp_path):
    target = tmp_path / "parts"
    with fileio.atomic_directory(target) as staging:
        (staging / "a").write_text("1")
    with pytest.raises(RuntimeError):
        with fileio.atomic_directory(target) as staging:
            (staging / "b").write_text("2")
            raise RuntimeError
    assert sorted(p.name for p in target.iterdir()) == ["a"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parts"]


def test_a_failed_staged_write_leaves_no_folder_it_made_and_keeps_those_it_found(tmp_path):
    (tmp_path / "results").mkdir()
    parts = tmp_path / "results" / "parts" / "w4a16"
    with pytest.raises(GenieBuildError, match="bad graph"):
        with fileio.staging_directory(parts, "prompt", mirrors=parts) as staging:
            (staging / "part_01_of_02").mkdir()
            raise GenieBuildError(staging / "part_01_of_02", "bad graph")
    assert list(tmp_path.iterdir()) == [tmp_path / "results"]
    assert list((tmp_path / "results").iterdir()) == []

    with fileio.staging_directory(parts, "prompt", mirrors=parts) as staging:
        (staging / "a").write_text("1")
    assert [p.name for p in parts.iterdir()] == []    # its writer moves what it keeps; the folder stays


def test_write_error_is_one_line_naming_the_file(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    with pytest.raises(GenieBuildError) as info:
        fileio.write_text(blocker / "x.json", "{}")
    assert "not_a_dir" in str(info.value) and "\n" not in str(info.value)


def test_read_json_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(GenieBuildError, match="bad.json: not valid JSON"):
        fileio.read_json(bad)
    with pytest.raises(GenieBuildError, match="missing.json: file not found"):
        fileio.read_json(tmp_path / "missing.json")


def test_hashing_writer_hashes_what_it_writes_on_to_its_sink_or_alone(tmp_path):
    data = bytes(range(256)) * 5000
    with open(tmp_path / "copy.bin", "wb") as sink:
        through = fileio.HashingWriter(hashlib.sha1(), sink)
        (tmp_path / "src.bin").write_bytes(data)
        with open(tmp_path / "src.bin", "rb") as src:
            fileio.copy_range(src, through, 3, len(data) - 3)
        assert through.tell() == len(data) - 3
    alone = fileio.HashingWriter(hashlib.sha256())
    alone.write(data[3:])
    assert (tmp_path / "copy.bin").read_bytes() == data[3:]
    assert through.digest.hexdigest() == hashlib.sha1(data[3:]).hexdigest()
    assert alone.digest.hexdigest() == hashlib.sha256(data[3:]).hexdigest()


# ------------------------------------------------------------------------------------------- bounded reading

def test_open_regular_refuses_what_is_not_a_regular_file_without_blocking(tmp_path):
    """A FIFO would block the reader forever, /dev/zero never ends, a directory is no document: each is refused
    from fstat of what was opened, before a byte is read."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "zero").symlink_to("/dev/zero")
    cases = {fifo: "is a FIFO, not a regular file", tmp_path / "zero": "is a character device, not a regular file",
             tmp_path: "is a directory, not a regular file", tmp_path / "absent": "file not found",
             tmp_path / "a\0b": "cannot read: embedded null byte"}
    for path, problem in cases.items():
        with pytest.raises(GenieBuildError) as info:
            fileio.read_regular(path, max_bytes=100)
        assert str(info.value) == f"{path}: {problem}"


def test_open_regular_bounds_the_size_before_reading(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as handle:
        handle.truncate(2**40)  # sparse: nothing is read, the size alone is refused
    with pytest.raises(GenieBuildError, match=rf"big.json: is {2**40} bytes, more than the 1000 such a file may"):
        fileio.read_json(big, max_bytes=1000)
    small = tmp_path / "small.json"
    small.write_text('{"a": 1}')
    assert fileio.read_json(small, max_bytes=8) == {"a": 1}
    with pytest.raises(GenieBuildError, match="more than the 7"):
        fileio.read_json(small, max_bytes=7)


def test_open_regular_inside_a_folder_follows_no_link_out_of_it(tmp_path):
    root, outside = tmp_path / "bundle", tmp_path / "secret.txt"
    root.mkdir()
    outside.write_text("secret")
    (root / "inner.txt").write_text("inner")
    (root / "out").symlink_to(outside)
    (root / "in").symlink_to(root / "inner.txt")
    (root / "up").symlink_to("../secret.txt")
    assert fileio.read_regular(root / "in", inside=[root], max_bytes=100) == b"inner"
    for name in ("out", "up"):
        with pytest.raises(GenieBuildError) as info:
            fileio.read_regular(root / name, inside=[root], max_bytes=100)
        assert str(info.value).startswith(f"{root / name}: resolves to {outside}, outside {root}")
    with pytest.raises(GenieBuildError, match="outside"):
        fileio.sha256_file(root / ".." / "secret.txt", inside=[root])
    assert fileio.sha256_file(root / "in", inside=[root]) == hashlib.sha256(b"inner").hexdigest()


def test_read_json_reads_no_more_than_the_size_it_opened(tmp_path):
    path = tmp_path / "doc.json"
    path.write_text('{"x": [1, 2]}')
    assert fileio.read_json(path) == {"x": [1, 2]}
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(GenieBuildError, match="doc.json: not valid JSON"):
        fileio.read_json(path)
