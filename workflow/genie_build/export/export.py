"""Export a Hugging Face checkpoint to Genie's prompt (AR-N) and token (AR-1) graphs: one part at a time
(:func:`export_part`, what the workflow runs) or the whole model (:func:`export_checkpoint`, the reference the
tests compare the parts with).

The graphs are transformers' own modules (the embedding, decoder layers with their attention, MLP and norms, the
final norm and the LM head, with the checkpoint's weights), exported by ``torch.onnx.export(dynamo=True,
optimize=False)`` through a thin wrapper, :class:`GenieIO`, whose inputs and outputs are Genie's IO contract
(docs/conventions.md), so nothing of the model is written again by hand:

- ``attention_mask [1, AR, CL]`` (additive) goes to every layer's attention as HF's 4-D additive mask;
- ``position_ids_cos/_sin [1, 1, AR, D/2]`` become HF's ``position_embeddings`` (each half repeated, as HF's
  rotary embedding concatenates ``freqs`` twice), so the scaled RoPE of Llama 3 is only in the tables Genie feeds;
- the KV cache is a cache object the attention's ``cache.update`` writes to: it concatenates the transposed past
  keys ``[1, n_kv, D, past]`` and past values with the new entries, and the graph outputs only the new ones
  (keys transposed).

A part holds the plan's pieces: the embedding (its graph takes ``input_ids``), a run of decoder layers (their
``past_*`` tensors) and the head (it gives ``logits``); between parts only the residual stream crosses, as the
input and output boundary (``/model/embed_tokens/Gather_output_0``, ``/model/layers.{i}/Add_1_output_0``). Its
graphs have the IO, tensor names and graph names the split gives a part of the whole export
(:mod:`genie_build.split.split`): every node and value gets its canonical name
(:mod:`genie_build.export.canonical`), the graphs are named ``prompt_ar{AR}_cl{CL}_{k}_of_{N}``, the exporter's stack
traces are dropped. The weights (HF names, Linear weights ``[out, in]`` behind a Transpose as torch writes them) are
written once, 4 KiB-aligned, to one data file both graphs read, with its SHA-1 as each tensor's ``checksum``
(:func:`part_files`); the part's graphs at other context lengths refer to the same file
(:mod:`genie_build.export.export_length`).

A tied LM head is written as its own ``lm_head.weight`` (the embedding table's values): Genie bundles quantize the
table and the head differently, and they sit in different parts.

Memory: a part reads only its own tensors, from the safetensors files holding them (``safe_open``), into modules
built on the meta device: about its float32 weights plus the process (a bfloat16 checkpoint is upcast tensor by
tensor). The exporter's program refers to the modules' tensors, and they are written to the data file one by one.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from huggingface_hub.errors import StrictDataclassError

from genie_build import __version__
from genie_build.conventions import (EMBEDDING_BOUNDARY, GRAPH_KINDS, INPUT_IDS, LOGITS, MASK, PART_WEIGHTS_NAME,
                                     POS_COS, POS_SIN, graph_ar, graph_name, kv_name, layer_output,
                                     unsplit_graph_name)
from genie_build.errors import GenieBuildError
from genie_build.export.canonical import canonicalize
from genie_build.export.sequence_split import split_without_sequences
from genie_build.fileio import COPY_CHUNK_BYTES, HashingWriter, atomic_open, write_bytes
from genie_build.hf_checkpoint import (CONFIG_NAME, FP8_SCALE_SUFFIX, Checkpoint, check_checkpoint, check_settings,
                                       stored_name, tensor_files)
from genie_build.hf_config import read_model_shape
from genie_build.onnx_graph import check_shared_initializers, require_finite
from genie_build.plan.plan_file import PartPlan
from genie_build.split.split import CHECKSUM_KEY, DATA_ALIGNMENT, check_part

__all__ = ["ExportShape", "ExportSummary", "GenieIO", "GraphSpan", "dequantize_fp8", "export_checkpoint",
           "export_part", "export_part_graphs", "export_shape", "part_files", "part_modules", "piece_outputs"]

log = logging.getLogger(__name__)
STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"
# What transformers raises for a config.json or checkpoint it cannot read (huggingface_hub's strict dataclasses
# validate config fields, e.g. layer_types against num_hidden_layers, with an Exception of their own).
_READ_ERRORS = (OSError, ValueError, TypeError, KeyError, StrictDataclassError)
_DtypeShape = tuple[int, tuple[int, ...]]   # an initializer's ONNX dtype and shape


@dataclass(frozen=True)
class ExportShape:
    """What the graphs' IO depends on: AR of the prompt graph, CL, the cache's dims and the hidden size."""

    ar: int
    context: int
    layers: int
    kv_heads: int
    head_dim: int
    hidden: int

    def past(self, kind: str) -> int:
        return self.context - graph_ar(kind, self.ar)


def export_shape(config: dict[str, Any], ar: int, context: int, where: str | os.PathLike[str]) -> ExportShape:
    """The graphs' dims from the HF config (:func:`genie_build.hf_config.read_model_shape`) and the export settings.

    Raises:
        GenieBuildError: settings that do not fit the model (:func:`genie_build.hf_checkpoint.check_settings`), or
            a config whose shape cannot be read.
    """
    check_settings(config, where, ar=ar, context=context)
    shape = read_model_shape(config, where)
    return ExportShape(ar=ar, context=context, layers=shape.layers, kv_heads=shape.kv_heads, head_dim=shape.head_dim,
                       hidden=shape.hidden)


@dataclass(frozen=True)
class GraphSpan:
    """The run of the plan's pieces one graph holds (the embedding, decoder layers, the head), and the
    residual-stream tensors at its cuts."""

    embedding: bool
    layers: tuple[int, ...]
    head: bool
    input_boundary: str | None = None    # None: the graph takes input_ids
    output_boundary: str | None = None   # None: the graph gives logits

    @classmethod
    def of_part(cls, part: PartPlan) -> GraphSpan:
        layers = () if part.first_layer is None else tuple(range(part.first_layer, part.last_layer + 1))
        return cls("embedding" in part.pieces, layers, "head" in part.pieces, part.input_boundary,
                   part.output_boundary)

    @classmethod
    def whole(cls, num_layers: int) -> GraphSpan:
        return cls(True, tuple(range(num_layers)), True)

    def io_names(self) -> tuple[list[str], list[str]]:
        """Genie's input and output names, in the order the split gives a part (whole-graph order, the boundary
        first)."""
        inputs = [self.input_boundary] if self.input_boundary else []
        inputs += [INPUT_IDS] if self.embedding else []
        inputs += [MASK, POS_COS, POS_SIN] if self.layers else []
        outputs = [self.output_boundary] if self.output_boundary else []
        outputs += [LOGITS] if self.head else []
        for layer in self.layers:
            inputs += [kv_name("key", layer, "in"), kv_name("value", layer, "in")]
            outputs += [kv_name("key", layer, "out"), kv_name("value", layer, "out")]
        return inputs, outputs

    def internal_boundaries(self) -> list[str]:
        """The residual-stream tensors inside the graph, which keep the conventions' names."""
        cuts = [EMBEDDING_BOUNDARY] if self.embedding and self.layers else []
        return cuts + [layer_output(layer) for layer in self.layers[:-1]] + (
            [layer_output(self.layers[-1])] if self.head and self.layers else [])


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote, for the log."""

    model_type: str
    shape: ExportShape
    tied_lm_head: bool
    files: tuple[Path, ...]


# --- the model's modules --------------------------------------------------------------------------------------

class _NewEntriesCache:
    """The cache HF's attention layers write to (duck-typed ``Cache.update``): past entries come from the graph
    inputs in Genie's layout, keyed by layer index, and the new ones are kept for the graph outputs."""

    def __init__(self, past: Sequence[torch.Tensor], layers: Sequence[int]) -> None:
        self.past_keys = dict(zip(layers, past[0::2]))     # [1, kv, D, past]
        self.past_values = dict(zip(layers, past[1::2]))   # [1, kv, past, D]
        self.new_keys: dict[int, torch.Tensor] = {}
        self.new_values: dict[int, torch.Tensor] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        new_keys = key_states.transpose(2, 3)
        self.new_keys[layer_idx], self.new_values[layer_idx] = new_keys, value_states
        keys = torch.cat([self.past_keys[layer_idx], new_keys], dim=3).transpose(2, 3)
        return keys, torch.cat([self.past_values[layer_idx], value_states], dim=2)

    def outputs(self) -> list[torch.Tensor]:
        return [tensor for layer in sorted(self.new_keys) for tensor in (self.new_keys[layer], self.new_values[layer])]


