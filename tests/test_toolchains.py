"""genie_build.toolchains: the toolchains table, the converters that variants share, and a toolchain's build as the
workflow records it (what reruns convert and compile)."""

from __future__ import annotations

import os
import re

import pytest

from genie_build import __version__
from genie_build.toolchains import SDK_TOOLCHAINS, TOOLCHAINS, Converter, converter_pattern, toolchain_version
from genie_build.toolchains.base import SDK_ROOT_VARIABLE


@pytest.mark.parametrize("toolchain, bits, name, suffixes", [
    ("reference", 16, "reference-fp16", (".onnx", ".onnx.data")),
    ("qairt", 32, "qairt-fp32", (".dlc",)),
    ("qnn-cli", 16, "qnn-cli-fp16", (".dlc",)),    # a '-' in the toolchain's own name
    ("qnn-htp", 16, "qnn-htp-fp16", (".onnx", ".onnx.data")),   # the QDQ graph (its DLC: convert_dlc)
])
def test_a_converter_is_named_and_read_back_by_one_rule(toolchain, bits, name, suffixes):
    converter = Converter.of_variant({"toolchain": toolchain, "float_bitwidth": bits, "weights_packing": True,
                                      "recipe": "w8a16"})   # the recipe is the encodings' folder, not the converter's
    assert (converter.name, Converter.named(name), converter.suffixes) == (name, converter, suffixes)


def test_the_wildcard_patterns_take_their_toolchains_converters_only():
    reference, sdk, htp = (converter_pattern(["reference"]), converter_pattern(SDK_TOOLCHAINS),
                           converter_pattern(["qnn-htp"]))
    assert re.fullmatch(reference, "reference-fp16") and not re.fullmatch(reference, "qairt-fp16")
    assert re.fullmatch(htp, "qnn-htp-fp16") and not re.fullmatch(sdk, "qnn-htp-fp16")
    assert re.fullmatch(sdk, "qnn-cli-fp32") and re.fullmatch(sdk, "qairt-fp16")
    assert not re.fullmatch(sdk, "reference-fp16") and not re.fullmatch(sdk, "qairt-fpx")
    assert not re.fullmatch(reference, "w8a16/reference-fp16")
    assert set(SDK_TOOLCHAINS) | {"reference", "qnn-htp"} == set(TOOLCHAINS)


def test_a_toolchains_build_is_genie_builds_version_or_the_sdk_folder(monkeypatch, tmp_path):
    assert toolchain_version("reference") == f"genie-build {__version__}"
    monkeypatch.delenv(SDK_ROOT_VARIABLE, raising=False)
    assert toolchain_version("qairt") == "QAIRT SDK at (not set)"
    (tmp_path / "qairt-2.42").mkdir()
    os.symlink(tmp_path / "qairt-2.42", tmp_path / "current")
    monkeypatch.setenv(SDK_ROOT_VARIABLE, str(tmp_path / "current"))
    assert toolchain_version("qnn-cli") == f"QAIRT SDK at {os.path.realpath(tmp_path / 'qairt-2.42')}"
