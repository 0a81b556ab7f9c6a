"""Size accounting, the A/B size table and its renderings, the account/size-table commands, report captions."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import jinja2
import pandas as pd
import pytest
from docutils.core import publish_parts

from genie_build import cli
from genie_build.errors import GenieBuildError
from genie_build.sizes import sizes
from genie_build.sizes.sizes import (AccountRecord, account_binary, build_size_table, read_record, size_table_markdown,
                                     write_size_table)
from genie_build.toolchains.base import AppliedOptions, BinaryInfo, GraphInfo, TensorInfo

REPORT_DIR = Path(__file__).resolve().parents[1] / "workflow" / "report"
UNPACKED = {"toolchain": "reference", "weights_packing": False, "weight_sharing_enabled": True}
PACKED = {"toolchain": "reference", "weights_packing": True, "weight_sharing_enabled": True}


def record(part: int, variant: str, size: int, **fields: object) -> AccountRecord:
    """An accounting record (:func:`record_json`), its sizes not checked: the table takes small made-up ones."""
    data = record_json(part, variant, size, **fields)
    return AccountRecord(**{**data, "applied": AppliedOptions(**data["applied"])})


def record_json(part: int, variant: str, size: int, *, weight_bytes: int | None = None,
                requested: dict | None = None, applied: dict | None = None) -> dict:
    """A record as ``account`` writes it; a variant named "packed*" requests packing unless told otherwise."""
    requested = requested if requested is not None else (PACKED if variant.startswith("packed") else UNPACKED)
    return {"part": part, "variant": variant, "toolchain": "reference", "tool_version": "0.1.0",
            "binary": f"compiled/{variant}/part_{part:02d}_of_03.bin", "bytes": size,
            "weight_bytes": size - 1000 if weight_bytes is None else weight_bytes,
            "requested": dict(requested), "applied": {} if applied is None else applied}


@pytest.fixture
def ab_records() -> list[AccountRecord]:
    """Three parts; packing halves parts 2 and 3 and leaves part 1 (the 8-bit embedding, say) as it was."""
    return [record(1, "unpacked", 2_000_000), record(2, "unpacked", 672_600_000), record(3, "unpacked", 4_000_000),
            record(1, "packed", 2_000_000), record(2, "packed", 337_300_000), record(3, "packed", 2_000_000)]


def binary_info(path: str = "compiled/packed/part_02_of_03.bin", applied: dict | None = None) -> BinaryInfo:
    def tensors(*names: str) -> tuple[TensorInfo, ...]:
        return tuple(TensorInfo(name, (1, 4), "uint16") for name in names)

    graphs = (GraphInfo("prompt_ar32_cl256_02_of_03", tensors("a", "b", "c"), tensors("d", "e")),
              GraphInfo("token_ar1_cl256_02_of_03", tensors("a", "b", "c"), tensors("d", "e")))
    return BinaryInfo(path=path, file_bytes=5000, weight_bytes=4200, graphs=graphs, toolchain="reference",
                      tool_version="0.1.0", applied_options=AppliedOptions(**applied) if applied is not None
                      else AppliedOptions(weights_packing=False, weight_sharing_enabled=True))


def test_importing_sizes_does_not_need_pandas():
    """``account`` runs in the QAIRT SDK's Python env too, which need not have pandas or matplotlib."""
    code = "import sys, genie_build.commands.account; print(sorted({'pandas', 'matplotlib'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# --- accounting -----------------------------------------------------------------------------------------------

def test_account_binary_reports_what_the_binary_holds_beside_the_request():
    account = account_binary(binary_info(), 2, "packed", PACKED).to_dict()

    assert account["part"] == 2 and account["variant"] == "packed"
    assert account["bytes"] == 5000 and account["weight_bytes"] == 4200
    assert [graph["name"] for graph in account["graphs"]] == ["prompt_ar32_cl256_02_of_03", "token_ar1_cl256_02_of_03"]
    assert account["io_tensors"] == 10
    assert account["requested"]["weights_packing"] is True
    assert account["applied"]["weights_packing"] is False
    json.dumps(account)  # the record is written as JSON


def test_check_part_graphs_refuses_another_parts_binary():
    sizes.check_part_graphs(binary_info(), "02_of_03")
    with pytest.raises(GenieBuildError, match="do not belong to part 03_of_03"):
        sizes.check_part_graphs(binary_info(), "03_of_03")


@pytest.mark.parametrize("field, value", [("bytes", "5000"), ("bytes", 0), ("part", True), ("requested", None),
                                          ("weight_bytes", -1)])
