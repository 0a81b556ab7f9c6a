"""The demo model: a Qwen2-architecture decoder written directly as two ONNX graphs.

The prompt graph (AR = ``shape.ar``) and the token graph (AR 1) follow ``docs/conventions.md``: Genie's
tensor names, keys transposed in the cache, KV outputs holding only the new entries, HF weight names with
MatMul weights stored ``[in, out]``. Both graphs have identical initializers (names and values; Reshape
shapes use 0-dims so no constant depends on AR), and every intermediate has a ``value_info`` so a part
can be cut without shape inference.

At the demo's own shape (:data:`TRAINED_SHAPE`, the config's default) the weights are those of a small model trained
on the demo's public-domain text (``resources/demo_model.safetensors``, made by ``scripts/train_demo.py``), so the
demo's text reads and its evaluation measures a model at work. At any other shape they are random but
deterministic: each tensor's generator is seeded from ``(seed, crc32(name))``, so a value never depends on
generation order. Tensors are written to the external-data files one by one as they are made or read (in blocks of
rows), so peak memory is one block, not the model.

The same module gives a random input feed of a graph (:func:`example_inputs`, with the RoPE tables and mask
of :mod:`genie_build.conventions`) for calibration and split verification.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from genie_build.conventions import (EMBED_WEIGHT, GRAPH_KINDS, INPUT_IDS, LM_HEAD_WEIGHT, LOGITS, MASK, POS_COS,
                                     POS_SIN, causal_mask, kv_name, length_graph_key, rope_tables, unsplit_graph_name)
from genie_build.conventions import graph_ar as _kind_ar
from genie_build.demo.train_tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID
from genie_build.errors import GenieBuildError
from genie_build.fileio import COPY_CHUNK_BYTES, atomic_open, write_json
from genie_build.hf_config import read_model_shape, read_rope, rope_kind

__all__ = ["DemoShape", "EXTERNAL_DATA_ALIGNMENT", "TRAINED_SHAPE", "TRAINED_WEIGHTS", "TensorSpec", "WEIGHT_DTYPES",
           "example_inputs", "generate_demo", "generate_demo_length", "graph_inputs", "graph_outputs", "graph_past", "hf_config", "shape_config",
           "is_trained_shape", "shape_from_hf_config"]

OPSET = 17
IR_VERSION = 8
# Tensors smaller than this stay inside the graph proto, as onnx's own external-data writer does.
INLINE_MAX_BYTES = 1024
# Page-aligned offsets let a runtime mmap each tensor.
EXTERNAL_DATA_ALIGNMENT = 4096
# Weights are made and written in blocks of rows this big, so even a large embedding table never sits
# in memory whole.
WEIGHT_CHUNK_BYTES = COPY_CHUNK_BYTES
WEIGHT_STD = 0.02       # keeps q/k/v and logits O(1) for hidden sizes up to a few thousand
NORM_WEIGHT_STD = 0.05  # norm weights are 1 + a perturbation, so a wrong norm formula shows in the logits
KV_CACHE_STD = 0.5      # random past K/V of about the magnitude the demo's own projections produce

_WeightInit = Literal["linear", "norm", "bias"]
WEIGHT_DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class DemoShape:
    """Size of the demo decoder; ``ar`` is the prompt graph's AR (the token graph has AR 1).

    ``weight_dtype="float16"`` stores every weight as fp16 followed by a Cast to float32, which halves
    the files of multi-GB benchmark models.

    Raises:
        GenieBuildError: a field is out of range or the sizes do not fit together (named ``demo.<field>``).
    """

    layers: int = 8
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 768
    vocab: int = 2048
    context: int = 256
    ar: int = 32
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    seed: int = 0
    weight_dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "context", "ar"):
            if getattr(self, name) < 1:
                raise GenieBuildError(f"demo.{name}", f"must be at least 1, got {getattr(self, name)}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise GenieBuildError("demo.hidden", f"{self.hidden} must split into {self.heads} heads of even size")
        if self.heads % self.kv_heads:
            raise GenieBuildError("demo.kv_heads", f"{self.kv_heads} does not divide heads={self.heads}")
        if self.ar >= self.context:
            raise GenieBuildError("demo.ar", f"{self.ar} must be smaller than context={self.context}")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise GenieBuildError("demo.rope_theta", "rope_theta and rms_norm_eps must be positive")
        if self.seed < 0:
            raise GenieBuildError("demo.seed", f"must be non-negative, got {self.seed}")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise GenieBuildError("demo.weight_dtype", f"{self.weight_dtype!r} is not one of {WEIGHT_DTYPES}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# The demo's default shape is the trained model's; only the weights' sizes and numerics must match (context, AR, seed
# and the stored dtype are free).
TRAINED_SHAPE = DemoShape()
TRAINED_WEIGHTS = "resources/demo_model.safetensors"   # in the workflow's folder, beside the demo's texts
_TRAINED_FIELDS = ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "rope_theta", "rms_norm_eps")


def is_trained_shape(shape: DemoShape) -> bool:
    """Whether ``shape`` is the trained model's (:data:`TRAINED_WEIGHTS` fit it); other shapes get random weights."""
    return all(getattr(shape, name) == getattr(TRAINED_SHAPE, name) for name in _TRAINED_FIELDS)


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: name, fixed dims and numpy dtype name."""

    name: str
    dims: tuple[int, ...]
    dtype: str = "float32"


def _graph_ar(shape: DemoShape, kind: str) -> int:
    """The number of new tokens per call of a graph: ``shape.ar`` for the prompt graph, 1 for the token graph."""
    return _kind_ar(kind, shape.ar)


def graph_past(shape: DemoShape, kind: str) -> int:
    """Cache slots of a graph: ``context - AR``."""
    return shape.context - _graph_ar(shape, kind)


def graph_inputs(shape: DemoShape, kind: str) -> tuple[TensorSpec, ...]:
    """The inputs of a full graph, in graph order (docs/conventions.md)."""
    ar, past, d, kv = _graph_ar(shape, kind), graph_past(shape, kind), shape.head_dim, shape.kv_heads
    specs = [TensorSpec(INPUT_IDS, (1, ar), "int32"),
             TensorSpec(MASK, (1, ar, shape.context)),
             TensorSpec(POS_COS, (1, 1, ar, d // 2)),
             TensorSpec(POS_SIN, (1, 1, ar, d // 2))]
    for i in range(shape.layers):
        specs += [TensorSpec(kv_name("key", i, "in"), (1, kv, d, past)),
                  TensorSpec(kv_name("value", i, "in"), (1, kv, past, d))]
    return tuple(specs)


def graph_outputs(shape: DemoShape, kind: str) -> tuple[TensorSpec, ...]:
    """The outputs of a full graph, in graph order: logits, then the new K/V entries per layer."""
    ar, d, kv = _graph_ar(shape, kind), shape.head_dim, shape.kv_heads
    specs = [TensorSpec(LOGITS, (1, ar, shape.vocab))]
    for i in range(shape.layers):
        specs += [TensorSpec(kv_name("key", i, "out"), (1, kv, d, ar)),
                  TensorSpec(kv_name("value", i, "out"), (1, kv, ar, d))]
    return tuple(specs)


# --- input feeds -------------------------------------------------------------------------------------

def example_inputs(shape: DemoShape, kind: str, past_len: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A full input feed for a graph: random token ids, random past K/V, the causal mask and RoPE tables
    for positions ``past_len..past_len+AR-1``. Deterministic for a seeded ``rng``."""
    ar = _graph_ar(shape, kind)
    cos, sin = rope_tables(shape.head_dim, shape.rope_theta, np.arange(past_len, past_len + ar))
    feed = {INPUT_IDS: rng.integers(0, shape.vocab, size=(1, ar), dtype=np.int32),
            MASK: causal_mask(ar, shape.context, past_len),
            POS_COS: cos, POS_SIN: sin}
    for spec in graph_inputs(shape, kind)[len(feed):]:
        feed[spec.name] = (rng.standard_normal(spec.dims, dtype=np.float32) * np.float32(KV_CACHE_STD))
    return feed


