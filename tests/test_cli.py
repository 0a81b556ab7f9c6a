"""The command dispatcher: one command's module is imported for a job; help lists them all."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from genie_build.cli import build_parser, main


def test_a_job_builds_only_its_command():
    parser = build_parser("size_table")
    assert set(parser._subparsers._group_actions[0].choices) == {"size-table"}


def test_help_and_unknown_commands_list_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["nosuch"])
    message = capsys.readouterr().err
    for command in ("split", "compile", "check-bundle", "run-bundle", "estimate"):
        assert f"'{command}'" in message


def test_a_command_does_not_import_the_others_libraries():
    """``account`` runs in the QAIRT environment too, so it must not pull in onnxruntime or pandas."""
    code = ("import sys; from genie_build.cli import build_parser; build_parser('account'); "
            "print(sorted(m for m in ('onnxruntime', 'pandas', 'matplotlib', 'tokenizers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("command", ["compile", "account", "convert", "size_table", "memory_plan"])
def test_the_per_part_and_table_commands_start_without_numpy_or_onnx(command):
    """Their jobs are most of a build's jobs: what they pay before their work is Python and the CLI only
    (genie_build.conventions imports numpy only where it computes RoPE tables and masks)."""
    code = (f"import sys; from genie_build.cli import build_parser; build_parser({command!r}); "
            "print(sorted(m for m in ('numpy', 'onnx', 'onnxruntime', 'pandas', 'jsonschema') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_reading_a_reference_binary_back_imports_neither_numpy_nor_onnx(tmp_path):
    """account, bundle and check-bundle read each binary's header through the toolchain's inspect: 0.2 s of numpy
    and onnx imports per job before container_format.py held the reader."""
    from genie_build.toolchains.reference.container_format import FORMAT_VERSION, MAGIC, PREAMBLE

    header = json.dumps({"graph_section_bytes": 0, "weight_section": {"bytes": 0}, "weights": [], "graphs": [],
                         "toolchain": "reference", "tool_version": "test",
                         "applied_options": {}}).encode()
    binary = tmp_path / "empty.bin"
    binary.write_bytes(PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0, len(header)) + header
                       + b"\0" * (-(PREAMBLE.size + len(header)) % 64))
    code = ("import sys; from genie_build.toolchains import get_toolchain; "
            f"info = get_toolchain('reference').inspect({str(binary)!r}); "
            "print(sorted(m for m in ('numpy', 'onnx') if m in sys.modules), info.file_bytes)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.split() == ["[]", str(binary.stat().st_size)], result.stderr


def test_benchmark_option_writes_time_and_peak_rss(tmp_path):
    import pandas as pd

    out = tmp_path / "bench" / "job.tsv"
    tiny = ["--layers", "1", "--hidden", "16", "--heads", "1", "--kv-heads", "1", "--intermediate", "8",
            "--vocab", "300", "--context", "8", "--ar", "2"]
    assert main(["--benchmark", str(out), "generate-demo", "--out-dir", str(tmp_path / "demo"), *tiny]) == 0
    row = pd.read_csv(out, sep="\t").iloc[0]
    assert 0 < row["s"] < 60 and 10 < row["max_rss"] < 4096 and row["h:m:s"].startswith("0:00:")


def test_a_failed_run_writes_no_benchmark(tmp_path):
    out = tmp_path / "job.tsv"
    assert main(["--benchmark", str(out), "check-bundle", str(tmp_path / "missing")]) != 0
    assert not out.exists()
