"""Quantize Genie-shaped graphs with aimet-onnx, by a named recipe, calibrated on text: one unit of the calibration
chain at a time (:func:`calibrate_unit`, the ``calibrate-unit`` command), or a whole prompt graph
(:func:`calibrate_prompt`, the reference the chain is compared with).

1. The graph becomes a ``QuantizationSimModel(param_type=..., activation_type="int16", config_file="htp_v79")``:
   16-bit activations, 4- or 8-bit per-channel weights (``w4a16``, ``w8a16``), or LPBQ (``w4a16-lpbq``: 4-bit
   blocks of :data:`LPBQ_BLOCK_SIZE` input channels whose scales are 8-bit integer multiples of one float scale per
   output channel; ``set_lpbq_for_params``).
2. AIMET's own LLM recipe, the steps of ``aimet_onnx.llm_configurator.llm_configurator.
   _apply_int8_kv_cache_tying_and_lm_head`` (what AI Hub Models' w4a16 applies) taken one by one: KV cache inputs
   and outputs 8-bit symmetric, each layer's ``_in`` and ``_out`` tied to one quantizer (with the Concat that joins
   them), the LM head weight 8-bit per channel (in the graph that has the head), and the second input of every
   MatMul (the attention's K and V) 8-bit symmetric.
3. The activations' grids are chosen by ``quantize.calibrator`` (:data:`CALIBRATORS`): ``min-max`` (the range the
   windows reached, AIMET's default), ``tf-enhanced`` (AIMET's SQNR search over the windows' histogram, which may
   clip rare outliers) or ``percentile`` (the :data:`PERCENTILE` th percentile of each end); the MatMul weights
   stay min-max (the embedding table and norm weights, which AIMET quantizes as activations, follow it).
4. ``compute_encodings`` runs the calibration windows (:func:`text_forward_pass`) on the sim's session (weights
   fake-quantized, activations observed in float, so a unit fed the stream its predecessor produced sees what it
   would see inside the whole model), then the encodings are exported (AIMET 1.0.0), the embedding's output given
   its table's encoding, which AIMET leaves it without (:mod:`genie_build.quantize.embedding_encoding`).

The token graphs are not calibrated: they take the prompt graph's encoding for every tensor they share
(:func:`token_encodings`; :mod:`genie_build.quantize.part_encodings` does it for each part).

Memory: AIMET holds a unit's weights in its ``ModelProto``, again in its onnxruntime session and fake-quantized,
about four times its float32 weights (:mod:`genie_build.plan.calibration_units` sizes the units by it); the feeds are
made one window at a time, so they add one KV cache of the unit's layers. Needs aimet-onnx
(``envs/requirements-hf.txt``).
"""

from __future__ import annotations

import gc
import logging
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from genie_build.conventions import EMBEDDING_PIECE, KV_TENSOR, LOGITS, kv_name
from genie_build.encodings import Encodings, read_encodings, share_encodings, write_encodings
from genie_build.errors import GenieBuildError
from genie_build.fileio import atomic_open
from genie_build.onnx_graph import check_external_data, embedding_gather, graph_tensors, load_graph, model_tensors
from genie_build.ort_session import job_threads
from genie_build.plan.calibration_units import CalibrationUnit
from genie_build.plan.recipes import LPBQ_BLOCK_SIZE, Recipe, recipe_named
from genie_build.quantize.calibrate import float_activations
from genie_build.quantize.calibrate_tables import (embedding_table, head_slice_graph, head_slices, merge_head_slices,
                                                   one_row_graph)
from genie_build.quantize.calibration_feeds import (FeedShape, ForwardPass, calibration_windows, text_forward_pass,
                                                    unit_feed_shape)
from genie_build.quantize.embedding_encoding import encode_embedding_output
from genie_build.quantize.window_stream import WindowFile, open_windows, write_windows
from genie_build.split.split import build_part, cut_graph, ensure_value_info
from genie_build.tokens import read_tokens
from genie_build.toolchains.reference.onnx_io import load_external_bytes

__all__ = ["CALIBRATORS", "DEFAULT_CALIBRATOR", "PERCENTILE", "calibrate_prompt", "calibrate_unit",
           "copy_kv_input_encodings", "kv_cache_io", "lm_head_weight", "recipe_sim", "require_aimet",
           "shared_token_tensors", "token_encodings"]

logger = logging.getLogger(__name__)