# --- graph construction ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _WeightSpec:
    """A random weight: HF name, dims and how its values are drawn."""

    name: str
    dims: tuple[int, ...]
    init: _WeightInit


@dataclass
class _GraphBuilder:
    """Collects nodes (named TorchScript-style: ``{scope}/{Op}``, ``{scope}/{Op}_1``…), value_info of
    every node output, inline constants and the specs of the random weights, in creation order."""

    weight_dtype: str
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    value_dims: dict[str, tuple[int, ...]] = field(default_factory=dict)
    constants: list[TensorProto] = field(default_factory=list)
    weights: list[_WeightSpec] = field(default_factory=list)
    _op_counts: Counter = field(default_factory=Counter)

    def ops(self, scope: str, op_type: str, inputs: Sequence[str], out_dims: Sequence[tuple[int, ...]],
            outputs: Sequence[str] | None = None, **attrs) -> list[str]:
        """Add a node with one output per entry of ``out_dims``; returns the output names."""
        base = f"{scope}/{op_type}"
        count = self._op_counts[base]
        self._op_counts[base] += 1
        name = base if count == 0 else f"{base}_{count}"
        outputs = list(outputs or [f"{name}_output_{k}" for k in range(len(out_dims))])
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, **attrs))
        self.value_dims.update(zip(outputs, (tuple(d) for d in out_dims)))
        return outputs

    def op(self, scope: str, op_type: str, inputs: Sequence[str], dims: tuple[int, ...],
           output: str | None = None, **attrs) -> str:
        return self.ops(scope, op_type, inputs, [dims], [output] if output else None, **attrs)[0]

    def constant(self, name: str, value: np.ndarray) -> str:
        self.constants.append(numpy_helper.from_array(value, name))
        return name

    def reshape_to(self, name: str, dims: Sequence[int]) -> str:
        """A Reshape target; 0 copies the input's dim and -1 takes the rest, so it holds for any AR."""
        return self.constant(name, np.array(dims, dtype=np.int64))

    def weight(self, scope: str, name: str, dims: tuple[int, ...], init: _WeightInit) -> str:
        """Register a weight; with fp16 weights, return the float32 output of a Cast in ``scope``."""
        self.weights.append(_WeightSpec(name, dims, init))
        if self.weight_dtype == "float32":
            return name
        return self.op(scope, "Cast", [name], dims, to=TensorProto.FLOAT)


