"""AIMET-style encodings calibrated on the demo model (what AIMET's min/max quantsim would export).

Activations: both graphs run in onnxruntime on deterministic inputs (:func:`genie_build.demo.demo.example_inputs`)
with every float intermediate exposed as an output; each tensor's min/max is taken over the prompt AND the
token runs, so a tensor present in both graphs gets one encoding, identical in both files (Genie rejects
"Non-identical quantization parameters found for the same tensor"). A layer's KV cache input and output
(``past_key_{i}_in``/``_out``) share one encoding too, as Genie requires and AIMET's tied KV quantizers give.
Each range becomes a 16-bit asymmetric per-tensor encoding (AIMET: ``min <= 0 <= max`` enforced,
``scale = (max - min) / (2**bw - 1)``, ``offset = round(min / scale)``).

Parameters, read one tensor at a time from the external data: every MatMul weight gets a 4-bit symmetric
per-channel encoding along its last (output) axis, the LM head 8-bit along its last axis and the embedding
table 8-bit along axis 0 (``offset = -2**(bw-1)``, ``scale = max|w| / (2**(bw-1) - 1)`` per channel).
Norm weights and biases get none: they fall back to float later.

These widths are :data:`BUILTIN_PRECISION`, the default precision (:class:`genie_build.plan.precision.Precision`), so
the estimate's default predicts the demo this calibrator quantizes. It is the named recipe ``w4a16``'s
(:mod:`genie_build.plan.recipes`) backbone, LM head and activations, but not its embedding table: aimet-onnx gives the
table 16 bits per tensor, this calibrator 8 bits per vocab row, as AI Hub Models' w4a16 exports keep it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from genie_build.conventions import GRAPH_KINDS, INPUT_IDS, KV_TENSOR, LM_HEAD_WEIGHT
from genie_build.demo.demo import DemoShape, example_inputs, graph_inputs, graph_past, shape_from_hf_config
from genie_build.encodings import Encodings, TensorEncoding, write_encodings
from genie_build.errors import GenieBuildError
from genie_build.hf_config import load_hf_config
from genie_build.onnx_graph import StoredTensor, check_external_data, load_graph, open_external_data
from genie_build.ort_session import cpu_session_options
from genie_build.plan.precision import Precision

__all__ = ["BUILTIN_PRECISION", "DEFAULT_NUM_SAMPLES", "Range", "activation_encoding", "calibrate", "calibration_feeds",
           "float_activations", "graph_shape", "merge_ranges", "read_initializer", "symmetric_per_channel",
           "tie_kv_cache"]

logger = logging.getLogger(__name__)

BUILTIN_PRECISION = Precision()  # the default precision: see the module doc
DEFAULT_NUM_SAMPLES = 4
CALIBRATION_SEED = 20240601
# Floor for a scale, so an all-zero tensor or channel still gets a valid (positive) encoding.
MIN_SCALE = 1e-10
QUANTIZER_ARGS = {"activation_bitwidth": BUILTIN_PRECISION.activations, "param_bitwidth": BUILTIN_PRECISION.layers,
                  "dtype": "int", "is_symmetric": True, "per_channel_quantization": True,
                  "quant_scheme": "post_training_tf"}
_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16)

Range = tuple[float, float]


# --- encodings from numbers --------------------------------------------------------------------------

def activation_encoding(name: str, low: float, high: float,
                        bitwidth: int = BUILTIN_PRECISION.activations) -> TensorEncoding:
    """AIMET asymmetric per-tensor encoding of the range ``[low, high]`` widened to include 0."""
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    scale = max((high - low) / (2 ** bitwidth - 1), MIN_SCALE)
    return TensorEncoding(name=name, dtype="int", bitwidth=bitwidth, kind="per_tensor", is_symmetric=False,
                          scale=(scale,), offset=(round(low / scale),))


def symmetric_per_channel(name: str, values: np.ndarray, axis: int, bitwidth: int) -> TensorEncoding:
    """AIMET symmetric per-channel encoding: ``scale = max|w| / (2**(bw-1) - 1)`` per channel along ``axis``."""
    reduce_axes = tuple(a for a in range(values.ndim) if a != axis % values.ndim)
    max_abs = np.abs(values).max(axis=reduce_axes).astype(np.float64)
    scales = np.maximum(max_abs / (2 ** (bitwidth - 1) - 1), MIN_SCALE)
    return TensorEncoding(name=name, dtype="int", bitwidth=bitwidth, kind="per_channel", is_symmetric=True,
                          scale=tuple(scales.tolist()), offset=(-2 ** (bitwidth - 1),) * len(scales))


# --- parameters --------------------------------------------------------------------------------------

def _quantized_params(graph: onnx.GraphProto) -> dict[str, tuple[int, int]]:
    """Initializers that get an integer encoding: name -> ``(bitwidth, channel axis)``.

    A weight is found through the op that uses it, also behind a Cast (fp16-stored weights).
    """
    initializers = {tensor.name for tensor in graph.initializer}
    cast_sources = {node.output[0]: node.input[0] for node in graph.node
                    if node.op_type == "Cast" and node.input[0] in initializers}
    chosen = {}
    for node in graph.node:
        if node.op_type == "MatMul":
            weight = cast_sources.get(node.input[1], node.input[1])
            if weight in initializers:
                chosen[weight] = (BUILTIN_PRECISION.lm_head if weight == LM_HEAD_WEIGHT else BUILTIN_PRECISION.layers,
                                  -1)
        elif node.op_type == "Gather":
            table = cast_sources.get(node.input[0], node.input[0])
            if table in initializers:
                chosen[table] = (BUILTIN_PRECISION.embedding, 0)
    return chosen


def read_initializer(tensor: TensorProto, model_path: Path) -> np.ndarray:
    """One initializer's values; external data (:func:`genie_build.onnx_graph.open_external_data`) is
    memory-mapped, so only this tensor is read."""
    if tensor.data_location != TensorProto.EXTERNAL:
        return numpy_helper.to_array(tensor)
    with open_external_data(StoredTensor(f"initializer {tensor.name!r}", tensor), model_path) as (data, ref):
        return np.memmap(data, dtype=helper.tensor_dtype_to_np_dtype(tensor.data_type), mode="r",
                         offset=ref.offset, shape=tuple(tensor.dims))


def _param_encodings(model: onnx.ModelProto, model_path: Path) -> dict[str, TensorEncoding]:
    """Per-channel symmetric encodings of the weights :func:`_quantized_params` chooses."""
    chosen = _quantized_params(model.graph)
    encodings = {}
    for tensor in model.graph.initializer:
        if tensor.name in chosen:
            bitwidth, axis = chosen[tensor.name]
            encodings[tensor.name] = symmetric_per_channel(tensor.name, read_initializer(tensor, model_path), axis,
                                                           bitwidth)
    return encodings


# --- activations -------------------------------------------------------------------------------------

def float_activations(model: onnx.ModelProto) -> list[str]:
    """Float graph inputs and float node outputs, in graph order, leaving out tensors computed from
    initializers alone (a Cast of an fp16 weight is a parameter, not an activation).

    Raises:
        GenieBuildError: a node output has no type even after shape inference.
    """
    graph, infos = model.graph, _value_infos(model)
    constant = {tensor.name for tensor in graph.initializer}
    names = [value.name for value in graph.input if value.name not in constant]
    for node in graph.node:
        if all(name in constant for name in node.input if name):
            constant.update(node.output)
        else:
            names.extend(node.output)
    untyped = [name for name in names if name not in infos]
    if untyped:
        raise GenieBuildError(graph.name or "graph", f"no type for tensors {untyped[:3]}")
    return [name for name in names if infos[name].type.tensor_type.elem_type in _FLOAT_TYPES]


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Type and shape of every graph input, output and intermediate; inferred only if some are missing."""
    graph = model.graph
    infos = {value.name: value for value in (*graph.input, *graph.value_info, *graph.output)}
    if any(output not in infos for node in graph.node for output in node.output):
        inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
        infos = {**{value.name: value for value in inferred}, **infos}
    return infos


