"""The chipset table: values from the facts file, lookup, and the device check the bundle checker uses."""

from __future__ import annotations

import pytest

from genie_build.chipsets import CHIPSETS, Chipset, _table, check_device, lookup
from genie_build.errors import GenieBuildError


@pytest.mark.parametrize(("name", "soc_model", "dsp_arch"), [
    ("SM8550", 43, "v73"), ("SM8650", 57, "v75"), ("SM8750", 69, "v79"), ("SM8850", 87, "v81"),
    ("SM8845", 97, "v81"), ("SC8380XP", 60, "v73"), ("SA8295P", 39, "v68"), ("QCM6490", 93, "v68"),
])
def test_table_holds_the_facts_file_values(name, soc_model, dsp_arch):
    chipset = CHIPSETS[name]
    assert (chipset.soc_model, chipset.dsp_arch, chipset.verified) == (soc_model, dsp_arch, True)


def test_only_the_rows_the_facts_mark_unverified_are_unverified():
    assert sorted(name for name, chipset in CHIPSETS.items() if not chipset.verified) == [
        "QCS8550", "SM8635", "SM8735"]


def test_every_row_names_its_source_and_a_marketing_name():
    assert all(chipset.source and chipset.marketing_name for chipset in CHIPSETS.values())


@pytest.mark.parametrize("name", ["sm8750", "SM8750", " Sm8750 "])
def test_lookup_ignores_case_and_surrounding_space(name):
    assert lookup(name) is CHIPSETS["SM8750"]


def test_unknown_chipset_names_the_key_the_value_and_the_known_ones():
    with pytest.raises(GenieBuildError) as caught:
        lookup("SM9999")
    message = str(caught.value)
    assert message.startswith("target.chipset: unknown chipset 'SM9999'; known: SM8550, SM8650, SM8750")


def test_table_refuses_a_soc_model_given_twice():
    rows = (Chipset("A", 1, "v73", None, "a", "s", True), Chipset("B", 1, "v75", None, "b", "s", True))
    with pytest.raises(ValueError, match="soc_model 1 given to both A and B"):
        _table(rows)


def test_table_refuses_a_malformed_dsp_arch():
    with pytest.raises(ValueError, match="'79' is not like 'v79'"):
        _table((Chipset("A", 1, "79", None, "a", "s", True),))


def test_matching_device_has_no_problems():
    assert check_device(69, "v79", "SM8750") == []
    assert check_device(69, "V79", CHIPSETS["SM8750"]) == []


def test_swapped_soc_model_names_the_chipset_it_belongs_to():
    (problem,) = check_device(57, "v79", "SM8750")
    assert problem == "soc_model 57 (that is SM8650's, Snapdragon 8 Gen 3) does not match SM8750's 69"


def test_soc_model_as_a_string_is_a_problem():
    # A string soc_model has hung a CDSP (public report); Genie's config wants the integer id.
    (problem,) = check_device("69", "v79", "SM8750")
    assert problem == "soc_model '69' is not an integer; SM8750 is 69"


def test_wrong_dsp_arch_and_unknown_soc_model_are_both_reported():
    problems = check_device(12345, "v75", "SM8750")
    assert problems == ["soc_model 12345 does not match SM8750's 69", "dsp_arch 'v75' does not match SM8750's 'v79'"]
