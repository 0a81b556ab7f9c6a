"""A tiny decoder-shaped ONNX graph for inspection, boundary and planning tests (onnx.helper, no torch).

Not a faithful transformer: it has just what boundary discovery and piece accounting must cope with,
including the traps real exports set:
- the residual stream ``[1, AR, hidden]`` with the conventions' names (``/model/layers.{i}/Add_1_output_0``);
- a RoPE-like tensor made before the layers and read by every layer (rank 3, but last dim != hidden);
- a tensor made in layer 0 and reused by every later layer (an exporter's CSE), rank 3, last dim 1;
- a rank-3 hidden-sized graph input read inside every layer (inputs are never boundaries);
- an eps initializer shared by all layers, weights reached through a Transpose (a constant-only node),
  and optionally a tied embedding/LM-head table.
No value_info is written, so shapes must come from shape inference. Weights come from an RNG seeded by
the weight's name, so graphs built with different AR share identical initializers.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ScopeStyle = Literal["name", "underscore", "metadata", "none"]
NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
EMBED_OUT = "/model/embed_tokens/Gather_output_0"


def layer_out(layer: int) -> str:
    return f"/model/layers.{layer}/Add_1_output_0"


def weight(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The deterministic value of a weight: seeded by its name, so every graph gets the same one."""
    return np.random.default_rng(zlib.crc32(name.encode())).standard_normal(shape).astype(np.float32)


def build_scoped_graph(path: Path | None = None, *, layers: int = 3, hidden: int = 8, rope: int = 4,
                       inter: int = 16, vocab: int = 32, ar: int = 4, scope: ScopeStyle = "name",
                       tied: bool = False) -> onnx.ModelProto:
    """Build the graph; with ``path``, also save it there with every weight in ``<name>.data`` (the
    returned model then refers to that file, like one loaded without external data).

    Args:
        scope: where a node's layer shows: ``name`` (``/model/layers.{i}/…``), ``underscore``
            (``/model/layers_{i}/…``), ``metadata`` (opaque node names, dynamo-style name-scope metadata)
            or ``none`` (no scopes at all).
        tied: the LM head reads the embedding table through a Transpose instead of its own weight.
    """
    nodes: list[onnx.NodeProto] = []
    inits: dict[str, np.ndarray] = {}

    def add(op: str, scope_path: str, inputs: list[str], output: str, layer: int | None = None,
            **attrs: object) -> str:
        node = helper.make_node(op, inputs, [output], name=_node_name(scope_path, op, layer, scope, len(nodes)),
                                **attrs)
        if scope == "metadata":
            scopes = ["", "m", "m.model"] + ([f"m.model.layers.{layer}"] if layer is not None else [])
            node.metadata_props.add(key=NAME_SCOPES_KEY, value=repr(scopes))
        nodes.append(node)
        return output

    def param(name: str, shape: tuple[int, ...]) -> str:
        inits[name] = weight(name, shape)
        return name

    inits["eps"] = np.array([1e-6], dtype=np.float32)
    table = param("model.embed_tokens.weight", (vocab, hidden))
    x = add("Gather", "/model/embed_tokens", [table, "input_ids"], EMBED_OUT)
    rope_table = add("Concat", "/model/rotary_emb", ["position_ids_cos", "position_ids_sin"],
                     "/model/rotary_emb/Concat_output_0", axis=-1)
    shared_gate = None
    for i in range(layers):
        p = f"model.layers.{i}"
        s = f"/model/layers.{i}"
        normed = add("Mul", f"{s}/input_layernorm", [x, param(f"{p}.input_layernorm.weight", (hidden,))],
                     f"{s}/input_layernorm/Mul_output_0", i)
        normed = add("Add", f"{s}/input_layernorm", [normed, "eps"], f"{s}/input_layernorm/Add_output_0", i)
        attn = add("MatMul", f"{s}/self_attn/q_proj", [normed, param(f"{p}.self_attn.q_proj.weight", (hidden, hidden))],
                   f"{s}/self_attn/q_proj/MatMul_output_0", i)
        if shared_gate is None:   # computed in layer 0 only, then reused by every layer (like a CSE'd RoPE op)
            shared_gate = add("ReduceMean", f"{s}/self_attn", [rope_table], f"{s}/self_attn/ReduceMean_output_0",
                              i, axes=[-1], keepdims=1)
        attn = add("Mul", f"{s}/self_attn", [attn, shared_gate], f"{s}/self_attn/Mul_output_0", i)
        attn = add("Add", f"{s}/self_attn", [attn, f"past_value_{i}_in"], f"{s}/self_attn/Add_output_0", i)
        key = add("MatMul", f"{s}/self_attn/k_proj", [normed, param(f"{p}.self_attn.k_proj.weight", (hidden, rope))],
                  f"{s}/self_attn/k_proj/MatMul_output_0", i)
        add("Mul", f"{s}/self_attn", [key, rope_table], f"past_key_{i}_out", i)
        residual = add("Add", s, [x, attn], f"{s}/Add_output_0", i)
        up = add("MatMul", f"{s}/mlp/up_proj", [residual, param(f"{p}.mlp.up_proj.weight", (hidden, inter))],
                 f"{s}/mlp/up_proj/MatMul_output_0", i)
        down_t = add("Transpose", f"{s}/mlp/down_proj", [param(f"{p}.mlp.down_proj.weight", (hidden, inter))],
                     f"{s}/mlp/down_proj/Transpose_output_0", i)
        down = add("MatMul", f"{s}/mlp/down_proj", [up, down_t], f"{s}/mlp/down_proj/MatMul_output_0", i)
        x = add("Add", s, [residual, down], layer_out(i), i)
    normed = add("Mul", "/model/norm", [x, param("model.norm.weight", (hidden,))], "/model/norm/Mul_output_0")
    if tied:
        head = add("Transpose", "/lm_head", [table], "/lm_head/Transpose_output_0")
    else:
        head = param("lm_head.weight", (hidden, vocab))
    add("MatMul", "/lm_head", [normed, head], "logits")

    def value(name: str, dtype: int, shape: list[int]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, dtype, shape)

    # attention_mask is only read for its shape (Genie takes CL from it), so no node consumes it here.
    inputs = [value("input_ids", TensorProto.INT64, [1, ar]),
              value("attention_mask", TensorProto.FLOAT, [1, ar, 64]),
              value("position_ids_cos", TensorProto.FLOAT, [1, ar, rope // 2]),
              value("position_ids_sin", TensorProto.FLOAT, [1, ar, rope // 2]),
              *(value(f"past_value_{i}_in", TensorProto.FLOAT, [1, ar, hidden]) for i in range(layers))]
    outputs = [value("logits", TensorProto.FLOAT, [1, ar, vocab]),
               *(value(f"past_key_{i}_out", TensorProto.FLOAT, [1, ar, rope]) for i in range(layers))]
    graph = helper.make_graph(nodes, f"scoped_ar{ar}", inputs, outputs,
                              [numpy_helper.from_array(array, name) for name, array in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    if path is not None:
        onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                  location=f"{Path(path).name}.data", size_threshold=0)
    return model


def _node_name(scope_path: str, op: str, layer: int | None, scope: ScopeStyle, index: int) -> str:
    if scope in ("metadata", "none"):
        return f"node_{op}_{index}"
    if scope == "underscore" and layer is not None:
        scope_path = scope_path.replace(f"layers.{layer}", f"layers_{layer}")
    return f"{scope_path}/{op}_{index}"
