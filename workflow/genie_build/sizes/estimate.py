"""The size model: plan and estimate context binary sizes from shapes alone (no weights, no encodings, no
compile).

The input is a model's weight inventory (:mod:`genie_build.plan.weight_inventory`: from an HF ``config.json`` or an
ONNX graph loaded without its external data) and a precision (:mod:`genie_build.plan.precision`). The output
is the plan the workflow would make (``plan.json``), and per part and predicted variant the size of the
reference toolchain's context binary (``docs/reference-container.md``):

- **weight bytes**, exact up to alignment padding: every weight as convert stores it (quantized values one
  per byte, or two per byte when packed and at most 4 bits; a float32 scale and a zero point per channel or
  block; float weights as float16 or float32) plus the conventions' graph constants, once per part with
  weight sharing, once per graph without;
- **file bytes** = weight bytes + an overhead model: the header JSON and the graph structures of a part grow
  with its graphs, decoder layers and weight-table entries. Their per-unit costs below were fitted to demo
  parts compiled by the reference toolchain (``docs/field-report-comparison.md``, "How the estimate is
  computed").

The variants are a fixed predicted set, :data:`PREDICTED_VARIANTS` (packing x sharing), not the config's
``variants``: the model predicts the reference container alone, and it judges each option against a baseline
with neither, which the config's variants need not have (the default config's both share weights).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from genie_build import __version__
from genie_build.bundle.embedding_table import table_bytes
from genie_build.bundle_layout import BundleLayout
from genie_build.chipsets import HTP_LOAD, LoadParams
from genie_build.conventions import GRAPH_KINDS
from genie_build.encodings import TensorEncoding
from genie_build.errors import GenieBuildError
from genie_build.fileio import write_json
from genie_build.hf_checkpoint import check_settings
from genie_build.hf_config import load_hf_config
from genie_build.job_memory import RunMemory
from genie_build.onnx_graph import InitializerSpec, load_graph
from genie_build.plan.auto_split import (JobMemory, auto_plan, binary_compile, io_dims_from_graph,
                                         io_dims_from_hf_config, part_jobs, plan_request)
from genie_build.plan.boundaries import find_boundaries
from genie_build.plan.load_model import IoDims, estimated_contexts, place_contexts
from genie_build.plan.plan import by_precision, weighed_pieces
from genie_build.plan.plan_file import Piece, Plan, write_plan
from genie_build.plan.precision import Precision
from genie_build.plan.weight_inventory import ModelWeights, weights_from_graph, weights_from_hf_config
from genie_build.sizes.memory_plan import MemoryLimits, PartSize, plan_memory, write_memory_plan
from genie_build.sizes.sizes import AccountRecord, build_size_table, write_size_table
from genie_build.split_request import SplitRequest
from genie_build.toolchains.base import AppliedOptions
from genie_build.toolchains.reference.container import stored_nbytes
from genie_build.toolchains.reference.quantize import stored_bitwidth, unsigned_dtype
from genie_build.units import MIB

__all__ = ["Estimate", "LAYER_CONSTANT_BYTES", "MEMORY_VARIANT", "PREDICTED_VARIANTS", "PartEstimate", "StoredSize",
           "TABLE_ENTRY_BYTES", "Variant", "container_overhead", "estimate", "estimate_to_dir", "graphs_per_part",
           "stored_size"]

log = logging.getLogger(__name__)

GRAPHS_PER_PART = len(GRAPH_KINDS)      # a part links its prompt and token graphs
TOOLCHAIN_LABEL = "reference (predicted)"

# Overhead of the reference container beyond its weight section, per graph unless said otherwise. Fitted by
# least squares to 96 compiled demo parts (7 shapes x 4 variants: hidden 64..512, 2..12 layers, AR 4..128,
# CL 32..4096, embedding alone or with layer 0); every file came out within 0.42% (the worst: hidden 64,
# where the overhead is half the file; 0.25% at hidden >= 128).
GRAPH_BYTES = 677               # preamble, fixed header keys, alignment, the graph's proto skeleton and record
LAYER_PART_GRAPH_BYTES = 709    # a part with layers also takes attention_mask, position_ids_cos/sin
EMBEDDING_GRAPH_BYTES = 912     # the Gather and its IO
LAYER_GRAPH_BYTES = 24_910      # a decoder layer: nodes, value_info, KV IO, constants, convert's metadata
HEAD_GRAPH_BYTES = 2_237        # final norm, LM head, logits
TABLE_ENTRY_BYTES = 260         # one stored tensor's entry in the header's weight table
# Graph constants of a decoder layer stored with its weights (eps and attention scale as float16, Reshape
# shapes as int64, alignment), per copy; the conventions fix them, a config does not name them.
LAYER_CONSTANT_BYTES = 204


@dataclass(frozen=True)
class Variant:
    """A predicted variant: the two options that change a reference container's size."""

    name: str
    weights_packing: bool
    weight_sharing_enabled: bool


