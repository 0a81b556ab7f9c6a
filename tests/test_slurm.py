"""The workflow through the SLURM profile on a single-node SLURM started for the test (scripts/slurm-local.sh):
the bundle's manifest and the size table equal, byte for byte, those of a local run of the same config.

Both runs build the small demo's files as a user model (exports/, made once locally) up to the bundle and the size
table: every SLURM submission costs about 12 s here (Snakemake starting inside the job, then the status poll), so
the demo's own generation, the checks and the host run are left to the local workflow tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rebuild_helpers import USER_MODEL, export_small_demo, user_model_checkout, user_model_config
from workflow_helpers import REPO, copy_workflow, load_json, run_snakemake

pytestmark = [pytest.mark.workflow, pytest.mark.slurm]

SLURM_LOCAL = REPO / "scripts" / "slurm-local.sh"
SLURM_PROGRAMS = ("slurmctld", "slurmd", "munged", "sinfo", "sbatch", "squeue", "scancel")
SLURM_CONF = Path("/etc/slurm/slurm.conf")
# The executor can wait forever for a status it never gets (docs/cluster.md): never let it hang the tests.
SLURM_RUN_TIMEOUT_S = 600
COMPARED = ("genie_bundle/manifest.json", "size_table.csv")
TARGETS = tuple(f"results/{USER_MODEL}/{name}" for name in ("genie_bundle/manifest.json", "size_table.csv"))
SPLIT = {"split": {"num_parts": 2}}  # the part groups run one after the other on a 2-CPU node: keep them few


def why_slurm_cannot_run() -> str | None:
    """Why this machine cannot start a local SLURM for the test, or None if it can."""
    if os.geteuid() != 0:
        return "starting slurmctld, slurmd and munged needs root"
    search_path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])
    missing = [name for name in SLURM_PROGRAMS if shutil.which(name, path=search_path) is None]
    if missing:
        return (f"SLURM is not installed (no {', '.join(missing)}): apt-get install slurm-wlm slurmctld slurmd "
                "munge slurm-client")
    if SLURM_CONF.exists():
        return f"{SLURM_CONF} exists: a SLURM is configured here already, and this test will not replace it"
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        return "the SLURM executor plugin is missing: pip install -r envs/requirements-slurm.txt"
    return None


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A single-node SLURM on localhost; every daemon it started is stopped afterwards, whatever happened."""
    reason = why_slurm_cannot_run()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("slurm")
    try:
        started = subprocess.run(["bash", str(SLURM_LOCAL), "start", str(state)], capture_output=True, text=True)
        if started.returncode != 0:
            logs = "\n".join(f"{path.name}: {path.read_text()[-1500:]}" for path in sorted((state / "log").glob("*")))
            pytest.fail(f"SLURM did not start:\n{started.stdout}{started.stderr}\n{logs}")
        yield state
    finally:
        subprocess.run(["bash", str(SLURM_LOCAL), "stop", str(state)], capture_output=True, text=True)


def as_workflow_config(workdir: Path, config_file: Path) -> None:
    """``config_file`` (a whole config) as the workflow's own config/config.yaml: Snakemake 9.27 does not pass
    ``--replace-workflow-config`` to the jobs it submits, which would merge a --configfile into the default
    config again (and build the default's other variants) inside each SLURM job."""
    shutil.copyfile(config_file, workdir / "config" / "config.yaml")


def run_on_slurm(workdir: Path) -> str:
    """Build TARGETS through the SLURM profile; Snakemake's log. Killed if it outlives SLURM_RUN_TIMEOUT_S."""
    result = run_snakemake(workdir, *TARGETS, "--workflow-profile", "workflow/profiles/slurm", "--jobs", "4",
                           "--slurm-init-seconds-before-status-checks", "1", "--latency-wait", "5", cores=None,
                           timeout=SLURM_RUN_TIMEOUT_S)
    return result.stdout + result.stderr


def test_slurm_build_equals_the_local_build(slurm, tmp_path):
    (tmp_path / "exporter").mkdir()
    exports = export_small_demo(copy_workflow(tmp_path / "exporter"))
    local, cluster = (user_model_checkout(tmp_path / name, exports) for name in ("local", "cluster"))
    for workdir in (local, cluster):
        as_workflow_config(workdir, user_model_config(workdir, SPLIT))
    with ThreadPoolExecutor(1) as pool:  # the local build runs while the SLURM one mostly waits for its polls
        local_build = pool.submit(run_snakemake, local, *TARGETS)
        log = run_on_slurm(cluster)
        local_build.result()

    # the parts of the bundle and the size table: part 1, the embedding alone, is the bundle's CPU table
    labels = [part["label"] for part in load_json(cluster / "results" / USER_MODEL / "plan.json")["parts"]][1:]
    assert "has been submitted with SLURM jobid" in log
    groups = sorted(set(re.findall(r"slurm_logs/group_[^\s/]+/", log)))
    for label in labels:  # the profile's point: one submission per part and toolchain (a toolchain's converts,
        for toolchain in ("qnn_htp", "reference"):   # compiles and accounts), not one per job
            assert f"slurm_logs/group_part_{label}_account_compile_part_convert_part_{toolchain}/" in groups, groups
    assert "slurm_logs/rule_compile_part/" not in log
    for output in COMPARED:
        expected = (local / "results" / USER_MODEL / output).read_bytes()
        assert (cluster / "results" / USER_MODEL / output).read_bytes() == expected, output
