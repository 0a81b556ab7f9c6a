"""Interruption: a build killed at any moment resumes to exactly the bundle an uninterrupted build makes, and a
writer killed mid-write leaves nothing that a later run takes as done or that lingers after it.

After a SIGKILL, Snakemake's lock stays behind; ``snakemake --unlock`` (what its own message says to run) is
part of the documented way on.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bundle_helpers import ReferenceBuild, build_reference_bundle
from genie_build.conventions import PART_WEIGHTS_NAME
from workflow_helpers import SMALL_DEMO, copy_workflow, load_json, run_snakemake, snakemake_command, write_config

# The small demo cut to 2 layers and 2 parts: fewer jobs, the same rules.
TINY_WORKFLOW = {"demo": {**SMALL_DEMO["demo"], "layers": 2, "hidden": 32, "intermediate": 64, "vocab": 300},
                 "split": {"num_parts": 2}}
KILL_TIMEOUT_S = 300  # seconds until a compile_part job must have started


def temporaries(directory: Path) -> list[Path]:
    """Files or folders that fileio's atomic writers stage under (``.<name>.<random>.tmp``, ``.<name>.old``)."""
    return sorted(path for path in directory.rglob(".*") if path.name.endswith((".tmp", ".old")))


def hidden(directory: Path) -> list[Path]:
    """Every hidden file or folder under ``directory``: fileio's temporaries, and the split's staging folder
    (``.<graph>.<random>`` inside the parts folder). A writer's own output has none."""
    return sorted(directory.rglob(".*"))


def visible_files(directory: Path) -> dict[str, bytes]:
    """Relative path -> bytes of every file under ``directory`` outside a hidden folder: what a later run reads."""
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file() and not any(part.startswith(".") for part in path.relative_to(directory).parts)}


# ------------------------------------------------------------------------------------------- one writer

@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> ReferenceBuild:
    return build_reference_bundle(tmp_path_factory.mktemp("built"))


def _plan_args(build: ReferenceBuild, out: Path) -> list[object]:
    source = build.source
    return ["plan", "--prompt", source / "prompt.onnx", "--token", source / "token.onnx",
            "--encodings-prompt", source / "prompt.encodings.json",
            "--num-parts", 3, "--out", out]


def _convert_args(build: ReferenceBuild, out: Path) -> list[object]:
    return ["convert", "--toolchain", "reference", "--onnx", build.root / "parts" / "part_3_of_3" / "prompt.onnx",
            "--encodings", build.root / "encodings" / "part_3_of_3" / "prompt.encodings.json",
            "--graph-name", "prompt_ar8_cl64_3_of_3", "--float-bitwidth", 16, "--out", out]


def _split_args(build: ReferenceBuild, out: Path) -> list[object]:
    return ["split", "--plan", build.root / "plan.json", "--graph", f"prompt={build.source / 'prompt.onnx'}",
            f"token={build.source / 'token.onnx'}", "--parts-dir", out]


# Python ignores SIGXFSZ from startup; restoring the default makes the kernel kill the writer the moment a write
# crosses the file-size limit: a deterministic "killed mid-write", as by SIGKILL or a power cut. The limit is set
# after the imports (loading onnxruntime writes more than it).
_KILLED_AT_LIMIT = ("import resource, signal, sys; from genie_build.cli import build_parser, main; build_parser(); "
                    "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000)); "
                    "signal.signal(signal.SIGXFSZ, signal.SIG_DFL); sys.exit(main(sys.argv[1:]))")


def _genie_build(args: list[object], cwd: Path, killed_mid_write: bool = False) -> subprocess.CompletedProcess:
    prefix = ["-c", _KILLED_AT_LIMIT] if killed_mid_write else ["-m", "genie_build"]
    return subprocess.run([sys.executable, *prefix, *map(str, args)], cwd=cwd, capture_output=True, text=True)


@pytest.mark.parametrize("make_args, output", [(_plan_args, "plan.json"), (_convert_args, "part_3_of_3.onnx")],
                         ids=["plan", "convert"])
