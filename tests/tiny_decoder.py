"""A tiny decoder-shaped ONNX graph for split/verify tests, built with onnx.helper (no torch).

It follows the conventions' tensor and weight names: an embedding Gather, ``layers`` blocks with two
residual Adds each (``/model/layers.{i}/Add_1_output_0`` is the boundary after layer ``i``), attention
over past + new K/V with an additive mask, shared cos/sin inputs scaled once by a preamble node that
every layer reads, KV outputs, a final norm and an LM head. Weights come from an RNG seeded by the
weight's name, so the prompt and token graphs share them; matrices are external data, vectors inline.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from genie_build.conventions import part_label
from genie_build.plan.plan_file import PartPlan, Plan

EMBED_OUT = "/model/embed_tokens/Gather_output_0"
EXTERNAL_THRESHOLD = 512  # bytes: matrices go to the data file, norm weights and biases stay inline


def layer_out(layer: int) -> str:
    return f"/model/layers.{layer}/Add_1_output_0"


def build_tiny_decoder(path: Path, *, layers: int = 4, hidden: int = 16, vocab: int = 64, ar: int = 4,
                       context: int = 8, overrides: dict[str, np.ndarray] | None = None,
                       if_in_layer: int | None = None, skip_from_layer0_into: int | None = None) -> Path:
    """Write the graph to ``path`` with its external data in ``path.name + ".data"``.

    Args:
        overrides: weight values by name, replacing the seeded ones.
        if_in_layer: put the MLP bias of that layer behind an If whose branches read outer-scope tensors.
        skip_from_layer0_into: add layer 0's attention residual into that layer (a tensor crossing cuts).
    """
    values = overrides or {}
    inits: list[TensorProto] = []

    def weight(name: str, shape: tuple[int, ...]) -> str:
        array = values.get(name)
        if array is None:
            array = np.random.default_rng(zlib.crc32(name.encode())).uniform(-0.5, 0.5, shape)
        inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    past = context - ar
    f32 = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, [1, ar]),
              helper.make_tensor_value_info("attention_mask", f32, [1, ar, context]),
              helper.make_tensor_value_info("position_ids_cos", f32, [1, ar, hidden]),
              helper.make_tensor_value_info("position_ids_sin", f32, [1, ar, hidden])]
    outputs = []
    nodes = [helper.make_node("Gather", [weight("model.embed_tokens.weight", (vocab, hidden)), "input_ids"],
                              [EMBED_OUT], name="/model/embed_tokens/Gather"),
             helper.make_node("Mul", ["position_ids_cos", weight("rope.scale", (1,))], ["cos_scaled"],
                              name="/model/rotary_emb/Mul")]
    x = EMBED_OUT
    for i in range(layers):
        p = f"/model/layers.{i}"
        w = f"model.layers.{i}"
        inputs += [helper.make_tensor_value_info(f"past_key_{i}_in", f32, [1, past, hidden]),
                   helper.make_tensor_value_info(f"past_value_{i}_in", f32, [1, past, hidden])]
        outputs += [helper.make_tensor_value_info(f"past_key_{i}_out", f32, [1, ar, hidden]),
                    helper.make_tensor_value_info(f"past_value_{i}_out", f32, [1, ar, hidden])]
        mlp = f"{p}/mlp/down_proj/MatMul_output_0"
        nodes += [
            helper.make_node("Mul", [x, weight(f"{w}.input_layernorm.weight", (hidden,))], [f"{p}/ln"]),
            helper.make_node("MatMul", [f"{p}/ln", weight(f"{w}.self_attn.q_proj.weight", (hidden, hidden))],
                             [f"{p}/q"]),
            helper.make_node("Mul", [f"{p}/q", "cos_scaled"], [f"{p}/q_rot"]),
            helper.make_node("MatMul", [f"{p}/ln", weight(f"{w}.self_attn.k_proj.weight", (hidden, hidden))],
                             [f"{p}/k"]),
            helper.make_node("Mul", [f"{p}/k", "position_ids_sin"], [f"past_key_{i}_out"]),
            helper.make_node("MatMul", [f"{p}/ln", weight(f"{w}.self_attn.v_proj.weight", (hidden, hidden))],
                             [f"past_value_{i}_out"]),
            helper.make_node("Concat", [f"past_key_{i}_in", f"past_key_{i}_out"], [f"{p}/keys"], axis=1),
            helper.make_node("Concat", [f"past_value_{i}_in", f"past_value_{i}_out"], [f"{p}/values"], axis=1),
            helper.make_node("Transpose", [f"{p}/keys"], [f"{p}/keys_t"], perm=[0, 2, 1]),
            helper.make_node("MatMul", [f"{p}/q_rot", f"{p}/keys_t"], [f"{p}/scores"]),
            helper.make_node("Add", [f"{p}/scores", "attention_mask"], [f"{p}/masked"]),
            helper.make_node("Softmax", [f"{p}/masked"], [f"{p}/probs"], axis=-1),
            helper.make_node("MatMul", [f"{p}/probs", f"{p}/values"], [f"{p}/attn"]),
            helper.make_node("MatMul", [f"{p}/attn", weight(f"{w}.self_attn.o_proj.weight", (hidden, hidden))],
                             [f"{p}/o"]),
            helper.make_node("Add", [x, f"{p}/o"], [f"{p}/Add_output_0"], name=f"{p}/Add"),
            helper.make_node("MatMul", [f"{p}/Add_output_0",
                                        weight(f"{w}.mlp.down_proj.weight", (hidden, hidden))], [mlp]),
        ]
        if i == if_in_layer:
            inits.append(numpy_helper.from_array(np.array(True), f"{w}.mlp.use_bias"))
            nodes.append(_if_bias(f"{w}.mlp.use_bias", mlp, weight(f"{w}.mlp.down_proj.bias", (hidden,)),
                                  f"{p}/mlp_biased", [1, ar, hidden]))
            mlp = f"{p}/mlp_biased"
        if i == skip_from_layer0_into:
            nodes.append(helper.make_node("Add", [mlp, "/model/layers.0/Add_output_0"], [f"{p}/skip"]))
            mlp = f"{p}/skip"
        nodes.append(helper.make_node("Add", [f"{p}/Add_output_0", mlp], [layer_out(i)], name=f"{p}/Add_1"))
        x = layer_out(i)
    nodes += [helper.make_node("Mul", [x, weight("model.norm.weight", (hidden,))], ["/model/norm/Mul_output_0"],
                               name="/model/norm/Mul"),
              helper.make_node("MatMul", ["/model/norm/Mul_output_0", weight("lm_head.weight", (hidden, vocab))],
                               ["logits"], name="/lm_head/MatMul")]
    outputs.insert(0, helper.make_tensor_value_info("logits", f32, [1, ar, vocab]))
    graph = helper.make_graph(nodes, "tiny_decoder", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.with_name(path.name + ".data").unlink(missing_ok=True)  # onnx.save refuses to overwrite it
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".data", size_threshold=EXTERNAL_THRESHOLD)
    return path


def _if_bias(condition: str, value: str, bias: str, out: str, shape: list[int]) -> onnx.NodeProto:
    """``out = value + bias if condition else value``; the branches read ``value`` and ``bias`` from the
    outer scope (not as node inputs), which a node walk over ``node.input`` alone would miss."""
    f32 = TensorProto.FLOAT
    then_branch = helper.make_graph([helper.make_node("Add", [value, bias], [f"{out}/then"])], "then", [],
                                    [helper.make_tensor_value_info(f"{out}/then", f32, shape)])
    else_branch = helper.make_graph([helper.make_node("Identity", [value], [f"{out}/else"])], "else", [],
                                    [helper.make_tensor_value_info(f"{out}/else", f32, shape)])
    return helper.make_node("If", [condition], [out], then_branch=then_branch, else_branch=else_branch,
                            name=f"{out}/If")


def make_plan(layers: int, groups: list[list[int]], *, embedding_alone: bool = True) -> Plan:
    """A plan cutting after the embedding (when alone) and after the last layer of each group."""
    num_parts = len(groups) + int(embedding_alone)
    cuts = ([EMBED_OUT] if embedding_alone else []) + [layer_out(group[-1]) for group in groups[:-1]]
    ranges = ([None] if embedding_alone else []) + groups
    parts = []
    for index, layer_range in enumerate(ranges, start=1):
        parts.append(PartPlan(
            index=index, label=part_label(index, num_parts),
            pieces=("embedding",) if layer_range is None else tuple(f"layer_{i}" for i in layer_range),
            first_layer=None if layer_range is None else layer_range[0],
            last_layer=None if layer_range is None else layer_range[-1],
            input_boundary=cuts[index - 2] if index > 1 else None,
            output_boundary=cuts[index - 1] if index < num_parts else None,
            estimated_bytes=0))
    return Plan(num_parts=num_parts, parts=tuple(parts), num_layers=layers,
                boundaries=(EMBED_OUT, *(layer_out(i) for i in range(layers))),
                embedding_alone=embedding_alone, mode="num_parts")
