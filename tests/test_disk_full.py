"""Disk full: a writer that cannot finish fails with one clear line, exits non-zero, and leaves the final path as
it was -- absent, or holding the previous complete output -- never a truncated file a later run would trust.

The split and the encodings slicer write files into folders other runs share (``parts/part_{label}/{graph}.onnx``,
``encodings/part_{label}/{graph}.encodings.json``), so their promise is per file: every file that was there keeps
its bytes, no new file appears, and nothing is left behind (no staging folder, no temporary file).

Two ways to run out of room: ``RLIMIT_FSIZE`` (with SIGXFSZ ignored, write() fails with EFBIG "File too large")
for every writer, and a 256 KiB tmpfs (ENOSPC) where mounting is permitted.
"""

from __future__ import annotations

import json
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bundle_helpers import VARIANT, ReferenceBuild, build_reference_bundle

FILE_SIZE_LIMIT = 1024  # bytes: below every output of the tiny demo, so each writer hits it


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> ReferenceBuild:
    return build_reference_bundle(tmp_path_factory.mktemp("built"))


def writer_args(build: ReferenceBuild, writer: str, out: Path) -> list[object]:
    """The command line of ``writer`` reading the build's files and writing ``out``."""
    root, source = build.root, build.source
    label, graph = "3_of_3", "prompt_ar8_cl64_3_of_3"
    commands: dict[str, list[object]] = {
        "plan": ["plan", "--prompt", source / "prompt.onnx", "--token", source / "token.onnx",
                 "--encodings-prompt", source / "prompt.encodings.json",
                 "--num-parts", 3, "--out", out],
        "split": ["split", "--plan", root / "plan.json", "--graph", f"prompt={source / 'prompt.onnx'}",
                  f"token={source / 'token.onnx'}", "--parts-dir", out],
        "slice-graph-encodings": ["slice-graph-encodings", "--graph", "prompt", "--model", source / "prompt.onnx",
                                  "--encodings", source / "prompt.encodings.json", "--parts-dir", root / "parts",
                                  "--out-dir", out],
        "convert": ["convert", "--toolchain", "reference", "--onnx", root / "parts" / f"part_{label}" / "prompt.onnx",
                    "--encodings", root / "encodings" / f"part_{label}" / "prompt.encodings.json",
                    "--graph-name", graph, "--float-bitwidth", 16, "--out", out],
        "compile": ["compile", "--toolchain", "reference",
                    "--graph", f"{graph}={root / 'converted' / 'prompt' / f'part_{label}.onnx'}",
                    "--graph", f"token_ar1_cl64_{label}={root / 'converted' / 'token' / f'part_{label}.onnx'}",
                    "--variant-json", json.dumps(VARIANT), "--chipset", "SM8750", "--out", out],
        "bundle": ["bundle", "--binaries", *build.binaries, "--toolchain", "reference", "--model-name", "demo",
                   "--hf-config", source / "config.json", "--tokenizer", source / "tokenizer.json",
                   "--chipset", "SM8750", "--out-dir", out],
    }
    return commands[writer]


def previous_output(build: ReferenceBuild, writer: str) -> Path:
    """What the build wrote with the same command: the complete output a failed rerun must not damage (for the split
    and the slicer, the whole parts or encodings folder: the token graph's files beside the prompt graph's)."""
    label = "3_of_3"
    return {"plan": build.root / "plan.json", "split": build.root / "parts",
            "slice-graph-encodings": build.root / "encodings",
            "convert": build.root / "converted" / "prompt" / f"part_{label}.onnx",
            "compile": build.root / "compiled" / f"part_{label}.bin", "bundle": build.bundle}[writer]


def run_limited(args: list[object], preexec: Callable[[], None] | None, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "genie_build", *map(str, args)], preexec_fn=preexec, cwd=cwd,
                          capture_output=True, text=True)


