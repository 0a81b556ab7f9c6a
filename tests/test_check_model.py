"""The check-model stage (genie_build.split.check_model, ``check-model``): both graphs' weights all there and finite,
the shared ones equal, and a summary of what they share."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from genie_build.cli import main
from genie_build.errors import GenieBuildError
from genie_build.split.check_model import check_model
from scoped_graph import weight
from test_onnx_graph import EMBED, one_line_error, prompt_and_token, replace_initializer  # noqa: F401 (a fixture)


def test_check_model_summarises_the_shared_weights(prompt_and_token: tuple[Path, Path], tmp_path: Path) -> None:
    prompt, token = prompt_and_token
    out = tmp_path / "model_check.json"
    assert main(["check-model", "--prompt", str(prompt), "--token", str(token),
                 "--out", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["shared_initializers"] == len(onnx.load(prompt, load_external_data=False).graph.initializer)


def test_check_model_names_the_users_file_tensor_and_value_of_a_non_finite_weight(
        prompt_and_token: tuple[Path, Path], tmp_path: Path) -> None:
    prompt, token = prompt_and_token
    bad = weight(EMBED, (32, 8))
    bad[5, 1] = -np.inf
    for path in (prompt, token):
        replace_initializer(path, EMBED, bad)
    with pytest.raises(GenieBuildError) as excinfo:
        check_model(str(prompt), str(token), tmp_path / "out.json")
    assert one_line_error(excinfo) == (f"{prompt}: initializer '{EMBED}' holds -inf at index [5, 1] (shape [32, 8]): "
                                       "every float weight must be finite")
    assert not (tmp_path / "out.json").exists()
