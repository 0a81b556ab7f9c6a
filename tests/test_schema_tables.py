"""The config schema against the code's tables: every value list and default the schema restates from the code
(genie_build/schema/config.schema.yaml) is the code's own, so the two cannot drift apart silently."""

from __future__ import annotations

from pathlib import Path

from genie_build.config import load_config, read_schema
from genie_build.encodings import SUPPORTED_FLOAT_BITWIDTHS, SUPPORTED_INT_BITWIDTHS
from genie_build.precision import Precision, precision_from_dict

REPO = Path(__file__).resolve().parents[1]


def properties(*path: str) -> dict:
    """The ``properties`` of the schema object at ``path`` (section names)."""
    schema = read_schema()
    for name in path:
        schema = schema["properties"][name]
    return schema["properties"]


def test_the_precision_section_defaults_to_the_default_precision():
    """The schema's ``recipe`` defaults, filled into the default config, are ``Precision()``: the builtin
    calibrator's (tests/test_estimate.py checks that against its encodings)."""
    assert precision_from_dict(load_config(REPO / "config" / "config.yaml")["recipe"], "config") == Precision()


def test_the_precision_bit_widths_are_the_encodings_widths():
    section = properties("recipe")
    for role in ("layers", "embedding", "lm_head", "activations"):
        assert section[role]["enum"] == list(SUPPORTED_INT_BITWIDTHS), role
    assert section["float_bitwidth"]["enum"] == list(SUPPORTED_FLOAT_BITWIDTHS)
