"""One module of test cases per family the registry (``genie_build.families``) holds, named by its model_type:

- ``PUBLISHED``: the keys its published config.json states beyond the dimensions (for the start-up checks, which
  read config.json as written);
- ``MODEL_KEYS``: the keys of the random transformers model the tests build of it, scaled to the tests' sizes;
- ``CASES``: variations of its config.json and settings, each with what the start-up checks say (``None``: it
  passes), as ``(changes, settings, expected)``.

Adding a family is its registry record and one module here; importing this package fails for a registered family
without its module.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from genie_build.families import FAMILIES

__all__ = ["FAMILY_CASES"]

FAMILY_CASES: dict[str, ModuleType] = {name: import_module(f"family_cases.{name}") for name in FAMILIES}