def _with_outputs(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of the graph-only model that also outputs ``names``."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {value.name for value in exposed.graph.output} | {value.name for value in exposed.graph.input}
    infos = _value_infos(model)
    exposed.graph.output.extend(infos[name] for name in names if name not in present)
    return exposed


def _session(model: onnx.ModelProto, model_dir: Path) -> ort.InferenceSession:
    """An ORT session on an in-memory graph whose external data ORT maps from ``model_dir``."""
    options = cpu_session_options()  # unoptimized: every exposed tensor is the value of the op that names it
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(model_dir))
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _observe_ranges(model: onnx.ModelProto, model_dir: Path, feeds: Iterable[Mapping[str, np.ndarray]]
                    ) -> dict[str, Range]:
    """Min/max of every float activation over all ``feeds``."""
    names = float_activations(model)
    if not names:
        return {}
    session = _session(_with_outputs(model, names), model_dir)
    outputs = [output.name for output in session.get_outputs()]
    ranges: dict[str, Range] = {}
    for feed in feeds:
        values = dict(zip(outputs, session.run(None, dict(feed))))
        values.update((name, feed[name]) for name in names if name in feed)
        ranges = merge_ranges(ranges, {name: (float(np.min(values[name])), float(np.max(values[name])))
                                       for name in names})
    return ranges


