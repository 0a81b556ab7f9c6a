"""Quality beside size: a variant's context binaries run on held-out text against the float model, one part at a time.

The text is tokenized and cut into windows of the prompt graph's AR tokens, in the order calibration uses
(consecutive windows share a sequence and its KV cache until the cache is full; the next window then starts a new
sequence). Every window is teacher-forced: all of its tokens are the text's, and the logits at each position are
compared with the text's next token and with the float model's logits there.

Both models run **part by part**: every window goes through part 1, whose outputs (the residual stream) are kept
for part 2, and so on, so memory holds one part's weights and the windows' boundary tensors, never the model; the
last part's logits are taken one window at a time. The float model runs once per text
(:func:`write_float_logits`: its logits, windows × AR × vocabulary, in a ``.npy`` file), and each variant is
compared with it window by window (:func:`quality_of`), so no job holds more than one window's logits of each model.
The float model is the parts of the float graphs the build split or exported; the variant is its compiled reference
binaries, with every weight as the binary stores it and every activation encoding of the part's encodings applied
as a fake quantization (``q = clip(round(x / scale) - offset, 0, 2**bits - 1)``, ``x' = (q + offset) * scale``,
the reference quantizer's arithmetic), which is how the HTP computes a quantized activation: 16-bit activations,
an 8-bit KV cache.

Metrics (:class:`Quality`): top-1 agreement with the float model's next token, mean KL(float || variant) in nats,
and the perplexity of both on the text.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from genie_build.conventions import INPUT_IDS, KV_PREFIX, LOGITS, MASK, POS_COS, POS_SIN, causal_mask, rope_tables
from genie_build.encodings import Encodings, TensorEncoding, read_encodings
from genie_build.errors import GenieBuildError
from genie_build.fileio import atomic_open, read_text, regular_file_size
from genie_build.genie_config import load_tokenizer
from genie_build.quality import Quality
from genie_build.run_bundle import GraphSession, KVCache, graph_ar_cl_of, make_runner, read_graph_file
from genie_build.toolchains.reference.container import ContainerGraph, read_graphs

__all__ = ["MAX_TEXT_BYTES", "Window", "compare_logits", "fake_quantize_activations", "quality_of", "text_windows",
           "write_float_logits"]

MAX_TEXT_BYTES = 16 * 1024 * 1024
_LOGITS_DTYPE = np.dtype("<f4")


@dataclass(frozen=True)
class Window:
    """AR consecutive tokens of the text, the tokens that follow each of them, and how many tokens of its sequence
    the cache holds before it."""

    ids: tuple[int, ...]
    targets: tuple[int, ...]
    past_len: int


def text_windows(ids: Sequence[int], ar: int, context: int, max_windows: int,
                 where: str | os.PathLike[str] = "evaluation text") -> list[Window]:
    """The windows of ``ids`` (at most ``max_windows``; each needs the token after it as the last target).

    Raises:
        GenieBuildError: (``where``: the text) shorter than one window and its next token.
    """
    count = min(max_windows, (len(ids) - 1) // ar)
    if count < 1:
        raise GenieBuildError(where, f"has {len(ids)} tokens: at least {ar + 1} are needed (one window "
                                                 f"of the prompt graph's {ar} tokens and the token after it)")
    windows, past_len = [], 0
    for index in range(count):
        if past_len > context - ar:
            past_len = 0
        start = index * ar
        windows.append(Window(tuple(ids[start:start + ar]), tuple(ids[start + 1:start + ar + 1]), past_len))
        past_len += ar
    return windows


def fake_quantize_activations(model: onnx.ModelProto, encodings: Encodings) -> list[str]:
    """Apply every integer activation encoding of ``encodings`` to the tensor of that name in ``model``'s graph (a
    graph input or a node's output), as nodes computing the quantized value right after it; other tensors are left
    alone.

    Returns:
        The names of the tensors quantized, in graph order.
    """
    graph = model.graph
    weights = {tensor.name for tensor in graph.initializer}
    for node in graph.node:  # a weight's rebuilding nodes (DequantizeLinear, Cast) already give its stored values
        if node.input and all(name in weights for name in node.input if name):
            weights.update(node.output)
    quantized: list[str] = []
    ordered: list[onnx.NodeProto] = []
    for value in graph.input:  # its readers take the quantized copy, computed first
        encoding = encodings.activations.get(value.name)
        if value.name in weights or encoding is None or encoding.dtype != "int":
            continue
        copy = f"{value.name}/quantized"
        for node in graph.node:
            node.input[:] = [copy if name == value.name else name for name in node.input]
        ordered += _fake_quantize_nodes(value.name, copy, encoding)
        quantized.append(value.name)
    for node in graph.node:
        ordered.append(node)
        for index, output in enumerate(node.output):
            encoding = encodings.activations.get(output)
            if output in weights or encoding is None or encoding.dtype != "int":
                continue
            node.output[index] = f"{output}/float"  # the readers of the name now read the quantized value
            ordered += _fake_quantize_nodes(node.output[index], output, encoding)
            quantized.append(output)
    graph.ClearField("node")
    graph.node.extend(ordered)
    return quantized


def compare_logits(float_logits: np.ndarray, variant_logits: np.ndarray, targets: np.ndarray) -> Quality:
    """:class:`Quality` of ``variant_logits`` against ``float_logits`` (both ``[positions, vocab]``) where the text
    continues with ``targets``."""
    sums = _QualitySums()
    sums.add(float_logits, variant_logits, targets)
    return sums.quality()


def write_float_logits(float_parts: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *,
                       text_path: str | os.PathLike[str], tokenizer_path: str | os.PathLike[str], rope: Mapping,
                       max_windows: int) -> tuple[int, int, int]:
    """The float model's logits on the text's windows, one part at a time, into ``out`` (a ``.npy`` file of float32
    ``[windows, AR, vocab]``, written one window at a time).

    Args:
        float_parts: the float prompt graphs, part order.
        rope: ``head_dim``, ``rope_theta`` and ``rope_scaling`` as :func:`genie_build.run_bundle.host_rope` gives.
        max_windows: windows of held-out text at most.

    Returns:
        The file's shape.

    Raises:
        GenieBuildError: a graph whose AR or CL differs from the first part's, or a text too short.
    """
    windows, logits = _logits_per_window([functools.partial(read_graph_file, path) for path in float_parts],
                                         _text_ids(text_path, tokenizer_path), rope, max_windows, text_path)
    with atomic_open(out, "wb") as handle:
        for index, window_logits in enumerate(logits):
            if index == 0:
                shape = (len(windows), *window_logits.shape)
                np.lib.format.write_array_header_1_0(handle, {"descr": np.lib.format.dtype_to_descr(_LOGITS_DTYPE),
                                                              "fortran_order": False, "shape": shape})
            handle.write(np.ascontiguousarray(window_logits, dtype=_LOGITS_DTYPE).tobytes())
    return shape


def quality_of(binaries: Sequence[str | os.PathLike[str]], part_encodings: Sequence[str | os.PathLike[str]],
               float_logits: str | os.PathLike[str], *, text_path: str | os.PathLike[str],
               tokenizer_path: str | os.PathLike[str], rope: Mapping, max_windows: int) -> Quality:
    """A variant's binaries (part order) on the text, one part at a time, against the float model's logits
    :func:`write_float_logits` wrote for the same text and windows, window by window.

    Args:
        binaries: the variant's reference context binaries; each part's prompt graph (its widest AR) is run.
        part_encodings: the parts' prompt-graph encodings, whose activation encodings are applied to the variant.
        float_logits: the float model's logits file.
        rope, max_windows: as for :func:`write_float_logits`.

    Raises:
        GenieBuildError: unequal numbers of binaries and encodings, a binary that is no reference container, a text
            too short, or a float logits file of other windows.
    """
    if len(binaries) != len(part_encodings):
        raise GenieBuildError("evaluate", f"{len(binaries)} binaries and {len(part_encodings)} encodings files: "
                                          "one of each per part")
    loaders = [functools.partial(_variant_graph, binary, encodings) for binary, encodings in zip(binaries,
                                                                                                part_encodings)]
    reference = _read_float_logits(float_logits)
    windows, logits = _logits_per_window(loaders, _text_ids(text_path, tokenizer_path), rope, max_windows, text_path)
    sums = _QualitySums()
    for index, (window, window_logits) in enumerate(zip(windows, logits)):
        if index == 0 and reference.shape != (len(windows), *window_logits.shape):
            raise GenieBuildError(float_logits, f"holds logits of shape {list(reference.shape)}, the variant gives "
                                                f"{[len(windows), *window_logits.shape]}: not the same windows of "
                                                "the same text (rebuild it)")
        sums.add(reference[index], window_logits, np.asarray(window.targets))
    return sums.quality()


# ---------------------------------------------------------------------------------------------- running parts

def _logits_per_window(loaders: Sequence[Callable[[], ContainerGraph]], ids: Sequence[int], rope: Mapping,
                       max_windows: int, text_path: str | os.PathLike[str]
                       ) -> tuple[list[Window], Iterator[np.ndarray]]:
    """The windows and, lazily, the last part's logits per window (``[AR, vocab]``): every part but the last runs over
    every window before the next part loads, and only the last part stays loaded while its logits are taken. The
    first part's AR and CL cut the windows; every later part must have the same."""
    if not loaders:
        raise GenieBuildError("evaluate", "no parts to run")
    shape: tuple[int, int] | None = None
    for index, load in enumerate(loaders):
        session, ar, context = _session_of(load(), rope)
        if shape is None:
            shape = (ar, context)
            windows = text_windows(ids, ar, context, max_windows, text_path)
            streams = [{INPUT_IDS: np.array([window.ids], dtype=np.int32)} for window in windows]
            tables = rope_tables(rope["head_dim"], rope["rope_theta"], np.arange(context), rope.get("rope_scaling"))
        elif shape != (ar, context):
            raise GenieBuildError(load.args[0], f"AR {ar} and CL {context}, unlike the parts before it "
                                                f"({shape[0]}, {shape[1]})")
        outputs = _run_part(session, streams, windows, tables, ar, context)
        if index == len(loaders) - 1:
            return windows, (output[LOGITS][0] for output in outputs)
        streams = list(outputs)
        del session, outputs   # before the next part loads


