"""Weights graphs share by name: the same tensor in the prompt and token graphs, and in the graphs of one kind at
every context length (shape, dtype and value)."""

from __future__ import annotations

import os

import onnx

from genie_build.errors import GenieBuildError
from genie_build.onnx_graph.model import dtype_name, load_graph
from genie_build.onnx_graph.values import scan_tensor

__all__ = ["check_same_weight_names", "check_same_weights", "check_shared_initializers"]

_MAX_LISTED_DIFFERENCES = 3


def check_shared_initializers(prompt_path: str | os.PathLike[str], token_path: str | os.PathLike[str], *,
                              check_values: bool = False) -> None:
    """Check that initializers with the same name in both graphs are the same tensor: shape, dtype and value.

    Weight sharing between the prompt and token graphs keys on names, and some exporters reuse a name for
    different constants in the two graphs; values are compared by a streamed sha256 of each tensor's
    bytes, so memory stays bounded by one copy chunk. Run :func:`check_external_data` on both first.

    Args:
        check_values: also require every float initializer of both graphs to be finite, in the same pass.

    Raises:
        GenieBuildError: naming both files, the tensor(s) and what differs; or (``check_values``) naming the
            graph file, the first non-finite weight and its value.
    """
    prompt, token = load_graph(prompt_path), load_graph(token_path)
    shared = {t.name for t in prompt.graph.initializer} & {t.name for t in token.graph.initializer}
    digests = {kind: {tensor.name: digest for tensor in model.graph.initializer
                      if (digest := scan_tensor(tensor, path, digest=tensor.name in shared,
                                                finite=check_values)) is not None}
               for kind, model, path in (("prompt", prompt, prompt_path), ("token", token, token_path))}
    prompt_tensors = {tensor.name: tensor for tensor in prompt.graph.initializer}
    differences = []
    for tensor in token.graph.initializer:
        other = prompt_tensors.get(tensor.name)
        if other is None:
            continue
        difference = _tensor_difference(other, tensor, digests["prompt"].get(tensor.name),
                                        digests["token"].get(tensor.name))
        if difference:
            differences.append(f"{tensor.name!r} {difference}")
    if differences:
        listed = "; ".join(differences[:_MAX_LISTED_DIFFERENCES])
        more = len(differences) - _MAX_LISTED_DIFFERENCES
        raise GenieBuildError(token_path, f"{len(differences)} initializer(s) named like ones in {prompt_path} hold "
                                          f"different data: {listed}{f'; and {more} more' if more > 0 else ''}. "
                                          "The prompt and token graphs must share identical weights "
                                          "(export both with the same exporter settings)")


def check_same_weight_names(base: onnx.ModelProto, other: onnx.ModelProto, base_path: str | os.PathLike[str],
                            other_path: str | os.PathLike[str]) -> None:
    """Check that a graph at another context length names the same weights (initializers stored as external data) as
    the graph of its kind at the largest (``base``): a graph of fewer or other layers is not the same model at
    another length. Reads the graphs' structure only.

    Raises:
        GenieBuildError: naming ``other_path``, how many weights it lacks or adds and the first of them.
    """
    names = [{tensor.name for tensor in model.graph.initializer if tensor.data_location == onnx.TensorProto.EXTERNAL}
             for model in (base, other)]
    for missing, verb in ((sorted(names[0] - names[1]), "lacks"), (sorted(names[1] - names[0]), "adds")):
        if missing:
            raise GenieBuildError(other_path, f"{verb} {len(missing)} weight(s) of {os.fspath(base_path)}, e.g. "
                                              f"{missing[0]!r}: the graphs at every context length must hold the "
                                              "same weights")


def check_same_weights(base_path: str | os.PathLike[str], other_path: str | os.PathLike[str]) -> int:
    """Check that a graph at another context length holds the weights (initializers stored as external data) of the
    graph of its kind at the largest (``base_path``), each the same tensor: the context binary stores a weight once
    for all lengths only when name, shape, dtype and bytes agree, so one that differs would be stored twice. Inline
    constants may differ (a shape at the graph's own length). Returns the number of weights checked.

    Raises:
        GenieBuildError: naming ``other_path``, a weight one graph has and the other lacks, or what differs.
    """
    base, other = load_graph(base_path), load_graph(other_path)
    check_same_weight_names(base, other, base_path, other_path)
    base_tensors = {tensor.name: tensor for tensor in base.graph.initializer}
    weights = [tensor for tensor in other.graph.initializer if tensor.data_location == onnx.TensorProto.EXTERNAL]
    differences = [f"{tensor.name!r} {difference}" for tensor in weights if (difference := _tensor_difference(
        base_tensors[tensor.name], tensor, scan_tensor(base_tensors[tensor.name], base_path, digest=True),
        scan_tensor(tensor, other_path, digest=True), ("graph at the largest length", "graph")))]
    if differences:
        raise GenieBuildError(other_path, f"{len(differences)} weight(s) differ from {base_path}'s: "
                                          + "; ".join(differences[:_MAX_LISTED_DIFFERENCES])
                                          + ". The graphs at every context length must hold the same weights")
    return len(weights)


def _tensor_difference(prompt: onnx.TensorProto, token: onnx.TensorProto, prompt_digest: str | None,
                       token_digest: str | None, graphs: tuple[str, str] = ("prompt graph", "token graph")
                       ) -> str | None:
    """How two same-named tensors differ (the first graph's value first), or None when they are identical."""
    first, second = graphs
    if list(prompt.dims) != list(token.dims):
        return f"has shape {list(prompt.dims)} in the {first} but {list(token.dims)} in the {second}"
    if prompt.data_type != token.data_type:
        return (f"has dtype {dtype_name(prompt.data_type)} in the {first} "
                f"but {dtype_name(token.data_type)} in the {second}")
    if prompt_digest != token_digest:
        return f"has the same shape {list(prompt.dims)} and dtype but different values"
    return None