ACTIVATION_TYPE = "int16"
HTP_CONFIG = "htp_v79"
WEIGHT_OP_TYPES = ("Gemm", "MatMul", "Conv")
_PASS_THROUGH = ("Identity", "Cast", "Reshape", "Transpose", "Squeeze", "Unsqueeze")
# quantize.calibrator -> aimet-onnx's quant scheme of the activation quantizers (docs/quantize.md, "Calibrators")
CALIBRATORS = {"min-max": "min_max", "tf-enhanced": "tf_enhanced", "percentile": "percentile"}
DEFAULT_CALIBRATOR = "min-max"
PERCENTILE = 99.99


# --- the graph ---------------------------------------------------------------------------------------------

def lm_head_weight(graph: onnx.GraphProto, where: str | Path) -> tuple[str, str]:
    """``(node, initializer)`` of the LM head: the weighted MatMul/Gemm that ``logits`` comes from, through
    data-movement ops, its weight found through a Transpose or Cast.

    Raises:
        GenieBuildError: no ``logits`` output, or no weighted MatMul/Gemm produces it.
    """
    found = _find_lm_head(graph)
    if found is None:
        raise GenieBuildError(where, f"no weighted MatMul or Gemm produces the output {LOGITS!r} (the LM head)")
    return found


def _find_lm_head(graph: onnx.GraphProto) -> tuple[str, str] | None:
    """:func:`lm_head_weight`, or None for a graph without the LM head."""
    producers = {output: node for node in graph.node for output in node.output}
    initializers = {tensor.name for tensor in graph.initializer}
    node = producers.get(LOGITS)
    while node is not None and node.op_type in _PASS_THROUGH:
        node = producers.get(node.input[0])
    if node is not None and node.op_type in ("MatMul", "Gemm"):
        weight = node.input[1]
        while weight not in initializers and weight in producers and producers[weight].op_type in _PASS_THROUGH:
            weight = producers[weight].input[0]
        if weight in initializers:
            return node.name, weight
    return None


def kv_cache_io(graph: onnx.GraphProto) -> dict[str, str]:
    """Each ``past_{key,value}_{i}_in`` graph input -> its ``_out`` graph output."""
    outputs = {value.name for value in graph.output}
    pairs = {}
    for value in graph.input:
        match = KV_TENSOR.match(value.name)
        if match and match.group(3) == "in":
            out = kv_name(match.group(1), int(match.group(2)), "out")
            if out in outputs:
                pairs[value.name] = out
    return pairs


# --- the AIMET driver --------------------------------------------------------------------------------------

def require_aimet(where: str = "quantize") -> tuple[Any, Any]:
    """aimet-onnx's ``quantsim`` and ``llm_configurator`` modules.

    Raises:
        GenieBuildError: aimet-onnx is not installed (at ``where``: the option or command that asked for it).
    """
    try:
        import aimet_onnx.llm_configurator.llm_configurator as llm_configurator
        import aimet_onnx.quantsim as quantsim
    except ImportError:
        raise GenieBuildError(where, "aimet needs aimet-onnx, which is not installed "
                                     "(pip install --no-deps -r envs/requirements-hf.txt)") from None
    return quantsim, llm_configurator


def calibrate_prompt(prompt_path: str | Path, recipe: Recipe, forward_pass: ForwardPass,
                     calibrator: str = DEFAULT_CALIBRATOR) -> Encodings:
    """The whole prompt graph quantized by ``recipe`` and AIMET's LLM recipe, calibrated by ``forward_pass``: the
    reference the chain of units is compared with (the workflow calibrates unit by unit, :func:`calibrate_unit`).

    Raises:
        GenieBuildError: aimet-onnx is missing, the graph is unreadable or stores float16 weights (aimet-onnx
            leaves a weight reaching its op through a Cast unquantized), or a weight does not split into LPBQ
            blocks.
    """
    path = Path(prompt_path)
    graph = load_graph(path)
    check_external_data(graph, path)
    _check_float32(graph, path)
    lm_head = lm_head_weight(graph.graph, path)
    kv_io = kv_cache_io(graph.graph)
    del graph
    return _calibrated(onnx.load(path), recipe, lm_head, kv_io, path, forward_pass, calibrator)


def _check_float32(model: onnx.ModelProto, path: Path) -> None:
    if any(tensor.data_type == onnx.TensorProto.FLOAT16 for tensor in model.graph.initializer):
        raise GenieBuildError(path, "float16 weights: aimet-onnx does not quantize a weight reaching its op "
                                    "through a Cast; export float32 weights (the demo needs demo.weight_dtype float32)")