class GenieIO(torch.nn.Module):
    """Pieces of a causal LM with Genie's graph IO (:meth:`GraphSpan.io_names`). The attributes mirror the HF
    model's (``model.embed_tokens``, ``model.layers.{i}``, ``model.norm``, ``lm_head``), so the exported
    initializers and the name scopes keep HF's names."""

    def __init__(self, span: GraphSpan, embed_tokens: torch.nn.Module | None,
                 layers: Mapping[int, torch.nn.Module], norm: torch.nn.Module | None,
                 lm_head: torch.nn.Module | None) -> None:
        super().__init__()
        self.span = span
        self.model = torch.nn.Module()
        if embed_tokens is not None:
            self.model.embed_tokens = embed_tokens
        self.model.layers = torch.nn.ModuleDict({str(index): layers[index] for index in span.layers})
        if norm is not None:
            self.model.norm = norm
        if lm_head is not None:
            self.lm_head = lm_head

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden, rest = inputs[0], inputs[1:]
        cache = _NewEntriesCache(rest[3:], self.span.layers)
        if self.span.layers:
            attention_mask, position_ids_cos, position_ids_sin = rest[:3]
            mask = attention_mask.unsqueeze(1)  # [1, 1, AR, CL], broadcast over heads
            # HF's rotary embedding gives [1, AR, D] with each half repeated; apply_rotary_pos_emb adds the head axis
            cos = torch.cat([position_ids_cos, position_ids_cos], dim=-1).squeeze(1)
            sin = torch.cat([position_ids_sin, position_ids_sin], dim=-1).squeeze(1)
        if self.span.embedding:
            hidden = self.model.embed_tokens(hidden)
        for index in self.span.layers:
            hidden = self.model.layers[str(index)](hidden, attention_mask=mask, position_embeddings=(cos, sin),
                                                   cache=cache)
        if self.span.head:
            hidden = self.lm_head(self.model.norm(hidden))
        return (hidden, *cache.outputs())


