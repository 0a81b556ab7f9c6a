"""The demo calibrated by aimet-onnx itself (``demo.calibrator: aimet``), with AIMET's LLM recipe.

Each graph gets its own ``QuantizationSimModel`` (``param_type="int4"``, ``activation_type="int16"``,
``config_file="htp_v79"``: 4-bit per-channel weights, 16-bit activations; the LM head 8-bit per channel, as
AI Hub's w4a16 keeps it), ``compute_encodings`` over the same deterministic feeds as the built-in calibrator
(:func:`genie_build.calibrate.calibration_feeds`) and ``export`` in format 1.0.0. AIMET quantizes the
embedding table as an activation (16-bit per tensor), which the reference toolchain stores as such.

The graphs are calibrated one by one, as AIMET users do, so their shared tensors come out different; the
token graph then takes the prompt graph's encodings (:func:`genie_build.encodings.share_encodings`, what
AI Hub's export does), and each layer's KV cache output takes its input's encoding (Genie requires them
equal; AIMET's LLM configurator ties those quantizers). Needs aimet-onnx (``envs/requirements-aimet.txt``).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Set as AbstractSet
from dataclasses import replace
from pathlib import Path

import onnx

from genie_build.calibrate import calibration_feeds, graph_shape
from genie_build.conventions import GRAPH_KINDS, KV_TENSOR, LM_HEAD_WEIGHT, kv_name
from genie_build.encodings import Encodings, read_encodings, share_encodings, write_encodings
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import check_external_data, load_graph, read_graph_tensors

logger = logging.getLogger(__name__)

LM_HEAD_BITWIDTH = 8


def calibrate_with_aimet(prompt_path: str | Path, token_path: str | Path, out_prompt: str | Path,
                         out_token: str | Path, *, num_samples: int, hf_config_path: str | Path | None = None) -> None:
    """Calibrate both demo graphs with aimet-onnx and write their encodings (AIMET 1.0.0).

    Raises:
        GenieBuildError: aimet-onnx is not installed, a graph or the config is missing or does not match,
            or ``num_samples < 1``.
    """
    if num_samples < 1:
        raise GenieBuildError("--num-samples", f"must be at least 1, got {num_samples}")
    try:
        from aimet_onnx.quantsim import QuantizationSimModel
    except ImportError:
        raise GenieBuildError("demo.calibrator", "aimet needs aimet-onnx, which is not installed "
                                                 "(pip install --no-deps -r envs/requirements-aimet.txt)") from None
    paths = {"prompt": Path(prompt_path), "token": Path(token_path)}
    shape = graph_shape(load_graph(paths["prompt"]), paths["prompt"],
                        Path(hf_config_path or paths["prompt"].parent / "config.json"))
    calibrated = {}
    for kind in GRAPH_KINDS:
        graph = load_graph(paths[kind])
        check_external_data(graph, paths[kind])
        if any(tensor.data_type == onnx.TensorProto.FLOAT16 for tensor in graph.graph.initializer):
            raise GenieBuildError(paths[kind], "demo.calibrator aimet needs demo.weight_dtype float32: aimet-onnx "
                                               "does not quantize a float16 weight reaching its op through a Cast")
        model = onnx.load(paths[kind])   # the demo is small: weights in memory
        sim = QuantizationSimModel(model, param_type="int4", activation_type="int16", config_file="htp_v79")
        if LM_HEAD_WEIGHT in sim.qc_quantize_op_dict:
            sim.qc_quantize_op_dict[LM_HEAD_WEIGHT].set_bitwidth(LM_HEAD_BITWIDTH)
        sim.compute_encodings(list(calibration_feeds(shape, kind, num_samples)))
        with tempfile.TemporaryDirectory() as export:
            sim.export(export, kind, encoding_version="1.0.0", export_model=False)
            calibrated[kind] = read_encodings(Path(export) / f"{kind}.encodings")
    names = {kind: read_graph_tensors(paths[kind]).tensor_names for kind in GRAPH_KINDS}
    prompt = tie_kv_cache(calibrated["prompt"], names["prompt"])
    token = tie_kv_cache(share_encodings(prompt, calibrated["token"], names["token"]), names["token"])
    for enc, out in ((prompt, out_prompt), (token, out_token)):
        write_encodings(out, enc)
        logger.info("%s: %d activation and %d param encodings from aimet-onnx, %d samples", out,
                    len(enc.activations), len(enc.params), num_samples)


def tie_kv_cache(enc: Encodings, tensor_names: AbstractSet[str]) -> Encodings:
    """Each ``past_{key,value}_{i}_out`` of the graph (``tensor_names``) with the encoding of its ``_in``
    (AIMET leaves an output made by a data-movement op, such as the new cache entries, without one)."""
    activations = dict(enc.activations)
    for name in sorted(tensor_names):
        match = KV_TENSOR.match(name)
        cache_in = kv_name(match.group(1), int(match.group(2)), "in") if match and match.group(3) == "out" else None
        if cache_in in activations:
            activations[name] = replace(activations[cache_in], name=name)
    return replace(enc, activations=activations)
