"""Rebuild precision: after ONE ``snakemake --cores 2``, exactly the outputs a change affects are rewritten
(judged by output mtimes), and nothing else.

The module builds one user model once (the small demo's files under exports/, as a user's export would be); each
case runs on its own copy of that built directory, Snakemake state included, so no case needs a restoring rebuild.
A change to one weight's encodings is covered by test_workflow.py.
"""

from __future__ import annotations

import os
import re

import pytest
import yaml

from genie_build.conventions import PART_WEIGHTS_NAME
from genie_build.fileio import sha256_file
from rebuild_helpers import (USER_MODEL, clone_workdir, export_small_demo, matching,
                             scale_initializer, user_model_config, variant_options)
from workflow_helpers import (TEST_VARIANTS, changed_since, copy_workflow, load_json, output_mtimes, run_snakemake,
                              scale_encoding)

pytestmark = pytest.mark.workflow

BUNDLE_VARIANT = "qnn-htp"
AGGREGATES = ("size_table.*", "memory_plan.*", "genie_bundle/*", "bundle_check.json", "host_run.json",
              "genie_run.json")
# The bundle variant's parts compiled again without weight sharing, for the host run (rules/compile.smk)
TWINS = "twin/part_{}/*"
# Rewritten whenever the split runs again; what matters is which parts' bytes changed (checked by content).
SPLIT_BOOKKEEPING = ("plan.json", "split.json", "parts/*", "encodings/*")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One full build of the user model; cases work on copies (see ``case``)."""
    workdir = copy_workflow(tmp_path_factory.mktemp("rebuild-base"))
    export_small_demo(workdir)
    config_file = user_model_config(workdir)
    run_snakemake(workdir, config_file=config_file)
    return workdir, config_file


@pytest.fixture
def case(built, tmp_path):
    """This case's own copy of the built directory, and its config file."""
    base, config_file = built
    workdir = clone_workdir(base, tmp_path / "wf")
    return workdir, workdir / config_file.name


def rebuild(workdir, config_file, before):
    """Run Snakemake once; the outputs under results/<model>/ whose mtime is no longer what ``before`` recorded."""
    run_snakemake(workdir, config_file=config_file)
    return changed_since(before, output_mtimes(workdir, USER_MODEL))


def assert_rebuilt_exactly(changed, before, expected, may_change=()):
    """``changed`` is every output matching ``expected`` and nothing else, apart from ``may_change``."""
    wanted = matching(set(before), *expected)
    assert wanted, f"no output matches {expected}"
    unexpected = changed - wanted - matching(changed, *may_change)
    missing = wanted - changed
    assert not unexpected and not missing, (f"rebuilt but should not have been: {sorted(unexpected)}\n"
                                            f"should have been rebuilt: {sorted(missing)}")


def per_part(*labels, variant="*", stages=("converted", "compiled", "sizes", "twin")):
    """Patterns for one or more parts' per-part outputs (converted per graph, compiled and sized per variant, the
    bundle variant's twin)."""
    patterns = {"converted": "converted/*/part_{}/*", "compiled": f"compiled/{variant}/part_{{}}.bin",
                "sizes": f"sizes/{variant}/part_{{}}.json", "twin": TWINS}
    return tuple(patterns[stage].format(label) for label in labels for stage in stages
                 if stage != "twin" or variant in ("*", BUNDLE_VARIANT))


def plan_of(workdir):
    return load_json(workdir / "results" / USER_MODEL / "plan.json")


def part_hashes(workdir):
    parts = workdir / "results" / USER_MODEL / "parts"
    return {str(path.relative_to(parts)): sha256_file(path) for path in parts.rglob("part_*/*")}


def test_touched_inputs_with_the_same_bytes_rebuild_nothing(case):
    workdir, config_file = case
    before = output_mtimes(workdir, USER_MODEL)
    for path in (workdir / "exports").iterdir():
        os.utime(path)  # newer than every output, same bytes: the recorded checksums must stop the rerun
    assert rebuild(workdir, config_file, before) == set()


def test_boundary_activation_encoding_rebuilds_the_two_parts_that_share_it(case):
    workdir, config_file = case
    parts = plan_of(workdir)["parts"]
    index = next(i for i, part in enumerate(parts[:-1]) if part["first_layer"] is not None)
    tensor = parts[index]["output_boundary"]
    assert re.fullmatch(r"/model/layers\.\d+/Add_1_output_0", tensor)
    sharing = (parts[index]["label"], parts[index + 1]["label"])
    before = output_mtimes(workdir, USER_MODEL)
    for graph in ("prompt", "token"):  # a boundary keeps identical encodings in both graphs
        scale_encoding(workdir / "exports" / f"{graph}.encodings.json", tensor, 1.5, "activation_encodings")

    changed = rebuild(workdir, config_file, before)

    assert_rebuilt_exactly(changed, before, (*per_part(*sharing), *AGGREGATES), may_change=("plan.json", "encodings/*"))


