"""Quality beside size: a variant's context binaries run on held-out text against the float model, one part at a time.

The text's token ids (``tokenize-text``, :mod:`genie_build.tokens`) are cut into windows of the prompt graph's AR tokens, in the order calibration uses
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
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from genie_build.conventions import INPUT_IDS, INPUTS_EMBEDS, KV_PREFIX, LOGITS, MASK, POS_COS, POS_SIN, causal_mask, rope_tables
from genie_build.encodings import Encodings, TensorEncoding, read_encodings
from genie_build.errors import GenieBuildError
from genie_build.evaluate.evaluation_table import ClippedTensor, Clipping, Quality
from genie_build.fileio import atomic_open
from genie_build.run.run_bundle import GraphSession, KVCache, graph_ar_cl_of, make_runner, read_graph_file
from genie_build.tokens import mapped_array, read_tokens
from genie_build.toolchains.reference.container import ContainerGraph, read_graphs

__all__ = ["CLIP_STATS_SUFFIX", "ClipSums", "Window", "compare_logits", "fake_quantize_activations",
           "float_nll", "grid_of", "quality_of", "text_windows", "write_float_logits"]

CLIP_STATS_SUFFIX = "/clip_stats"
MOST_CLIPPED = 5              # tensors named per variant
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


def fake_quantize_activations(model: onnx.ModelProto, encodings: Encodings, *, clip_stats: bool = False) -> list[str]:
    """Apply every integer activation encoding of ``encodings`` to the tensor of that name in ``model``'s graph (a
    graph input or a node's output), as nodes computing the quantized value right after it; other tensors are left
    alone. With ``clip_stats``, each quantized tensor also gets a graph output ``<name>/clip_stats``: float32
    ``[values clipped (more than a step past the grid's end), values, min, max]`` of the float values it quantized
    (:class:`ClipSums` adds them up).

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
        ordered += _fake_quantize_nodes(value.name, copy, encoding, _stats_name(value.name, clip_stats))
        quantized.append(value.name)
    for node in graph.node:
        ordered.append(node)
        for index, output in enumerate(node.output):
            encoding = encodings.activations.get(output)
            if output in weights or encoding is None or encoding.dtype != "int":
                continue
            node.output[index] = f"{output}/float"  # the readers of the name now read the quantized value
            ordered += _fake_quantize_nodes(node.output[index], output, encoding, _stats_name(output, clip_stats))
            quantized.append(output)
    graph.ClearField("node")
    graph.node.extend(ordered)
    if clip_stats:
        graph.output.extend(helper.make_tensor_value_info(_stats_name(name, True), onnx.TensorProto.FLOAT, [4])
                            for name in quantized)
    return quantized


def _stats_name(tensor: str, clip_stats: bool) -> str | None:
    return f"{tensor}{CLIP_STATS_SUFFIX}" if clip_stats else None


def grid_of(encoding: TensorEncoding) -> tuple[float, float]:
    """The float values an integer per-tensor encoding can hold: ``[offset * scale, (2**bits - 1 + offset) * scale]``."""
    scale, offset = encoding.scale[0], encoding.offset[0]
    return offset * scale, (2 ** encoding.bitwidth - 1 + offset) * scale


@dataclass
class ClipSums:
    """The clip statistics of a variant's quantized activations, added up over parts and windows: per tensor, values
    outside the grid, values, min and max (the ``<name>/clip_stats`` outputs of :func:`fake_quantize_activations`)."""

    grids: dict[str, tuple[float, float]] = field(default_factory=dict)
    sums: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, outputs: Mapping[str, np.ndarray]) -> None:
        for name, stats in outputs.items():
            if not name.endswith(CLIP_STATS_SUFFIX):
                continue
            tensor, stats = name.removesuffix(CLIP_STATS_SUFFIX), np.asarray(stats, np.float64)
            old = self.sums.get(tensor)
            self.sums[tensor] = stats if old is None else np.array([old[0] + stats[0], old[1] + stats[1],
                                                                     min(old[2], stats[2]), max(old[3], stats[3])])

    def clipping(self, most: int = MOST_CLIPPED) -> Clipping:
        """The share of all values outside their grids and the ``most`` tensors with the largest shares."""
        outside = sum(float(stats[0]) for stats in self.sums.values())
        values = sum(float(stats[1]) for stats in self.sums.values())
        tensors = [ClippedTensor(name, float(stats[0] / stats[1]), *self.grids[name], float(stats[2]),
                                 float(stats[3])) for name, stats in self.sums.items() if stats[0] > 0]
        tensors.sort(key=lambda tensor: (-tensor.share, -tensor.past_end, tensor.name))
        return Clipping(share=outside / values if values else 0.0, values=int(values), tensors=tuple(tensors[:most]))


def compare_logits(float_logits: np.ndarray, variant_logits: np.ndarray, targets: np.ndarray) -> Quality:
    """:class:`Quality` of ``variant_logits`` against ``float_logits`` (both ``[positions, vocab]``) where the text
    continues with ``targets``."""
    sums = _QualitySums()
    sums.add(float_logits, variant_logits, targets)
    return sums.quality()


def write_float_logits(float_parts: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *,
                       tokens_path: str | os.PathLike[str], rope: Mapping, max_windows: int) -> tuple[int, int, int]:
    """The float model's logits on the text's windows, one part at a time, into ``out`` (a ``.npy`` file of float32
    ``[windows, AR, vocab]``, written one window at a time).

    Args:
        float_parts: the float prompt graphs, part order.
        tokens_path: the text's token ids (what ``tokenize-text`` wrote).
        rope: ``head_dim``, ``rope_theta`` and ``rope_scaling`` as :func:`genie_build.run.run_bundle.host_rope` gives.
        max_windows: windows of held-out text at most.

    Returns:
        The file's shape.

    Raises:
        GenieBuildError: a graph whose AR or CL differs from the first part's, or a text too short.
    """
    windows, logits = _logits_per_window([functools.partial(read_graph_file, path) for path in float_parts],
                                         read_tokens(tokens_path), rope, max_windows, tokens_path)
    with atomic_open(out, "wb") as handle:
        for index, window_logits in enumerate(logits):
            if index == 0:
                shape = (len(windows), *window_logits.shape)
                np.lib.format.write_array_header_1_0(handle, {"descr": np.lib.format.dtype_to_descr(_LOGITS_DTYPE),
                                                              "fortran_order": False, "shape": shape})
            handle.write(np.ascontiguousarray(window_logits, dtype=_LOGITS_DTYPE).tobytes())
    return shape


def float_nll(float_parts: Sequence[str | os.PathLike[str]], ids: Sequence[int], *, rope: Mapping,
              where: str | os.PathLike[str]) -> tuple[float, int]:
    """The float model's negative log-likelihood of ``ids[1:]``, each token given the ones before it, summed, and how
    many tokens that is: ``ids`` run from an empty cache in windows of the prompt graph's AR, one part at a time
    (``where``: the text, for errors). Tokens past the last whole window are not scored."""
    windows, logits = _logits_per_window([functools.partial(read_graph_file, path) for path in float_parts], ids,
                                         rope, len(ids), where)
    total, count = 0.0, 0
    for window, window_logits in zip(windows, logits):
        targets = np.asarray(window.targets)
        total -= float(np.sum(_log_softmax(window_logits)[np.arange(len(targets)), targets]))
        count += len(targets)
    return total, count


def quality_of(binaries: Sequence[str | os.PathLike[str]], part_encodings: Sequence[str | os.PathLike[str]],
               float_logits: str | os.PathLike[str], *, tokens_path: str | os.PathLike[str], rope: Mapping,
               max_windows: int, activations: bool = True, clipping: ClipSums | None = None) -> Quality:
    """A variant's binaries (part order) on the text, one part at a time, against the float model's logits
    :func:`write_float_logits` wrote for the same text and windows, window by window.

    Args:
        binaries: the variant's reference context binaries; each part's prompt graph (its widest AR) is run.
        part_encodings: the parts' prompt-graph encodings, whose activation encodings are applied to the variant.
        float_logits: the float model's logits file.
        tokens_path, rope, max_windows: as for :func:`write_float_logits`.
        activations: False: the weights as the binaries store them, every activation left in float (what the
            variant's weights alone cost).
        clipping: gathers how many of each quantized activation's values fall outside its grid.

    Raises:
        GenieBuildError: unequal numbers of binaries and encodings, a binary that is no reference container, a text
            too short, or a float logits file of other windows.
    """
    if len(binaries) != len(part_encodings):
        raise GenieBuildError("evaluate", f"{len(binaries)} binaries and {len(part_encodings)} encodings files: "
                                          "one of each per part")
    loaders = [functools.partial(_variant_graph, binary, encodings if activations else None, clipping)
               for binary, encodings in zip(binaries, part_encodings)]
    reference = _read_float_logits(float_logits)
    windows, logits = _logits_per_window(loaders, read_tokens(tokens_path), rope, max_windows, tokens_path,
                                         clipping)
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
                       max_windows: int, tokens_path: str | os.PathLike[str], clipping: ClipSums | None = None
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
            windows = text_windows(ids, ar, context, max_windows, tokens_path)
            streams = [{INPUT_IDS: np.array([window.ids], dtype=np.int32)} for window in windows]
            tables = rope_tables(rope["head_dim"], rope["rope_theta"], np.arange(context), rope.get("rope_scaling"))
        elif shape != (ar, context):
            raise GenieBuildError(load.args[0], f"AR {ar} and CL {context}, unlike the parts before it "
                                                f"({shape[0]}, {shape[1]})")
        outputs = _run_part(session, _session_streams(session, streams), windows, tables, ar, context, clipping)
        if index == len(loaders) - 1:
            return windows, (output[LOGITS][0] for output in outputs)
        streams = list(outputs)
        del session, outputs   # before the next part loads


def _session_streams(session: GraphSession, streams: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The streams as ``session`` takes them: a part that takes ``inputs_embeds`` (the part after the embedding in a
    bundle whose embedding is a CPU table, ``bundle.embedding: lut``) is fed part 1's embedding vectors, the one
    tensor part 1 hands on."""
    if INPUTS_EMBEDS not in {node.name for node in session.inputs()} or not streams or INPUTS_EMBEDS in streams[0]:
        return streams
    if len(streams[0]) != 1:
        raise GenieBuildError("evaluate", f"a part takes {INPUTS_EMBEDS}, but the part before it hands on "
                                          f"{sorted(streams[0])}, not the embedding vectors alone")
    return [{INPUTS_EMBEDS: next(iter(stream.values()))} for stream in streams]


def _run_part(session: GraphSession, streams: Sequence[dict[str, np.ndarray]], windows: Sequence[Window],
              tables: tuple[np.ndarray, np.ndarray], ar: int, context: int,
              clipping: ClipSums | None = None) -> Iterator[dict[str, np.ndarray]]:
    """One part over every window, its KV cache restarted with each sequence: each window's outputs but the cache
    and the clip statistics (which go to ``clipping``), as the window is run."""
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
        if clipping is not None:
            clipping.add(outputs)
        yield {name: value for name, value in outputs.items()
               if not name.startswith(KV_PREFIX) and not name.endswith(CLIP_STATS_SUFFIX)}


def _session_of(graph: ContainerGraph, rope: Mapping) -> tuple[GraphSession, int, int]:
    runner = make_runner([{graph.model.graph.name: graph}], **rope)
    (ar, session), = runner.parts[0].items()
    return session, ar, runner.context_length


def _variant_graph(binary: str | os.PathLike[str], encodings: str | os.PathLike[str] | None,
                   clipping: ClipSums | None = None) -> ContainerGraph:
    """A part's prompt graph as the variant computes it: its stored weights, and (unless ``encodings`` is None) its
    activation encodings applied, with clip statistics when ``clipping`` gathers them."""
    graph = _widest(read_graphs(binary), binary)
    if encodings is not None:
        part = read_encodings(encodings)
        quantized = fake_quantize_activations(graph.model, part, clip_stats=clipping is not None)
        if clipping is not None:
            clipping.grids.update((name, grid_of(part.activations[name])) for name in quantized)
    return graph


def _read_float_logits(path: str | os.PathLike[str]) -> np.ndarray:
    """The float model's logits file, mapped (a window is read when it is compared)."""
    return mapped_array(path, "logits", _LOGITS_DTYPE, 3, "float32 [windows, AR, vocab] logits")


def _widest(graphs: Mapping[str, ContainerGraph], where: str | os.PathLike[str]) -> ContainerGraph:
    """The prompt graph of a part's binary: the one with the widest AR."""
    if not graphs:
        raise GenieBuildError(where, "holds no graph")
    return graphs[max(graphs, key=lambda name: graph_ar_cl_of(name, graphs[name].model)[0] or 0)]


# ---------------------------------------------------------------------------------------------- the graph pass

def _fake_quantize_nodes(source: str, target: str, encoding: TensorEncoding,
                         stats: str | None = None) -> list[onnx.NodeProto]:
    """Nodes computing ``target`` = ``source`` fake-quantized by a per-tensor integer encoding (and, given a name,
    ``stats``: how many of its values fall outside the grid, of how many, and their min and max)."""
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
    return nodes + (_clip_stats_nodes(source, prefix, stats, encoding.bitwidth) if stats else [])


def _clip_stats_nodes(source: str, prefix: str, output: str, bitwidth: int) -> list[onnx.NodeProto]:
    """``output`` = float32 ``[values clipped, values, min, max]`` of ``source``, a value counting as clipped when it
    lies more than one step past the grid's end (reading the fake quantization's ``levels`` and ``offset`` under
    ``prefix``): within a step the clip moves it no more than rounding would, as the RoPE tables' 1.0 on a grid
    ending half a step below it."""
    def name(step: str) -> str:
        return f"{prefix}/clip/{step}"

    def node(op: str, inputs: list[str], step: str, **attrs) -> onnx.NodeProto:
        return helper.make_node(op, inputs, [output if step == "stats" else name(step)], name=name(step), **attrs)

    def constant(step: str, value: np.ndarray) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name(step)], name=name(step),
                                value=numpy_helper.from_array(value, name(step)))

    floats = onnx.TensorProto.FLOAT
    return [constant("axes", np.array([0], np.int64)), constant("first", np.float32(-1)),
            constant("last", np.float32(2 ** bitwidth)),
            node("Sub", [f"{prefix}/levels", f"{prefix}/offset"], "unrounded"),
            node("Less", [name("unrounded"), name("first")], "under"),
            node("Greater", [name("unrounded"), name("last")], "over"),
            node("Or", [name("under"), name("over")], "outside"), node("Cast", [name("outside")], "outside_f", to=floats),
            node("ReduceSum", [name("outside_f")], "count", keepdims=0),
            node("Size", [source], "size_i"), node("Cast", [name("size_i")], "size", to=floats),
            node("ReduceMin", [source], "min", keepdims=0), node("ReduceMax", [source], "max", keepdims=0),
            *(node("Unsqueeze", [name(step), name("axes")], f"{step}_1") for step in ("count", "size", "min", "max")),
            node("Concat", [name(f"{step}_1") for step in ("count", "size", "min", "max")], "stats", axis=0)]


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
