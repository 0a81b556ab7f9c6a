"""Export a Hugging Face checkpoint to Genie's prompt (AR-N) and token (AR-1) graphs.

The graphs are transformers' own model (its embedding, decoder layers with their attention, MLP and norms, the
final norm and the LM head, with the checkpoint's weights), exported by ``torch.onnx.export(dynamo=True,
optimize=False)`` through a thin wrapper whose inputs and outputs are Genie's IO contract
(docs/conventions.md), so nothing of the model is written again by hand:

- ``attention_mask [1, AR, CL]`` (additive) goes to every layer's attention as HF's 4-D additive mask;
- ``position_ids_cos/_sin [1, 1, AR, D/2]`` become HF's ``position_embeddings`` (each half repeated, as HF's
  rotary embedding concatenates ``freqs`` twice), so the scaled RoPE of Llama 3 is only in the tables Genie feeds;
- the KV cache is a cache object the attention's ``cache.update`` writes to: it concatenates the transposed past
  keys ``[1, n_kv, D, past]`` and past values with the new entries, and the graph outputs only the new ones
  (keys transposed).

After the export, the residual-stream tensors get the names of the conventions (``/model/embed_tokens/
Gather_output_0``, ``/model/layers.{i}/Add_1_output_0``) and the graph is named ``prompt_ar{AR}_cl{CL}``; weights
keep their HF names, the Linear weights stored ``[out, in]`` behind a Transpose as torch writes them. A tied LM
head is untied into its own ``lm_head.weight`` (a copy of the embedding table): Genie bundles quantize the table
and the head differently, and each graph part holds its own weights anyway.

Memory: the model is loaded once in float32 (``from_pretrained`` reads the safetensors memory-mapped), each
graph's exporter program is freed before the next, and the external data is written tensor by tensor.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import torch

from genie_build.boundaries import discover_boundaries
from genie_build.conventions import (EMBEDDING_BOUNDARY, GRAPH_KINDS, INPUT_IDS, LOGITS, MASK, POS_COS, POS_SIN,
                                     graph_ar, kv_name, layer_output, unsplit_graph_name)
from genie_build.errors import GenieBuildError
from genie_build.fileio import write_bytes
from genie_build.genie_config import head_dim
from genie_build.hf_checkpoint import CONFIG_NAME, SUPPORTED_ARCHITECTURES, Checkpoint, read_checkpoint
from genie_build.onnx_graph import check_shared_initializers

log = logging.getLogger(__name__)
STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"


@dataclass(frozen=True)
class ExportShape:
    """What the graphs' IO depends on: AR of the prompt graph, CL, and the cache's dims."""

    ar: int
    context: int
    layers: int
    kv_heads: int
    head_dim: int

    def past(self, kind: str) -> int:
        return self.context - graph_ar(kind, self.ar)


def export_shape(config: dict[str, Any], ar: int, context: int, where: str | os.PathLike[str]) -> ExportShape:
    """The graphs' dims from the HF config and the export settings.

    Raises:
        GenieBuildError: AR not below CL, CL beyond the model's max_position_embeddings, or a config without
            the layer / head counts.
    """
    if not 1 <= ar < context:
        raise GenieBuildError("export.ar", f"{ar} must be at least 1 and below export.context = {context}")
    missing = [key for key in ("num_hidden_layers", "num_attention_heads", "hidden_size") if key not in config]
    if missing:
        raise GenieBuildError(where, f"missing keys {missing}")
    limit = config.get("max_position_embeddings")
    if isinstance(limit, int) and context > limit:
        raise GenieBuildError("export.context", f"{context} exceeds the model's max_position_embeddings {limit}")
    return ExportShape(ar=ar, context=context, layers=config["num_hidden_layers"],
                       kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
                       head_dim=head_dim(config, where))


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote, for the log."""

    model_type: str
    shape: ExportShape
    tied_lm_head: bool
    files: tuple[Path, ...]


def export_checkpoint(directory: str | os.PathLike[str], out_dir: str | os.PathLike[str], *, ar: int,
                      context: int) -> ExportSummary:
    """Write ``prompt.onnx`` (AR = ``ar``) and ``token.onnx`` (AR 1), each with its ``.onnx.data``, to ``out_dir``.

    All four files are written in a staging folder inside ``out_dir`` and moved into place only when both graphs
    are complete, so a failure leaves none of them.

    Raises:
        GenieBuildError: the checkpoint is not one the export supports or cannot be loaded; a file cannot be
            written.
    """
    checkpoint = read_checkpoint(directory)
    shape = export_shape(checkpoint.config, ar, context, checkpoint.directory / CONFIG_NAME)
    model, tied = load_model(checkpoint)
    wrapper = GenieIO(model).eval()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _staging(out) as staging:
        for kind in GRAPH_KINDS:
            _export_graph(wrapper, shape, kind, staging / f"{kind}.onnx")
        del wrapper, model
        check_shared_initializers(staging / "prompt.onnx", staging / "token.onnx")
        files = tuple(name for kind in GRAPH_KINDS for name in (f"{kind}.onnx.data", f"{kind}.onnx"))
        for name in files:  # data before graphs: a graph in place always finds its data
            os.replace(staging / name, out / name)
    return ExportSummary(checkpoint.model_type, shape, tied, tuple(out / name for name in files))


