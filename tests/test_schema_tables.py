"""The config schema against the code's tables: every value list and default the schema restates from the code
(genie_build/schema/config.schema.yaml) is the code's own, so the two cannot drift apart silently."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import get_args, get_type_hints

import pytest
import yaml

from genie_build.chipsets import CHIPSETS
from genie_build.cli import build_parser
from genie_build.config import DemoCalibrator, load_config, read_schema, validate_config
from genie_build.conventions import EMBEDDING_LAYOUTS
from genie_build.demo.demo import WEIGHT_DTYPES
from genie_build.encodings import SUPPORTED_FLOAT_BITWIDTHS, SUPPORTED_INT_BITWIDTHS, EncodingKind
from genie_build.errors import GenieBuildError
from genie_build.plan.precision import Precision, WeightRule, precision_from_dict
from genie_build.plan.recipes import RECIPES
from genie_build.quantize.calibrate_unit import CALIBRATORS, DEFAULT_CALIBRATOR
from genie_build.toolchains import TOOLCHAINS
from genie_build.toolchains.reference.convert import FLOAT_BITWIDTHS

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def properties(*path: str) -> dict:
    """The ``properties`` of the schema object at ``path`` (section names; ``*`` for a map's values)."""
    schema = read_schema()
    for name in path:
        schema = schema["additionalProperties"] if name == "*" else schema["properties"][name]
    return schema["properties"]


def choices(command: str, option: str) -> list:
    """The choices of ``option`` of a CLI command."""
    subparsers = next(action for action in build_parser(command)._actions
                      if isinstance(action, argparse._SubParsersAction))
    parser = subparsers.choices[command]
    return list(next(action for action in parser._actions if option in action.option_strings).choices)


def test_the_named_recipes_are_the_quantizers_table():
    recipe = properties("quantize")["recipe"]
    assert recipe["enum"] == list(RECIPES) and recipe["default"] in RECIPES
    for command in ("calibrate-unit", "plan-hf", "plan", "estimate"):
        assert choices(command, "--recipe") == sorted(RECIPES), command


def test_the_calibrators_are_the_quantizers_table():
    calibrator = properties("quantize")["calibrator"]
    assert calibrator["enum"] == list(CALIBRATORS) and calibrator["default"] == DEFAULT_CALIBRATOR
    assert choices("calibrate-unit", "--calibrator") == sorted(CALIBRATORS)


def test_the_toolchains_are_the_toolchains_table():
    toolchain = properties("variants", "*")["toolchain"]
    assert toolchain["enum"] == list(TOOLCHAINS) and toolchain["default"] in TOOLCHAINS
    for command in ("convert", "compile"):
        assert choices(command, "--toolchain") == sorted(TOOLCHAINS), command


def test_the_embedding_layouts_are_the_conventions_table():
    embedding = properties("bundle")["embedding"]
    assert embedding["enum"] == list(EMBEDDING_LAYOUTS) and embedding["default"] in EMBEDDING_LAYOUTS
    for command in ("plan", "plan-hf", "estimate"):
        assert choices(command, "--embedding") == list(EMBEDDING_LAYOUTS), command


def test_the_float_fallback_widths_are_the_converters_and_the_encodings():
    assert list(FLOAT_BITWIDTHS) == list(SUPPORTED_FLOAT_BITWIDTHS)
    assert properties("variants", "*")["float_bitwidth"]["enum"] == list(SUPPORTED_FLOAT_BITWIDTHS)
    assert choices("convert", "--float-bitwidth") == list(SUPPORTED_FLOAT_BITWIDTHS)


def test_every_chipset_of_the_table_is_a_valid_target_and_no_other():
    """The schema takes any string; the validator holds it to genie_build.chipsets (no second list)."""
    assert properties("target")["chipset"]["default"] in CHIPSETS
    for name in CHIPSETS:
        assert validate_config({**DEFAULT_CONFIG, "target": {"chipset": name}})["target"]["chipset"] == name
    with pytest.raises(GenieBuildError, match="config target.chipset: .*SM0000"):
        validate_config({**DEFAULT_CONFIG, "target": {"chipset": "SM0000"}})


def test_the_demo_choices_are_the_demos():
    demo = properties("demo")
    assert demo["weight_dtype"]["enum"] == list(WEIGHT_DTYPES)
    assert demo["calibrator"]["enum"] == list(get_args(DemoCalibrator))


def test_the_precision_section_defaults_to_the_default_precision():
    """The schema's ``precision`` defaults, filled into an empty section, are ``Precision()``: the builtin
    calibrator's (tests/test_estimate.py checks that against its encodings)."""
    config = validate_config({**load_config(REPO / "config" / "config.yaml"), "precision": {}})
    assert precision_from_dict(config["precision"], "config") == Precision()


def test_the_precision_widths_and_granularities_are_the_encodings():
    section = properties("precision")
    for role in ("layers", "embedding", "lm_head", "activations"):
        assert section[role]["enum"] == list(SUPPORTED_INT_BITWIDTHS), role
    assert section["float_bitwidth"]["enum"] == list(SUPPORTED_FLOAT_BITWIDTHS)
    assert section["granularity"]["enum"] == list(get_args(EncodingKind))
    override = section["overrides"]["items"]["properties"]
    assert override["granularity"]["enum"] == list(get_args(EncodingKind))
    assert override["dtype"]["enum"] == list(get_args(get_type_hints(WeightRule)["dtype"]))


def test_the_load_alignments_and_keys_are_the_chipset_tables():
    from genie_build.chipsets import ALIGNMENTS, load_params

    load = properties("report", "load")
    assert load["alignment"]["enum"] == [*ALIGNMENTS, None]
    # every key the schema allows is one load_params reads (an unknown one would be refused there)
    assert load_params("SM8750", {key: None for key in load}) == CHIPSETS["SM8750"].load