def _run_part(session: GraphSession, streams: Sequence[dict[str, np.ndarray]], windows: Sequence[Window],
              tables: tuple[np.ndarray, np.ndarray], ar: int, context: int) -> Iterator[dict[str, np.ndarray]]:
    """One part over every window, its KV cache restarted with each sequence: each window's outputs but the cache,
    as the window is run."""
    cache = KVCache(context)
    for window, stream in zip(windows, streams):
        if window.past_len == 0:
            cache = KVCache(context)
        positions = slice(window.past_len, window.past_len + ar)
        feed = {**stream, MASK: causal_mask(ar, context, window.past_len),
                POS_COS: tables[0][:, :, positions], POS_SIN: tables[1][:, :, positions]}
        inputs = {node.name: feed[node.name] if node.name in feed else cache.past(node.name, node.shape)
                  for node in session.inputs()}
        outputs = session.run(inputs)
        cache.store(outputs, ar)
        cache.advance(ar)
        yield {name: value for name, value in outputs.items() if not name.startswith(KV_PREFIX)}


def _session_of(graph: ContainerGraph, rope: Mapping) -> tuple[GraphSession, int, int]:
    runner = make_runner([{graph.model.graph.name: graph}], **rope)
    (ar, session), = runner.parts[0].items()
    return session, ar, runner.context_length