def _calibrated(model: onnx.ModelProto, recipe: Recipe, lm_head: tuple[str, str] | None, kv_io: Mapping[str, str],
                where: Path, forward_pass: Callable[..., None], calibrator: str = DEFAULT_CALIBRATOR, *,
                with_sim: bool = False) -> Encodings:
    """``model``'s encodings: a sim set up by :func:`recipe_sim`, calibrated by ``forward_pass`` (called with the
    sim's session, and with the sim itself when ``with_sim``: a unit that feeds a quantizer itself), exported; the
    embedding's output, which AIMET leaves unencoded, takes its table's encoding
    (:mod:`genie_build.quantize.embedding_encoding`)."""
    lookup = embedding_gather(model)
    with tempfile.TemporaryDirectory(prefix="genie-build-aimet-") as scratch:
        sim = recipe_sim(model, recipe, lm_head, kv_io, where, Path(scratch) / "sim", calibrator)
        del model
        sim.compute_encodings((lambda session: forward_pass(session, sim)) if with_sim else forward_pass)
        sim.export(scratch, "graph", encoding_version="1.0.0", export_model=False)
        return encode_embedding_output(read_encodings(Path(scratch) / "graph.encodings"), lookup)


def recipe_sim(model: onnx.ModelProto, recipe: Recipe, lm_head: tuple[str, str] | None, kv_io: Mapping[str, str],
               where: Path, scratch: Path, calibrator: str = DEFAULT_CALIBRATOR) -> Any:
    """An uncalibrated ``QuantizationSimModel`` of ``model`` set up by ``recipe`` and AIMET's LLM recipe
    (``scratch``: where AIMET keeps the weights of a model too large for one protobuf).

    ``lm_head`` is ``(node, weight)`` of the LM head, None for a graph (a unit of the chain) without it: the
    steps of ``llm_configurator._apply_int8_kv_cache_tying_and_lm_head`` are taken one by one, in its order, so
    that a graph without the head skips only the head's step. Each step is local to a decoder layer or to the
    head, so a unit gets what the whole graph gets (docs/quantize.md). The session takes the job's threads and no
    CPU arena (memory only; the values are the same).
    """
    quantsim, llm_configurator = require_aimet()
    # No CPU arena: it rounds a large tensor's block up to a power of two and keeps it after the run (the LM head's
    # fake-quantized weight and its transpose, 2.2 GB each for Qwen2.5-7B)
    options = {"enable_cpu_mem_arena": False, **({"intra_op_num_threads": job_threads()} if job_threads() else {})}
    sim = quantsim.QuantizationSimModel(model, param_type=recipe.param_type, activation_type=ACTIVATION_TYPE,
                                        config_file=HTP_CONFIG, path=str(scratch), session_options_kwargs=options)
    if recipe.lpbq:
        _set_lpbq(quantsim, sim, {lm_head[0]} if lm_head else set(), where)
    llm_configurator._set_tensors_to_output_8b_sym(sim, [*kv_io, *kv_io.values()])
    if lm_head is not None:
        llm_configurator._set_lm_head_to_8b(sim, lm_head[1])
    llm_configurator._tie_quantizers_for_kv_cache(sim, dict(kv_io))
    llm_configurator._set_matmul_second_input_to_8b(sim)
    _set_calibrator(sim, calibrator)
    return sim


def _set_calibrator(sim: Any, calibrator: str) -> None:
    """Give every activation quantizer ``calibrator``'s quant scheme (after the recipe's steps, which rebuild the
    quantizers they change); the MatMul weights' quantizers keep min-max."""
    if calibrator not in CALIBRATORS:
        raise GenieBuildError("quantize.calibrator", f"{calibrator!r} is not one of {sorted(CALIBRATORS)}")
    if calibrator == DEFAULT_CALIBRATOR:
        return
    from aimet_onnx.common.defs import QuantScheme

    scheme = QuantScheme.from_str(CALIBRATORS[calibrator])
    quantizers = {id(quantizer): quantizer for name in sim.activation_names
                  if (quantizer := sim.qc_quantize_op_dict.get(name)) is not None}   # tied ones once
    for quantizer in quantizers.values():
        quantizer.set_quant_scheme(scheme)
        if calibrator == "percentile":
            # aimet-onnx has no public setter; its tensor quantizer takes the percentile of each end
            quantizer._tensor_quantizer.setPercentileValue(PERCENTILE)