# Packing x sharing. The first, with neither, is the size table's baseline: the table judges an option by
# the size against the baseline, so the baseline must differ from each variant only in what it enables.
# "unpacked" and "packed" are the default config's variants.
PREDICTED_VARIANTS = (Variant("unpacked_unshared", False, False), Variant("unpacked", False, True),
                      Variant("packed_unshared", True, False), Variant("packed", True, True))
VARIANT_SET = "predicted: weights_packing x weight_sharing_enabled of the reference container, not config variants"
MEMORY_VARIANT = "packed"           # what the bundle ships


@dataclass(frozen=True)
class StoredSize:
    """What one weight becomes in the container: bytes and weight-table entries."""

    bytes: int
    tensors: int


@dataclass(frozen=True)
class PartEstimate:
    part: int
    variant: str
    weight_bytes: int
    file_bytes: int


@dataclass(frozen=True)
class Estimate:
    plan: Plan
    parts: tuple[PartEstimate, ...]   # part by part, each in PREDICTED_VARIANTS order


# ------------------------------------------------------------------------------------------- sizes

def stored_size(spec: InitializerSpec, encoding: TensorEncoding | None, float_bitwidth: int,
                packing: bool) -> StoredSize:
    """What one weight takes in the reference container: the container's :func:`stored_nbytes` of each
    tensor convert makes of it (quantized values, a float32 scale and a zero point per channel or block;
    or the float weight, as float16 at float bitwidth 16).

    LPBQ stores what its encoding gives: the values at the compressed width, a float64 scale and a zero
    point per channel, an integer scale per block (uint8) and the reshape constant of its written-out
    dequantization.

    Not modelled: 8-bit values that happen to fit 4 bits (packed when packing; real weights use their
    range), a per-block weight's reshape constant below opset 21, and alignment padding (at most an
    element per tensor).
    """
    if encoding is not None and encoding.dtype == "int":
        bits = stored_bitwidth(encoding)
        values = unsigned_dtype(bits).name      # convert keeps 32-bit values as int32: the same size
        scales = (len(encoding.scale),)
        scale_dtype = "float64" if encoding.kind == "lpbq" else "float32"
        size = (stored_nbytes(spec.shape, values, packed=packing and bits <= 4)
                + stored_nbytes(scales, scale_dtype) + stored_nbytes(scales, values))
        if encoding.kind != "lpbq":
            return StoredSize(size, 3)
        int_scale_dtype = unsigned_dtype(encoding.bitwidth - encoding.compressed_bitwidth).name
        return StoredSize(size + stored_nbytes((len(encoding.per_block_int_scale),), int_scale_dtype)
                          + stored_nbytes((len(spec.shape),), "int64"), 5)
    bitwidth = encoding.bitwidth if encoding is not None else float_bitwidth
    return StoredSize(stored_nbytes(spec.shape, "float16" if spec.dtype == "float32" and bitwidth == 16
                                    else spec.dtype), 1)