def merge_ranges(first: Mapping[str, Range], second: Mapping[str, Range]) -> dict[str, Range]:
    """Union of two range maps; a tensor in both gets the range covering both."""
    merged = dict(first)
    for name, (low, high) in second.items():
        old_low, old_high = merged.get(name, (low, high))
        merged[name] = (min(low, old_low), max(high, old_high))
    return merged


def tie_kv_cache(ranges: Mapping[str, Range]) -> dict[str, Range]:
    """Give ``past_{key,value}_{i}_in`` and ``_out`` of one layer the range covering both."""
    groups: dict[tuple[str, str], list[str]] = {}
    for name in ranges:
        match = KV_TENSOR.match(name)
        if match:
            groups.setdefault(match.group(1, 2), []).append(name)
    tied = dict(ranges)
    for names in groups.values():
        low = min(ranges[name][0] for name in names)
        high = max(ranges[name][1] for name in names)
        tied.update((name, (low, high)) for name in names)
    return tied


def calibration_feeds(shape: DemoShape, kind: str, num_samples: int) -> Iterator[dict[str, np.ndarray]]:
    """Deterministic feeds whose valid cache length runs from empty to full over the samples."""
    past = graph_past(shape, kind)
    for sample in range(num_samples):
        past_len = sample * past // max(num_samples - 1, 1)
        rng = np.random.default_rng([CALIBRATION_SEED, GRAPH_KINDS.index(kind), sample])
        yield example_inputs(shape, kind, past_len, rng)


# --- the command -------------------------------------------------------------------------------------

def graph_shape(prompt: onnx.ModelProto, prompt_path: Path, hf_config_path: Path) -> DemoShape:
    """The demo shape: sizes from the HF config, the prompt AR from the graph's ``input_ids``."""
    ids = next((value for value in prompt.graph.input if value.name == INPUT_IDS), None)
    if ids is None or len(ids.type.tensor_type.shape.dim) != 2:
        raise GenieBuildError(prompt_path, "no input 'input_ids' of shape [1, AR]")
    ar = ids.type.tensor_type.shape.dim[1].dim_value
    return shape_from_hf_config(load_hf_config(hf_config_path), ar, where=str(hf_config_path))


def _check_inputs(model: onnx.ModelProto, shape: DemoShape, kind: str, path: Path) -> None:
    """Require the graph's inputs to be the ones :func:`example_inputs` feeds (names and dims)."""
    found = {value.name: tuple(dim.dim_value for dim in value.type.tensor_type.shape.dim)
             for value in model.graph.input}
    for spec in graph_inputs(shape, kind):
        if found.get(spec.name) != spec.dims:
            raise GenieBuildError(path, f"input {spec.name!r} has shape {found.get(spec.name)}, expected "
                                        f"{spec.dims} from the model config")


def calibrate(prompt_path: str | Path, token_path: str | Path, out_prompt: str | Path, out_token: str | Path, *,
              num_samples: int = DEFAULT_NUM_SAMPLES, hf_config_path: str | Path | None = None) -> None:
    """Calibrate encodings for the demo model's two graphs and write them (AIMET 1.0.0).

    Args:
        hf_config_path: the model's ``config.json``; default: beside the prompt graph.

    Raises:
        GenieBuildError: a graph or the config is missing or does not match, or ``num_samples < 1``.
    """
    if num_samples < 1:
        raise GenieBuildError("--num-samples", f"must be at least 1, got {num_samples}")
    paths = {"prompt": Path(prompt_path), "token": Path(token_path)}
    models = {kind: load_graph(path) for kind, path in paths.items()}
    shape = graph_shape(models["prompt"], paths["prompt"],
                         Path(hf_config_path or paths["prompt"].parent / "config.json"))
    ranges: dict[str, Range] = {}
    for kind, model in models.items():
        check_external_data(model, paths[kind])
        _check_inputs(model, shape, kind, paths[kind])
        ranges = merge_ranges(ranges, _observe_ranges(model, paths[kind].parent,
                                                      calibration_feeds(shape, kind, num_samples)))
    ranges = tie_kv_cache(ranges)
    for kind, out_path in (("prompt", out_prompt), ("token", out_token)):
        activations = {name: activation_encoding(name, *ranges[name]) for name in float_activations(models[kind])}
        params = _param_encodings(models[kind], paths[kind])
        write_encodings(out_path, Encodings(activations=activations, params=params,
                                            quantizer_args=dict(QUANTIZER_ARGS)))
        logger.info("%s: %d activation and %d param encodings from %d samples per graph", out_path,
                    len(activations), len(params), num_samples)
