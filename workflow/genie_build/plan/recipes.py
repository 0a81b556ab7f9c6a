"""The named quantization recipes (``quantize.recipe``: ``w4a16``, ``w4a16-lpbq``, ``w8a16``) and what AIMET's LLM
recipe gives each weight under one, from shapes alone.

A named recipe sets what aimet-onnx is asked for (:mod:`genie_build.quantize.calibrate_unit`): the backbone weights'
type and whether they are LPBQ. What aimet-onnx 2.42 then writes for a Genie decoder is fixed by AIMET's rules, so the
bytes of every weight after quantization are known before any calibration (:func:`precision_of`):

- the embedding table and every norm weight (RMSNorm scales, Qwen3's q/k norms): a 16-bit per-tensor encoding
  (AIMET quantizes them as the activations they are: a Gather table, a Mul's operand);
- the decoder layers' MatMul weights: ``param_type`` per output channel, or LPBQ (4-bit values in blocks of
  :data:`LPBQ_BLOCK_SIZE` input channels, 8-bit integer block scales, a float scale per channel);
- the LM head: 8-bit per output channel (AIMET's LLM recipe, also under LPBQ);
- biases: no encoding (kept as float16 by the converters).

The per-part plan weighs its pieces by this rule, and re-plans from the real encodings after calibration to
check it (:mod:`genie_build.plan.shape_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass

from genie_build.conventions import EMBED_WEIGHT, LM_HEAD_WEIGHT
from genie_build.errors import GenieBuildError
from genie_build.plan.precision import Precision, WeightRule

__all__ = ["RECIPES", "LPBQ_BLOCK_SIZE", "Recipe", "precision_of", "recipe_named"]

ACTIVATION_BITWIDTH = 16
LPBQ_BLOCK_SIZE = 64          # AIMET's LLM LPBQ recipe and AI Hub's LPBQ exports (block_size 64)
LM_HEAD_BITWIDTH = 8
TABLE_BITWIDTH = 16           # the embedding table's and the norm weights' per-tensor encodings
NORM_WEIGHTS = "*norm.weight"


@dataclass(frozen=True)
class Recipe:
    """What a recipe sets beyond AIMET's LLM recipe: the backbone weights' type and whether they are LPBQ."""

    name: str
    param_type: str
    lpbq: bool = False

    @property
    def weight_bitwidth(self) -> int:
        """Bits of a backbone weight's values (4 for ``int4``)."""
        return int(self.param_type.removeprefix("int"))


RECIPES = {recipe.name: recipe for recipe in (Recipe("w4a16", "int4"), Recipe("w4a16-lpbq", "int4", lpbq=True),
                                              Recipe("w8a16", "int8"))}


def recipe_named(name: str) -> Recipe:
    """Raises: GenieBuildError: ``name`` is no recipe."""
    if name not in RECIPES:
        raise GenieBuildError("quantize.recipe", f"{name!r} is not one of {sorted(RECIPES)}")
    return RECIPES[name]


def precision_of(recipe: Recipe) -> Precision:
    """The bits AIMET's LLM recipe gives each weight role under ``recipe`` (see the module doc), as a
    :class:`~genie_build.plan.precision.Precision`, so that a plan weighs each weight as the calibrated encodings will
    store it."""
    per_tensor = "per_tensor"
    return Precision(layers=recipe.weight_bitwidth, embedding=TABLE_BITWIDTH, lm_head=LM_HEAD_BITWIDTH,
                     activations=ACTIVATION_BITWIDTH, granularity="lpbq" if recipe.lpbq else "per_channel",
                     block_size=LPBQ_BLOCK_SIZE if recipe.lpbq else None,
                     overrides=(WeightRule(EMBED_WEIGHT, TABLE_BITWIDTH, granularity=per_tensor),
                                WeightRule(NORM_WEIGHTS, TABLE_BITWIDTH, granularity=per_tensor),
                                WeightRule(LM_HEAD_WEIGHT, LM_HEAD_BITWIDTH, granularity="per_channel")))
