"""The check-model stage: both graphs' weights are all there and finite, and the ones they share agree."""

from __future__ import annotations

import os
from collections.abc import Sequence

from genie_build.fileio import write_json
from genie_build.onnx_graph import (check_external_data, check_same_weights, check_shared_initializers,
                                    initializer_specs, load_graph, model_tensors, scan_tensor)

__all__ = ["check_model"]


def check_model(prompt_path: str, token_path: str, out: str | os.PathLike[str],
                lengths: Sequence[tuple[str, str]] = ()) -> dict:
    """The check-model stage: both graphs' weights are all there (:func:`check_external_data`), every float weight
    is finite, and the shared ones agree (:func:`check_shared_initializers`, one pass over the weights for
    both); each graph at another context length (``lengths``: its kind and path) holds its kind's weights
    (:func:`check_same_weights`); writes and returns a summary of what they share.

    Raises:
        GenieBuildError: a weight file is missing or short, a float weight holds NaN or infinity (naming the
            graph file, the tensor and the value), or a shared weight differs.
    """
    graphs = {"prompt": load_graph(prompt_path), "token": load_graph(token_path)}
    check_external_data(graphs["prompt"], prompt_path)
    check_external_data(graphs["token"], token_path)
    check_shared_initializers(prompt_path, token_path, check_values=True)
    for kind, path in (("prompt", prompt_path), ("token", token_path)):
        for stored in model_tensors(graphs[kind]):
            if not stored.initializer and not stored.sparse:
                scan_tensor(stored, path, finite=True)
    specs = {kind: initializer_specs(model) for kind, model in graphs.items()}
    shared = sorted(set(specs["prompt"]) & set(specs["token"]))
    summary = {"prompt": prompt_path, "token": token_path, "shared_initializers": len(shared),
               "shared_bytes": sum(specs["prompt"][name].nbytes for name in shared), "lengths": {}}
    for kind, path in lengths:
        check_external_data(load_graph(path), path)
        summary["lengths"][path] = check_same_weights({"prompt": prompt_path, "token": token_path}[kind], path)
    write_json(out, summary)
    return summary
