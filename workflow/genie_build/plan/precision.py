"""A precision: the bits per weight role (embedding, decoder layers, LM head), overridable per tensor-name pattern,
and the shape-only encoding it gives each weight of a :mod:`genie_build.plan.weight_inventory`.

A precision is what the size estimate and the plans weigh weights by. It is written as the config's top-level
``precision`` section (a precision file is a YAML file holding such a section), or follows from a named
quantization recipe (``quantize.recipe``, :mod:`genie_build.plan.recipes`), which says what aimet-onnx is asked for:
:func:`genie_build.plan.recipes.precision_of`. Precision files and workflow configs are judged by one definition, the
``precision`` section of the config schema.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from functools import cache
from typing import Literal

import jsonschema
import yaml

from genie_build.config import DEFAULT_SCHEMA, MAX_CONFIG_BYTES, StrictValidator, read_schema
from genie_build.encodings import (SUPPORTED_FLOAT_BITWIDTHS, SUPPORTED_INT_BITWIDTHS, EncodingKind, TensorEncoding,
                                   block_grid)
from genie_build.errors import GenieBuildError
from genie_build.fileio import read_text
from genie_build.plan.weight_inventory import Weight

__all__ = ["Granularity", "Precision", "WeightRule", "precision_from_dict", "read_precision", "weight_encoding"]

_BLOCKED = ("per_block", "lpbq")
Granularity = EncodingKind  # a precision rule's granularity is the kind of encoding it gives


@dataclass(frozen=True)
class WeightRule:
    """A precision override: weights whose name matches ``pattern`` (fnmatch) get this encoding."""

    pattern: str
    bitwidth: int
    dtype: Literal["int", "float"] = "int"
    granularity: Granularity = "per_channel"
    block_size: int | None = None


@dataclass(frozen=True)
class Precision:
    """Bits per weight role; overrides are tried first, in order. ``activations`` is recorded only:
    activation encodings do not change the weight bytes. Float weights without an integer encoding
    (norms, biases) are stored at ``float_bitwidth``. ``lpbq`` (AIMET's LPBQ) stores the role's bits as the
    compressed width, twice that as the decompressed one: values, a float scale per channel and an integer
    scale per block.

    The defaults are what the builtin calibrator (:mod:`genie_build.quantize.calibrate`) gives the demo, and the config
    schema's ``precision`` defaults restate them (tests/test_schema_tables.py ties the three)."""

    layers: int = 4
    embedding: int = 8
    lm_head: int = 8
    activations: int = 16
    float_bitwidth: int = 16
    granularity: Granularity = "per_channel"
    block_size: int | None = None
    overrides: tuple[WeightRule, ...] = ()


@cache
def _precision_schema() -> dict:
    """The ``precision`` section of the workflow's config schema (``genie_build/schema/config.schema.yaml``): precision
    files and workflow configs are judged by one definition.

    Raises:
        GenieBuildError: the schema file cannot be read.
    """
    try:
        return read_schema()["properties"]["precision"]
    except (KeyError, TypeError) as exc:
        raise GenieBuildError(DEFAULT_SCHEMA,
                              f"cannot read the precision section of the config schema: {exc}") from None


def read_precision(path: str | os.PathLike[str]) -> Precision:
    """The precision in the ``precision`` mapping of a YAML (or JSON) file, e.g. an estimate config
    (``config/qwen2_5_7b_*.yaml``).

    Raises:
        GenieBuildError: the file is unreadable, has no ``precision``, or a field is invalid (named).
    """
    text = read_text(path, max_bytes=MAX_CONFIG_BYTES)
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise GenieBuildError(path, f"not valid YAML: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("precision"), dict):
        raise GenieBuildError(path, "expected a top-level 'precision' mapping")
    return precision_from_dict(document["precision"], os.fspath(path))


def precision_from_dict(data: dict, where: str = "precision") -> Precision:
    """A :class:`Precision` from its mapping, the config's ``precision`` section (keys as the dataclass fields).

    Raises:
        GenieBuildError: an unknown key, a bad value, a per-block rule without ``block_size``, or a float
            override whose bitwidth is not 16 or 32.
    """
    error = jsonschema.exceptions.best_match(StrictValidator(_precision_schema()).iter_errors(data))
    if error is not None:
        field = "/".join(str(key) for key in error.absolute_path) or "top level"
        raise GenieBuildError(where, f"precision {field}: {error.message}")
    overrides = tuple(WeightRule(**rule) for rule in data.get("overrides", ()))
    precision = Precision(**{**data, "overrides": overrides})
    if precision.granularity in _BLOCKED and precision.block_size is None:
        raise GenieBuildError(where, f"precision granularity: {precision.granularity} needs a block_size")
    for rule in overrides:
        allowed = SUPPORTED_FLOAT_BITWIDTHS if rule.dtype == "float" else SUPPORTED_INT_BITWIDTHS
        if rule.bitwidth not in allowed:
            raise GenieBuildError(where, f"precision rule {rule.pattern!r}: {rule.dtype} bitwidth {rule.bitwidth} "
                                         f"is not one of {allowed}")
        if rule.dtype == "int" and rule.granularity in _BLOCKED and rule.block_size is None:
            raise GenieBuildError(where, f"precision rule {rule.pattern!r}: {rule.granularity} needs a block_size")
        if rule.dtype == "int" and rule.granularity == "lpbq" and 2 * rule.bitwidth not in SUPPORTED_INT_BITWIDTHS:
            raise GenieBuildError(where, f"precision rule {rule.pattern!r}: lpbq needs a bitwidth of 4, 8 or 16")
    return precision


def weight_encoding(weight: Weight, precision: Precision) -> TensorEncoding | None:
    """The shape-only encoding ``precision`` gives a weight (scales counted, not computed); None: float
    weight stored at ``precision.float_bitwidth``.

    Per-channel scales run along the weight's channel axis (:meth:`Weight.axes`: its consumer's, AIMET's
    rule), blocks along its block axis.

    Raises:
        GenieBuildError: a per-block rule on a weight that is not a whole number of blocks.
    """
    spec = weight.spec
    rule = next((rule for rule in precision.overrides if fnmatch.fnmatchcase(spec.name, rule.pattern)), None)
    if rule is None and weight.role == "float":
        return None
    if rule is None:  # the role's bits: precision.layers, precision.embedding or precision.lm_head
        rule = WeightRule("", getattr(precision, weight.role), granularity=precision.granularity,
                          block_size=precision.block_size)
    if rule.dtype == "float":
        return TensorEncoding(spec.name, "float", rule.bitwidth)
    layout = weight.axes()
    if rule.granularity == "per_tensor":
        count = 1
    elif rule.granularity == "per_channel":
        count = spec.shape[layout.channel_axis]
    else:
        blocks, channels = block_grid(spec.name, spec.shape, rule.block_size, layout)
        count = blocks * channels
    if rule.granularity == "lpbq":
        return TensorEncoding(spec.name, "int", 2 * rule.bitwidth, "lpbq", is_symmetric=True,
                              scale=(1.0,) * channels, offset=(-(2 ** (2 * rule.bitwidth - 1)),) * channels,
                              block_size=rule.block_size, compressed_bitwidth=rule.bitwidth,
                              per_block_int_scale=(1,) * count)
    return TensorEncoding(spec.name, "int", rule.bitwidth, rule.granularity, is_symmetric=True,
                          scale=(1.0,) * count, offset=(-(2 ** (rule.bitwidth - 1)),) * count,
                          block_size=rule.block_size)