def _rms_norm(b: _GraphBuilder, scope: str, x: str, weight: str, dims: tuple[int, ...], eps: float) -> str:
    """HF Qwen2RMSNorm: ``weight * x / sqrt(mean(x^2, -1) + eps)``."""
    reduced = (*dims[:-1], 1)
    squared = b.op(scope, "Mul", [x, x], dims)
    mean = b.op(scope, "ReduceMean", [squared], reduced, axes=[-1], keepdims=1)
    shifted = b.op(scope, "Add", [mean, b.constant(f"{scope}/eps", np.array(eps, np.float32))], reduced)
    root = b.op(scope, "Sqrt", [shifted], reduced)
    normalized = b.op(scope, "Div", [x, root], dims)
    return b.op(scope, "Mul", [normalized, b.weight(scope, weight, (dims[-1],), "norm")], dims)


def _rope(b: _GraphBuilder, scope: str, x: str, dims: tuple[int, ...]) -> str:
    """HF ``x * cos + rotate_half(x) * sin`` written on the halves the graph gets as inputs."""
    half = (*dims[:-1], dims[-1] // 2)
    x1, x2 = b.ops(scope, "Split", [x], [half, half], axis=-1)
    cos, sin = POS_COS, POS_SIN
    first = b.op(scope, "Sub", [b.op(scope, "Mul", [x1, cos], half), b.op(scope, "Mul", [x2, sin], half)], half)
    second = b.op(scope, "Add", [b.op(scope, "Mul", [x2, cos], half), b.op(scope, "Mul", [x1, sin], half)], half)
    return b.op(scope, "Concat", [first, second], dims, axis=-1)


def _projection(b: _GraphBuilder, scope: str, prefix: str, x: str, dims: tuple[int, ...], width: int,
                bias: bool) -> str:
    """``x @ W (+ b)`` with ``W`` stored ``[in, out]``, in the Linear module's scope."""
    out_dims = (*dims[:-1], width)
    y = b.op(scope, "MatMul", [x, b.weight(scope, f"{prefix}.weight", (dims[-1], width), "linear")], out_dims)
    if bias:
        y = b.op(scope, "Add", [y, b.weight(scope, f"{prefix}.bias", (width,), "bias")], out_dims)
    return y


def _heads(b: _GraphBuilder, scope: str, x: str, ar: int, n: int, d: int, output: str | None = None) -> str:
    """``[1, AR, n*d] -> [1, n, AR, d]``."""
    split = b.op(scope, "Reshape", [x, b.reshape_to(f"{scope}/heads_shape", [0, 0, n, d])], (1, ar, n, d))
    return b.op(scope, "Transpose", [split], (1, n, ar, d), output=output, perm=[0, 2, 1, 3])


def _attention(b: _GraphBuilder, shape: DemoShape, i: int, x: str, ar: int) -> str:
    """Self-attention of layer ``i`` with GQA and the KV cache; writes ``past_{key,value}_{i}_out``."""
    s = f"/model/layers.{i}/self_attn"
    p = f"model.layers.{i}.self_attn"
    h, kv, d, cl = shape.heads, shape.kv_heads, shape.head_dim, shape.context
    dims, groups = (1, ar, shape.hidden), h // kv
    q_proj = _projection(b, f"{s}/q_proj", f"{p}.q_proj", x, dims, h * d, True)
    k_proj = _projection(b, f"{s}/k_proj", f"{p}.k_proj", x, dims, kv * d, True)
    v_proj = _projection(b, f"{s}/v_proj", f"{p}.v_proj", x, dims, kv * d, True)
    q = _rope(b, f"{s}/q_rope", _heads(b, f"{s}/q_proj", q_proj, ar, h, d), (1, h, ar, d))
    k = _rope(b, f"{s}/k_rope", _heads(b, f"{s}/k_proj", k_proj, ar, kv, d), (1, kv, ar, d))
    v = _heads(b, f"{s}/v_proj", v_proj, ar, kv, d, output=kv_name("value", i, "out"))
    k_new = b.op(s, "Transpose", [k], (1, kv, d, ar), output=kv_name("key", i, "out"), perm=[0, 1, 3, 2])
    keys = b.op(s, "Concat", [kv_name("key", i, "in"), k_new], (1, kv, d, cl), axis=3)
    values = b.op(s, "Concat", [kv_name("value", i, "in"), v], (1, kv, cl, d), axis=2)
    # GQA without repeating K/V: query head j belongs to KV head j // groups (HF repeat_kv), which is
    # exactly what folding the heads axis into [kv, groups * AR] does.
    to_groups = b.reshape_to(f"{s}/groups_shape", [0, kv, -1, 0])
    to_heads = b.reshape_to(f"{s}/heads_shape", [0, h, -1, 0])
    grouped_q = b.op(s, "Reshape", [q, to_groups], (1, kv, groups * ar, d))
    grouped_scores = b.op(s, "MatMul", [grouped_q, keys], (1, kv, groups * ar, cl))
    scores = b.op(s, "Reshape", [grouped_scores, to_heads], (1, h, ar, cl))
    scaled = b.op(s, "Mul", [scores, b.constant(f"{s}/scale", np.array(d ** -0.5, np.float32))], (1, h, ar, cl))
    probs = b.op(s, "Softmax", [b.op(s, "Add", [scaled, MASK], (1, h, ar, cl))], (1, h, ar, cl), axis=-1)
    grouped_probs = b.op(s, "Reshape", [probs, to_groups], (1, kv, groups * ar, cl))
    grouped_context = b.op(s, "MatMul", [grouped_probs, values], (1, kv, groups * ar, d))
    context = b.op(s, "Reshape", [grouped_context, to_heads], (1, h, ar, d))
    merged = b.op(s, "Transpose", [context], (1, ar, h, d), perm=[0, 2, 1, 3])
    flat = b.op(s, "Reshape", [merged, b.reshape_to(f"{s}/merge_shape", [0, 0, -1])], dims)
    return _projection(b, f"{s}/o_proj", f"{p}.o_proj", flat, dims, shape.hidden, False)


def _mlp(b: _GraphBuilder, shape: DemoShape, i: int, x: str, ar: int) -> str:
    """SwiGLU: ``down(gate * sigmoid(gate) * up)``."""
    s, p = f"/model/layers.{i}/mlp", f"model.layers.{i}.mlp"
    dims, inner = (1, ar, shape.hidden), (1, ar, shape.intermediate)
    gate = _projection(b, f"{s}/gate_proj", f"{p}.gate_proj", x, dims, shape.intermediate, False)
    up = _projection(b, f"{s}/up_proj", f"{p}.up_proj", x, dims, shape.intermediate, False)
    activated = b.op(s, "Mul", [gate, b.op(s, "Sigmoid", [gate], inner)], inner)
    return _projection(b, f"{s}/down_proj", f"{p}.down_proj", b.op(s, "Mul", [activated, up], inner), inner,
                       shape.hidden, False)


def _decoder_layer(b: _GraphBuilder, shape: DemoShape, i: int, x: str, ar: int) -> str:
    """Pre-norm attention and MLP with residuals; returns ``/model/layers.{i}/Add_1_output_0``."""
    s, p, dims = f"/model/layers.{i}", f"model.layers.{i}", (1, ar, shape.hidden)
    normed = _rms_norm(b, f"{s}/input_layernorm", x, f"{p}.input_layernorm.weight", dims, shape.rms_norm_eps)
    mid = b.op(s, "Add", [x, _attention(b, shape, i, normed, ar)], dims)
    normed = _rms_norm(b, f"{s}/post_attention_layernorm", mid, f"{p}.post_attention_layernorm.weight", dims,
                       shape.rms_norm_eps)
    return b.op(s, "Add", [mid, _mlp(b, shape, i, normed, ar)], dims)


def _build_graph(shape: DemoShape, kind: str) -> _GraphBuilder:
    """All nodes of one graph; weights are only registered, not made."""
    ar, b = _graph_ar(shape, kind), _GraphBuilder(shape.weight_dtype)
    dims = (1, ar, shape.hidden)
    table = b.weight("/model/embed_tokens", EMBED_WEIGHT, (shape.vocab, shape.hidden), "linear")
    x = b.op("/model/embed_tokens", "Gather", [table, INPUT_IDS], dims, axis=0)
    for i in range(shape.layers):
        x = _decoder_layer(b, shape, i, x, ar)
    x = _rms_norm(b, "/model/norm", x, "model.norm.weight", dims, shape.rms_norm_eps)
    head = b.weight("/lm_head", LM_HEAD_WEIGHT, (shape.hidden, shape.vocab), "linear")
    b.op("/lm_head", "MatMul", [x, head], (1, ar, shape.vocab), output=LOGITS)
    return b


# --- weights -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _StoredWeight:
    """Where a weight went: inline bytes, or ``(offset, length)`` in the external-data file."""

    spec: _WeightSpec
    offset: int = 0
    length: int = 0
    inline: bytes | None = None


def _rows_per_chunk(row_dims: Sequence[int]) -> int:
    """Rows of a weight per block of at most :data:`WEIGHT_CHUNK_BYTES` (float32)."""
    return max(1, WEIGHT_CHUNK_BYTES // (np.dtype(np.float32).itemsize * math.prod(row_dims)))


@dataclass(frozen=True)
class _TrainedWeights:
    """The trained model's weights (Hugging Face names and layout, ``[out, in]`` Linear weights), read one tensor at
    a time."""

    path: Path

    def chunks(self, spec: _WeightSpec, dtype: str) -> Iterator[np.ndarray]:
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(self.path, framework="numpy") as stored:
                values = stored.get_tensor(spec.name) if spec.name in stored.keys() else None
        except (OSError, SafetensorError) as exc:
            raise GenieBuildError(self.path, f"not a safetensors file of the demo's weights: {exc}") from None
        if values is None:
            raise GenieBuildError(self.path, f"has no tensor {spec.name!r}")
        # The graph's MatMul weights are [in, out]: every Linear weight but the embedding table is transposed
        if spec.init == "linear" and spec.name != EMBED_WEIGHT:
            values = values.T
        if values.shape != spec.dims:
            raise GenieBuildError(self.path, f"{spec.name!r} has shape {list(values.shape)}, the demo's graphs need "
                                             f"{list(spec.dims)}")
        step = _rows_per_chunk(spec.dims[1:])
        for start in range(0, len(values), step):
            yield np.ascontiguousarray(values[start:start + step], dtype=dtype)


def _weight_chunks(spec: _WeightSpec, seed: int, dtype: str) -> Iterator[np.ndarray]:
    """The deterministic values of one weight, in blocks of rows of at most :data:`WEIGHT_CHUNK_BYTES`.

    The generator is seeded by ``(seed, crc32(name))`` and draws rows in order, so the values depend
    neither on the order weights are made in nor on the block size.
    """
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode("utf-8"))])
    rows, row_dims = spec.dims[0], spec.dims[1:]
    rows_per_chunk = _rows_per_chunk(row_dims)
    for start in range(0, rows, rows_per_chunk):
        values = rng.standard_normal((min(rows_per_chunk, rows - start), *row_dims), dtype=np.float32)
        values *= np.float32(NORM_WEIGHT_STD if spec.init == "norm" else WEIGHT_STD)
        if spec.init == "norm":
            values += np.float32(1.0)
        yield values.astype(dtype, copy=False)


