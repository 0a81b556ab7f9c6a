"""What the qairt toolchain does when the SDK is missing or unusable, with qairt-dev's real ``import qairt`` (run in
subprocesses: it changes sys.path and the environment, and may exit). Every socket connect and name lookup fails
and is logged there, so any attempt to reach the network is seen; each case must end in one line naming the fix.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from doubles import install_fake_sdk
from qairt_api.conftest import NATIVE_STUBS

NO_NETWORK = '''
import os, socket

def _refuse(*args, **kwargs):
    with open(os.environ["NETWORK_ATTEMPTS"], "a") as log:
        log.write(repr(args[:2]) + "\\n")
    raise OSError("network disabled by the test")

socket.socket.connect = socket.socket.connect_ex = _refuse
socket.create_connection = socket.getaddrinfo = _refuse
'''
CONVERT = ["-m", "genie_build", "convert", "--toolchain", "qairt", "--onnx", "part.onnx", "--encodings",
           "part.json", "--graph-name", "prompt_ar32_cl256_1_of_2", "--float-bitwidth", "16", "--out", "part.dlc"]


def run_offline(tmp_path: Path, args: list[str], sdk_root: Path | None) -> tuple[subprocess.CompletedProcess, str]:
    """``python args`` with the network refused; returns the process and the logged network attempts."""
    guard = tmp_path / "guard"
    guard.mkdir(exist_ok=True)
    (guard / "sitecustomize.py").write_text(NO_NETWORK)
    attempts = tmp_path / "network_attempts.log"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("QAIRT", "QNN"))}
    env.update(PYTHONPATH=str(guard), NETWORK_ATTEMPTS=str(attempts))
    if sdk_root is not None:
        env["QAIRT_SDK_ROOT"] = str(sdk_root)
    completed = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                               timeout=120, check=False)
    return completed, attempts.read_text() if attempts.exists() else ""


def assert_one_line_error(completed: subprocess.CompletedProcess, attempts: str, expected_start: str,
                          qairt_logged: bool = False) -> None:
    """Exit 2 and one ``genie-build: error:`` line, last; before it only qairt's own log lines, and only once
    ``import qairt`` ran (``qairt_logged``)."""
    lines = completed.stderr.strip().splitlines()
    assert completed.returncode == 2, completed.stderr
    assert lines[-1].startswith(f"genie-build: error: {expected_start}"), lines[-1]
    assert all(line.startswith("QAIRT-VM: ") for line in lines[:-1]) and (qairt_logged or len(lines) == 1), lines
    assert attempts == ""


def test_the_guard_sees_qairts_own_network_request(tmp_path):
    # Without the adapter's checks, `import qairt` with no QAIRT_SDK_ROOT asks the vendor's server.
    completed, attempts = run_offline(tmp_path, ["-c", "import qairt"], sdk_root=None)
    assert completed.returncode != 0
    assert attempts != ""


def test_no_sdk_root(tmp_path):
    completed, attempts = run_offline(tmp_path, CONVERT, sdk_root=None)
    assert_one_line_error(completed, attempts, "toolchain qairt: QAIRT_SDK_ROOT is not set: unpack the QAIRT SDK")


def test_sdk_root_without_sdk_yaml(tmp_path):
    root = install_fake_sdk(tmp_path / "sdk")
    (root / "sdk.yaml").unlink()
    completed, attempts = run_offline(tmp_path, CONVERT, sdk_root=root)
    assert_one_line_error(completed, attempts, f"{root}/sdk.yaml: file not found: QAIRT_SDK_ROOT must name an "
                                               "unpacked QAIRT SDK")


def test_sdk_too_old(tmp_path):
    root = install_fake_sdk(tmp_path / "sdk")
    (root / "sdk.yaml").write_text("version: 2.40.0.250101\n")
    completed, attempts = run_offline(tmp_path, CONVERT, sdk_root=root)
    assert_one_line_error(completed, attempts, f"{root}/sdk.yaml: QAIRT SDK 2.40.0.250101, but qairt-dev 0.13.0 "
                                               "needs 2.46.0 or newer")


def test_sdk_without_its_python_modules(tmp_path):
    # qairt raises ModuleNotFoundError for the SDK's qti.aisw.core.
    root = install_fake_sdk(tmp_path / "sdk")
    completed, attempts = run_offline(tmp_path, CONVERT, sdk_root=root)
    assert_one_line_error(completed, attempts, f"toolchain qairt: import qairt failed with the SDK at {root} "
                                               "(ModuleNotFoundError:", qairt_logged=True)


def test_sdk_whose_native_modules_do_not_load(tmp_path):
    # The SDK's pure-Python qti modules are there, its native modeltools is not: qairt calls sys.exit(1).
    root = install_fake_sdk(tmp_path / "sdk")
    shutil.copytree(NATIVE_STUBS, root / "lib" / "python")
    completed, attempts = run_offline(tmp_path, CONVERT, sdk_root=root)
    assert_one_line_error(completed, attempts, f"toolchain qairt: import qairt failed with the SDK at {root} "
                                               "(SystemExit: 1)", qairt_logged=True)
    assert "Unable to import qti.aisw.converters.common.modeltools" in completed.stdout


def test_the_check_comes_before_reading_any_input(tmp_path):
    # The inputs named in CONVERT do not exist: the SDK is what is reported, not them.
    completed, _ = run_offline(tmp_path, CONVERT, sdk_root=None)
    assert "part.onnx" not in completed.stderr