def _example_args(shape: ExportShape, kind: str, span: GraphSpan) -> tuple[torch.Tensor, ...]:
    """Zero inputs of a graph's shapes and dtypes (docs/conventions.md): the export traces with these."""
    ar, past, d, kv = graph_ar(kind, shape.ar), shape.past(kind), shape.head_dim, shape.kv_heads
    first = (torch.zeros((1, ar), dtype=torch.int32) if span.embedding
             else torch.zeros((1, ar, shape.hidden)))
    feeds = ((torch.zeros((1, ar, shape.context)), torch.zeros((1, 1, ar, d // 2)), torch.zeros((1, 1, ar, d // 2)))
             if span.layers else ())
    cache = [torch.zeros(dims) for _ in span.layers for dims in ((1, kv, d, past), (1, kv, past, d))]
    return (first, *feeds, *cache)


def _load_model(checkpoint: Checkpoint) -> tuple[torch.nn.Module, bool]:
    """The checkpoint as its transformers class (``from_pretrained``), float32, eager attention, in eval mode, with
    a tied LM head untied. Returns ``(model, whether the head was tied)``.

    Raises:
        GenieBuildError: transformers cannot load it (the message's first line, naming the directory).
    """
    import transformers
    from safetensors import SafetensorError

    model_class = getattr(transformers, checkpoint.family.architecture)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = model_class.from_pretrained(checkpoint.directory, dtype=torch.float32,
                                                attn_implementation="eager")
    except (*_READ_ERRORS, RuntimeError, SafetensorError) as exc:
        raise GenieBuildError(checkpoint.directory, f"transformers cannot load the checkpoint: {_first_line(exc)}"
                              ) from None
    model.eval().requires_grad_(False)
    table = model.get_input_embeddings().weight
    tied = model.lm_head.weight is table
    if tied:
        model.lm_head.weight = torch.nn.Parameter(table.detach().clone(), requires_grad=False)
    return model, tied


def part_modules(checkpoint: Checkpoint, span: GraphSpan) -> GenieIO:
    """The part's modules built from the model family's own classes on the meta device, then given the part's
    tensors from the checkpoint (float32), and nothing else.

    Raises:
        GenieBuildError: transformers cannot build the family's modules, or the checkpoint lacks a tensor or has
            one of another shape (named).
    """
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(checkpoint.directory, attn_implementation="eager")
    except _READ_ERRORS as exc:
        raise GenieBuildError(checkpoint.directory / CONFIG_NAME, f"transformers cannot read it: {_first_line(exc)}"
                              ) from None
    family = checkpoint.family
    modeling = importlib.import_module(family.modeling_module)
    layer_class = getattr(modeling, f"{family.class_prefix}DecoderLayer")
    norm_class = getattr(modeling, f"{family.class_prefix}RMSNorm")
    with torch.device("meta"):
        module = GenieIO(
            span, torch.nn.Embedding(config.vocab_size, config.hidden_size) if span.embedding else None,
            {index: layer_class(config, index) for index in span.layers},
            norm_class(config.hidden_size, eps=config.rms_norm_eps) if span.head else None,
            torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False) if span.head else None)
    state = dict(_read_tensors(checkpoint, list(module.state_dict())))
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise GenieBuildError(checkpoint.directory, f"the checkpoint's tensors do not fit the model: "
                                                    f"{_first_line(exc)}") from None
    return module.eval().requires_grad_(False)


def piece_outputs(checkpoint: Checkpoint, span: GraphSpan, feeds: Sequence[Mapping[str, np.ndarray]]
                  ) -> list[dict[str, np.ndarray]]:
    """What transformers' modules compute for a part's outputs (by Genie name) from each of ``feeds`` (its inputs by
    Genie name, one per graph checked): the part's pieces (the embedding, each decoder layer, the head) built,
    loaded and run one at a time on every feed, the residual stream passed on from one to the next, so each of
    the checkpoint's tensors is read once whatever the number of feeds."""
    steps = ([GraphSpan(True, (), False)] if span.embedding else []) + [
        GraphSpan(False, (layer,), False) for layer in span.layers] + ([GraphSpan(False, (), True)]
                                                                          if span.head else [])
    hidden = [torch.from_numpy(np.asarray(inputs[span.input_boundary or INPUT_IDS])) for inputs in feeds]
    outputs: list[dict[str, np.ndarray]] = [{} for _ in feeds]
    for step in steps:
        module = part_modules(checkpoint, step)
        names = [MASK, POS_COS, POS_SIN, *(kv_name(kind, layer, "in") for layer in step.layers
                                           for kind in ("key", "value"))] if step.layers else []
        for index, inputs in enumerate(feeds):
            with torch.no_grad():
                hidden[index], *entries = module(hidden[index], *(torch.from_numpy(np.asarray(inputs[name]))
                                                                  for name in names))
            for layer in step.layers:
                outputs[index][kv_name("key", layer, "out")], outputs[index][kv_name("value", layer, "out")] = (
                    entry.numpy() for entry in entries)
        del module
    for index, result in enumerate(outputs):
        result[span.output_boundary or LOGITS] = hidden[index].numpy()
    return outputs


def _read_tensors(checkpoint: Checkpoint, names: Sequence[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """Each named tensor as float32, read from the file holding it and required finite (one tensor at a time, so
    a NaN or an infinity is refused before any calibration, naming the shard and the tensor); ``lm_head.weight``
    of a tied checkpoint as transformers 5 reads it (:func:`genie_build.hf_checkpoint.stored_name`); an FP8
    weight multiplied by its block scales (:func:`dequantize_fp8`)."""
    from safetensors import SafetensorError, safe_open

    holders = tensor_files(checkpoint.directory)
    tied = read_model_shape(checkpoint.config, checkpoint.directory / CONFIG_NAME).tied
    stored = {name: stored_name(name, tied, holders) for name in names}
    missing = sorted(name for name in set(stored.values()) if name not in holders)
    if missing:
        raise GenieBuildError(checkpoint.directory, f"the checkpoint has no tensor(s) {missing[:3]} "
                                                    f"({len(missing)} in all)")
    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(holders[stored[name]], []).append(name)
    for path, wanted in sorted(by_file.items()):
        try:
            with safe_open(path, framework="pt") as handle:
                for name in wanted:
                    tensor = _float_tensor(handle, stored[name], holders, path)
                    require_finite(tensor.numpy(), f"tensor {stored[name]!r}", path)
                    yield name, tensor
        except (OSError, SafetensorError, RuntimeError) as exc:
            raise GenieBuildError(path, f"cannot read tensor(s) of the checkpoint: {_first_line(exc)}") from None
        log.info("read %d tensor(s) from %s", len(wanted), path.name)


def _float_tensor(handle: Any, name: str, holders: Mapping[str, Path], path: Path) -> torch.Tensor:
    """A stored tensor as float32; an FP8 one (whose scales the checkpoint checks found beside it) dequantized."""
    tensor = handle.get_tensor(name)
    if tensor.dtype != torch.float8_e4m3fn:
        return tensor.to(torch.float32)
    from safetensors import safe_open

    scale_name = name + FP8_SCALE_SUFFIX
    if holders.get(scale_name) == path:
        return dequantize_fp8(tensor, handle.get_tensor(scale_name))
    with safe_open(holders[scale_name], framework="pt") as other:
        return dequantize_fp8(tensor, other.get_tensor(scale_name))


def dequantize_fp8(weight: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """An FP8 weight ``[rows, cols]`` times its block scales ``[rows / bm, cols / bn]``, in float32: what
    transformers' ``Fp8Dequantize`` computes when it loads the checkpoint (each block's float32 codes times its
    float32 scale; the block is the weight's shape over the scale grid's)."""
    rows, cols = weight.shape
    grid_rows, grid_cols = scale_inv.shape
    blocks = weight.to(torch.float32).reshape(grid_rows, rows // grid_rows, grid_cols, cols // grid_cols)
    return (blocks * scale_inv.to(torch.float32)[:, None, :, None]).reshape(rows, cols)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


# --- exporting ----------------------------------------------------------------------------------------------

def export_part(checkpoint_dir: str | os.PathLike[str], part: PartPlan, out_dir: str | os.PathLike[str], *,
                num_parts: int, ar: int, context: int) -> ExportSummary:
    """Write ``part`` (of a plan of ``num_parts``) to ``out_dir``: ``prompt.onnx`` (AR ``ar``) and ``token.onnx``
    (AR 1), context ``context``, reading one ``weights.onnx.data`` (:func:`part_files`), from the part's tensors
    only.

    Raises:
        GenieBuildError: the checkpoint is not one the export supports or lacks a tensor of the part, the settings
            do not fit the model, or a file cannot be written.
    """
    checkpoint = check_checkpoint(checkpoint_dir, ar=ar, context=context)
    graphs, data = part_files(out_dir)
    return export_part_graphs(checkpoint, part, graphs, data, num_parts=num_parts, ar=ar, context=context)


def export_part_graphs(checkpoint: Checkpoint, part: PartPlan, graphs: Mapping[str, Path], data: Path, *,
                       num_parts: int, ar: int, context: int, base: tuple[Path, Mapping[str, onnx.TensorProto]]
                       | None = None) -> ExportSummary:
    """Export ``part``'s graphs at AR ``ar``, CL ``context`` to ``graphs`` (kind -> path) from the checked
    ``checkpoint``, their weights written to ``data``; with ``base`` (a graph beside them and its initializers),
    referring to that graph's weights in ``data`` instead, which is not written.

    Raises:
        GenieBuildError: as :func:`export_part`; a weight the graphs read that ``base`` lacks or has in another
            dtype or shape (naming its graph).
    """
    shape = export_shape(checkpoint.config, ar, context, checkpoint.directory / CONFIG_NAME)
    span = GraphSpan.of_part(part)
    log.info("part %s: %s (%d layer(s)); reading its tensors", part.label, "+".join(part.pieces), len(span.layers))
    module = part_modules(checkpoint, span)
    log.info("part %s: %s loaded; exporting its graphs at context %d", part.label, _span_text(span), context)
    names = {kind: graph_name(kind, graph_ar(kind, ar), context, part.index, num_parts) for kind in GRAPH_KINDS}
    source, weights = base or (graphs["prompt"], None)
    _export_graphs(module, shape, span, names, graphs, {kind: data for kind in GRAPH_KINDS}, source, weights)
    files = tuple(graphs.values()) if base else (data, *graphs.values())
    return ExportSummary(checkpoint.model_type, shape, bool(checkpoint.config.get("tie_word_embeddings")), files)


def _span_text(span: GraphSpan) -> str:
    layers = (f"layers {span.layers[0]}-{span.layers[-1]} ({len(span.layers)})" if len(span.layers) > 1
              else f"layer {span.layers[0]}" if span.layers else "")
    return ", ".join(text for text in ("the embedding" if span.embedding else "", layers,
                                       "the head" if span.head else "") if text)


def part_files(out_dir: str | os.PathLike[str]) -> tuple[dict[str, Path], Path]:
    """An exported part's files: each graph's ``.onnx`` and the one data file both read
    (:data:`genie_build.conventions.PART_WEIGHTS_NAME`, as a split part's)."""
    out = Path(out_dir)
    return {kind: out / f"{kind}.onnx" for kind in GRAPH_KINDS}, out / PART_WEIGHTS_NAME


def export_checkpoint(directory: str | os.PathLike[str], out_dir: str | os.PathLike[str], *, ar: int,
                      context: int) -> ExportSummary:
    """Write the whole model as ``prompt.onnx`` (AR = ``ar``) and ``token.onnx`` (AR 1), each with its own
    ``.onnx.data``, to ``out_dir``: the model loaded by transformers' ``from_pretrained``, the reference the
    per-part export is compared with (split, it gives the same parts).

    All four files are written in a staging folder inside ``out_dir`` and moved into place only when both graphs
    are complete, so a failure leaves none of them.

    Raises:
        GenieBuildError: the checkpoint is not one the export supports or cannot be loaded; a file cannot be
            written.
    """
    checkpoint = check_checkpoint(directory, ar=ar, context=context)
    shape = export_shape(checkpoint.config, ar, context, checkpoint.directory / CONFIG_NAME)
    model, tied = _load_model(checkpoint)
    span = GraphSpan.whole(shape.layers)
    wrapper = GenieIO(span, model.model.embed_tokens, dict(enumerate(model.model.layers)), model.model.norm,
                      model.lm_head).eval()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = {kind: unsplit_graph_name(kind, graph_ar(kind, ar), context) for kind in GRAPH_KINDS}
    with _staging(out) as staging:
        graphs = {kind: staging / f"{kind}.onnx" for kind in GRAPH_KINDS}
        _export_graphs(wrapper, shape, span, names, graphs, {kind: _data_path(graphs[kind]) for kind in GRAPH_KINDS},
                       graphs["prompt"])
        del wrapper, model
        check_shared_initializers(graphs["prompt"], graphs["token"])
        files = tuple(name for kind in GRAPH_KINDS for name in (f"{kind}.onnx.data", f"{kind}.onnx"))
        for name in files:  # data before graphs: a graph in place always finds its data
            os.replace(staging / name, out / name)
    return ExportSummary(checkpoint.model_type, shape, tied, tuple(out / name for name in files))


def _export_graphs(module: GenieIO, shape: ExportShape, span: GraphSpan, names: Mapping[str, str],
                   graphs: Mapping[str, Path], data: Mapping[str, Path], source: Path,
                   weights: Mapping[str, onnx.TensorProto] | None = None) -> None:
    """Export the prompt and token graphs of ``module`` to ``graphs``, the prompt graph's weights written to
    ``data["prompt"]`` and the token graph reading the same file, or a copy of it at ``data["token"]``; or, given
    ``weights`` (those of the graph ``source``, stored in ``data["prompt"]``), both graphs referring to them."""
    models = {}
    for kind in GRAPH_KINDS:
        model, program = _exported_graph(module, shape, kind, span, names[kind])
        if weights is None:
            weights = _write_weights(program, data[kind])
        elif data[kind] != data["prompt"]:
            _copy_file(data["prompt"], data[kind])
        _add_weights(model, weights, _initializer_types(program), data[kind].name, graphs[kind], source)
        models[kind] = model
        del program
    for kind, model in models.items():  # once both have their weights: a refused graph leaves neither written
        write_bytes(graphs[kind], model.SerializeToString(deterministic=True))
        check_part(graphs[kind])
        log.info("exported %s (%s): %d nodes, %d weights", graphs[kind], names[kind], len(model.graph.node),
                 len(model.graph.initializer))


def _exported_graph(module: GenieIO, shape: ExportShape, kind: str, span: GraphSpan, name: str
                    ) -> tuple[onnx.ModelProto, Any]:
    """One graph of ``module`` without its weights, named and canonicalized, and the exporter's program (which
    holds the weights)."""
    input_names, output_names = span.io_names()
    # The exporter prints progress and warns about its own internals; the log keeps what we say instead.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            tempfile.TemporaryDirectory(prefix="genie-build-export-") as scratch:
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, _example_args(shape, kind, span), dynamo=True, optimize=False,
                                    input_names=input_names, output_names=output_names)
        program.save(os.path.join(scratch, "graph.onnx"), include_initializers=False)
        model = onnx.load(os.path.join(scratch, "graph.onnx"))
    for node in model.graph.node:  # the exporting box's source paths; the name scopes (kept) say where a node is
        kept = [prop for prop in node.metadata_props if prop.key != STACK_TRACE_KEY]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    split_without_sequences(model.graph)
    canonicalize(model.graph)
    _check_boundaries(model, span, name)
    model.graph.name = name
    model.producer_name, model.producer_version = "genie-build", __version__
    return model, program


def _check_boundaries(model: onnx.ModelProto, span: GraphSpan, name: str) -> None:
    """The residual stream inside the graph has the conventions' names (what the canonical names give a decoder
    whose layers add their attention and MLP outputs to the stream, in that order)."""
    produced = {output for node in model.graph.node for output in node.output}
    missing = [boundary for boundary in span.internal_boundaries() if boundary not in produced]
    if missing:
        raise GenieBuildError(name, f"the exported graph has no residual-stream tensor(s) {missing[:3]}: the "
                                    "decoder layers of this model are not built as the export expects")


def _write_weights(program: Any, data_path: Path) -> dict[str, onnx.TensorProto]:
    """Write every initializer of ``program`` to ``data_path`` (4 KiB aligned, one tensor at a time) and return
    their TensorProtos referring to it (with the file's SHA-1 as ``checksum``)."""
    protos = {}
    with atomic_open(data_path) as handle:
        writer = HashingWriter(hashlib.sha1(), handle)
        for name, value in program.model.graph.initializers.items():
            array = np.ascontiguousarray(value.const_value.numpy())
            writer.write(b"\0" * (-writer.tell() % DATA_ALIGNMENT))
            offset = writer.tell()
            writer.write(memoryview(array).cast("B"))
            protos[name] = _external_tensor(name, array, data_path.name, offset)
    checksum = writer.digest.hexdigest()
    for proto in protos.values():
        proto.external_data.add(key=CHECKSUM_KEY, value=checksum)
    log.info("wrote %d weights, %.1f MB, to %s", len(protos), data_path.stat().st_size / 1e6, data_path.name)
    return protos


def _external_tensor(name: str, array: np.ndarray, location: str, offset: int) -> onnx.TensorProto:
    tensor = onnx.TensorProto(name=name, dims=array.shape, data_type=onnx.helper.np_dtype_to_tensor_dtype(array.dtype),
                              data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(array.nbytes))):
        tensor.external_data.add(key=key, value=value)
    return tensor


def _initializer_types(program: Any) -> dict[str, _DtypeShape]:
    return {name: (int(value.dtype), tuple(value.shape)) for name, value in program.model.graph.initializers.items()}


def _add_weights(model: onnx.ModelProto, weights: Mapping[str, onnx.TensorProto], types: Mapping[str, _DtypeShape],
                 location: str, path: Path, source: Path) -> None:
    """Give the graph the weights it reads (of the dtypes and shapes ``types`` says), as the data file ``location``
    beside it stores them; ``weights`` are those of the graph ``source``."""
    read = {name for node in model.graph.node for name in node.input}
    produced = {name for node in model.graph.node for name in node.output} | {v.name for v in model.graph.input}
    needed = sorted(read - produced - {""})
    missing = [name for name in needed if name not in weights]
    if missing:
        raise GenieBuildError(source, f"has no weight(s) {missing[:3]} ({len(missing)} in all) that {path.name} reads")
    for name in needed:
        stored = (weights[name].data_type, tuple(weights[name].dims))
        if stored != types[name]:
            raise GenieBuildError(source, f"weight {name!r} is {_type_text(stored)}, {path.name} reads it as "
                                          f"{_type_text(types[name])}")
    for name in weights:
        if name in read:
            tensor = model.graph.initializer.add()
            tensor.CopyFrom(weights[name])
            tensor.external_data[0].value = location


def _type_text(dtype_shape: _DtypeShape) -> str:
    return f"{onnx.TensorProto.DataType.Name(dtype_shape[0]).lower()} {list(dtype_shape[1])}"


def _copy_file(source: Path, target: Path) -> None:
    with open(source, "rb") as src, atomic_open(target) as dst:
        shutil.copyfileobj(src, dst, COPY_CHUNK_BYTES)


def _data_path(onnx_path: Path) -> Path:
    return onnx_path.with_name(onnx_path.name + ".data")


@contextlib.contextmanager
def _staging(out: Path):
    """A temporary folder in ``out`` (same file system, so moving out of it is a rename), removed afterwards."""
    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)