_Chunks = Callable[[_WeightSpec], Iterator[np.ndarray]]


def _stream_weights(specs: Sequence[_WeightSpec], chunks: _Chunks, dtype: str,
                    data_files: Sequence[BinaryIO]) -> list[_StoredWeight]:
    """Make (or read) each weight and append it (page-aligned) to every data file, one block of rows at a time."""
    stored, end = [], 0
    for spec in specs:
        nbytes = math.prod(spec.dims) * np.dtype(dtype).itemsize
        if nbytes < INLINE_MAX_BYTES:
            stored.append(_StoredWeight(spec, inline=b"".join(c.tobytes() for c in chunks(spec))))
            continue
        offset = end + (-end % EXTERNAL_DATA_ALIGNMENT)
        for handle in data_files:
            handle.write(b"\0" * (offset - end))
        for chunk in chunks(spec):
            for handle in data_files:
                handle.write(np.ascontiguousarray(chunk).data)
        end = offset + nbytes
        stored.append(_StoredWeight(spec, offset, nbytes))
    return stored


def _weight_proto(weight: _StoredWeight, dtype: str, location: str) -> TensorProto:
    proto = TensorProto(name=weight.spec.name, dims=weight.spec.dims,
                        data_type=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    if weight.inline is not None:
        proto.raw_data = weight.inline
        return proto
    proto.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(weight.offset)), ("length", str(weight.length))):
        proto.external_data.add(key=key, value=value)
    return proto


