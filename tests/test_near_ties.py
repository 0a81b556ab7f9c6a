"""The host run's comparison with a reference that runs other arithmetic (a QNN bundle's twin on the HTP
simulation against its QDQ graphs on the CPU): the reference follows the bundle's tokens and accepts a near tie."""

from __future__ import annotations

import numpy as np
import pytest

from genie_build.run.near_ties import NEAR_TIE_SHARE, FollowBundle, NearTie


def _logits(best: int, second: int, gap: float, vocab: int = 8) -> np.ndarray:
    """Logits over ``vocab`` spanning 0..10 whose argmax ``best`` leads ``second`` by ``gap`` of that range."""
    logits = np.zeros(vocab, dtype=np.float32)
    logits[best], logits[second] = 10.0, 10.0 * (1 - gap)
    return logits


def _run(follow: FollowBundle, steps: list[np.ndarray]) -> list[int]:
    """The reference's generation: each step's choice, as _generate_timed feeds it back."""
    return [follow(logits) for logits in steps]


def test_the_same_tokens_agree_with_no_near_tie():
    follow = FollowBundle([3, 4])
    assert _run(follow, [_logits(3, 1, 0.5), _logits(4, 1, 0.5)]) == [3, 4]
    assert follow.agrees and follow.near_ties == [] and follow.reference_ids == [3, 4]


def test_a_near_tie_is_followed_and_reported():
    """The bundle took 5 where the reference's 2 leads it by half a percent: the reference goes on from 5 (its
    next steps see the bundle's history) and the step is reported with the reference's own choice."""
    follow = FollowBundle([5, 6])
    chosen = _run(follow, [_logits(2, 5, 0.005), _logits(6, 1, 0.4)])
    assert chosen == [5, 6] and follow.agrees
    assert follow.reference_ids == [2, 6]
    assert follow.near_ties == [NearTie(step=0, bundle_id=5, reference_id=2, margin=0.005)]


def test_a_gap_beyond_the_share_is_a_difference():
    follow = FollowBundle([5, 6])
    assert _run(follow, [_logits(2, 5, 2 * NEAR_TIE_SHARE), _logits(6, 1, 0.4)]) == [2, 6]
    assert not follow.agrees and follow.near_ties == []


@pytest.mark.parametrize("bundle, steps", [([3], [_logits(3, 1, 0.5), _logits(4, 1, 0.5)]),   # reference goes on
                                           ([3, 4], [_logits(3, 1, 0.5)])])                      # reference stops
def test_generations_of_different_lengths_differ(bundle, steps):
    follow = FollowBundle(bundle)
    _run(follow, steps)
    assert not follow.agrees


def test_with_no_tolerance_a_near_tie_is_a_difference():
    """A reference toolchain's bundle runs the reference's own arithmetic: the host run gives it no tolerance."""
    follow = FollowBundle([5], tolerance=0.0)
    assert _run(follow, [_logits(2, 5, 1e-4)]) == [2] and not follow.agrees
