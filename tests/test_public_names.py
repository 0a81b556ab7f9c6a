"""Every module of genie_build declares its public names (``__all__``), and what other code imports from it is
among them: a name outside ``__all__`` is the module's own business, free to change."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import genie_build

REPO = Path(__file__).resolve().parents[1]
# No public names of their own: the package (its version), the entry point, and packages of modules.
WITHOUT_API = {"genie_build", "genie_build.__main__", "genie_build.commands", "genie_build.toolchains.reference",
               "genie_build.demo", "genie_build.plan", "genie_build.split",
               "genie_build.export", "genie_build.quantize", "genie_build.sizes",
               "genie_build.bundle", "genie_build.run", "genie_build.evaluate"}
MODULES = sorted(info.name for info in pkgutil.walk_packages(genie_build.__path__, "genie_build.")
                 if info.name not in WITHOUT_API)
SMK_IMPORT = re.compile(r"^from (genie_build(?:\.[\w.]+)?) import ([^\n(]+|\([^)]*\))", re.MULTILINE)


def imports_from_package() -> list[tuple[str, str, str]]:
    """(importing file, module, name) of every ``from genie_build... import name`` in the repository's code."""
    found = []
    for path in [*REPO.glob("workflow/genie_build/**/*.py"), *REPO.glob("tests/**/*.py"), *REPO.glob("scripts/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "genie_build":
                found += [(path.name, node.module, alias.name) for alias in node.names]
    for path in [REPO / "Snakefile", *REPO.glob("workflow/rules/*.smk")]:
        for module, names in SMK_IMPORT.findall(path.read_text()):
            found += [(path.name, module, name.split(" as ")[0].strip())
                      for name in names.strip("()").replace("\n", " ").split(",") if name.strip()]
    return found


@pytest.mark.parametrize("name", MODULES)
def test_every_module_declares_its_public_names_and_has_them(name):
    module = importlib.import_module(name)
    assert hasattr(module, "__all__"), f"{name} has no __all__"
    assert [item for item in module.__all__ if not hasattr(module, item)] == []


def test_what_other_code_imports_from_a_module_is_in_its_all():
    outside = []
    for where, module_name, name in imports_from_package():
        module = importlib.import_module(module_name)
        if name.startswith("_") or module_name in WITHOUT_API or hasattr(module, "__path__") and \
                importlib.util.find_spec(f"{module_name}.{name}") is not None:
            continue  # a private helper a test reaches for, the package's version, or a submodule
        if name not in module.__all__:
            outside.append(f"{where}: {module_name}.{name}")
    assert outside == []
