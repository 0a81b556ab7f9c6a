"""bundle.share_resources: the keys it writes into the bundle's two configs, and what check-bundle says about the
extension config's context and groupContext sections."""

from __future__ import annotations

import pytest

from genie_build.bundle.check_bundle import check_bundle
from genie_build.genie_config import make_genie_config, make_htp_backend_ext_config

from bundle_helpers import demo_hf_config, edit_json, write_bundle, write_tokenizer


def htp_findings(bundle) -> list[tuple[str, str]]:
    return [(f.severity, f.message) for f in check_bundle(bundle, chipset="SM8750") if f.rule == "htp-extensions"]


def share(bundle, async_init: bool) -> None:
    edit_json(bundle / "htp_backend_ext_config.json", lambda c: c.update(groupContext={"share_resources": True}))
    edit_json(bundle / "genie_config.json",
              lambda c: c["dialog"]["engine"]["backend"]["QnnHtp"].update({"allow-async-init": async_init}))


def test_share_resources_writes_the_group_context_and_async_init(tmp_path):
    assert make_htp_backend_ext_config("SM8750", share_resources=True)["groupContext"] == {"share_resources": True}
    assert "groupContext" not in make_htp_backend_ext_config("SM8750")
    tokenizer = write_tokenizer(tmp_path / "tokenizer.json")
    for shared in (True, False):
        config = make_genie_config(demo_hf_config(), tokenizer, ["a.bin"], 64, share_resources=shared)
        assert config["dialog"]["engine"]["backend"]["QnnHtp"]["allow-async-init"] is shared


def test_a_bundle_sharing_resources_with_async_init_passes(tmp_path):
    bundle = write_bundle(tmp_path / "b")
    share(bundle, async_init=True)
    assert htp_findings(bundle) == []
    assert [f for f in check_bundle(bundle, chipset="SM8750") if f.severity == "error"] == []


def test_share_resources_without_async_init_is_a_warning(tmp_path):
    """The ChatApp's pairing: Genie creates the contexts one by one and never applies the group option."""
    bundle = write_bundle(tmp_path / "b")
    share(bundle, async_init=False)
    assert htp_findings(bundle) == [("warning", "htp_backend_ext_config.json: groupContext.share_resources is true "
                                                "but QnnHtp allow-async-init is not: Genie then creates the contexts "
                                                "one by one and the group option has no effect")]


@pytest.mark.parametrize("section, body, message", [
    ("groupContext", {"share_resource": True}, "groupContext has key 'share_resource' that the HTP backend does not "
                                               "know (known: share_resources, share_resources_optimization_type, "
                                               "reused_io_limit_mb)"),
    ("groupContext", {"share_resources": "yes"}, "groupContext.share_resources must be bool, got 'yes'"),
    ("context", {"io_memory_estimation": 1}, "context.io_memory_estimation must be bool, got 1"),
    ("groupContext", [True], "groupContext must be an object, got [True]"),
    ("context", {"concurrent_deserialization_patch": True},
     "context.concurrent_deserialization_patch must be str, got True"),   # the library's schema: a string
    ("context", [{"weight_sharing_enabled": True}, {"io_memory_estimation": "yes"}],   # qairt's list form
     "context[1].io_memory_estimation must be bool, got 'yes'"),
    ("memory", {"mem_type": "ion"}, "memory.mem_type is 'ion'; the HTP backend takes shared_buffer"),
])
def test_unknown_or_mistyped_extension_keys_are_errors(tmp_path, section, body, message):
    bundle = write_bundle(tmp_path / "b")
    edit_json(bundle / "htp_backend_ext_config.json", lambda c: c.update({section: body}))
    assert htp_findings(bundle) == [("error", f"htp_backend_ext_config.json: {message}")]


def test_the_context_section_of_the_vendors_template_passes(tmp_path):
    """The context section of quic/ai-hub-apps' template (tests/data/vendor/htp_backend_ext_config.json.template)."""
    bundle = write_bundle(tmp_path / "b")
    edit_json(bundle / "htp_backend_ext_config.json", lambda c: c.update(context={"weight_sharing_enabled": True}))
    assert htp_findings(bundle) == []
