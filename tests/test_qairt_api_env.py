"""Runs tests/qairt_api -- the qairt toolchain against qairt-dev 0.13.0's real code -- in the QAIRT environment
(.venv-qairt, made by scripts/make_qairt_env.sh): qairt-dev needs Python 3.10 or 3.12 and numpy 1.26, so it
cannot live in this interpreter. Skips when that environment is absent, unless $GENIE_BUILD_REQUIRE_QAIRT_ENV is
set (CI sets it after creating the environment): then its absence fails."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
QAIRT_PYTHON = REPO / ".venv-qairt" / "bin" / "python"
REQUIRE_VARIABLE = "GENIE_BUILD_REQUIRE_QAIRT_ENV"


def test_qairt_api_suite_passes_in_the_qairt_environment(tmp_path):
    if not QAIRT_PYTHON.is_file():
        if os.environ.get(REQUIRE_VARIABLE):
            pytest.fail(f"{REQUIRE_VARIABLE} is set but {QAIRT_PYTHON} does not exist: run scripts/make_qairt_env.sh")
        pytest.skip(f"no QAIRT environment at {QAIRT_PYTHON.parent.parent} (scripts/make_qairt_env.sh makes it)")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("QAIRT", "QNN", "PYTHON"))}
    completed = subprocess.run([str(QAIRT_PYTHON), "-m", "pytest", "-q", "-p", "no:warnings", "-p", "no:cacheprovider",
                                "--basetemp", str(tmp_path / "basetemp"), "tests/qairt_api"],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    summary = completed.stdout.strip().splitlines()[-1] if completed.stdout.strip() else completed.stderr
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    # every test ran: nothing skipped or deselected, and the suite is not empty
    assert re.fullmatch(r"\d+ passed in [\d.]+s( \(.*\))?", summary), summary