def test_read_record_names_the_file_and_the_bad_field(tmp_path, field, value):
    path = tmp_path / "part_01_of_03.json"
    path.write_text(json.dumps({**record_json(1, "packed", 5000), field: value}))
    with pytest.raises(GenieBuildError) as caught:
        read_record(path)
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)


# --- the table --------------------------------------------------------------------------------------------------

def test_table_rows_and_reductions_computed_by_hand(ab_records):
    table = build_size_table(ab_records, "unpacked")

    assert list(zip(table["part"], table["variant"])) == [(1, "unpacked"), (1, "packed"), (2, "unpacked"),
                                                          (2, "packed"), (3, "unpacked"), (3, "packed")]
    packed = table[table["variant"] == "packed"].set_index("part")
    assert packed.at[2, "reduction_vs_baseline"] == pytest.approx(1 - 337.3 / 672.6)   # the field report's 49.9%
    assert packed.at[3, "reduction_vs_baseline"] == pytest.approx(0.5)
    assert (table[table["variant"] == "unpacked"]["reduction_vs_baseline"] == 0.0).all()
    assert (table["baseline"] == "unpacked").all()


def test_baseline_comes_first_whatever_the_record_order(ab_records):
    table = build_size_table(list(reversed(ab_records)), "unpacked")
    assert list(table["variant"][:2]) == ["unpacked", "packed"]
    assert list(table["part"]) == [1, 1, 2, 2, 3, 3]


def test_packing_with_the_same_size_is_flagged_and_logged(ab_records, caplog):
    with caplog.at_level(logging.WARNING, logger="genie_build.sizes.sizes"):
        table = build_size_table(ab_records, "unpacked")

    flags = table.set_index(["part", "variant"])["flag"]
    assert flags[(1, "packed")] == ("weights_packing requested but no effect: 2,000,000 bytes vs 2,000,000 bytes "
                                    "in unpacked")
    assert flags[(2, "packed")] == "" and flags[(3, "packed")] == ""
    assert [r.getMessage() for r in caplog.records] == [f"part 1, variant packed: {flags[(1, 'packed')]}"]


def test_strict_turns_the_flag_into_an_error_naming_the_binary(ab_records):
    with pytest.raises(GenieBuildError, match=r"^compiled/packed/part_01_of_03.bin: weights_packing requested "
                                              r"but no effect"):
        build_size_table(ab_records, "unpacked", strict=True)


def test_strict_passes_a_real_reduction():
    records = [record(1, "unpacked", 1000), record(1, "packed", 500)]
    assert build_size_table(records, "unpacked", strict=True)["flag"].tolist() == ["", ""]


@pytest.mark.parametrize("packed_size, flagged", [(1000, True), (1001, True), (995, True), (991, True),
                                                  (990, False), (600, False)])
def test_under_one_percent_smaller_counts_as_no_effect(packed_size, flagged):
    records = [record(1, "unpacked", 1000), record(1, "packed", packed_size)]
    table = build_size_table(records, "unpacked")
    assert bool(table.loc[table["variant"] == "packed", "flag"].item()) is flagged


def test_packing_the_binary_reports_not_applied_is_flagged_even_when_smaller():
    records = [record(1, "unpacked", 1000), record(1, "packed", 500, applied={"weights_packing": False})]
    flag = build_size_table(records, "unpacked")["flag"].iloc[1]
    assert flag == ("weights_packing requested but the binary reports it not applied: 500 bytes vs 1,000 bytes "
                    "in unpacked")


def test_weight_sharing_reported_not_applied_is_flagged():
    records = [record(1, "unpacked", 1000, applied={"weight_sharing_enabled": False}),
               record(1, "packed", 500, applied={"weight_sharing_enabled": True, "weights_packing": True})]
    flags = build_size_table(records, "unpacked")["flag"].tolist()
    assert flags == ["weight_sharing_enabled requested but the binary reports it not applied", ""]


def test_an_o_level_the_binary_does_not_show_is_flagged_per_graph_in_the_table():
    # applied as qnn-context-binary-utility reports it per graph (graphBlobInfo.info.optimizationLevel)
    asked = {**PACKED, "optimization_type": 3, "vtcm_mb": 0}
    records = [record(1, "unpacked", 1000),
               record(1, "packed", 500, requested=asked, applied={"optimization_type": {"p_1": 2, "t_1": 3}})]
    table = build_size_table(records, "unpacked")
    assert table["flag"].iloc[1] == "optimization_type 3 requested but the binary reports O 2 for graph p_1"
    markdown = size_table_markdown(table)
    assert "[^1]: part 1, `packed`: optimization_type 3 requested but the binary reports O 2 for graph p_1" in markdown