def _model_proto(b: _GraphBuilder, shape: DemoShape, kind: str, weights: list[TensorProto]) -> onnx.ModelProto:
    """Wrap one graph's nodes with its IO, initializers and a value_info for every intermediate."""
    def info(spec: TensorSpec) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(spec.name, helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype)),
                                             spec.dims)

    outputs = graph_outputs(shape, kind)
    output_names = {spec.name for spec in outputs}
    value_info = [info(TensorSpec(name, dims)) for name, dims in b.value_dims.items() if name not in output_names]
    graph = helper.make_graph(b.nodes, unsplit_graph_name(kind, _graph_ar(shape, kind), shape.context),
                              [info(spec) for spec in graph_inputs(shape, kind)], [info(spec) for spec in outputs],
                              initializer=[*b.constants, *weights], value_info=value_info)
    return helper.make_model(graph, producer_name="genie-build demo", ir_version=IR_VERSION,
                             opset_imports=[helper.make_opsetid("", OPSET)])


def hf_config(shape: DemoShape) -> dict:
    """The HF ``config.json`` describing the demo model (Qwen2ForCausalLM)."""
    return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "hidden_size": shape.hidden, "intermediate_size": shape.intermediate,
            "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads, "vocab_size": shape.vocab,
            "max_position_embeddings": shape.context, "rope_theta": shape.rope_theta,
            "rms_norm_eps": shape.rms_norm_eps, "hidden_act": "silu", "tie_word_embeddings": False,
            "bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_ID, "torch_dtype": shape.weight_dtype}


