"""``snakemake --lint`` on the workflow: no lint but the one this workflow accepts (docs/snakemake.md, "Lint").

The rules run the project venv's interpreter, not a conda env or container (QAIRT and the package come from
pip, and envs/core.yaml cannot be deployed by Snakemake's ``conda:``), so "Specify a conda environment or
container for each rule" is the one lint left; any other lint fails this test."""

from __future__ import annotations

import re
import subprocess
import sys

from workflow_helpers import copy_workflow

ACCEPTED = {"Specify a conda environment or container for each rule."}


def test_snakemake_lint_reports_nothing_but_the_accepted_lint(tmp_path) -> None:
    workdir = copy_workflow(tmp_path)
    result = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=workdir, capture_output=True,
                            text=True, timeout=300)
    output = result.stdout + result.stderr
    titles = re.findall(r"^\s+\* (.+?):$", output, re.MULTILINE)
    assert titles, output[-3000:]  # the accepted lint is there, so the linter did run
    assert set(titles) <= ACCEPTED, sorted(set(titles) - ACCEPTED)
