"""Weights the prompt and token graphs share by name: the same tensor in both (shape, dtype and value)."""

from __future__ import annotations

import os

import onnx

from genie_build.errors import GenieBuildError
from genie_build.onnx_graph.model import dtype_name, load_graph
from genie_build.onnx_graph.values import scan_tensor

__all__ = ["check_shared_initializers"]

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


def _tensor_difference(prompt: onnx.TensorProto, token: onnx.TensorProto, prompt_digest: str | None,
                       token_digest: str | None) -> str | None:
    """How two same-named tensors differ (prompt value first), or None when they are identical."""
    if list(prompt.dims) != list(token.dims):
        return f"has shape {list(prompt.dims)} in the prompt graph but {list(token.dims)} in the token graph"
    if prompt.data_type != token.data_type:
        return (f"has dtype {dtype_name(prompt.data_type)} in the prompt graph "
                f"but {dtype_name(token.data_type)} in the token graph")
    if prompt_digest != token_digest:
        return f"has the same shape {list(prompt.dims)} and dtype but different values"
    return None