def shape_config(section: dict) -> dict:
    """The keys of the config's ``demo`` section that are :class:`DemoShape` fields (``calibrator`` is not), its
    context the largest of its lengths."""
    shape = {spec.name: section[spec.name] for spec in fields(DemoShape) if spec.name in section}
    if isinstance(shape.get("context"), list):
        shape["context"] = max(shape["context"])
    return shape


def shape_from_hf_config(config: dict, ar: int, where: str = "config.json") -> DemoShape:
    """Inverse of :func:`hf_config` (``ar`` is not an HF field; take it from the prompt graph), for a config.json in
    either transformers layout (:mod:`genie_build.hf_config`).

    Raises:
        GenieBuildError: a key is missing, the RoPE is scaled (the demo's feeds compute plain RoPE), or a value
            does not make a valid shape.
    """
    missing = sorted(key for key in ("max_position_embeddings", "rms_norm_eps") if key not in config)
    if missing:
        raise GenieBuildError(where, f"missing keys {missing}")
    shape, rope = read_model_shape(config, where), read_rope(config, where)
    if rope.scaling is not None:
        raise GenieBuildError(where, f"RoPE scaling {rope_kind(rope.scaling)!r}: the demo's graphs and feeds "
                                     "compute plain RoPE")
    dtype = config.get("torch_dtype", "float32")
    return DemoShape(layers=shape.layers, hidden=shape.hidden, heads=shape.heads, kv_heads=shape.kv_heads,
                     intermediate=shape.intermediate, vocab=shape.vocab, context=config["max_position_embeddings"],
                     rope_theta=rope.theta, rms_norm_eps=config["rms_norm_eps"], ar=ar,
                     weight_dtype=dtype if dtype in WEIGHT_DTYPES else "float32")