def test_a_writer_killed_mid_write_leaves_no_output_and_the_rerun_no_leftovers(
        build: ReferenceBuild, tmp_path: Path, make_args: Callable[[ReferenceBuild, Path], list[object]],
        output: str) -> None:
    out = tmp_path / "out" / output
    killed = _genie_build(make_args(build, out), tmp_path, killed_mid_write=True)
    assert killed.returncode == -signal.SIGXFSZ, killed.stderr[-2000:]
    assert temporaries(out.parent), "the writer was not killed while writing"
    assert not out.exists(), "a killed writer left something at the final path"

    rerun = _genie_build(make_args(build, out), tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert out.exists()
    assert hidden(out.parent) == [], "the killed writer's temporary outlived the rerun"


# The split writes the model's graphs into the parts folder (part_{label}/{graph}.onnx and the part's weights file),
# moving each file into place only once all parts are written: a killed split leaves every file that was there as it
# was and no new one, and its staging folder does not outlive the rerun.
_PARTS = {f"part_{index}_of_3/{name}" for index in (1, 2, 3)
          for name in ("prompt.onnx", "token.onnx", PART_WEIGHTS_NAME)}


@pytest.mark.parametrize("previous", [False, True], ids=["empty", "previous-parts"])
def test_a_split_killed_mid_write_leaves_the_parts_as_they_were_and_the_rerun_no_leftovers(
        build: ReferenceBuild, tmp_path: Path, previous: bool) -> None:
    out = tmp_path / "out" / "parts"
    if previous:   # the build's parts of both graphs: what a killed rerun must not damage
        shutil.copytree(build.root / "parts", out)
    before = visible_files(out) if out.exists() else {}
    killed = _genie_build(_split_args(build, out), tmp_path, killed_mid_write=True)
    assert killed.returncode == -signal.SIGXFSZ, killed.stderr[-2000:]
    assert hidden(out.parent), "the split was not killed while writing"
    assert visible_files(out) == before, "a killed split changed or added a file a later run reads"

    rerun = _genie_build(_split_args(build, out), tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    expected = visible_files(build.root / "parts")
    assert set(expected) == _PARTS
    assert visible_files(out) == expected, "the rerun's parts differ from an uninterrupted split's"
    assert hidden(out.parent) == [], "the killed split's staging folder outlived the rerun"


# ------------------------------------------------------------------------------------------- the workflow

def _start_snakemake(workdir: Path, config_file: Path, log: Path) -> subprocess.Popen:
    """Snakemake in its own session, so that the whole process group (jobs included) can be killed at once."""
    command, env = snakemake_command(workdir, config_file=config_file)
    with open(log, "w") as handle:
        return subprocess.Popen(command, cwd=workdir, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _group_members(pgid: int) -> list[str]:
    """Command lines of the live (not zombie) processes of process group ``pgid``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended while we looked
            continue
        if int(group) == pgid and state != "Z":
            members.append(cmdline)
    return members


def _compiling(pgid: int) -> bool:
    return any("genie_build compile" in cmdline for cmdline in _group_members(pgid))


def _wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def _fresh_dir(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.workflow
def test_a_run_killed_during_compile_resumes_to_the_bundle_of_an_uninterrupted_run(tmp_path: Path) -> None:
    interrupted = copy_workflow(_fresh_dir(tmp_path / "interrupted"))
    config = write_config(interrupted, TINY_WORKFLOW)
    process = _start_snakemake(interrupted, config, tmp_path / "killed-run.log")
    try:
        caught_compiling = _wait_until(lambda: process.poll() is not None or _compiling(process.pid), KILL_TIMEOUT_S) \
            and process.poll() is None
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert caught_compiling, f"no compile_part job was seen running:\n{(tmp_path / 'killed-run.log').read_text()}"
    assert _wait_until(lambda: not _group_members(process.pid), 30), "a killed job is still running"
    out = interrupted / "results" / "demo"
    # The bundle's output is its manifest; Snakemake makes the (empty) directory when the bundle job starts,
    # which it may have while the other variant still compiles. No bundle file may be there before it is complete.
    bundle = out / "genie_bundle"
    assert not bundle.exists() or not any(bundle.iterdir()), sorted(p.name for p in bundle.iterdir())

    run_snakemake(interrupted, "--unlock", config_file=config)
    run_snakemake(interrupted, config_file=config)

    settled = run_snakemake(interrupted, "-n", config_file=config)
    assert "Nothing to be done" in settled.stdout + settled.stderr
    assert temporaries(interrupted / "results") == []

    uninterrupted = copy_workflow(_fresh_dir(tmp_path / "uninterrupted"))  # only as far as the bundle
    run_snakemake(uninterrupted, "results/demo/genie_bundle/manifest.json",
                  config_file=write_config(uninterrupted, TINY_WORKFLOW))
    resumed = load_json(out / "genie_bundle" / "manifest.json")["files"]
    reference = load_json(uninterrupted / "results" / "demo" / "genie_bundle" / "manifest.json")["files"]
    assert resumed == reference
