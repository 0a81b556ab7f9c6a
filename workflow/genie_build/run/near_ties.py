"""The host run's comparison of a bundle's greedy tokens with a reference's, when the two run different arithmetic.

A qnn-htp bundle's twin runs on the HTP backend's x86 simulation (float16 and fixed-point kernels), its reference,
the same QDQ graphs on onnxruntime's CPU kernels (float32 between the quantize nodes): both are right, and where the
reference's two best logits nearly tie, they may pick different tokens, after which their generations part for good.
The reference is therefore run teacher-forced on the bundle's tokens (:class:`FollowBundle`): at every step it takes
the bundle's token when that token is its own argmax or within :data:`NEAR_TIE_SHARE` of it, and records each such
step (:class:`NearTie`); any other step is a real difference. A reference toolchain's bundle runs the reference's own
arithmetic, so it is compared with no tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["NEAR_TIE_SHARE", "FollowBundle", "NearTie"]

# The share of the reference's logit range (max - min over the vocabulary, at that step) by which the bundle's token
# may trail the reference's argmax. The HTP simulation and the CPU differ by a few output quantization steps on the
# demo (16-bit logits: range / 65535 each); a hundredth of the range is far above that and far below a real error
# (a wrong weight or encoding moves the argmax by a large part of the range).
NEAR_TIE_SHARE = 0.01


@dataclass(frozen=True)
class NearTie:
    """A step where the bundle took a token the reference ranks just below its own choice."""

    step: int            # 0: the token after the prompt
    bundle_id: int
    reference_id: int
    margin: float        # the reference's logit gap between the two, as a share of its logit range


class FollowBundle:
    """A chooser for the reference's generation: the reference's argmax at each step (kept in ``reference_ids``),
    but the bundle's token when :data:`NEAR_TIE_SHARE` (``tolerance``) separates the two, so that the reference
    goes on from the bundle's history."""

    def __init__(self, bundle_ids: Sequence[int], tolerance: float = NEAR_TIE_SHARE) -> None:
        self.bundle_ids = list(bundle_ids)
        self.tolerance = tolerance
        self.reference_ids: list[int] = []
        self.near_ties: list[NearTie] = []

    def __call__(self, logits: np.ndarray) -> int:
        step, best = len(self.reference_ids), int(np.argmax(logits))
        self.reference_ids.append(best)
        if step >= len(self.bundle_ids) or self.bundle_ids[step] == best:
            return best
        ours = self.bundle_ids[step]
        spread = float(logits.max() - logits.min())
        margin = float(logits[best] - logits[ours]) / spread if spread > 0 else 0.0
        if margin > self.tolerance:
            return best        # a real difference: the comparison fails on reference_ids
        self.near_ties.append(NearTie(step, ours, best, round(margin, 6)))
        return ours

    @property
    def agrees(self) -> bool:
        """Every step of the bundle's generation is the reference's choice or a near tie, and both stop together."""
        tied = {tie.step for tie in self.near_ties}
        return len(self.reference_ids) == len(self.bundle_ids) and all(
            ours == theirs or step in tied
            for step, (ours, theirs) in enumerate(zip(self.bundle_ids, self.reference_ids)))