def _set_lpbq(quantsim: Any, sim: Any, excluded: set[str], path: Path) -> None:
    """LPBQ for every backbone weight (the LM head, ``excluded``, stays 8-bit per channel, as AIMET's recipe
    sets it)."""
    try:
        # 4-bit values, 8-bit (twice the bitwidth) per-block integer scales
        quantsim.set_lpbq_for_params(sim, 4, LPBQ_BLOCK_SIZE, op_types=set(WEIGHT_OP_TYPES),
                                     nodes_to_exclude=excluded, strict=True)
    except (RuntimeError, ValueError) as exc:
        raise GenieBuildError(path, f"LPBQ with blocks of {LPBQ_BLOCK_SIZE}: {exc}") from None


def copy_kv_input_encodings(enc: Encodings, tensor_names: set[str] | frozenset[str]) -> Encodings:
    """Each ``past_{key,value}_{i}_out`` of the graph (``tensor_names``) with the encoding of its ``_in``: the
    two share one quantizer in AIMET, but AIMET exports it under the input's name only (the output is made by a
    data-movement op)."""
    activations = dict(enc.activations)
    for name in sorted(tensor_names):
        match = KV_TENSOR.match(name)
        cache_in = kv_name(match.group(1), int(match.group(2)), "in") if match and match.group(3) == "out" else None
        if cache_in in activations:
            activations[name] = replace(activations[cache_in], name=name)
    return replace(enc, activations=activations)


def shared_token_tensors(prompt_names: frozenset[str], token_path: Path) -> frozenset[str]:
    """The token graph's tensor names, checked to be the prompt graph's (``prompt_names``) where they need an
    encoding.

    Raises:
        GenieBuildError: the token graph has a float tensor (activation or initializer) that the prompt graph
            lacks, named.
    """
    token = load_graph(token_path)
    check_external_data(token, token_path)
    floats = set(float_activations(token)) | {tensor.name for tensor in token.graph.initializer
                                              if tensor.data_type == onnx.TensorProto.FLOAT}
    missing = sorted(floats - prompt_names)
    if missing:
        raise GenieBuildError(token_path, f"tensors {missing[:3]} ({len(missing)} in all) are not in the prompt "
                                          "graph, so they have no encoding to share; export both graphs from one "
                                          "model so that they name their tensors alike")
    return graph_tensors(token).tensor_names


def token_encodings(prompt_enc: Encodings, token_names: frozenset[str]) -> Encodings:
    """The prompt graph's encodings of the tensors the token graph has (``token_names``)."""
    empty = Encodings(activations={}, params={}, quantizer_args=dict(prompt_enc.quantizer_args),
                      header=prompt_enc.header, version=prompt_enc.version)
    return copy_kv_input_encodings(share_encodings(prompt_enc, empty, token_names), token_names)


# --- the chain: one unit at a time ---------------------------------------------------------------------------