def _variant_graph(binary: str | os.PathLike[str], encodings: str | os.PathLike[str]) -> ContainerGraph:
    graph = _widest(read_graphs(binary), binary)
    fake_quantize_activations(graph.model, read_encodings(encodings))
    return graph


def _text_ids(text_path: str | os.PathLike[str], tokenizer_path: str | os.PathLike[str]) -> list[int]:
    return load_tokenizer(tokenizer_path).encode(read_text(text_path, max_bytes=MAX_TEXT_BYTES)).ids


def _read_float_logits(path: str | os.PathLike[str]) -> np.ndarray:
    """The float model's logits file, mapped (a window is read when it is compared)."""
    regular_file_size(path)   # a regular file, not a link out of the results or a device
    try:
        logits = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise GenieBuildError(path, f"not a logits file: {exc}") from None
    if logits.dtype != _LOGITS_DTYPE or logits.ndim != 3:
        raise GenieBuildError(path, f"holds {logits.dtype} of {logits.ndim} dimensions, not float32 "
                                    "[windows, AR, vocab] logits")
    return logits


def _widest(graphs: Mapping[str, ContainerGraph], where: str | os.PathLike[str]) -> ContainerGraph:
    """The prompt graph of a part's binary: the one with the widest AR."""
    if not graphs:
        raise GenieBuildError(where, "holds no graph")
    return graphs[max(graphs, key=lambda name: graph_ar_cl_of(name, graphs[name].model)[0] or 0)]


