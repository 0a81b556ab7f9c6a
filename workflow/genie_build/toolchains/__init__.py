"""Toolchains: one interface (:class:`genie_build.toolchains.base.Toolchain`), three implementations,
chosen per variant by its ``toolchain`` key. Imported lazily so that a missing SDK only matters to the
variants that use it."""

from __future__ import annotations

import importlib

from genie_build.errors import GenieBuildError
from genie_build.toolchains.base import Toolchain

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