def calibrate_unit(part_graph: str | Path, units: Sequence[CalibrationUnit], label: str, out_encodings: str | Path,
                   out_boundary: str | Path, *, hf_config_path: str | Path, tokens_path: str | Path, recipe: str,
                   num_samples: int, ar: int, context: int, boundary_in: str | Path | None = None,
                   calibrator: str = DEFAULT_CALIBRATOR) -> Encodings:
    """The ``calibrate-unit`` command: unit ``label`` of the chain, one of its part's ``units``
    (:mod:`genie_build.plan.calibration_units`), carved from the part's prompt graph, quantized by ``recipe`` and
    AIMET's LLM recipe, and calibrated on ``num_samples`` windows of the calibration text's ids (``tokens_path``:
    what ``tokenize-text`` wrote; only those windows are read), fed the residual stream the unit before it stored
    (``boundary_in``, read a window at a time); writes its encodings and its own output stream (``out_boundary``:
    ``[windows, 1, AR, hidden]`` float32, written a window at a time; empty for the last unit, whose output is the
    logits). A unit of the embedding alone reads its table in place, and a unit of the head whose ``slices`` is
    above 1 is calibrated in slices of its vocabulary (:mod:`genie_build.quantize.calibrate_tables`).

    Raises:
        GenieBuildError: a bad recipe or sample count, a unit the chain does not have, a boundary file of another
            shape than the windows need, or the problems of :func:`_unit_graph`,
            :func:`genie_build.tokens.read_tokens` and :func:`calibrate_prompt`.
    """
    chosen = recipe_named(recipe)
    if calibrator not in CALIBRATORS:
        raise GenieBuildError("--calibrator", f"{calibrator!r} is not one of {sorted(CALIBRATORS)}")
    if num_samples < 1:
        raise GenieBuildError("--num-samples", f"must be at least 1, got {num_samples}")
    part_path = Path(part_graph)
    unit = next((unit for unit in units if unit.label == label), None)
    if unit is None or {other.part for other in units} != {unit.part}:
        raise GenieBuildError("--part-units-json", f"not the units of one part holding unit {label!r}")
    model = _unit_graph(part_path, units, label)
    shape = unit_feed_shape(model, part_path, Path(hf_config_path), ar=ar, context=context,
                            boundary=unit.input_boundary)
    ids = read_tokens(tokens_path, num_samples * ar)
    with ExitStack() as stack:
        stream = None
        if shape.boundary is not None:
            stream = stack.enter_context(_open_boundary(boundary_in, num_samples, ar)).window
        require_aimet("calibrate-unit")  # after the inputs are read: importing aimet-onnx takes seconds, a bad input not
        logger.info("unit %s: %s of part %s, %d windows of %d tokens%s", label, "+".join(unit.pieces), unit.part,
                    num_samples, ar, f", the head in {unit.slices} slices" if unit.slices > 1 else "")
        run = _UnitRun(model, part_path, chosen, calibrator, shape, ids, num_samples, stream)
        if unit.pieces == (EMBEDDING_PIECE,):
            encodings = run.embedding_in_place(out_boundary)
        elif unit.slices > 1:
            encodings = run.head_in_slices(unit.slices)
            _write_no_stream(out_boundary)
        else:
            encodings = run.whole(unit.output_boundary, out_boundary)
    write_encodings(out_encodings, encodings)
    logger.info("unit %s: %d activation and %d param encodings", label, len(encodings.activations),
                len(encodings.params))
    return encodings


@dataclass(frozen=True)
class _UnitRun:
    """What a unit's calibration reads: its graph (weights still external), the recipe, the windows and the stream
    before it."""

    model: onnx.ModelProto
    where: Path
    recipe: Recipe
    calibrator: str
    shape: FeedShape
    ids: np.ndarray
    num_samples: int
    stream: Callable[[int], np.ndarray] | None

    def forward(self, collect: str | None = None, sink: Callable[[np.ndarray], None] | None = None) -> ForwardPass:
        return text_forward_pass(self.shape, self.ids, self.num_samples, boundary_in=self.stream, collect=collect,
                                 sink=sink)

    def whole(self, collect: str | None, out_boundary: str | Path) -> Encodings:
        """The unit in one sim, its output stream written window by window (empty for the last unit)."""
        _load_weights(self.model, self.where)
        _check_float32(self.model, self.where)
        lm_head, kv_io = _find_lm_head(self.model.graph), kv_cache_io(self.model.graph)
        if collect is None:
            _write_no_stream(out_boundary)
            return _calibrated(self.model, self.recipe, lm_head, kv_io, self.where, self.forward(), self.calibrator)
        with write_windows(out_boundary, self.num_samples) as out:
            return _calibrated(self.model, self.recipe, lm_head, kv_io, self.where, self.forward(collect, out.append),
                               self.calibrator)

    def head_in_slices(self, slices: int) -> Encodings:
        """The head in ``slices`` slices of its vocabulary, one sim at a time; each slice's logits kept a window at a
        time on disk, and the last slice's ``logits`` quantizer fed every whole window (calibrate_tables)."""
        node, weight = lm_head_weight(self.model.graph, self.where)
        for stored in model_tensors(self.model):   # the norm's weights; the head's is read a slice at a time
            if stored.tensor.data_location == onnx.TensorProto.EXTERNAL and stored.tensor.name != weight:
                load_external_bytes(stored, self.where)
        rows = [tensor.dims[0] for tensor in self.model.graph.initializer if tensor.name == weight][0]
        ranges = head_slices(rows, slices)
        with tempfile.TemporaryDirectory(prefix="genie-build-head-") as scratch:
            logits = [Path(scratch) / f"logits_{index}.npy" for index in range(slices)]
            parts = []
            for index, (first, last) in enumerate(ranges):
                graph = head_slice_graph(self.model, weight, (first, last), self.where)
                _check_float32(graph, self.where)
                logger.info("LM head rows %d..%d (slice %d of %d)", first, last - 1, index + 1, slices)

                def forward(session: Any, sim: Any, index: int = index) -> None:
                    with write_windows(logits[index], self.num_samples) as out:
                        self.forward(LOGITS, out.append)(session)
                    if index == slices - 1:
                        _feed_whole_logits(sim.qc_quantize_op_dict[LOGITS], logits, self.num_samples)

                parts.append(_calibrated(graph, self.recipe, (node, weight), {}, self.where, forward,
                                         self.calibrator, with_sim=True))
                del graph
                gc.collect()   # aimet-onnx's sim holds reference cycles: free this slice's before the next is built
        return merge_head_slices(parts, weight, self.where)

    def embedding_in_place(self, out_boundary: str | Path) -> Encodings:
        """The embedding's table mapped from the data file: its quantizer (a one-row table's sim's) fed the table
        once per window, as the whole unit's sim feeds it (min-max once: the same table again cannot move a minimum
        or a maximum), and the stream its rows (calibrate_tables)."""
        table = embedding_table(self.model, self.where)
        rows = table.mapped()
        with write_windows(out_boundary, self.num_samples) as out:
            def forward(session: Any, sim: Any) -> None:
                quantizer = sim.qc_quantize_op_dict[table.name]
                for index, (window, _) in enumerate(calibration_windows(self.ids, self.shape.ar, self.shape.context,
                                                                        self.num_samples)):
                    if index == 0 or self.calibrator != "min-max":
                        quantizer.update_encoding_stats(rows)
                    out.append(np.asarray(rows[window])[None])
                    logger.info("calibrated window %d of %d", index + 1, self.num_samples)

            return _calibrated(one_row_graph(self.model, table), self.recipe, None, {}, self.where, forward,
                               self.calibrator, with_sim=True)


