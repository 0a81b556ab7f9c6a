"""What the plans and the estimate know of a model before any weight is read: every weight's name, declared shape
and role (a precision recipe picks its bits by role), and the pieces (embedding, layer i, head) that use it.

From an HF ``config.json`` of a family :mod:`genie_build.families` registers, the weights are named and shaped as
``docs/conventions.md`` says and as the export writes them. From an ONNX graph loaded without its external data,
every float initializer of rank >= 1 is a weight; scalars and integer tensors (eps, Reshape shapes) are graph
constants, kept apart: a graph's encodings weigh them as stored (:mod:`genie_build.plan.plan`), while the size model
counts them per layer as the conventions' graph has them, so that a graph and its config estimate alike.
Which pieces use an initializer follows the graph's data flow from its boundaries (:func:`initializer_pieces`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import onnx

from genie_build.conventions import EMBEDDING_BOUNDARY, LM_HEAD_WEIGHT, layer_output, piece_names
from genie_build.errors import GenieBuildError
from genie_build.hf_config import ModelShape, shape_of, stored_tensors
from genie_build.onnx_graph import InitializerSpec, WeightLayout, consumer_layouts, initializer_specs
from genie_build.plan.boundaries import CONFIG_KEY as BOUNDARIES_KEY
from genie_build.plan.calibration_units import PieceFloat

__all__ = ["ModelWeights", "Role", "Weight", "initializer_pieces", "weights_from_graph", "weights_from_hf_config"]

Role = Literal["embedding", "layers", "lm_head", "float"]


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
    """What the plans and the estimate know about a model: its weights, its L + 1 boundary tensors, and (of a
    graph) its other initializers, the graph constants, each with the pieces using it."""

    weights: tuple[Weight, ...]
    boundaries: tuple[str, ...]
    constants: tuple[Weight, ...] = ()

    @property
    def num_layers(self) -> int:
        return len(self.boundaries) - 1

    def piece_floats(self) -> dict[str, PieceFloat]:
        """Piece name -> the float32 bytes of its weights and of the largest (what an export or a calibration
        unit holds)."""
        totals, largest = [0] * (self.num_layers + 2), [0] * (self.num_layers + 2)
        for weight in self.weights:
            for piece in weight.pieces:
                totals[piece] += 4 * math.prod(weight.spec.shape)
                largest[piece] = max(largest[piece], 4 * math.prod(weight.spec.shape))
        return {name: PieceFloat(total, most)
                for name, total, most in zip(piece_names(self.num_layers), totals, largest)}


def weights_from_hf_config(path: str | os.PathLike[str] | ModelShape) -> ModelWeights:
    """The weights of a ``config.json`` of a registered family as the export writes them: the checkpoint's tensors
    (:func:`genie_build.hf_config.stored_tensors`) with each Linear weight as ``[in, out]`` (the MatMul the
    conventions' graph has) and a tied LM head written as its own ``lm_head.weight`` (the export unties it,
    because Genie bundles quantize the table and the head differently). ``path``: the file, or its shape as read
    once (:attr:`genie_build.hf_checkpoint.Checkpoint.shape`).

    Raises:
        GenieBuildError: the file is unreadable, or the model is not one :func:`read_model_shape` reads.
    """
    shape = shape_of(path if isinstance(path, ModelShape) else os.fspath(path))
    roles: dict[str, Role] = {"embedding": "embedding", "linear": "layers", "bias": "float", "norm": "float",
                              "lm_head": "lm_head"}

    def weight(name: str, dims: tuple[int, ...], role: Role, piece: int) -> Weight:
        return Weight(InitializerSpec(name, dims, "float32", math.prod(dims) * 4), role, frozenset({piece}))

    weights = [weight(tensor.name, tensor.shape[::-1] if tensor.kind in ("linear", "lm_head") else tensor.shape,
                      roles[tensor.kind], tensor.piece) for tensor in stored_tensors(shape)]
    if shape.tied:
        weights.append(weight(LM_HEAD_WEIGHT, (shape.hidden, shape.vocab), "lm_head", shape.layers + 1))
    boundaries = (EMBEDDING_BOUNDARY, *(layer_output(i) for i in range(shape.layers)))
    return ModelWeights(tuple(weights), boundaries)


def weights_from_graph(model: onnx.ModelProto, boundaries: Sequence[str]) -> ModelWeights:
    """The weights of an ONNX graph (loaded without its external data) cut at its ``boundaries``
    (:func:`genie_build.plan.boundaries.find_boundaries`), and the pieces using each.

    A float initializer of rank >= 1 is a weight: a 2-D one is the ``embedding`` when the embedding piece
    uses it, else ``lm_head`` in the head and ``layers`` in a layer; the others are ``float``. Scalars and
    integer initializers are the graph's constants; unused initializers are left out.

    Raises:
        GenieBuildError: the boundaries do not cut the residual stream in order (:func:`initializer_pieces`).
    """
    owners = initializer_pieces(model, boundaries)
    head_piece = len(boundaries)
    specs = initializer_specs(model)
    layouts = consumer_layouts([model.graph], {name: tuple(spec.shape) for name, spec in specs.items()})
    weights, constants = [], []
    for name, spec in specs.items():
        if name not in owners:
            continue
        pieces = owners[name]
        if not spec.shape or "float" not in spec.dtype:  # float16, bfloat16, float8... are weights
            constants.append(Weight(spec, "float", pieces))
            continue
        role: Role = "float"
        if len(spec.shape) == 2:
            role = "embedding" if 0 in pieces else "lm_head" if pieces == {head_piece} else "layers"
        weights.append(Weight(spec, role, pieces, layouts.get(name)))
    return ModelWeights(tuple(weights), tuple(boundaries), tuple(constants))


def initializer_pieces(model: onnx.ModelProto, boundaries: Sequence[str]) -> dict[str, frozenset[int]]:
    """Which pieces consume each initializer: 0 = embedding, i + 1 = layer i, L + 1 = head.

    A node's piece is the number of boundaries upstream of it: data from graph inputs starts in piece 0
    and crossing boundary k moves it to piece k + 1. Nodes fed only by constants (weight Transposes,
    Constant nodes) belong to the pieces of their consumers. Unused initializers are left out.
    Relies on ONNX's topological node order; subgraph bodies (If/Loop) are not looked into.

    Raises:
        GenieBuildError: a boundary does not depend on the one before it (the boundaries do not cut the
            residual stream in order), or is not computed from the graph inputs.
    """
    graph = model.graph
    consumers: dict[str, list[int]] = {}
    for index, node in enumerate(graph.node):
        for name in node.input:
            consumers.setdefault(name, []).append(index)
    data_pieces = _data_flow_pieces(graph, boundaries)
    node_pieces: list[frozenset[int]] = [frozenset()] * len(graph.node)
    for index in reversed(range(len(graph.node))):
        piece = data_pieces[index]
        node_pieces[index] = frozenset({piece}) if piece is not None else frozenset().union(
            *(node_pieces[consumer] for output in graph.node[index].output for consumer in consumers.get(output, ())))
    return {tensor.name: frozenset().union(*(node_pieces[consumer] for consumer in consumers[tensor.name]))
            for tensor in graph.initializer if tensor.name in consumers}


def _data_flow_pieces(graph: onnx.GraphProto, boundaries: Sequence[str]) -> list[int | None]:
    """Each node's piece from the graph inputs downstream (None for nodes fed by constants only)."""
    cut_index = {name: index for index, name in enumerate(boundaries)}
    initializers = {tensor.name for tensor in graph.initializer}
    tensor_piece = {value.name: 0 for value in graph.input if value.name not in initializers}
    pieces: list[int | None] = []
    for node in graph.node:
        upstream = [tensor_piece[name] for name in node.input if name in tensor_piece]
        piece = max(upstream) if upstream else None
        pieces.append(piece)
        for output in node.output if piece is not None else ():
            if output in cut_index:
                _check_cut_order(output, cut_index[output], piece, boundaries)
                tensor_piece[output] = cut_index[output] + 1
            else:
                tensor_piece[output] = piece
    unreached = [name for name in boundaries if name not in tensor_piece]
    if unreached:
        raise GenieBuildError(BOUNDARIES_KEY, f"{unreached} are not computed from the graph inputs (missing or "
                                              "constant); the boundaries must be the residual stream")
    return pieces


def _check_cut_order(name: str, index: int, producer_piece: int, boundaries: Sequence[str]) -> None:
    if producer_piece != index:
        previous = f"boundary {index - 1} {boundaries[index - 1]!r}" if index else "the graph inputs"
        raise GenieBuildError(BOUNDARIES_KEY, f"boundary {index} {name!r} does not follow {previous} in the data "
                                              "flow; the boundaries must be the residual stream after the "
                                              "embedding and after each layer, in order")