def generate_demo(shape: DemoShape, out_dir: str | Path, weights: str | Path | None = None) -> None:
    """Write ``prompt.onnx``/``token.onnx`` (each with its ``.onnx.data``) and ``config.json`` to ``out_dir``.

    Both graphs get the same initializers at the same offsets in their own data file; weights are made (or read
    from ``weights``, a safetensors file of the trained model's, one tensor at a time) and written in blocks of rows,
    so peak memory stays near one tensor.

    Raises:
        GenieBuildError: ``weights`` given for a shape that is not the trained model's, unreadable or missing a
            tensor; or a file could not be written.
    """
    out_dir = Path(out_dir)
    if weights is None:
        chunks: _Chunks = functools.partial(_weight_chunks, seed=shape.seed, dtype=shape.weight_dtype)
    elif not is_trained_shape(shape):
        raise GenieBuildError(weights, "trained weights fit only the demo's own shape "
                                       f"({', '.join(f'{n}={getattr(TRAINED_SHAPE, n)}' for n in _TRAINED_FIELDS)})")
    else:
        chunks = functools.partial(_TrainedWeights(Path(weights)).chunks, dtype=shape.weight_dtype)
    builders = {kind: _build_graph(shape, kind) for kind in GRAPH_KINDS}
    data_names = {kind: f"{kind}.onnx.data" for kind in GRAPH_KINDS}
    with atomic_open(out_dir / data_names["prompt"]) as prompt_data, \
            atomic_open(out_dir / data_names["token"]) as token_data:
        stored = _stream_weights(builders["prompt"].weights, chunks, shape.weight_dtype, [prompt_data, token_data])
    for kind, builder in builders.items():
        weights = [_weight_proto(weight, shape.weight_dtype, data_names[kind]) for weight in stored]
        with atomic_open(out_dir / f"{kind}.onnx") as handle:
            handle.write(_model_proto(builder, shape, kind, weights).SerializeToString())
    write_json(out_dir / "config.json", hf_config(shape))


def generate_demo_length(shape: DemoShape, out_dir: str | Path, context: int) -> dict[str, Path]:
    """Write the prompt and token graphs at another context length beside :func:`generate_demo`'s (``shape.context``
    the largest): ``prompt_cl{context}.onnx`` and ``token_cl{context}.onnx``, whose weights are the base graphs'
    own entries in their data files, so no weight is written again and the base files are left as they are.

    Raises:
        GenieBuildError: ``context`` not below ``shape.context`` or not above the AR, or a base graph missing or
            holding other weights than this shape's.
    """
    out_dir = Path(out_dir)
    if not shape.ar < context < shape.context:
        raise GenieBuildError("--context", f"{context} must lie between the AR {shape.ar} and the largest context "
                                           f"length {shape.context}")
    at_length = replace(shape, context=context)
    written = {}
    for kind in GRAPH_KINDS:
        base_path = out_dir / f"{kind}.onnx"
        if not base_path.is_file():
            raise GenieBuildError(base_path, "missing: generate the demo at its largest context length first")
        builder = _build_graph(at_length, kind)
        base = {tensor.name: tensor for tensor in onnx.load(base_path, load_external_data=False).graph.initializer}
        missing = [spec.name for spec in builder.weights if spec.name not in base
                   or tuple(base[spec.name].dims) != spec.dims]
        if missing:
            raise GenieBuildError(base_path, f"does not hold this shape's weight {missing[0]!r} "
                                             f"({len(missing)} of {len(builder.weights)} differ)")
        weights = [base[spec.name] for spec in builder.weights]
        written[kind] = out_dir / f"{length_graph_key(kind, context)}.onnx"
        with atomic_open(written[kind]) as handle:
            handle.write(_model_proto(builder, at_length, kind, weights).SerializeToString())
    return written
