"""Plan and estimate context binary sizes from shapes alone: no weights, no encodings, no compile.

The input is an HF ``config.json`` (Qwen2, Llama or Mistral architecture) or an ONNX graph loaded without its
external data, plus a *precision recipe* (bits per weight role, overridable per tensor-name pattern). The
output is the plan the workflow would make (``plan.json``), and per part and variant the size of the
reference toolchain's context binary (``docs/reference-container.md``):

- **weight bytes**, exact up to alignment padding: every weight as convert stores it (quantized values one
  per byte, or two per byte when packed and at most 4 bits; a float32 scale and a zero point per channel or
  block; float weights as float16 or float32) plus the conventions' graph constants, once per part with
  weight sharing, once per graph without;
- **file bytes** = weight bytes + an overhead model: the header JSON and the graph structures of a part grow
  with its graphs, decoder layers and weight-table entries. Their per-unit costs below were fitted to demo
  parts compiled by the reference toolchain (``docs/field-report-comparison.md``, "How the estimate is
  computed").

Weights follow ``docs/conventions.md``. From an ONNX graph, every float initializer of rank >= 1 is a weight;
scalars and integer tensors (eps, Reshape shapes) are graph constants, counted per layer as the conventions'
graph has them, so that a graph and its config estimate alike.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import jsonschema
import yaml

from genie_build import __version__
from genie_build.boundaries import find_boundaries
from genie_build.config import DEFAULT_SCHEMA
from genie_build.conventions import EMBED_WEIGHT, EMBEDDING_BOUNDARY, FINAL_NORM_WEIGHT, GRAPH_KINDS, LM_HEAD_WEIGHT
from genie_build.demo import shape_from_hf_config
from genie_build.encodings import (SUPPORTED_FLOAT_BITWIDTHS, SUPPORTED_INT_BITWIDTHS, TensorEncoding, WeightLayout,
                                   block_grid, consumer_layouts)
from genie_build.errors import GenieBuildError
from genie_build.fileio import read_json, write_json
from genie_build.memory_plan import MemoryLimits, PartSize, plan_memory, write_memory_plan
from genie_build.onnx_graph import InitializerSpec, initializer_specs, load_graph
from genie_build.plan import (Piece, Plan, initializer_pieces, plan_by_max_part_bytes, plan_by_num_parts,
                              weighed_pieces, write_plan)
from genie_build.sizes import AccountRecord, build_size_table, write_size_table
from genie_build.toolchains.base import AppliedOptions
from genie_build.toolchains.reference.container import stored_nbytes
from genie_build.toolchains.reference.quantize import stored_bitwidth, unsigned_dtype

Role = Literal["embedding", "layers", "lm_head", "float"]
_BLOCKED = ("per_block", "lpbq")
Granularity = Literal["per_tensor", "per_channel", "per_block", "lpbq"]

GRAPHS_PER_PART = len(GRAPH_KINDS)      # a part links its prompt and token graphs
TOOLCHAIN_LABEL = "reference (predicted)"
SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "mistral")

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
class WeightRule:
    """A recipe override: weights whose name matches ``pattern`` (fnmatch) get this encoding."""

    pattern: str
    bitwidth: int
    dtype: Literal["int", "float"] = "int"
    granularity: Granularity = "per_channel"
    block_size: int | None = None


@dataclass(frozen=True)
class Recipe:
    """Bits per weight role; overrides are tried first, in order. ``activations`` is recorded only:
    activation encodings do not change the weight bytes. Float weights without an integer encoding
    (norms, biases) are stored at ``float_bitwidth``. ``lpbq`` (AIMET's LPBQ) stores the role's bits as the
    compressed width, twice that as the decompressed one: values, a float scale per channel and an integer
    scale per block."""

    layers: int = 4
    embedding: int = 8
    lm_head: int = 8
    activations: int = 16
    float_bitwidth: int = 16
    granularity: Granularity = "per_channel"
    block_size: int | None = None
    overrides: tuple[WeightRule, ...] = ()


@dataclass(frozen=True)
class Weight:
    """A weight without values: its declared shape, the role that picks its precision, and the pieces
    that use it (0 = embedding, i + 1 = layer i, L + 1 = head; a tied table is in two)."""

    spec: InitializerSpec
    role: Role
    pieces: frozenset[int]
    layout: WeightLayout | None = None  # its consumer's axes; None: those of the role's default op

    def axes(self) -> WeightLayout:
        """The channel and block axes: the consumer's, else a Gather table's for the embedding and an
        ``[in, out]`` MatMul weight's otherwise."""
        if self.layout is not None:
            return self.layout
        rank = len(self.spec.shape)
        if rank < 2:
            return WeightLayout(0, None)
        return WeightLayout(0, 1) if self.role == "embedding" else WeightLayout(rank - 1, rank - 2)


@dataclass(frozen=True)
class ModelWeights:
    """What the estimate knows about a model: its weights and its L + 1 boundary tensors."""

    weights: tuple[Weight, ...]
    boundaries: tuple[str, ...]

    @property
    def num_layers(self) -> int:
        return len(self.boundaries) - 1


@dataclass(frozen=True)
class Variant:
    name: str
    weights_packing: bool
    weight_sharing_enabled: bool


# Packing x sharing. The first, with neither, is the size table's baseline: the table judges an option by
# the size against the baseline, so the baseline must differ from each variant only in what it enables.
VARIANTS = (Variant("unpacked_unshared", False, False), Variant("unpacked", False, True),
            Variant("packed_unshared", True, False), Variant("packed", True, True))
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
    parts: tuple[PartEstimate, ...]   # part by part, each in VARIANTS order


# ------------------------------------------------------------------------------------------- models

def weights_from_hf_config(path: str | os.PathLike[str]) -> ModelWeights:
    """The weights of a Qwen2/Llama ``config.json``, named and shaped as ``docs/conventions.md`` says.

    Raises:
        GenieBuildError: the file is unreadable, a key is missing or invalid, or the architecture is not
            one the conventions describe (an explicit ``head_dim`` other than hidden / heads included).
    """
    config = read_json(path)
    where = os.fspath(path)
    if not isinstance(config, dict):
        raise GenieBuildError(where, "expected a JSON object (an HF config.json)")
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise GenieBuildError(where, f"model_type {model_type!r} is not supported "
                                     f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    shape = shape_from_hf_config(config, ar=1, where=where)
    if config.get("head_dim", shape.head_dim) != shape.head_dim:
        raise GenieBuildError(where, f"head_dim {config['head_dim']} differs from hidden_size / "
                                     f"num_attention_heads = {shape.head_dim}; not supported")
    qkv_bias = model_type == "qwen2" or bool(config.get("attention_bias", False))
    o_bias = model_type != "qwen2" and bool(config.get("attention_bias", False))
    mlp_bias = bool(config.get("mlp_bias", False))
    hidden, inter, kv_width = shape.hidden, shape.intermediate, shape.kv_heads * shape.head_dim
    head_piece = shape.layers + 1

    def weight(name: str, dims: tuple[int, ...], role: Role, *pieces: int) -> Weight:
        return Weight(InitializerSpec(name, dims, "float32", math.prod(dims) * 4), role, frozenset(pieces))

    tied = bool(config.get("tie_word_embeddings", False))
    weights = [weight(EMBED_WEIGHT, (shape.vocab, hidden), "embedding", 0, *((head_piece,) if tied else ()))]
    for i in range(shape.layers):
        prefix, piece = f"model.layers.{i}", i + 1
        projections = (("self_attn.q_proj", hidden, hidden, qkv_bias), ("self_attn.k_proj", hidden, kv_width, qkv_bias),
                       ("self_attn.v_proj", hidden, kv_width, qkv_bias), ("self_attn.o_proj", hidden, hidden, o_bias),
                       ("mlp.gate_proj", hidden, inter, mlp_bias), ("mlp.up_proj", hidden, inter, mlp_bias),
                       ("mlp.down_proj", inter, hidden, mlp_bias))
        for module, fan_in, fan_out, bias in projections:
            weights.append(weight(f"{prefix}.{module}.weight", (fan_in, fan_out), "layers", piece))
            if bias:
                weights.append(weight(f"{prefix}.{module}.bias", (fan_out,), "float", piece))
        weights += [weight(f"{prefix}.{norm}.weight", (hidden,), "float", piece)
                    for norm in ("input_layernorm", "post_attention_layernorm")]
    weights.append(weight(FINAL_NORM_WEIGHT, (hidden,), "float", head_piece))
    if not tied:
        weights.append(weight(LM_HEAD_WEIGHT, (hidden, shape.vocab), "lm_head", head_piece))
    boundaries = (EMBEDDING_BOUNDARY, *(f"/model/layers.{i}/Add_1_output_0" for i in range(shape.layers)))
    return ModelWeights(tuple(weights), boundaries)


def weights_from_onnx(path: str | os.PathLike[str], boundaries: Sequence[str] | None = None) -> ModelWeights:
    """The weights of an ONNX graph (read without its external data) and the pieces using each.

    A float initializer of rank >= 1 is a weight: a 2-D one is the ``embedding`` when the embedding piece
    uses it, else ``lm_head`` in the head and ``layers`` in a layer; the others are ``float``.

    Raises:
        GenieBuildError: the graph cannot be read or its boundaries not found.
    """
    model = load_graph(path)
    found = find_boundaries(model, path, boundaries)
    owners = initializer_pieces(model, found)
    head_piece = len(found)
    specs = initializer_specs(model)
    layouts = consumer_layouts([model.graph], {name: tuple(spec.shape) for name, spec in specs.items()})
    weights = []
    for name, spec in specs.items():
        if name not in owners or not spec.shape or "float" not in spec.dtype:  # float16, bfloat16, float8...
            continue
        pieces = owners[name]
        role: Role = "float"
        if len(spec.shape) == 2:
            role = "embedding" if 0 in pieces else "lm_head" if pieces == {head_piece} else "layers"
        weights.append(Weight(spec, role, pieces, layouts.get(name)))
    return ModelWeights(tuple(weights), found)


# ------------------------------------------------------------------------------------------- recipe

@cache
def recipe_schema() -> dict:
    """The ``recipe`` section of the workflow's config schema (``genie_build/schema/config.schema.yaml``): recipe
    files and workflow configs are judged by one definition.

    Raises:
        GenieBuildError: the schema file cannot be read.
    """
    try:
        return yaml.safe_load(DEFAULT_SCHEMA.read_text(encoding="utf-8"))["properties"]["recipe"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise GenieBuildError(DEFAULT_SCHEMA, f"cannot read the recipe section of the config schema: {exc}") from None


def read_recipe(path: str | os.PathLike[str]) -> Recipe:
    """The ``recipe`` mapping of a YAML (or JSON) file, e.g. an estimate config (``config/qwen2_5_7b_*.yaml``).

    Raises:
        GenieBuildError: the file is unreadable, has no ``recipe``, or a field is invalid (named).
    """
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise GenieBuildError(path, f"cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise GenieBuildError(path, f"not valid YAML: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("recipe"), dict):
        raise GenieBuildError(path, "expected a top-level 'recipe' mapping")
    return recipe_from_dict(document["recipe"], os.fspath(path))


def recipe_from_dict(data: dict, where: str = "recipe") -> Recipe:
    """A :class:`Recipe` from its mapping (keys as the dataclass fields).

    Raises:
        GenieBuildError: an unknown key, a bad value, a per-block rule without ``block_size``, or a float
            override whose bitwidth is not 16 or 32.
    """
    try:
        jsonschema.validate(data, recipe_schema())
    except jsonschema.ValidationError as exc:
        field = "/".join(str(key) for key in exc.absolute_path) or "top level"
        raise GenieBuildError(where, f"recipe {field}: {exc.message}") from None
    overrides = tuple(WeightRule(**rule) for rule in data.get("overrides", ()))
    recipe = Recipe(**{**data, "overrides": overrides})
    if recipe.granularity in _BLOCKED and recipe.block_size is None:
        raise GenieBuildError(where, f"recipe granularity: {recipe.granularity} needs a block_size")
    for rule in overrides:
        allowed = SUPPORTED_FLOAT_BITWIDTHS if rule.dtype == "float" else SUPPORTED_INT_BITWIDTHS
        if rule.bitwidth not in allowed:
            raise GenieBuildError(where, f"recipe rule {rule.pattern!r}: {rule.dtype} bitwidth {rule.bitwidth} "
                                         f"is not one of {allowed}")
        if rule.dtype == "int" and rule.granularity in _BLOCKED and rule.block_size is None:
            raise GenieBuildError(where, f"recipe rule {rule.pattern!r}: {rule.granularity} needs a block_size")
        if rule.dtype == "int" and rule.granularity == "lpbq" and 2 * rule.bitwidth not in SUPPORTED_INT_BITWIDTHS:
            raise GenieBuildError(where, f"recipe rule {rule.pattern!r}: lpbq needs a bitwidth of 4, 8 or 16")
    return recipe


def weight_encoding(weight: Weight, recipe: Recipe) -> TensorEncoding | None:
    """The shape-only encoding the recipe gives a weight (scales counted, not computed); None: float
    weight stored at ``recipe.float_bitwidth``.

    Per-channel scales run along the weight's channel axis (:meth:`Weight.axes`: its consumer's, AIMET's
    rule), blocks along its block axis.

    Raises:
        GenieBuildError: a per-block rule on a weight that is not a whole number of blocks.
    """
    spec = weight.spec
    rule = next((rule for rule in recipe.overrides if fnmatch.fnmatchcase(spec.name, rule.pattern)), None)
    if rule is None and weight.role == "float":
        return None
    if rule is None:  # the role's bits: recipe.layers, recipe.embedding or recipe.lm_head
        rule = WeightRule("", getattr(recipe, weight.role), granularity=recipe.granularity,
                          block_size=recipe.block_size)
    if rule.dtype == "float":
        return TensorEncoding(spec.name, "float", rule.bitwidth)
    layout = weight.axes()
    if rule.granularity == "per_tensor":
        count = 1
    elif rule.granularity == "per_channel":
        count = spec.shape[layout.channel_axis]
    else:
        blocks, channels = block_grid(spec.name, spec.shape, rule.block_size, layout)
        count = blocks * channels
    if rule.granularity == "lpbq":
        return TensorEncoding(spec.name, "int", 2 * rule.bitwidth, "lpbq", is_symmetric=True,
                              scale=(1.0,) * channels, offset=(-(2 ** (2 * rule.bitwidth - 1)),) * channels,
                              block_size=rule.block_size, compressed_bitwidth=rule.bitwidth,
                              per_block_int_scale=(1,) * count)
    return TensorEncoding(spec.name, "int", rule.bitwidth, rule.granularity, is_symmetric=True,
                          scale=(1.0,) * count, offset=(-(2 ** (rule.bitwidth - 1)),) * count,
                          block_size=rule.block_size)


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


def container_overhead(pieces: Sequence[Piece], table_entries: int) -> int:
    """Bytes of a part's container beyond its weight section: header and graph structures (the overhead
    model of the module docstring)."""
    layers = sum(piece.kind == "layer" for piece in pieces)
    per_graph = (GRAPH_BYTES + (LAYER_PART_GRAPH_BYTES if layers else 0) + LAYER_GRAPH_BYTES * layers
                 + EMBEDDING_GRAPH_BYTES * any(piece.kind == "embedding" for piece in pieces)
                 + HEAD_GRAPH_BYTES * any(piece.kind == "head" for piece in pieces))
    return GRAPHS_PER_PART * per_graph + TABLE_ENTRY_BYTES * table_entries


def estimate(model: ModelWeights, recipe: Recipe, *, num_parts: int | None = None,
             max_part_bytes: int | None = None, embedding_alone: bool = True) -> Estimate:
    """Plan the split and predict every part's container for every variant of :data:`VARIANTS`.

    Exactly one of ``num_parts`` and ``max_part_bytes`` is given.

    Raises:
        GenieBuildError: the split is infeasible (from the planner) or a recipe rule does not fit a weight.
    """
    if (num_parts is None) == (max_part_bytes is None):
        raise ValueError("give exactly one of num_parts and max_part_bytes")
    encodings = {weight.spec.name: weight_encoding(weight, recipe) for weight in model.weights}
    # Sized by the planner's own rule, so the predicted plan is the one the workflow makes from encodings
    # of this recipe.
    pieces = weighed_pieces({weight.spec.name: weight.spec for weight in model.weights},
                            {weight.spec.name: weight.pieces for weight in model.weights}, encodings,
                            model.boundaries)
    plan = (plan_by_num_parts(pieces, num_parts, embedding_alone) if num_parts is not None
            else plan_by_max_part_bytes(pieces, max_part_bytes, embedding_alone))
    index_of = {piece.name: index for index, piece in enumerate(pieces)}
    parts = []
    for part in plan.parts:
        held = {index_of[name] for name in part.pieces}
        held_pieces = [pieces[index] for index in sorted(held)]
        weights = [weight for weight in model.weights if weight.pieces & held]
        constants = LAYER_CONSTANT_BYTES * sum(piece.kind == "layer" for piece in held_pieces)
        for variant in VARIANTS:
            sizes = [stored_size(weight.spec, encodings[weight.spec.name], recipe.float_bitwidth,
                                 variant.weights_packing) for weight in weights]
            copies = 1 if variant.weight_sharing_enabled else GRAPHS_PER_PART
            weight_bytes = copies * (sum(size.bytes for size in sizes) + constants)
            overhead = container_overhead(held_pieces, copies * sum(size.tensors for size in sizes))
            parts.append(PartEstimate(part.index, variant.name, weight_bytes, weight_bytes + overhead))
    return Estimate(plan, tuple(parts))


# ------------------------------------------------------------------------------------------- outputs

def size_records(result: Estimate) -> list[AccountRecord]:
    """The predictions as accounting records, for ``sizes.build_size_table``. ``applied`` is empty: there is
    no binary to read back, so an option is judged by size alone."""
    options = {variant.name: {"weights_packing": variant.weights_packing,
                              "weight_sharing_enabled": variant.weight_sharing_enabled} for variant in VARIANTS}
    return [AccountRecord(part=part.part, variant=part.variant, toolchain=TOOLCHAIN_LABEL, tool_version=__version__,
                          bytes=part.file_bytes, weight_bytes=part.weight_bytes, requested=options[part.variant],
                          applied=AppliedOptions()) for part in result.parts]


def write_estimate(out_dir: str | os.PathLike[str], result: Estimate, *, source: str, recipe: Recipe,
                   memory_variant: str = MEMORY_VARIANT, limits: MemoryLimits = MemoryLimits()) -> None:
    """Write ``plan.json``, ``estimate.json``, ``size_table.{csv,md,png}`` (baseline: the first variant)
    and ``memory_plan.{json,md}`` (``memory_variant`` against ``limits``) into ``out_dir``, each atomically.

    Raises:
        GenieBuildError: ``memory_variant`` is not one of :data:`VARIANTS`, or a file cannot be written.
    """
    out = Path(out_dir)
    records = size_records(result)
    memory_sizes = [PartSize(part.part, part.weight_bytes, part.file_bytes)
                    for part in result.parts if part.variant == memory_variant]
    if not memory_sizes:
        raise GenieBuildError("--memory-variant", f"{memory_variant!r} is not one of "
                                                  f"{[variant.name for variant in VARIANTS]}")
    write_plan(out / "plan.json", result.plan)
    write_json(out / "estimate.json", {
        "source": source, "recipe": dataclasses.asdict(recipe), "graphs_per_part": GRAPHS_PER_PART,
        "variants": [dataclasses.asdict(variant) for variant in VARIANTS],
        "overhead_model": {"graph_bytes": GRAPH_BYTES, "layer_part_graph_bytes": LAYER_PART_GRAPH_BYTES,
                           "embedding_graph_bytes": EMBEDDING_GRAPH_BYTES, "layer_graph_bytes": LAYER_GRAPH_BYTES,
                           "head_graph_bytes": HEAD_GRAPH_BYTES, "table_entry_bytes": TABLE_ENTRY_BYTES,
                           "layer_constant_bytes": LAYER_CONSTANT_BYTES},
        "parts": [dataclasses.asdict(part) for part in result.parts],
        "totals": {variant.name: {key: sum(getattr(part, key) for part in result.parts if part.variant == variant.name)
                                  for key in ("weight_bytes", "file_bytes")} for variant in VARIANTS},
    })
    write_size_table(build_size_table(records, VARIANTS[0].name), out / "size_table.csv", out / "size_table.md",
                     out / "size_table.png")
    write_memory_plan(plan_memory(memory_sizes, memory_variant, limits, basis="predicted"),
                      out / "memory_plan.json", out / "memory_plan.md")