@pytest.mark.parametrize("variant", TEST_VARIANTS)
def test_variant_option_change_recompiles_only_that_variant(case, variant):
    workdir, _ = case
    variants = {name: variant_options(workdir, name) for name in TEST_VARIANTS}
    config_file = user_model_config(workdir, {"variants": {**variants, variant: {**variants[variant], "vtcm_mb": 2}}},
                                    name="vtcm.yaml")
    assert set(yaml.safe_load(config_file.read_text())["variants"]) == set(TEST_VARIANTS)
    before = output_mtimes(workdir, USER_MODEL)

    changed = rebuild(workdir, config_file, before)

    labels = [part["label"] for part in plan_of(workdir)["parts"]]
    expected = (*per_part(*labels, variant=variant, stages=("compiled", "sizes", "twin")), "size_table.*")
    if variant == BUNDLE_VARIANT:  # its binaries are the bundle's, and its twins are compiled like them
        expected += AGGREGATES
    assert_rebuilt_exactly(changed, before, expected)


def test_one_layer_weight_change_rebuilds_only_the_part_holding_it(case):
    workdir, config_file = case
    layer = 1
    holder = next(part["label"] for part in plan_of(workdir)["parts"]
                  if part["first_layer"] is not None and part["first_layer"] <= layer <= part["last_layer"])
    hashes_before = part_hashes(workdir)
    before = output_mtimes(workdir, USER_MODEL)
    for graph in ("prompt", "token"):  # one weight, identical in both graphs as Genie requires
        scale_initializer(workdir / "exports" / f"{graph}.onnx", f"model.layers.{layer}.mlp.down_proj.weight", 1.5)

    changed = rebuild(workdir, config_file, before)

    hashes_after = part_hashes(workdir)
    # the part's data, and the .onnx files that carry the data's SHA-1 (what the converts depend on)
    assert {path for path in hashes_after if hashes_after[path] != hashes_before.get(path)} == {
        f"part_{holder}/{name}" for name in ("prompt.onnx", "token.onnx", PART_WEIGHTS_NAME)}
    assert_rebuilt_exactly(changed, before, (*per_part(holder), *AGGREGATES, "verify/*", "model_check.json"),
                           may_change=SPLIT_BOOKKEEPING)


def test_target_chipset_change_recompiles_everything_but_converts_nothing(case):
    workdir, _ = case
    config_file = user_model_config(workdir, {"target": {"chipset": "SM8650"}}, name="sm8650.yaml")
    labels = [part["label"] for part in plan_of(workdir)["parts"]]
    before = output_mtimes(workdir, USER_MODEL)

    changed = rebuild(workdir, config_file, before)

    assert_rebuilt_exactly(changed, before, (*per_part(*labels, stages=("compiled", "sizes", "twin")), *AGGREGATES))


def test_toolchain_version_change_reconverts_and_recompiles_but_does_not_split(case, monkeypatch):
    """The reference toolchain is genie_build itself, so a new toolchain is a genie_build with another version:
    the workdir's own copy of the package (copy_workflow copies workflow/), put first on PYTHONPATH for Snakemake
    and every job, with its ``__version__`` changed. Nothing is installed and the repository is not touched."""
    workdir, config_file = case
    package_init = workdir / "workflow" / "genie_build" / "__init__.py"
    text = package_init.read_text()
    version = re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE).group(1)
    new_version = f"{version}+rebuild-test"
    labels = [part["label"] for part in plan_of(workdir)["parts"]]
    before = output_mtimes(workdir, USER_MODEL)
    package_init.write_text(text.replace(f'__version__ = "{version}"', f'__version__ = "{new_version}"'))
    monkeypatch.setenv("PYTHONPATH", str(workdir / "workflow"))

    changed = rebuild(workdir, config_file, before)

    manifest = load_json(workdir / "results" / USER_MODEL / "genie_bundle" / "manifest.json")
    assert new_version in manifest["tool_versions"].values(), "the jobs did not run the changed toolchain"
    assert_rebuilt_exactly(changed, before, (*per_part(*labels), *AGGREGATES))