def container_overhead(pieces: Sequence[Piece], table_entries: int, graphs: int = GRAPHS_PER_PART) -> int:
    """Bytes of a part's container beyond its weight section: header and the structures of its ``graphs`` (the
    overhead model of the module docstring)."""
    layers = sum(piece.kind == "layer" for piece in pieces)
    per_graph = (GRAPH_BYTES + (LAYER_PART_GRAPH_BYTES if layers else 0) + LAYER_GRAPH_BYTES * layers
                 + EMBEDDING_GRAPH_BYTES * any(piece.kind == "embedding" for piece in pieces)
                 + HEAD_GRAPH_BYTES * any(piece.kind == "head" for piece in pieces))
    return graphs * per_graph + TABLE_ENTRY_BYTES * table_entries


def estimate(model: ModelWeights, precision: Precision, *, num_parts: int | str | None = None,
             max_part_bytes: int | None = None, embedding_alone: bool = True, dims: IoDims | None = None,
             load: LoadParams = HTP_LOAD, embedding: str = "graph", jobs: JobMemory | None = None) -> Estimate:
    """Plan the split and predict every part's container for every variant of :data:`PREDICTED_VARIANTS`.

    One of ``num_parts`` and ``max_part_bytes`` is given, or both with ``num_parts`` "auto" (which needs ``dims``:
    :func:`genie_build.plan.auto_split.plan_request`, in the ``embedding`` layout, its parts' ``jobs`` within what a job
    may take).

    Raises:
        GenieBuildError: the split is infeasible (from the planner) or a precision rule does not fit a weight.
    """
    if num_parts is None and max_part_bytes is None:
        raise ValueError("give num_parts or max_part_bytes")
    graphs = graphs_per_part(dims)
    weighing = by_precision(precision)
    encodings = {weight.spec.name: weighing.encoding_of(weight) for weight in model.weights}
    # Weighed by the planner's own path, so the predicted plan is the one the workflow makes from encodings
    # of this precision.
    pieces = weighed_pieces(model, weighing)
    plan = plan_request(pieces, SplitRequest(num_parts, max_part_bytes, embedding_alone), dims=dims, load=load,
                        embedding=embedding, jobs=jobs)
    index_of = {piece.name: index for index, piece in enumerate(pieces)}
    parts = []
    for part in plan.parts:
        held = {index_of[name] for name in part.pieces}
        held_pieces = [pieces[index] for index in sorted(held)]
        weights = [weight for weight in model.weights if weight.pieces & held]
        constants = LAYER_CONSTANT_BYTES * sum(piece.kind == "layer" for piece in held_pieces)
        for variant in PREDICTED_VARIANTS:
            sizes = [stored_size(weight.spec, encodings[weight.spec.name], precision.float_bitwidth,
                                 variant.weights_packing) for weight in weights]
            copies = 1 if variant.weight_sharing_enabled else graphs
            weight_bytes = copies * (sum(size.bytes for size in sizes) + constants)
            overhead = container_overhead(held_pieces, copies * sum(size.tensors for size in sizes), graphs)
            parts.append(PartEstimate(part.index, variant.name, weight_bytes, weight_bytes + overhead))
    return Estimate(plan, tuple(parts))


def graphs_per_part(dims: IoDims | None) -> int:
    """A part's graphs: its prompt and token graphs at each context length (one length without ``dims``)."""
    return GRAPHS_PER_PART * (len(dims.context_lengths) if dims is not None else 1)


# ------------------------------------------------------------------------------------------- outputs

def _size_records(result: Estimate) -> list[AccountRecord]:
    """The predictions as accounting records, for ``sizes.build_size_table``. ``applied`` is empty: there is
    no binary to read back, so an option is judged by size alone."""
    options = {variant.name: {"weights_packing": variant.weights_packing,
                              "weight_sharing_enabled": variant.weight_sharing_enabled}
               for variant in PREDICTED_VARIANTS}
    return [AccountRecord(part=part.part, variant=part.variant, toolchain=TOOLCHAIN_LABEL, tool_version=__version__,
                          bytes=part.file_bytes, weight_bytes=part.weight_bytes, requested=options[part.variant],
                          applied=AppliedOptions()) for part in result.parts]


