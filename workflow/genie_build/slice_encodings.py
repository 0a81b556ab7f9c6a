"""The encodings stage: cut one graph's full AIMET encodings into one file per split part.

Runs once per graph (prompt or token), so each graph's slices are their own checkpoint output and a change
to one graph's encodings leaves the other's untouched. It validates the full encodings against the full
graph, optionally checks them against the other graph's encodings (``consistent_with``: Genie rejects a
tensor the two graphs share with different encodings) or takes the other graph's encodings for every tensor
this graph has (``share_from``, as AI Hub gives the token graph the prompt graph's), then writes
``part_{label}.encodings.json`` (canonical bytes, in the version of the input file) for every
``part_{label}.onnx`` in the parts directory. The output directory appears complete or not at all.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from genie_build.conventions import find_parts
from genie_build.encodings import (Encodings, check_boundary_consistency, check_graphs_consistent,
                                   check_kv_cache_tied, read_encodings, share_encodings, slice_encodings,
                                   validate_against_model, write_encodings)
from genie_build.fileio import atomic_directory
from genie_build.onnx_graph import part_tensor_names, read_graph_tensors

log = logging.getLogger(__name__)


def slice_graph_encodings(graph: str, model: str | os.PathLike[str], encodings: str | os.PathLike[str],
                          parts_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                          consistent_with: str | os.PathLike[str] | None = None,
                          share_from: str | os.PathLike[str] | None = None,
                          kv_cache_tied: bool = False) -> None:
    """Write ``out_dir/part_{label}.encodings.json`` for every part of ``parts_dir`` (see the module doc).

    Args:
        graph: ``"prompt"`` or ``"token"`` (which side of a consistency message this graph is).
        consistent_with: the other graph's encodings, which must agree on every tensor both have.
        share_from: the other graph's encodings, whose entries this graph takes for every tensor it has.
        kv_cache_tied: require each ``past_*_out`` to have its ``past_*_in``'s encoding (a bundle will be built).

    Raises:
        GenieBuildError: invalid encodings, encodings that do not fit the graph or the other graph's, an
            incomplete parts directory, or parts whose shared boundary tensors would get different encodings.
    """
    enc = read_encodings(encodings)
    tensors = read_graph_tensors(model)
    if share_from is not None:
        enc = share_encodings(read_encodings(share_from), enc, tensors.tensor_names)
    validate_against_model(enc, encodings, tensors.tensor_names, tensors.param_shapes, tensors.param_layouts)
    if consistent_with is not None:
        other = read_encodings(consistent_with)
        check_graphs_consistent(*((enc, other) if graph == "prompt" else (other, enc)))
    if kv_cache_tied:
        check_kv_cache_tied(enc, tensors.tensor_names)

    slices = {label: slice_encodings(enc, *part_tensor_names(path))
              for label, path in find_parts(Path(parts_dir)).items()}
    check_boundary_consistency(slices)
    _log_coverage(graph, enc, slices)

    with atomic_directory(Path(out_dir)) as staging:
        for label, part_enc in slices.items():
            write_encodings(staging / slice_file_name(label), part_enc)


def slice_file_name(label: str) -> str:
    """``slice_file_name("01_of_06") == "part_01_of_06.encodings.json"``."""
    return f"part_{label}.encodings.json"


def _log_coverage(graph: str, enc: Encodings, slices: dict[str, Encodings]) -> None:
    """Log each part's share; encodings no part uses point at tensors the split dropped."""
    for label, part_enc in slices.items():
        log.info("%s part %s: %d activation and %d param encodings", graph, label,
                 len(part_enc.activations), len(part_enc.params))
    used = {name for part_enc in slices.values() for name in (*part_enc.activations, *part_enc.params)}
    unused = sorted(set(enc.activations).union(enc.params) - used)
    if unused:
        log.warning("%s: %d encodings are used by no part, e.g. %s", graph, len(unused), ", ".join(unused[:5]))
