"""The ``qairt`` toolchain against qairt-dev's real Python code (run in the QAIRT environment, .venv-qairt).

Only the QAIRT SDK's native parts are replaced: the modules in ``native_stubs/`` (the smallest set qairt-dev's
config classes import; see ../../docs/toolchains.md) and ``qairt.convert``/``load``/``compile``
(tests/doubles/python/qairt_calls.py). ``qairt/__init__.py`` itself, which needs an SDK, is not run: a bare
``qairt`` package over the installed one is seeded in ``sys.modules`` -- the import-time behaviour is tested
separately, in subprocesses (test_import_guard.py). Without qairt-dev installed (the main Python 3.11 run)
nothing here is collected; tests/test_qairt_api_env.py runs this directory in the QAIRT environment instead.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import types
from pathlib import Path

import pytest

try:
    importlib.metadata.distribution("qairt-dev")
except importlib.metadata.PackageNotFoundError:
    collect_ignore_glob = ["test_*.py"]

NATIVE_STUBS = Path(__file__).resolve().parent / "native_stubs"


@pytest.fixture
def real_qairt(tmp_path, monkeypatch):
    """qairt-dev's real config classes and serializer, the native SDK calls doubled, a fake SDK (sdk.yaml and the
    utility) in $QAIRT_SDK_ROOT, calls logged to tmp_path/calls.jsonl."""
    from doubles import FAIL_VARIABLE, FAKE_PYTHON_PATH, LOG_VARIABLE, install_fake_sdk

    monkeypatch.syspath_prepend(str(FAKE_PYTHON_PATH))
    monkeypatch.setattr(sys, "path", [*sys.path, str(NATIVE_STUBS)])  # after site-packages, as an SDK's would be
    spec = importlib.util.find_spec("qairt")
    package = types.ModuleType("qairt")
    package.__path__ = list(spec.submodule_search_locations)
    monkeypatch.setitem(sys.modules, "qairt", package)
    import qairt_calls
    from qairt.api.converter.converter_config import CalibrationConfig

    for name in ("convert", "load", "compile"):
        setattr(package, name, getattr(qairt_calls, name))
    package.CalibrationConfig = CalibrationConfig
    monkeypatch.setenv("QAIRT_SDK_ROOT", str(install_fake_sdk(tmp_path / "sdk")))
    monkeypatch.setenv(LOG_VARIABLE, str(tmp_path / "calls.jsonl"))
    monkeypatch.delenv(FAIL_VARIABLE, raising=False)
    yield package
    for module in [name for name in sys.modules
                   if name.split(".")[0] in ("qairt", "qti", "qairt_calls", "genie_build_doubles")]:
        del sys.modules[module]


@pytest.fixture
def genie_models(real_qairt, monkeypatch):
    """qairt-dev's Genie config models (qairt/modules/genie_execution/genie_config.py); the two packages above
    them are seeded bare too, their __init__ needs the full qairt."""
    for name in ("qairt.modules", "qairt.modules.genie_execution"):
        package = types.ModuleType(name)
        package.__path__ = [str(Path(real_qairt.__path__[0], *name.split(".")[1:]))]
        monkeypatch.setitem(sys.modules, name, package)
    return importlib.import_module("qairt.modules.genie_execution.genie_config")