def _feed_whole_logits(quantizer: Any, slices: Sequence[Path], windows_count: int) -> None:
    """The ``logits`` quantizer's statistics again, from each window's logits whole (the slices' columns joined),
    window by window as the whole head's sim would feed it."""
    quantizer.reset_encoding_stats()
    with ExitStack() as stack:
        files = [stack.enter_context(open_windows(path)) for path in slices]
        for index in range(windows_count):
            quantizer.update_encoding_stats(np.concatenate([file.window(index) for file in files], axis=-1))


def _load_weights(model: onnx.ModelProto, where: Path) -> None:
    for stored in model_tensors(model):   # read through the resolver: onnx's loader refuses a symlinked data file
        if stored.tensor.data_location == onnx.TensorProto.EXTERNAL:
            load_external_bytes(stored, where)


def _unit_graph(part_graph: Path, units: Sequence[CalibrationUnit], label: str) -> onnx.ModelProto:
    """Unit ``label`` carved from its part's graph (``units``: the part's units) by the split's own cut, its
    weights still external (in the part's data file).

    Raises:
        GenieBuildError: the part graph is unreadable, or the units' boundaries do not cut it.
    """
    model = load_graph(part_graph)
    check_external_data(model, part_graph)
    labels = [unit.label for unit in units]
    specs = cut_graph(model, labels, [unit.output_boundary for unit in units[:-1]], part_graph)
    spec = specs[labels.index(label)]
    model = ensure_value_info(model, [*spec.inputs, *spec.outputs], part_graph)
    return build_part(model, spec, label)


@contextmanager
def _open_boundary(path: str | Path | None, windows_count: int, ar: int) -> Iterator[WindowFile]:
    """The residual stream a unit stored for the next, checked against the windows it must cover, open to be read a
    window at a time.

    Raises:
        GenieBuildError: no file, not a ``.npy``, or another shape than ``[windows, 1, AR, hidden]`` float32.
    """
    if path is None:
        raise GenieBuildError("--boundary-in", "this unit takes the residual stream of the unit before it")
    with open_windows(path) as stream:
        if stream.dtype != np.float32 or len(stream.shape) != 4 or stream.shape[:3] != (windows_count, 1, ar):
            raise GenieBuildError(path, f"holds {stream.dtype} {list(stream.shape)}, not [{windows_count}, 1, {ar}, "
                                        "hidden] float32: it was stored for other calibration settings")
        yield stream


def _write_no_stream(path: str | Path) -> None:
    """The last unit's output stream: none (its output is the logits)."""
    with atomic_open(path) as handle:
        np.save(handle, np.zeros((0,), np.float32), allow_pickle=False)
