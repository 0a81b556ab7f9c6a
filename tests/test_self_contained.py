"""The repository stands alone: no file of it (code, tests, docs, schema, profiles) names a path outside it, so a
clone on any machine runs the tests and follows every citation."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Folders that are not the project's own files: environments, caches, build and workflow state.
NOT_PROJECT = {".git", ".venv", ".venv-test", ".venv-qairt", ".snakemake", ".hypothesis", ".pytest_cache", ".cache",
               "__pycache__", "results", "bench", "build"}
# A reference to the folder beside the repository that the project's notes were kept in, by path or by the names
# of the notes; spelled out of pieces so that this file names no such path itself, not even in parts.
_SLASH = "/"
OUTSIDE = re.compile("|".join([re.escape(_SLASH.join(("", "work", "shared"))),
                               re.escape(_SLASH.join(("..", "shared", ""))), "shared " + "folder",
                               *(re.escape(name) for name in ("snakemake-" + "findings", "onnx-" + "findings",
                                                              "aimet-encodings-" + "facts", "qairt-genie-" + "facts",
                                                              "qairt-dev-" + "facts", "per-part-hf-" + "study",
                                                              "codebase-" + "review"))]))


def project_files() -> list[Path]:
    files = []
    for folder, subfolders, names in os.walk(REPO):
        # a tool's cache marks itself with CACHEDIR.TAG (ruff, pytest) and holds this machine's absolute paths
        subfolders[:] = [name for name in subfolders if name not in NOT_PROJECT and not name.endswith(".egg-info")
                         and not (Path(folder) / name / "CACHEDIR.TAG").exists()]
        files += [Path(folder) / name for name in names if not (Path(folder) / name).is_symlink()]
    return files


def test_no_project_file_names_a_path_outside_the_repository() -> None:
    found = []
    for path in project_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary test data
        found += [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
                  for number, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]
    assert found == []


def test_the_vendored_test_data_says_where_it_comes_from_and_under_which_licence() -> None:
    readme = (REPO / "tests" / "data" / "vendor" / "README.md").read_text(encoding="utf-8")
    assert "quic/ai-hub-apps" in readme and "BSD-3-Clause" in readme
    for path in (REPO / "tests" / "data" / "vendor").iterdir():
        assert path.name == "README.md" or f"`{path.name}`" in readme, f"{path.name} is not described"
