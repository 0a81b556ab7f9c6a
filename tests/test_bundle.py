"""Bundle assembly: the files Genie needs, metadata read back from the ctx-bins, a manifest of hashes;
deterministic bytes; atomic (a failure leaves nothing at the final path, and an old bundle intact)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

import genie_build.bundle.bundle as bundle_module
from bundle_helpers import TINY_DEMO, ReferenceBuild
from genie_build.bundle.bundle import assemble_bundle, runtime_tool_versions
from genie_build.bundle.check_bundle import check_bundle
from genie_build.bundle.metadata import METADATA_NAME, parse_metadata
from genie_build.cli import main
from genie_build.errors import GenieBuildError
from genie_build.toolchains.reference.container_format import inspect_container

CTX_BINS = ["demo_part_1_of_3.bin", "demo_part_2_of_3.bin", "demo_part_3_of_3.bin"]
CONFIG_USED = {"model": {"name": "demo"}, "bundle": {"variant": "packed"}}


def assemble(build: ReferenceBuild, out_dir: Path, binaries: list[Path] | None = None, **overrides) -> Path:
    arguments = {"toolchain": "reference", "hf_config_path": build.source / "config.json",
                 "tokenizer_path": build.source / "tokenizer.json", "chipset": "SM8750", "context_size": 64,
                 "config_used": CONFIG_USED, "tool_versions": runtime_tool_versions(), "model_name": "demo",
                 **overrides}
    return assemble_bundle(out_dir, binaries if binaries is not None else list(build.binaries), **arguments)


def test_bundle_holds_what_genie_needs_in_part_order(build: ReferenceBuild) -> None:
    files = sorted(path.name for path in build.bundle.iterdir())
    assert files == sorted(CTX_BINS + ["genie_config.json", "htp_backend_ext_config.json", "manifest.json",
                                       METADATA_NAME, "tokenizer.json"])
    for name, source in zip(CTX_BINS, build.binaries):
        assert (build.bundle / name).read_bytes() == source.read_bytes()
    config = json.loads((build.bundle / "genie_config.json").read_text())
    assert config["dialog"]["engine"]["model"]["binary"]["ctx-bins"] == CTX_BINS
    assert (build.bundle / "tokenizer.json").read_bytes() == (build.source / "tokenizer.json").read_bytes()
    assert check_bundle(build.bundle, hf_config=build.source / "config.json", chipset="SM8750") == []


def test_metadata_is_what_the_ctx_bins_say(build: ReferenceBuild) -> None:
    metadata = parse_metadata((build.bundle / METADATA_NAME).read_text(), METADATA_NAME)
    assert metadata == {name: inspect_container(build.bundle / name).graphs for name in CTX_BINS}
    first = yaml.safe_load((build.bundle / METADATA_NAME).read_text())["model_files"][CTX_BINS[0]]
    assert list(first["graphs"]) == ["prompt_ar8_cl64_1_of_3", "token_ar1_cl64_1_of_3"]
    assert first["applied_options"]["weight_sharing_enabled"] is True


def test_manifest_hashes_every_file_and_records_versions_and_config(build: ReferenceBuild) -> None:
    manifest = json.loads((build.bundle / "manifest.json").read_text())
    assert set(manifest["files"]) == {path.name for path in build.bundle.iterdir()} - {"manifest.json"}
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == hashlib.sha256((build.bundle / name).read_bytes()).hexdigest()
    assert manifest["tool_versions"]["reference toolchain"] == inspect_container(build.binaries[0]).tool_version
    assert {"genie-build", "python", "onnxruntime"} <= set(manifest["tool_versions"])


def test_two_assemblies_are_byte_identical(build: ReferenceBuild, tmp_path: Path) -> None:
    first, second = assemble(build, tmp_path / "one"), assemble(build, tmp_path / "two")
    names = sorted(path.name for path in first.iterdir())
    assert names == sorted(path.name for path in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert json.loads((first / "manifest.json").read_text())["config_used"] == CONFIG_USED


def test_a_failed_assembly_leaves_no_bundle(build: ReferenceBuild, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"not a context binary")
    with pytest.raises(GenieBuildError, match=r"garbage\.bin: not a genie-build reference context binary"):
        assemble(build, tmp_path / "out" / "bundle", [build.binaries[0], garbage, build.binaries[2]])
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_a_failure_while_writing_removes_the_staging_dir_and_keeps_the_old_bundle(
        build: ReferenceBuild, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = assemble(build, tmp_path / "bundle")
    before = {path.name: path.read_bytes() for path in old.iterdir()}

    def disk_full(*args, **kwargs):
        raise GenieBuildError("manifest.json", "cannot write: No space left on device")

    monkeypatch.setattr(bundle_module, "manifest_document", disk_full)
    with pytest.raises(GenieBuildError, match="No space left"):
        assemble(build, tmp_path / "bundle")
    assert [path.name for path in tmp_path.iterdir()] == ["bundle"]  # no staging or .old directory left
    assert {path.name: path.read_bytes() for path in old.iterdir()} == before


def test_reassembly_replaces_the_whole_bundle(build: ReferenceBuild, tmp_path: Path) -> None:
    out = assemble(build, tmp_path / "bundle")
    (out / "stale.bin").write_bytes(b"from an earlier build with more parts")
    assemble(build, out, list(build.binaries[:2]) + [build.binaries[2]])
    assert not (out / "stale.bin").exists()
    assert check_bundle(out) == []


@pytest.mark.parametrize("name", ["../escape", "a/b", "", "-x"])
def test_model_name_must_be_a_safe_file_name_prefix(build: ReferenceBuild, tmp_path: Path, name: str) -> None:
    with pytest.raises(GenieBuildError, match="^model.name: "):
        assemble(build, tmp_path / "bundle", model_name=name)
    assert not (tmp_path / "bundle").exists()


def test_missing_ctx_bin_is_named(build: ReferenceBuild, tmp_path: Path) -> None:
    with pytest.raises(GenieBuildError, match=r"nope\.bin: ctx-bin not found"):
        assemble(build, tmp_path / "bundle", [tmp_path / "nope.bin"])


def test_bundle_command_records_the_config_used(build: ReferenceBuild, tmp_path: Path) -> None:
    reordered = dict(reversed(CONFIG_USED.items()))  # key order must not change the manifest
    out = tmp_path / "bundle"
    assert main(["bundle", "--binaries", *map(str, build.binaries), "--toolchain", "reference",
                 "--model-name", "demo", "--hf-config", str(build.source / "config.json"),
                 "--tokenizer", str(build.source / "tokenizer.json"), "--chipset", "SM8750",
                 "--config-json", json.dumps(reordered), "--out-dir", str(out)]) == 0
    assert json.loads((out / "manifest.json").read_text())["config_used"] == CONFIG_USED
    assert (out / "manifest.json").read_bytes() == (assemble(build, tmp_path / "api") / "manifest.json").read_bytes()
    assert main(["bundle", "--binaries", str(build.binaries[0]), "--toolchain", "reference", "--model-name", "x",
                 "--hf-config", "c", "--tokenizer", "t", "--chipset", "SM8750", "--config-json", "[1]",
                 "--out-dir", str(tmp_path / "never")]) == 2
    assert not (tmp_path / "never").exists()


def test_context_size_defaults_to_the_compiled_context_length(build: ReferenceBuild, tmp_path: Path) -> None:
    config = json.loads((assemble(build, tmp_path / "b", context_size=None) / "genie_config.json").read_text())
    assert config["dialog"]["context"]["size"] == 64
    config = json.loads((assemble(build, tmp_path / "c", context_size=48) / "genie_config.json").read_text())
    assert config["dialog"]["context"]["size"] == 48


def test_a_bundle_that_fails_its_check_is_never_published_and_an_old_one_goes_too(build: ReferenceBuild,
                                                                                   tmp_path: Path) -> None:
    """Assembled from a config.json whose vocab_size is wider than the logits, the bundle would say n-vocab 4096 for
    fewer logits and fail on the phone: the command fails with every error in one line, and nothing is left at the
    bundle's path -- not the new bundle, and not the old one, whose manifest the workflow removes anyway."""
    config = json.loads((build.source / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": 4096}))
    out = tmp_path / "genie_bundle"
    assemble(build, out)  # a bundle from an earlier, good build
    with pytest.raises(GenieBuildError) as caught:
        assemble(build, out, hf_config_path=tmp_path / "config.json")
    assert caught.value.where == str(out)
    last_prompt_graph = f"prompt_ar{TINY_DEMO['ar']}_cl{TINY_DEMO['context']}_3_of_3"
    assert caught.value.problem == (f"1 error(s): [n-vocab] context.n-vocab is 4096 but the logits of graph "
                                    f"{last_prompt_graph!r} is {TINY_DEMO['vocab']} wide: Genie would read past them")
    assert not out.exists() and [path.name for path in tmp_path.iterdir()] == ["config.json"]


def test_check_bundle_withdraw_moves_a_failing_bundle_aside(build: ReferenceBuild, tmp_path: Path) -> None:
    out = assemble(build, tmp_path / "genie_bundle")
    (out / "demo_part_2_of_3.bin").write_bytes(b"changed after the build")
    assert main(["check-bundle", str(out), "--withdraw", "--out", str(tmp_path / "check.json")]) == 1
    assert not out.exists() and (tmp_path / "genie_bundle.rejected" / "manifest.json").exists()
    assert not (tmp_path / "check.json").exists()
    assert main(["check-bundle", str(assemble(build, out)), "--withdraw"]) == 0 and out.exists()


@pytest.mark.parametrize("value, written", [(None, "unset"), ("true", True), ("false", False)])
def test_graph_switching_reaches_genies_config_through_the_command(build: ReferenceBuild, tmp_path: Path,
                                                                   value: str | None, written: object) -> None:
    """bundle.graph_switching as bundle.smk passes it: absent (the key is not written), true or false."""
    switch = [] if value is None else ["--graph-switching", value]
    assert main(["bundle", "--binaries", *map(str, build.binaries), "--toolchain", "reference", "--model-name", "demo",
                 "--hf-config", str(build.source / "config.json"), "--tokenizer", str(build.source / "tokenizer.json"),
                 "--chipset", "SM8750", *switch, "--out-dir", str(tmp_path / "b")]) == 0
    qnn_htp = json.loads((tmp_path / "b" / "genie_config.json").read_text())["dialog"]["engine"]["backend"]["QnnHtp"]
    assert qnn_htp.get("enable-graph-switching", "unset") == written