def file_size_limit() -> None:
    """In the child: ignore SIGXFSZ (so write() returns EFBIG instead of killing it) and cap file sizes."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))


def snapshot(path: Path) -> dict[str, bytes]:
    """Relative path -> bytes of every file at ``path`` (a file or a directory); empty when absent."""
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(item.relative_to(path)): item.read_bytes() for item in sorted(path.rglob("*")) if item.is_file()}


def place_previous(build: ReferenceBuild, writer: str, out: Path) -> None:
    source = previous_output(build, writer)
    out.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, out)
    else:
        shutil.copy2(source, out)
        if source.suffix == ".onnx":
            shutil.copy2(source.with_name(source.name + ".data"), out.with_name(out.name + ".data"))


def assert_clean_failure(result: subprocess.CompletedProcess, out: Path, problem: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"genie-build: error: {out}") and last.endswith(f"cannot write: {problem}"), last
    # Every writer's temporaries are hidden (fileio's ``.<name>.*.tmp``/``.<name>.old``, the split's staging folder
    # ``.<graph>.*`` inside the parts folder): nothing hidden may remain.
    leftovers = sorted(p for p in out.parent.rglob(".*"))
    assert leftovers == [], f"a temporary file or staging directory was left behind: {leftovers}"


WRITERS = ["plan", "split", "slice-graph-encodings", "convert", "compile", "bundle"]
# Writers into a folder other runs share, each file moved into place on its own: a failed run may leave the (empty)
# folder, but no file in it.
SHARED_FOLDER_WRITERS = {"split", "slice-graph-encodings"}


@pytest.mark.parametrize("writer", WRITERS)
def test_file_too_large_leaves_no_output(build: ReferenceBuild, tmp_path: Path, writer: str) -> None:
    out = tmp_path / "out" / previous_output(build, writer).name
    result = run_limited(writer_args(build, writer, out), file_size_limit, tmp_path)
    assert_clean_failure(result, out, "File too large")
    if writer in SHARED_FOLDER_WRITERS:
        assert snapshot(out) == {}, "a failed run left a file in the parts or encodings folder"
    else:
        assert not out.exists()
    assert not out.with_name(out.name + ".data").exists()


@pytest.mark.parametrize("writer", WRITERS)
def test_file_too_large_keeps_the_previous_output_whole(build: ReferenceBuild, tmp_path: Path, writer: str) -> None:
    out = tmp_path / "out" / previous_output(build, writer).name
    place_previous(build, writer, out)
    before = snapshot(out)
    result = run_limited(writer_args(build, writer, out), file_size_limit, tmp_path)
    assert_clean_failure(result, out, "File too large")
    assert snapshot(out) == before


def test_the_same_commands_succeed_without_the_limit(build: ReferenceBuild, tmp_path: Path) -> None:
    """The failures above come from the limit, not from the command lines."""
    for writer in ("plan", "split", "slice-graph-encodings", "compile"):
        out = tmp_path / writer / previous_output(build, writer).name
        result = run_limited(writer_args(build, writer, out), None, tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        expected = snapshot(previous_output(build, writer))
        if writer == "slice-graph-encodings":   # the prompt graph's files of the common folder
            expected = {name: data for name, data in expected.items() if Path(name).name.startswith("prompt.")}
        assert snapshot(out) == expected  # deterministic, and complete


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs, unmounted afterwards; skipped where mounting is not permitted."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
                                 capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


@pytest.mark.parametrize("writer", ["split", "bundle"])
def test_no_space_left_on_device_leaves_the_small_disk_empty(build: ReferenceBuild, small_disk: Path,
                                                             writer: str) -> None:
    out = small_disk / previous_output(build, writer).name
    result = run_limited(writer_args(build, writer, out), None, small_disk.parent)
    assert_clean_failure(result, out, "No space left on device")
    if writer in SHARED_FOLDER_WRITERS:
        assert snapshot(small_disk) == {}, "a failed run left a file on the small disk"
        assert [p for p in small_disk.iterdir() if p != out] == []
    else:
        assert list(small_disk.iterdir()) == []
