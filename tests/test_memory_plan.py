"""Memory plan: warnings at the limits, the sizes it reports, its outputs and the memory-plan command."""

from __future__ import annotations

import json
import logging

import pytest

from genie_build import cli
from genie_build.chipsets import HTP_MODEL_BYTES, HTP_SESSION_BYTES
from genie_build.config import read_schema
from genie_build.errors import GenieBuildError
from genie_build.sizes.memory_plan import (MemoryLimits, PartSize, memory_plan_json, memory_plan_markdown,
                                           part_sizes_from_records, plan_memory, write_memory_plan)
from genie_build.sizes.sizes import AccountRecord
from genie_build.toolchains.base import AppliedOptions
from genie_build.units import MIB

GIB = 1024 ** 3


def checks(plan) -> list[tuple[str, int | None]]:
    return [(warning.check, warning.part) for warning in plan.warnings]


def test_defaults_are_the_documented_limits():
    assert MemoryLimits().max_context_bytes == 2 * GIB
    assert MemoryLimits().max_session_bytes == int(3.75 * GIB)
    assert MemoryLimits().max_contexts is None


def test_the_configs_default_limits_are_the_devices():
    """report.max_context_mb and max_session_mb default to the chipset module's limits: the schema cannot import
    them, so this holds the two in step."""
    report = read_schema()["properties"]["report"]["properties"]
    assert report["max_context_mb"]["default"] * MIB == HTP_MODEL_BYTES
    assert report["max_session_mb"]["default"] * MIB == HTP_SESSION_BYTES


@pytest.mark.parametrize("delta, warned", [(-1, False), (0, False), (1, True)])
def test_context_size_warning_just_under_at_and_just_over_the_limit(delta, warned):
    limits = MemoryLimits(max_context_bytes=1000, max_session_bytes=10**9)
    plan = plan_memory([PartSize(1, 10, 500), PartSize(2, 900, 1000 + delta)], "packed", limits)
    assert checks(plan) == ([("context_size", 2)] if warned else [])


@pytest.mark.parametrize("delta, warned", [(-1, False), (0, False), (1, True)])
def test_session_warning_just_under_at_and_just_over_the_limit(delta, warned):
    limits = MemoryLimits(max_context_bytes=10**9, max_session_bytes=3000)
    plan = plan_memory([PartSize(1, 900, 1000), PartSize(2, 900, 1000), PartSize(3, 900, 1000 + delta)],
                       "packed", limits)
    assert checks(plan) == ([("session_total", None)] if warned else [])


def test_session_check_uses_file_bytes_not_only_weights():
    """Weights alone fit; the binaries (weights plus graph data) do not."""
    plan = plan_memory([PartSize(1, 1400, 1600), PartSize(2, 1400, 1600)], "packed",
                       MemoryLimits(max_context_bytes=10**9, max_session_bytes=3000))
    assert checks(plan) == [("session_total", None)]
    assert plan.warnings[0].value == 3200 and plan.warnings[0].limit == 3000


@pytest.mark.parametrize("max_contexts, warned", [(None, False), (7, False), (6, False), (5, True)])
def test_context_count_warning_only_when_configured(max_contexts, warned):
    sizes = [PartSize(index, 10, 20) for index in range(1, 7)]
    plan = plan_memory(sizes, "packed", MemoryLimits(max_contexts=max_contexts))
    assert checks(plan) == ([("context_count", None)] if warned else [])


def test_field_report_shape_warns_on_the_session_but_not_per_context(caplog):
    """Six parts of a 4.7 GB build: each part is fine, the total (6 x 783e6 bytes = 4,480.36 MiB) is over 3.75 GiB
    (and it still ran there)."""
    sizes = [PartSize(index, 740 * 10**6, 783 * 10**6) for index in range(1, 7)]
    with caplog.at_level(logging.WARNING, logger="genie_build.sizes.memory_plan"):
        plan = plan_memory(sizes, "packed")
    assert checks(plan) == [("session_total", None)]
    assert plan.warnings[0].sources == ("HTPDOC", "FIELD")
    assert len(caplog.records) == 1 and "4,480.36 MiB" in caplog.records[0].getMessage()


def test_largest_part_totals_and_part_order():
    plan = plan_memory([PartSize(3, 300, 310), PartSize(1, 100, 120), PartSize(2, 700, 720)], "packed")
    assert [size.part for size in plan.parts] == [1, 2, 3]
    assert plan.largest_part == PartSize(2, 700, 720)
    assert (plan.num_contexts, plan.total_weight_bytes, plan.total_file_bytes) == (3, 1100, 1150)


def test_bad_sizes_are_errors():
    with pytest.raises(GenieBuildError, match="no part sizes"):
        plan_memory([], "packed")
    with pytest.raises(GenieBuildError, match="part 1 of variant 'packed' given twice"):
        plan_memory([PartSize(1, 1, 1), PartSize(1, 2, 2)], "packed")
    with pytest.raises(GenieBuildError, match="negative sizes"):
        plan_memory([PartSize(1, -1, 1)], "packed")
    with pytest.raises(GenieBuildError, match="'guessed' is not one of"):
        plan_memory([PartSize(1, 1, 1)], "packed", basis="guessed")


