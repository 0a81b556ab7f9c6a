"""The demo calibrated by aimet-onnx itself (``demo.calibrator: aimet``): the ``quantize`` stage's driver
(:mod:`genie_build.quantize`, recipe ``w4a16``: AIMET's LLM recipe, the token graph sharing the prompt graph's
encodings) on the built-in calibrator's deterministic feeds (:func:`genie_build.calibrate.calibration_feeds`),
since the demo has no text to calibrate on. Needs aimet-onnx (``envs/requirements-hf.txt``).
"""

from __future__ import annotations

from pathlib import Path

from genie_build.calibrate import calibration_feeds, graph_shape
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import load_graph
from genie_build.quantize import RECIPES, feeds_forward_pass, quantize_pair, require_aimet

DEMO_RECIPE = "w4a16"


def calibrate_with_aimet(prompt_path: str | Path, token_path: str | Path, out_prompt: str | Path,
                         out_token: str | Path, *, num_samples: int, hf_config_path: str | Path | None = None) -> None:
    """Quantize both demo graphs with aimet-onnx and write their encodings (AIMET 1.0.0).

    Raises:
        GenieBuildError: aimet-onnx is not installed, a graph or the config is missing or does not match, the
            weights are float16, or ``num_samples < 1``.
    """
    require_aimet("demo.calibrator")
    if num_samples < 1:
        raise GenieBuildError("--num-samples", f"must be at least 1, got {num_samples}")
    prompt = Path(prompt_path)
    shape = graph_shape(load_graph(prompt), prompt, Path(hf_config_path or prompt.parent / "config.json"))
    quantize_pair(prompt, token_path, out_prompt, out_token, recipe=RECIPES[DEMO_RECIPE],
                  forward_pass=feeds_forward_pass(calibration_feeds(shape, "prompt", num_samples)))