@pytest.mark.parametrize(("requested_mb", "reported", "flagged"), [
    (8, {"p_1": 8, "t_1": 8}, False), (8, {"p_1": 8 * 2**20}, False), (8, {"p_1": 4}, True),
    (0, {"p_1": 4}, False),  # 0 asks for the device maximum, which the table does not know
])
def test_a_vtcm_size_the_binary_does_not_show_is_flagged(requested_mb, reported, flagged):
    asked = {**PACKED, "optimization_type": 3, "vtcm_mb": requested_mb}
    records = [record(1, "unpacked", 1000),
               record(1, "packed", 500, requested=asked, applied={"vtcm_size": reported})]
    flag = build_size_table(records, "unpacked")["flag"].iloc[1]
    assert flag == (f"vtcm_mb {requested_mb} requested but the binary reports VTCM size 4 for graph p_1"
                    if flagged else "")


def test_the_reference_toolchains_scalar_options_are_not_judged_per_graph():
    asked = {**PACKED, "optimization_type": 3, "vtcm_mb": 8}
    records = [record(1, "unpacked", 1000),
               record(1, "packed", 500, requested=asked, applied={"optimization_type": 3, "vtcm_mb": 8})]
    assert build_size_table(records, "unpacked")["flag"].tolist() == ["", ""]


def test_no_size_flag_when_the_baseline_packs_too():
    """Two packing variants of the same size are not evidence that packing did nothing."""
    records = [record(1, "packed", 500), record(1, "packed_o3", 500)]
    assert build_size_table(records, "packed")["flag"].tolist() == ["", ""]


def test_unknown_baseline_duplicate_part_and_missing_part_are_errors(ab_records):
    with pytest.raises(GenieBuildError, match="variant 'nope' has no records"):
        build_size_table(ab_records, "nope")
    with pytest.raises(GenieBuildError, match="part 2 of variant 'packed' accounted twice"):
        build_size_table(ab_records + [record(2, "packed", 1)], "unpacked")
    with pytest.raises(GenieBuildError, match=r"variant 'packed' has parts \[1, 2\] but baseline 'unpacked' has "
                                              r"\[1, 2, 3\]"):
        build_size_table(ab_records[:-1], "unpacked")
    with pytest.raises(GenieBuildError, match="no accounting records"):
        build_size_table([], "unpacked")


# --- renderings ----------------------------------------------------------------------------------------------

def test_markdown_has_parts_as_rows_variants_as_columns_totals_and_reduction(ab_records):
    markdown = size_table_markdown(build_size_table(ab_records, "unpacked"))
    table_lines = [line for line in markdown.splitlines() if line.startswith("|")]

    assert table_lines[0] == "| part | unpacked (MB) | packed (MB) | packed vs unpacked |"
    assert table_lines[2:] == [
        "| 1 | 2.0 | 2.0 [^1] | 0.0% |",
        "| 2 | 672.6 | 337.3 | 49.9% |",
        "| 3 | 4.0 | 2.0 | 50.0% |",
        # 678.6 MB -> 341.3 MB: 1 - 341.3 / 678.6 = 49.7%
        "| **total** | **678.6** | **341.3** | **49.7%** |",
    ]
    assert ("[^1]: part 1, `packed`: weights_packing requested but no effect: 2,000,000 bytes vs 2,000,000 bytes "
            "in unpacked") in markdown


def test_markdown_switches_to_kilobytes_for_a_tiny_model():
    markdown = size_table_markdown(build_size_table([record(1, "unpacked", 52_400), record(1, "packed", 30_100)],
                                                    "unpacked"))
    assert "| part | unpacked (kB) | packed (kB) | packed vs unpacked |" in markdown
    assert "| 1 | 52.4 | 30.1 | 42.6% |" in markdown


