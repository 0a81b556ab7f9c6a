"""The split request's one rule (exactly one of num_parts and max_part_mb, or num_parts auto), as the config,
``--split-json`` and every planner meet it."""

from __future__ import annotations

import pytest

from genie_build.errors import GenieBuildError
from genie_build.split_request import AUTO, SplitRequest, check_split_request
from genie_build.units import MIB


@pytest.mark.parametrize("num_parts, max_part_mb", [(None, None), (4, 10)])
def test_neither_or_both_is_refused_naming_where_it_came_from(num_parts, max_part_mb):
    with pytest.raises(GenieBuildError) as raised:
        check_split_request(num_parts, max_part_mb, "--split-json")
    assert str(raised.value) == (f"--split-json: set exactly one of num_parts and max_part_mb (the other to null), "
                                 f"got num_parts={num_parts!r}, max_part_mb={max_part_mb!r}")


@pytest.mark.parametrize("num_parts, max_part_mb", [(4, None), (None, 2.5), (AUTO, None), (AUTO, 100)])
def test_one_of_them_or_auto_with_a_bound_is_a_request(num_parts, max_part_mb):
    check_split_request(num_parts, max_part_mb, "split")
    request = SplitRequest(num_parts, None if max_part_mb is None else int(max_part_mb * MIB))
    assert request.auto == (num_parts == AUTO) and request.embedding_alone


def test_a_request_is_checked_when_made():
    with pytest.raises(GenieBuildError, match=r"^split: set exactly one of num_parts and max_part_mb .* "
                                              r"got num_parts=3, max_part_mb=2\.0$"):
        SplitRequest(3, 2 * MIB)