def load_model(checkpoint: Checkpoint) -> tuple[torch.nn.Module, bool]:
    """The checkpoint as its transformers class, float32, eager attention (plain MatMul/Softmax), in eval mode;
    with a tied LM head untied. Returns ``(model, whether the head was tied)``.

    Raises:
        GenieBuildError: transformers cannot load it (the message's first line, naming the directory).
    """
    import transformers
    from safetensors import SafetensorError

    model_class = getattr(transformers, SUPPORTED_ARCHITECTURES[checkpoint.model_type])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = model_class.from_pretrained(checkpoint.directory, dtype=torch.float32,
                                                attn_implementation="eager")
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise GenieBuildError(checkpoint.directory, f"transformers cannot load the checkpoint: {first_line}") from None
    model.eval().requires_grad_(False)
    table = model.get_input_embeddings().weight
    tied = model.lm_head.weight is table
    if tied:
        model.lm_head.weight = torch.nn.Parameter(table.detach().clone(), requires_grad=False)
    return model, tied


class NewEntriesCache:
    """The cache HF's attention layers write to (duck-typed ``Cache.update``): past entries come from the graph
    inputs in Genie's layout, the new ones are kept for the graph outputs."""

    def __init__(self, past: Sequence[torch.Tensor]) -> None:
        self.past_keys, self.past_values = past[0::2], past[1::2]  # keys [1, kv, D, past], values [1, kv, past, D]
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
    """A causal LM with Genie's graph IO. The attributes ``model`` and ``lm_head`` are the HF model's own, so the
    exported initializers keep HF's weight names."""

    def __init__(self, causal_lm: torch.nn.Module) -> None:
        super().__init__()
        self.model = causal_lm.model
        self.lm_head = causal_lm.lm_head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids_cos: torch.Tensor,
                position_ids_sin: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cache = NewEntriesCache(past)
        mask = attention_mask.unsqueeze(1)  # [1, 1, AR, CL], broadcast over heads
        # HF's rotary embedding gives [1, AR, D] with each half repeated; apply_rotary_pos_emb adds the head axis
        cos = torch.cat([position_ids_cos, position_ids_cos], dim=-1).squeeze(1)
        sin = torch.cat([position_ids_sin, position_ids_sin], dim=-1).squeeze(1)
        hidden = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=(cos, sin), cache=cache)
        return (self.lm_head(self.model.norm(hidden)), *cache.outputs())


def example_args(shape: ExportShape, kind: str) -> tuple[torch.Tensor, ...]:
    """Zero inputs of a graph's shapes and dtypes (docs/conventions.md): the export traces with these."""
    ar, past, d, kv = graph_ar(kind, shape.ar), shape.past(kind), shape.head_dim, shape.kv_heads
    cache = [torch.zeros(dims) for _ in range(shape.layers) for dims in ((1, kv, d, past), (1, kv, past, d))]
    return (torch.zeros((1, ar), dtype=torch.int32), torch.zeros((1, ar, shape.context)),
            torch.zeros((1, 1, ar, d // 2)), torch.zeros((1, 1, ar, d // 2)), *cache)


def io_names(layers: int) -> tuple[list[str], list[str]]:
    """Genie's input and output names, in graph order."""
    cache = [(kv_name("key", i, side), kv_name("value", i, side)) for i in range(layers) for side in ("in", "out")]
    inputs = [INPUT_IDS, MASK, POS_COS, POS_SIN, *(name for pair in cache[0::2] for name in pair)]
    return inputs, [LOGITS, *(name for pair in cache[1::2] for name in pair)]


def _export_graph(wrapper: GenieIO, shape: ExportShape, kind: str, path: Path) -> None:
    """One graph to ``path`` (+ ``path.data``), then renamed to the conventions' tensor and graph names."""
    input_names, output_names = io_names(shape.layers)
    # The exporter prints progress and warns about its own internals; the log keeps what we say instead.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(wrapper, example_args(shape, kind), dynamo=True, optimize=False,
                                    input_names=input_names, output_names=output_names)
        program.save(str(path), external_data=True)
    del program
    model = onnx.load(str(path), load_external_data=False)
    model.graph.name = unsplit_graph_name(kind, graph_ar(kind, shape.ar), shape.context)
    for node in model.graph.node:  # the exporting box's source paths; the name scopes (kept) say where a node is
        kept = [prop for prop in node.metadata_props if prop.key != STACK_TRACE_KEY]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    _rename_values(model.graph, _boundary_names(model, path))
    write_bytes(path, model.SerializeToString())
    log.info("exported %s: %d nodes, %d initializers", path.name, len(model.graph.node),
             len(model.graph.initializer))


def _boundary_names(model: onnx.ModelProto, path: Path) -> dict[str, str]:
    """Exporter name -> conventions name of the residual stream after the embedding and after each layer."""
    found = discover_boundaries(model, path)
    wanted = (EMBEDDING_BOUNDARY, *(layer_output(i) for i in range(len(found) - 1)))
    return dict(zip(found, wanted))


def _rename_values(graph: onnx.GraphProto, names: dict[str, str]) -> None:
    for node in graph.node:
        node.input[:] = [names.get(name, name) for name in node.input]
        node.output[:] = [names.get(name, name) for name in node.output]
    for value in graph.value_info:
        value.name = names.get(value.name, value.name)


@contextlib.contextmanager
def _staging(out: Path):
    """A temporary folder in ``out`` (same file system, so moving out of it is a rename), removed afterwards."""
    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)

