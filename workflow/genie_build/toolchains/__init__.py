"""Toolchains: one interface (:class:`genie_build.toolchains.base.Toolchain`), three implementations,
chosen per variant by its ``toolchain`` key. Imported lazily so that a missing SDK only matters to the
variants that use it."""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genie_build import __version__
from genie_build.chipsets import lookup
from genie_build.errors import GenieBuildError
from genie_build.toolchains.base import SDK_ROOT_VARIABLE, CompileOptions, Toolchain

__all__ = ["HOST_RUN_TOOLCHAINS", "SDK_TOOLCHAINS", "TOOLCHAINS", "Converter", "compile_variant", "converter_pattern", "get_toolchain",
           "toolchain_version"]

TOOLCHAINS = {
    "reference": "genie_build.toolchains.reference.toolchain:ReferenceToolchain",
    "qairt": "genie_build.toolchains.qairt:QairtToolchain",
    "qnn-cli": "genie_build.toolchains.qnn_cli:QnnCliToolchain",
    "qnn-htp": "genie_build.toolchains.qnn_htp.toolchain:QnnHtpToolchain",
}
# The toolchains of the QAIRT SDK: they convert to a DLC, the others to ONNX (qnn-htp: QDQ ONNX and its DLC).
SDK_TOOLCHAINS = ("qairt", "qnn-cli")
# The toolchains whose binaries run on the host: the reference container on the CPU, a QNN binary (unshared) in the
# HTP simulation of the vendor's x86 libraries.
HOST_RUN_TOOLCHAINS = ("reference", "qnn-htp")
_FLOAT_MARK = "-fp"


def get_toolchain(name: str) -> Toolchain:
    """Instantiate the toolchain called ``name`` (a key of :data:`TOOLCHAINS`)."""
    if name not in TOOLCHAINS:
        raise GenieBuildError("toolchain", f"unknown toolchain {name!r}; known: {', '.join(TOOLCHAINS)}")
    module_name, class_name = TOOLCHAINS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)()


def compile_variant(toolchain_name: str, converted: dict[str, Path], out: Path, variant: dict, chipset: str) -> None:
    """The ``compile`` stage: link a part's converted graphs (graph name -> file) into one context binary with a
    variant's options (``variants.<name>``, whose ``toolchain`` key, if given, must be ``toolchain_name``) for
    ``chipset``.

    Raises:
        GenieBuildError: another toolchain in the variant, a bad option, an unknown chipset, a toolchain that is
            not available, or what its compile raises.
    """
    if variant.get("toolchain", toolchain_name) != toolchain_name:
        raise GenieBuildError("--variant-json", f"toolchain {variant['toolchain']!r} differs from "
                                                f"--toolchain {toolchain_name!r}")
    options = CompileOptions.from_variant(variant, lookup(chipset))
    toolchain = get_toolchain(toolchain_name)
    toolchain.check_available()
    toolchain.compile(converted, out, options)


def toolchain_version(name: str) -> str:
    """The build of a toolchain, as a param of the rules that run it (convert, compile): a new one reruns them and
    keys their between-workflow cache entries apart. The reference toolchain is genie_build's own code; an SDK
    toolchain is its resolved ``$QAIRT_SDK_ROOT``, a directory QAIRT names after its version."""
    if name == "reference":
        return f"genie-build {__version__}"
    if name == "qnn-htp":
        from genie_build.qnn_wheel import DISTRIBUTION, locate_wheel
        try:
            wheel = locate_wheel(f"toolchain {name}")
        except GenieBuildError:
            return f"{DISTRIBUTION} (not installed)"
        return f"genie-build {__version__}, {DISTRIBUTION} {wheel.version} (QNN {wheel.qnn_version})"
    sdk_root = os.environ.get(SDK_ROOT_VARIABLE)
    return f"QAIRT SDK at {os.path.realpath(sdk_root) if sdk_root else '(not set)'}"


@dataclass(frozen=True)
class Converter:
    """How a variant's parts are converted from one set of encodings. Variants with the same toolchain and float
    bitwidth convert alike and share one convert job, named ``{toolchain}-fp{float_bitwidth}`` (:attr:`name`: a
    wildcard of the workflow and a folder of ``results/<model>/converted/<encodings>/``)."""

    toolchain: str
    float_bitwidth: int

    @classmethod
    def of_variant(cls, variant: Mapping[str, Any]) -> Converter:
        """The converter of a variant (``variants.<name>``, defaults filled in)."""
        return cls(variant["toolchain"], variant["float_bitwidth"])

    @classmethod
    def named(cls, name: str) -> Converter:
        """The converter called ``name`` (:attr:`name`)."""
        toolchain, bits = name.rsplit(_FLOAT_MARK, 1)
        return cls(toolchain, int(bits))

    @property
    def name(self) -> str:
        return f"{self.toolchain}{_FLOAT_MARK}{self.float_bitwidth}"

    @property
    def suffixes(self) -> tuple[str, ...]:
        """The files of a converted graph: the reference toolchain's ONNX and its data, qnn-htp's QDQ ONNX and its
        data (its DLC is a stage of its own, ``convert_dlc``), or an SDK's DLC."""
        return (".dlc",) if self.toolchain in SDK_TOOLCHAINS else (".onnx", ".onnx.data")


def converter_pattern(toolchains: Iterable[str]) -> str:
    """A regular expression matching the names of the converters of ``toolchains`` (a wildcard constraint)."""
    return f"({'|'.join(map(re.escape, toolchains))}){re.escape(_FLOAT_MARK)}\\d+"