def test_sizes_from_records_keep_only_the_variant():
    records = [AccountRecord(1, "unpacked", "reference", 900, 800, {}, AppliedOptions()),
               AccountRecord(1, "packed", "reference", 500, 400, {}, AppliedOptions())]
    assert part_sizes_from_records(records, "packed") == (PartSize(1, 400, 500),)
    with pytest.raises(GenieBuildError, match=r"no accounting records for variant 'fast'; records have "
                                              r"\['packed', 'unpacked'\]"):
        part_sizes_from_records(records, "fast")


def test_json_names_sources_limits_and_says_guidance_only():
    plan = plan_memory([PartSize(1, 100, 3 * GIB)], "packed", MemoryLimits(max_contexts=4), basis="predicted")
    data = json.loads(json.dumps(memory_plan_json(plan)))

    assert data["guidance_only"] is True and "not a guarantee" in data["disclaimer"]
    assert "11-part" in data["disclaimer"] and "6-part" in data["disclaimer"]
    assert data["basis"] == "predicted" and data["num_contexts"] == 1
    assert data["largest_part"] == {"part": 1, "weight_bytes": 100, "file_bytes": 3 * GIB}
    assert data["limits"]["max_context_bytes"] == {"value": 2 * GIB, "sources": ["AIHM", "HTPDOC"]}
    assert data["limits"]["max_contexts"]["value"] == 4
    assert [w["check"] for w in data["warnings"]] == ["context_size"]
    assert "1-2 GB" in data["sources"]["AIHM"] and "3.75 GB" in data["sources"]["HTPDOC"]


def test_markdown_shows_parts_checks_and_warnings():
    plan = plan_memory([PartSize(1, 256 * MIB, 300 * MIB), PartSize(2, 2048 * MIB, 2100 * MIB)], "packed")
    markdown = memory_plan_markdown(plan)

    assert markdown.startswith("# Memory plan for `packed` (2 contexts, sizes measured)\n\n> This plan is guidance")
    assert "| 1 | 256.00 | 300.00 | 14.6% |" in markdown
    assert "| **total** | **2,304.00** | **2,400.00** | |" in markdown
    assert "| largest context binary | 2,100.00 MiB (part 2) | 2,048.00 MiB | **over** | AIHM, HTPDOC |" in markdown
    assert "| all context binaries in one HTP session | 2,400.00 MiB | 3,840.00 MiB | ok | HTPDOC, FIELD |" in markdown
    assert "| number of contexts | 2 | none | not set | FIELD |" in markdown
    assert "- part 2: context binary 2,100.00 MiB is over" in markdown


def test_markdown_says_unknown_for_weights_a_toolchain_cannot_read_back():
    markdown = memory_plan_markdown(plan_memory([PartSize(1, 0, MIB), PartSize(2, 0, MIB)], "qnn"))
    assert "| 1 | unknown | 1.00 | 0.0% |" in markdown
    assert "| **total** | **unknown** | **2.00** | |" in markdown


def test_write_memory_plan_writes_all_three_files(tmp_path):
    plan = plan_memory([PartSize(1, 10, 20)], "packed")
    write_memory_plan(plan, tmp_path / "memory_plan.json", tmp_path / "memory_plan.md", tmp_path / "memory_plan.png")
    assert json.loads((tmp_path / "memory_plan.json").read_text())["total_file_bytes"] == 20
    assert (tmp_path / "memory_plan.png").read_bytes().startswith(b"\x89PNG")
    assert "## Warnings\n\nNone." in (tmp_path / "memory_plan.md").read_text()


def test_memory_plan_command_applies_the_limits_in_mib(tmp_path):
    paths = []
    for part, size in ((1, 3 * MIB), (2, 5 * MIB)):
        path = tmp_path / f"part_0{part}_of_02.json"
        path.write_text(json.dumps({"part": part, "variant": "packed", "toolchain": "reference", "bytes": size,
                                    "weight_bytes": size - 100, "requested": {}, "applied": {}}))
        paths.append(str(path))
    out_json, out_md = tmp_path / "memory_plan.json", tmp_path / "memory_plan.md"

    code = cli.main(["memory-plan", "--records", *paths, "--variant", "packed", "--max-context-mb", "4",
                     "--max-session-mb", "8", "--max-contexts", "1", "--json", str(out_json), "--md", str(out_md),
                     "--png", str(tmp_path / "memory_plan.png")])

    assert code == 0
    data = json.loads(out_json.read_text())
    assert data["limits"]["max_context_bytes"]["value"] == 4 * MIB
    # 8 MiB total is at the session limit, not over it
    assert [(w["check"], w["part"]) for w in data["warnings"]] == [("context_size", 2), ("context_count", None)]
    assert out_md.exists()


def test_memory_plan_command_refuses_a_non_positive_limit(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["memory-plan", "--records", "x.json", "--variant", "packed", "--max-context-mb", "0",
                  "--json", str(tmp_path / "a.json"), "--md", str(tmp_path / "a.md"), "--png", str(tmp_path / "a.png")])
    assert "must be positive" in capsys.readouterr().err