def test_written_csv_has_the_tidy_columns_and_dtypes_and_is_deterministic(tmp_path, ab_records):
    table = build_size_table(ab_records, "unpacked")
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        write_size_table(table, out / "size_table.csv", out / "size_table.md", out / "size_table.png")

    for name in ("size_table.csv", "size_table.md", "size_table.png"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    csv = pd.read_csv(first / "size_table.csv", keep_default_na=False)
    assert list(csv.columns) == list(sizes.TABLE_COLUMNS)
    assert pd.api.types.is_integer_dtype(csv["part"]) and pd.api.types.is_integer_dtype(csv["bytes"])
    assert pd.api.types.is_integer_dtype(csv["weight_bytes"])
    assert pd.api.types.is_float_dtype(csv["reduction_vs_baseline"])
    # part order, baseline first within a part
    assert csv["bytes"].tolist() == [2_000_000, 2_000_000, 672_600_000, 337_300_000, 4_000_000, 2_000_000]
    assert csv["flag"].astype(bool).tolist() == [False, True, False, False, False, False]
    assert sorted(p.name for p in first.iterdir()) == ["size_table.csv", "size_table.md", "size_table.png"]


def test_chart_is_a_non_empty_png_of_the_expected_size(ab_records):
    png = sizes.size_chart_png(build_size_table(ab_records, "unpacked"))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width >= 600 and height == 400
    assert len(png) > 5000  # bars, labels and a legend, not a blank canvas


# --- commands ------------------------------------------------------------------------------------------------

class FakeToolchain:
    name = "reference"

    def inspect(self, binary_path: Path) -> BinaryInfo:
        info = binary_info(str(binary_path))
        return BinaryInfo(**{**info.__dict__, "file_bytes": binary_path.stat().st_size})


def test_account_command_writes_the_record(tmp_path, monkeypatch):
    monkeypatch.setattr("genie_build.sizes.sizes.get_toolchain", lambda name: FakeToolchain())
    binary = tmp_path / "compiled" / "packed" / "part_02_of_03.bin"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"\0" * 1234)
    out = tmp_path / "sizes" / "packed" / "part_02_of_03.json"

    code = cli.main(["account", "--toolchain", "reference", "--binary", str(binary), "--part-label", "02_of_03",
                     "--variant", "packed", "--variant-json", json.dumps(PACKED), "--out", str(out)])

    assert code == 0
    written = read_record(out).to_dict()
    assert (written["part"], written["bytes"], written["requested"]) == (2, 1234, PACKED)


