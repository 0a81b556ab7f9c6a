"""Between-workflow cache (docs/cluster.md): separate checkouts share one ``SNAKEMAKE_OUTPUT_CACHE``.

A second checkout of the same model restores every converted and compiled part from the cache with the same bytes;
different parts never share an entry (Snakemake's cache key ignores wildcards, docs/snakemake.md); a part whose
weights changed is built again, not restored.
"""

from __future__ import annotations

import pytest

from rebuild_helpers import USER_MODEL, export_small_demo, scale_initializer, user_model_checkout, user_model_config
from workflow_helpers import TEST_VARIANTS, copy_workflow, load_json, run_snakemake

pytestmark = pytest.mark.workflow

CACHED_RULES = ("convert_part_reference", "convert_part_qnn_htp", "compile_part")
# a converted graph's files: the reference's ONNX and its data; qnn-htp's QDQ ONNX and its data (its DLC, convert_dlc,
# is not cached: nothing before the size table reads it)
CONVERTED_FILES = {"reference": 2, "qnn-htp": 2}
TARGET = f"results/{USER_MODEL}/size_table.csv"  # everything the cached rules feed, nothing after it
LAYER = 1


def build_with_cache(workdir, cache):
    """Build TARGET in ``workdir`` with the cache at ``cache``; Snakemake's log."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SNAKEMAKE_OUTPUT_CACHE", str(cache))
        # The target first: --cache takes every word up to the next option.
        result = run_snakemake(workdir, TARGET, "--cache", *CACHED_RULES, config_file=user_model_config(workdir))
    return result.stdout + result.stderr


def cached_outputs(workdir):
    """The outputs of the cached rules, relative to ``workdir`` as Snakemake logs them."""
    out = workdir / "results" / USER_MODEL
    stages = (("converted", "part_*/*"), ("compiled", "part_*"))
    return sorted(str(path.relative_to(workdir)) for stage, pattern in stages for path in (out / stage).rglob(pattern))


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Three checkouts built in turn against one cache: ``first`` fills it, ``second`` is the same model, and
    ``changed`` has one layer's weights scaled in both graphs."""
    root = tmp_path_factory.mktemp("cache")
    cache = root / "cache"
    cache.mkdir()
    exporter = root / "exporter"
    exporter.mkdir()
    exports = export_small_demo(copy_workflow(exporter))
    workdirs = {name: user_model_checkout(root / name, exports) for name in ("first", "second", "changed")}
    for graph in ("prompt", "token"):
        scale_initializer(workdirs["changed"] / "exports" / f"{graph}.onnx",
                          f"model.layers.{LAYER}.mlp.down_proj.weight", 1.5)
    logs = {name: build_with_cache(workdir, cache) for name, workdir in workdirs.items()}
    return workdirs, logs, cache


def test_first_build_stores_every_part_in_the_cache(builds):
    workdirs, logs, cache = builds
    outputs = cached_outputs(workdirs["first"])
    parts = 2   # parts 2 and 3: part 1, the embedding alone, is the bundle's CPU table
    assert set(CONVERTED_FILES) == set(TEST_VARIANTS)
    # converted: parts x graphs x files per variant; compiled: parts x variants
    assert len(outputs) == parts * 2 * sum(CONVERTED_FILES.values()) + parts * len(TEST_VARIANTS)
    for output in outputs:
        assert f"Moving output file {output} to cache." in logs["first"], output
        assert (workdirs["first"] / output).resolve().parent == cache.resolve(), output


def test_second_checkout_restores_every_part_from_the_cache_with_the_same_bytes(builds):
    workdirs, logs, _ = builds
    outputs = cached_outputs(workdirs["second"])
    assert outputs == cached_outputs(workdirs["first"])
    assert "to cache." not in logs["second"], "the second checkout built a part itself"
    for output in outputs:
        assert f"Symlinking output file {output} from cache." in logs["second"], output
        assert (workdirs["second"] / output).read_bytes() == (workdirs["first"] / output).read_bytes(), output
    table = f"results/{USER_MODEL}/size_table.csv"
    assert (workdirs["second"] / table).read_bytes() == (workdirs["first"] / table).read_bytes()


def test_different_parts_never_share_a_cache_entry(builds):
    workdirs, _, cache = builds
    first = workdirs["first"]
    entries = {output: (first / output).resolve() for output in cached_outputs(first)}
    assert len(set(entries.values())) == len(entries), "two outputs point at one cache entry"
    binaries = {output: (first / output).read_bytes() for output in entries if output.endswith(".bin")}
    assert len(set(binaries.values())) == len(binaries), "two parts or variants compiled to the same bytes"


def test_a_part_whose_weights_changed_is_built_not_restored(builds):
    workdirs, logs, _ = builds
    changed, first = workdirs["changed"], workdirs["first"]
    holder = next(part["label"] for part in load_json(changed / "results" / USER_MODEL / "plan.json")["parts"]
                  if part["first_layer"] is not None and part["first_layer"] <= LAYER <= part["last_layer"])
    for output in cached_outputs(changed):
        if f"/part_{holder}." in output:
            assert f"Moving output file {output} to cache." in logs["changed"], f"{output} restored, stale"
            if output.endswith(".bin"):
                assert (changed / output).read_bytes() != (first / output).read_bytes(), output
        else:
            assert f"Symlinking output file {output} from cache." in logs["changed"], output
