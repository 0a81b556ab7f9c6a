"""The qairt toolchain where no qairt-dev is needed: the checks it makes before ``import qairt``. Everything else is
tested against qairt-dev's real code in the QAIRT environment (tests/qairt_api, run by test_qairt_api_env.py)."""

from __future__ import annotations

import importlib.metadata
import sys

import pytest

from genie_build.errors import GenieBuildError
from genie_build.toolchains import get_toolchain
from genie_build.toolchains.qairt import QairtToolchain
from doubles import install_fake_sdk


class ImportForbidden:
    """Put in sys.modules["qairt"]: any use means the adapter imported qairt before its checks."""

    def __getattr__(self, name):
        raise AssertionError(f"qairt.{name} used before the SDK was checked")


@pytest.fixture
def no_qairt_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "qairt", ImportForbidden())


def test_registry_maps_qairt_to_this_class():
    assert isinstance(get_toolchain("qairt"), QairtToolchain)


def test_missing_sdk_root_is_named_before_qairt_is_imported(no_qairt_import, monkeypatch):
    monkeypatch.delenv("QAIRT_SDK_ROOT", raising=False)
    with pytest.raises(GenieBuildError, match="^toolchain qairt: QAIRT_SDK_ROOT is not set: unpack the QAIRT SDK"):
        QairtToolchain().check_available()


@pytest.mark.skipif(any(True for _ in importlib.metadata.distributions(name="qairt-dev")),
                    reason="qairt-dev is installed in this interpreter")
def test_missing_qairt_dev_is_named_without_importing_qairt(no_qairt_import, tmp_path, monkeypatch):
    monkeypatch.setenv("QAIRT_SDK_ROOT", str(install_fake_sdk(tmp_path / "sdk")))
    with pytest.raises(GenieBuildError) as caught:
        QairtToolchain().check_available()
    assert str(caught.value) == (
        f"toolchain qairt: the qairt Python package (qairt-dev) is not installed for {sys.executable}: create the "
        "QAIRT environment (scripts/make_qairt_env.sh, or envs/qairt.yaml) and point toolchains.qairt.python at "
        "its interpreter")