def _write_estimate(out_dir: str | os.PathLike[str], result: Estimate, *, source: str, precision: Precision,
                    dims: IoDims, load: LoadParams = HTP_LOAD, memory_variant: str = MEMORY_VARIANT,
                    limits: MemoryLimits = MemoryLimits(), embedding: str = "graph") -> None:
    """Write ``plan.json``, ``estimate.json``, ``size_table.{csv,md,png}`` (baseline: the first variant; the parts
    that will not map flagged) and ``memory_plan.{json,md,png}`` (``memory_variant`` against ``limits`` and the load
    model under ``load``, its IO at ``dims``) into ``out_dir``, each atomically.

    Raises:
        GenieBuildError: ``memory_variant`` is not one of :data:`PREDICTED_VARIANTS`, or a file cannot be
            written.
    """
    out = Path(out_dir)
    records = _size_records(result)
    on_htp = frozenset(part.index for part in BundleLayout(embedding).binaries(result.plan.parts))
    memory_sizes = [PartSize(part.part, part.weight_bytes, part.file_bytes)
                    for part in result.parts if part.variant == memory_variant and part.part in on_htp]
    if not memory_sizes:
        raise GenieBuildError("--memory-variant", f"{memory_variant!r} is not one of "
                                                  f"{[variant.name for variant in PREDICTED_VARIANTS]}")
    write_plan(out / "plan.json", result.plan)
    write_json(out / "estimate.json", {
        "source": source, "precision": dataclasses.asdict(precision), "graphs_per_part": graphs_per_part(dims),
        "context_lengths": list(dims.context_lengths),
        "variant_set": VARIANT_SET, "variants": [dataclasses.asdict(variant) for variant in PREDICTED_VARIANTS],
        "overhead_model": {"graph_bytes": GRAPH_BYTES, "layer_part_graph_bytes": LAYER_PART_GRAPH_BYTES,
                           "embedding_graph_bytes": EMBEDDING_GRAPH_BYTES, "layer_graph_bytes": LAYER_GRAPH_BYTES,
                           "head_graph_bytes": HEAD_GRAPH_BYTES, "table_entry_bytes": TABLE_ENTRY_BYTES,
                           "layer_constant_bytes": LAYER_CONSTANT_BYTES},
        "parts": [dataclasses.asdict(part) for part in result.parts],
        "embedding": {"layout": embedding, "cpu_table_bytes": _cpu_table_bytes(dims, embedding)},
        "totals": {variant.name: {key: sum(getattr(part, key) for part in result.parts if part.variant == variant.name)
                                  for key in ("weight_bytes", "file_bytes")} for variant in PREDICTED_VARIANTS},
    })
    contexts = estimated_contexts([part for part in result.plan.parts if part.index in on_htp],
                                  [size.weight_bytes for size in memory_sizes], dims)
    memory = plan_memory(memory_sizes, memory_variant, limits, basis="predicted", contexts=contexts, load=load,
                         remedies=_part_count_remedy(result.plan, dims, load, embedding),
                         cpu_table_bytes=_cpu_table_bytes(dims, embedding), part_count=result.plan.chosen_by)
    unmapped = {context.part: context.reason for context in memory.load.failing}
    write_size_table(build_size_table(records, PREDICTED_VARIANTS[0].name,
                                      unmapped={memory_variant: unmapped}), out / "size_table.csv",
                     out / "size_table.md", out / "size_table.png")
    write_memory_plan(memory, out / "memory_plan.json", out / "memory_plan.md", out / "memory_plan.png")


def _cpu_table_bytes(dims: IoDims, embedding: str) -> int:
    """The table's bytes when the embedding is one (0 in the graph layout)."""
    return table_bytes(dims.vocab, dims.hidden, 8 * dims.activation_bytes) if BundleLayout(embedding).table else 0