@pytest.mark.parametrize("args, message", [
    (["--part-label", "2of3"], "--part-label: not a part label"),
    (["--variant-json", "[1]"], "--variant-json: expected a JSON object"),
    (["--part-label", "03_of_03"], "do not belong to part 03_of_03"),
])
def test_account_command_reports_bad_input_on_one_line(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.setattr("genie_build.sizes.sizes.get_toolchain", lambda name: FakeToolchain())
    binary = tmp_path / "part_02_of_03.bin"
    binary.write_bytes(b"\0")
    defaults = {"--toolchain": "reference", "--binary": str(binary), "--part-label": "02_of_03",
                "--variant": "packed", "--variant-json": "{}", "--out": str(tmp_path / "out.json")}
    defaults.update(dict(zip(args[::2], args[1::2])))

    assert cli.main(["account", *(item for pair in defaults.items() for item in pair)]) == cli.EXIT_USER_ERROR
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def write_records(directory: Path, records: list[AccountRecord]) -> list[str]:
    paths = []
    for item in records:
        path = directory / item.variant / f"part_{item.part:02d}_of_03.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(item.to_dict()))
        paths.append(str(path))
    return paths


def test_size_table_command_writes_three_files_and_strict_fails(tmp_path, ab_records, capsys):
    paths = write_records(tmp_path / "sizes", ab_records)
    outputs = ["--csv", str(tmp_path / "t.csv"), "--md", str(tmp_path / "t.md"), "--png", str(tmp_path / "t.png")]

    assert cli.main(["size-table", "--records", *paths, "--baseline", "unpacked", *outputs]) == 0
    assert "| 2 | 672.6 | 337.3 | 49.9% |" in (tmp_path / "t.md").read_text()
    assert len(pd.read_csv(tmp_path / "t.csv")) == 6 and (tmp_path / "t.png").stat().st_size > 0

    for path in ("t.csv", "t.md", "t.png"):
        (tmp_path / path).unlink()
    assert cli.main(["size-table", "--records", *paths, "--baseline", "unpacked", "--strict", *outputs]) == 2
    assert "weights_packing requested but no effect" in capsys.readouterr().err
    assert not any((tmp_path / path).exists() for path in ("t.csv", "t.md", "t.png"))


# --- report captions -----------------------------------------------------------------------------------------

class FakeSnakemake:
    """What Snakemake's report passes to a caption template (dicts stand in for its Namedlists)."""

    def __init__(self, config: dict, params: dict) -> None:
        self.config, self.params, self.wildcards = config, params, {}


@pytest.mark.parametrize("caption", ["size_table.rst", "size_chart.rst", "memory_plan.rst"])
@pytest.mark.parametrize("config, params, expected", [
    ({"model": {"name": "demo"}, "target": {"chipset": "SM8750"}},
     {"baseline": "unpacked", "variant": "packed", "max_context_mb": 1536, "max_session_mb": 3840}, "SM8750"),
    ({}, {}, "the target chipset"),
])
def test_report_captions_render_as_restructuredtext(caption, config, params, expected):
    # the Jinja settings of snakemake.report
    template = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string((REPORT_DIR / caption).read_text())
    text = template.render(snakemake=FakeSnakemake(config, params))
    warnings = io.StringIO()
    html = publish_parts(text, writer="html", settings_overrides={"warning_stream": warnings,
                                                                      "halt_level": 2})["body"]
    assert warnings.getvalue() == ""
    assert expected in html and "{" not in html
    if params:
        assert f"literal\">{params['baseline' if 'size' in caption else 'variant']}</tt>" in html
    if params and caption == "memory_plan.rst":
        assert "above 1536 MiB per context binary" in html


def test_nothing_to_pack_is_not_flagged_but_an_ignored_option_still_is():
    """An 8-bit embedding alone has no weight that fits 4 bits: same size, no flag. The binary must say so;
    without that report, the same sizes are flagged (the field report's silently ignored option)."""
    nothing_to_pack = {"weights_packing": True, "packable_weights": 0, "packed_weights": 0}
    records = [record(1, "unpacked", 1000), record(1, "packed", 1000, applied=nothing_to_pack)]
    assert build_size_table(records, "unpacked")["flag"].tolist() == ["", ""]
    silent = [record(1, "unpacked", 1000), record(1, "packed", 1000, applied={})]
    assert build_size_table(silent, "unpacked")["flag"].iloc[1].startswith("weights_packing requested but no effect")


def test_weight_sharing_that_shares_nothing_is_flagged():
    records = [record(1, "unpacked", 1000),
               record(1, "packed", 500, applied={"weight_sharing_enabled": True, "shared_weights": 0})]
    assert build_size_table(records, "unpacked")["flag"].iloc[1] == (
        "weight_sharing_enabled requested but the binary shares no weight between its graphs")


def test_evaluated_variants_quality_stands_beside_their_size_and_an_unknown_variant_is_refused(ab_records):
    """Quality is a variant's, the same on each of its rows (NaN where the variant was not evaluated); the Markdown
    puts it under the totals."""
    from genie_build.evaluate.evaluation_table import Quality

    packed = Quality(positions=512, top1_agreement=0.875, mean_kl=0.0123, float_perplexity=9.0,
                     variant_perplexity=9.5)
    table = build_size_table(ab_records, "unpacked", quality={"packed": packed})
    rows = table.set_index("variant")
    assert set(rows.loc["packed", "top1_agreement"]) == {0.875} and set(rows.loc["packed", "perplexity"]) == {9.5}
    assert rows.loc["unpacked", "mean_kl"].isna().all()
    markdown = size_table_markdown(table)
    assert "| top-1 agreement | n/a | 87.5% |" in markdown and "| mean KL (nats) | n/a | 0.0123 |" in markdown
    assert "| perplexity | n/a | 9.50 |" in markdown
    assert "top-1 agreement" not in size_table_markdown(build_size_table(ab_records, "unpacked"))
    with pytest.raises(GenieBuildError, match="reports of variants without binaries: w8"):
        build_size_table(ab_records, "unpacked", quality={"w8": packed})


def test_packing_is_judged_against_the_same_toolchains_variant_that_does_not_pack():
    """Against a baseline of another toolchain a packed QNN binary may well be smaller or larger; what says whether
    the option did anything is the variant that differs from it in packing alone."""
    import dataclasses

    def qnn(part: int, variant: str, size: int, packing: bool) -> AccountRecord:
        return dataclasses.replace(record(part, variant, size, requested={**UNPACKED, "weights_packing": packing}),
                                   toolchain="qnn-htp")

    records = [record(2, "reference", 900_000, requested=PACKED),
               qnn(2, "qnn-htp", 1_146_880, False), qnn(2, "qnn-htp-packing", 1_146_880, True)]
    table = build_size_table(records, "reference").set_index("variant")
    assert table.loc["qnn-htp-packing", "flag"] == ("weights_packing requested but no effect: 1,146,880 bytes vs "
                                                    "1,146,880 bytes in qnn-htp")
    assert table.loc["qnn-htp-packing", "reduction_vs_baseline"] == pytest.approx(1 - 1_146_880 / 900_000)
    halved = [*records[:2], qnn(2, "qnn-htp-packing", 573_440, True)]
    assert build_size_table(halved, "reference").set_index("variant").loc["qnn-htp-packing", "flag"] == ""
