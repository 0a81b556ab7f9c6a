"""What the plans and the estimate know of a model before any weight is read: every weight's name, declared shape
and role (a precision recipe picks its bits by role), and the pieces (embedding, layer i, head) that use it.

From an HF ``config.json`` of a family :mod:`genie_build.families` registers, the weights are named and shaped as
``docs/conventions.md`` says and as the export writes them. From an ONNX graph loaded without its external data,
every float initializer of rank >= 1 is a weight; scalars and integer tensors (eps, Reshape shapes) are graph
constants, which the size model counts per layer as the conventions' graph has them, so that a graph and its
config estimate alike.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from genie_build.boundaries import find_boundaries
from genie_build.conventions import EMBEDDING_BOUNDARY, LM_HEAD_WEIGHT, layer_output
from genie_build.hf_config import ModelShape, shape_of, stored_tensors
from genie_build.onnx_graph import InitializerSpec, WeightLayout, consumer_layouts, initializer_specs, load_graph
from genie_build.plan import initializer_pieces

__all__ = ["ModelWeights", "Role", "Weight", "weights_from_hf_config", "weights_from_onnx"]

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
    """What the estimate knows about a model: its weights and its L + 1 boundary tensors."""

    weights: tuple[Weight, ...]
    boundaries: tuple[str, ...]

    @property
    def num_layers(self) -> int:
        return len(self.boundaries) - 1


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