def _part_count_remedy(plan: Plan, dims: IoDims, load: LoadParams, embedding: str) -> tuple[str, ...]:
    """The part count that would map, when ``plan``'s contexts (in the ``embedding`` layout) do not (empty when they
    do)."""
    held = BundleLayout(embedding).binaries(plan.parts)
    contexts = estimated_contexts(held, [part.estimated_bytes for part in held], dims)
    if place_contexts(contexts, load).maps:
        return ()
    try:
        fitting = auto_plan(plan.pieces, plan.embedding_alone, dims, load, embedding=embedding)
    except GenieBuildError as exc:
        return (f"**part count**: none maps ({exc})",)
    return (f"**part count**: {fitting.num_parts} parts map under the same model (`split.num_parts: "
            f"{fitting.num_parts}` or `auto`)",)


def estimate_to_dir(out_dir: str | os.PathLike[str], precision: Precision, split: dict, *,
                    hf_config: str | os.PathLike[str] | None = None, onnx: str | os.PathLike[str] | None = None,
                    ar: int | None = None, context_length: int | Sequence[int] | None = None,
                    load: LoadParams = HTP_LOAD,
                    memory_variant: str = MEMORY_VARIANT, limits: MemoryLimits = MemoryLimits(),
                    embedding: str = "graph", memory: RunMemory | None = None, evaluate: bool = False,
                    toolchains: Sequence[str] = ()) -> Estimate:
    """The ``estimate`` stage: the weights of an HF config or of an ONNX graph (exactly one), the split the
    workflow would make (``split``: ``num_parts`` or ``max_part_mb``, ``embedding_alone``, ``boundaries``; for an
    HF config's ``num_parts`` "auto", its parts' jobs within what a job of a run given ``memory`` may take, the
    evaluation's with ``evaluate``, each binary's compile by ``toolchains``) and every part's predicted sizes,
    written by :func:`_write_estimate` and logged per part.

    Raises:
        GenieBuildError: boundaries given with a config (its boundaries follow the conventions), an unreadable
            source, an AR or context length a build of the config's model refuses
            (:func:`genie_build.hf_checkpoint.check_settings`), an infeasible split, or what :func:`_write_estimate`
            raises.
    """
    if (hf_config is None) == (onnx is None):
        raise ValueError("give exactly one of hf_config and onnx")
    if split["boundaries"] and hf_config is not None:
        raise GenieBuildError("--boundaries", "applies to --onnx only; a config's boundaries follow the conventions")
    if hf_config is not None:
        if ar is None or context_length is None:
            raise ValueError("an HF config's estimate needs the export's ar and context_length")
        settings = load_hf_config(hf_config)
        for length in [context_length] if isinstance(context_length, int) else context_length:
            check_settings(settings, hf_config, ar=ar, context=length)   # what a build of these graphs is held to
        model = weights_from_hf_config(hf_config)
        dims = io_dims_from_hf_config(hf_config, precision.activations, ar, context_length)
    else:
        graph = load_graph(onnx)   # read once, without its weights
        model = weights_from_graph(graph, find_boundaries(graph, onnx, split["boundaries"]))
        dims = io_dims_from_graph(graph, precision.activations, onnx)
    request = SplitRequest.from_section(split)
    jobs = None if memory is None or hf_config is None else part_jobs(
        model.piece_floats(), memory, evaluate, binary_compile(toolchains, dims.context_lengths), embedding)
    result = estimate(model, precision, num_parts=request.num_parts, max_part_bytes=request.max_part_bytes,
                      embedding_alone=request.embedding_alone, dims=dims, load=load, embedding=embedding, jobs=jobs)
    _write_estimate(out_dir, result, source=os.fspath(hf_config if hf_config is not None else onnx),
                    precision=precision, dims=dims, load=load, memory_variant=memory_variant, limits=limits,
                    embedding=embedding)
    for part in result.plan.parts:
        sizes = ", ".join(f"{predicted.variant} {predicted.file_bytes / MIB:,.1f} MiB"
                          for predicted in result.parts if predicted.part == part.index)
        log.info("part %s: %s: %s", part.label, "+".join(part.pieces), sizes)
    return result
