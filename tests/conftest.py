"""Worlds the test modules share, built once per session.

- ``small_demo``: the SMALL demo model (tests/demo_shapes.py) generated once; read only.
- ``hf_qwen2``: a transformers Qwen2 (2 layers, AR 8, CL 32) exported by torch.onnx dynamo, prompt and token
  graphs; read only. Skips without torch/transformers; a test that takes it is marked ``hf``.
- ``build``: the tiny demo built end to end through the commands (tests/bundle_helpers.py, about 2 s); read only:
  a test that changes it copies what it changes.

Markers (pyproject.toml): ``workflow`` runs Snakemake end to end, ``hf`` needs the Hugging Face stack
(envs/requirements-hf.txt); the fast tier is ``-m "not workflow and not hf"``.

The Snakemake workflow tests (``-m workflow``) share one build per module (their ``built`` fixtures) and clone it
(tests/rebuild_helpers.py ``clone_workdir``) before changing anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bundle_helpers import ReferenceBuild, build_reference_bundle
from demo_shapes import SMALL
from genie_build.demo.demo import generate_demo


@pytest.fixture(scope="session")
def small_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("small-demo")
    generate_demo(SMALL, out)
    return out


@pytest.fixture(scope="session")
def hf_qwen2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    hf_export = pytest.importorskip("hf_export", reason="tests/hf_export.py is not there")
    return hf_export.export_tiny_qwen2(tmp_path_factory.mktemp("hf"), layers=2, prompt_ar=8, context=32)


@pytest.fixture(scope="session")
def build(tmp_path_factory: pytest.TempPathFactory) -> ReferenceBuild:
    """A tiny demo built once through every command: source files, parts, slices, converted graphs, ctx-bins."""
    return build_reference_bundle(tmp_path_factory.mktemp("reference"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "hf_qwen2" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.hf)