# ---------------------------------------------------------------------------------------------- the graph pass

def _fake_quantize_nodes(source: str, target: str, encoding: TensorEncoding) -> list[onnx.NodeProto]:
    """Nodes computing ``target`` = ``source`` fake-quantized by a per-tensor integer encoding."""
    if encoding.kind != "per_tensor" or len(encoding.scale) != 1:
        raise GenieBuildError(encoding.name, f"activation encoding {encoding.kind} with {len(encoding.scale)} "
                                             "scales: only per-tensor activation encodings are evaluated")
    prefix = f"{target}/fake_quant"
    constants = {"scale": np.float32(encoding.scale[0]), "offset": np.float32(encoding.offset[0]),
                 "low": np.float32(0), "high": np.float32(2 ** encoding.bitwidth - 1)}
    nodes = [helper.make_node("Constant", [], [f"{prefix}/{key}"], name=f"{prefix}/{key}",
                              value=numpy_helper.from_array(np.asarray(value), f"{prefix}/{key}"))
             for key, value in constants.items()]
    steps = [("Div", [source, "scale"], "levels"), ("Round", ["levels"], "rounded"),
             ("Sub", ["rounded", "offset"], "shifted"), ("Clip", ["shifted", "low", "high"], "codes"),
             ("Add", ["codes", "offset"], "signed"), ("Mul", ["signed", "scale"], None)]
    for op, operands, result in steps:
        names = [operand if operand == source else f"{prefix}/{operand}" for operand in operands]
        nodes.append(helper.make_node(op, names, [target if result is None else f"{prefix}/{result}"],
                                      name=f"{prefix}/{op}"))
    return nodes


@dataclass
class _QualitySums:
    """The metrics' sums over the positions compared so far."""

    positions: int = 0
    agreeing: int = 0
    kl: float = 0.0
    float_nll: float = 0.0
    variant_nll: float = 0.0

    def add(self, float_logits: np.ndarray, variant_logits: np.ndarray, targets: np.ndarray) -> None:
        float_log_p, variant_log_p = _log_softmax(float_logits), _log_softmax(variant_logits)
        rows = np.arange(len(targets))
        self.positions += len(targets)
        self.agreeing += int(np.sum(np.argmax(float_logits, -1) == np.argmax(variant_logits, -1)))
        self.kl += float(np.sum(np.exp(float_log_p) * (float_log_p - variant_log_p)))
        self.float_nll -= float(np.sum(float_log_p[rows, targets]))
        self.variant_nll -= float(np.sum(variant_log_p[rows, targets]))

    def quality(self) -> Quality:
        count = self.positions
        return Quality(positions=count, top1_agreement=self.agreeing / count, mean_kl=self.kl / count,
                       float_perplexity=float(np.exp(self.float_nll / count)),
                       variant_perplexity=float(np.exp(self.variant_nll / count)))


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - np.max(logits, axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
