"""The whole-model calibration of a prompt/token graph pair: the reference the calibration chain is compared with
(the workflow calibrates one unit of one part at a time, genie_build.quantize.calibrate_unit.calibrate_unit). Test
helper; needs aimet-onnx."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from genie_build.encodings import Encodings, write_encodings
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import load_graph, read_graph_tensors
from genie_build.plan.recipes import Recipe, recipe_named
from genie_build.quantize.calibrate_unit import (calibrate_prompt, copy_kv_input_encodings, require_aimet,
                                                 shared_token_tensors, token_encodings)
from genie_build.quantize.calibration_feeds import ForwardPass, feed_shape, text_forward_pass
from genie_build.tokens import text_token_ids


def quantize_pair(prompt_path: str | Path, token_path: str | Path, out_prompt: str | Path, out_token: str | Path,
                  *, recipe: Recipe, forward_pass: ForwardPass) -> tuple[Encodings, Encodings]:
    """Quantize the prompt graph (:func:`calibrate_prompt`), give the token graph its encodings, write both.

    Raises:
        GenieBuildError: the problems of :func:`shared_token_tensors` (checked before AIMET runs) and
            :func:`calibrate_prompt`.
    """
    prompt_path, token_path = Path(prompt_path), Path(token_path)
    prompt_names = read_graph_tensors(prompt_path).tensor_names
    token_names = shared_token_tensors(prompt_names, token_path)
    prompt = copy_kv_input_encodings(calibrate_prompt(prompt_path, recipe, forward_pass), prompt_names)
    token = token_encodings(prompt, token_names)
    for enc, out in ((prompt, out_prompt), (token, out_token)):
        write_encodings(out, enc)
    return prompt, token


def quantize(prompt_path: str | Path, token_path: str | Path, out_prompt: str | Path, out_token: str | Path, *,
             hf_config_path: str | Path, tokenizer_path: str | Path, corpus_path: str | Path, recipe: str,
             num_samples: int = 8) -> tuple[Encodings, Encodings]:
    """Both graphs' AIMET encodings by ``recipe``, the whole prompt graph calibrated on ``num_samples`` windows of
    the corpus.

    Raises:
        GenieBuildError: a bad recipe, ``num_samples < 1``, or any of the problems of :func:`feed_shape`,
            :func:`genie_build.tokens.text_token_ids` and :func:`quantize_pair`.
    """
    chosen = recipe_named(recipe)
    if num_samples < 1:
        raise GenieBuildError("--num-samples", f"must be at least 1, got {num_samples}")
    prompt = Path(prompt_path)
    shape = feed_shape(load_graph(prompt), prompt, Path(hf_config_path))
    ids = text_token_ids(corpus_path, tokenizer_path)
    require_aimet()  # after the inputs are read: importing aimet-onnx (and torch) takes seconds, a bad input does not
    return quantize_pair(prompt, token_path, out_prompt, out_token, recipe=chosen,
                         forward_pass=text_forward_pass(shape, ids, num_samples))


def feeds_forward_pass(feeds: Sequence[Mapping[str, np.ndarray]] | Iterator[Mapping[str, np.ndarray]]
                       ) -> ForwardPass:
    """A forward pass over given feeds (the demo's deterministic random ones)."""
    def run(session: Any) -> None:
        for feed in feeds:
            session.run(None, dict(feed))

    return run
