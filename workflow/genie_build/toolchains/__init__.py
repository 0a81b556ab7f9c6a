"""Toolchains: one interface (:class:`genie_build.toolchains.base.Toolchain`), three implementations,
chosen per variant by its ``toolchain`` key. Imported lazily so that a missing SDK only matters to the
variants that use it."""

from __future__ import annotations

import importlib
from pathlib import Path

from genie_build.chipsets import lookup
from genie_build.errors import GenieBuildError
from genie_build.toolchains.base import CompileOptions, Toolchain

TOOLCHAINS = {
    "reference": "genie_build.toolchains.reference.toolchain:ReferenceToolchain",
    "qairt": "genie_build.toolchains.qairt:QairtToolchain",
    "qnn-cli": "genie_build.toolchains.qnn_cli:QnnCliToolchain",
}


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
