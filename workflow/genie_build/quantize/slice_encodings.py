"""The encodings stage: cut the graphs' full AIMET encodings into one file per split part.

The workflow slices both graphs in one job (:func:`slice_model_encodings`): one checkpoint, so Snakemake learns of
both graphs' slices at once, and each encodings file is read once. :func:`slice_graph_encodings` slices one graph,
for a run by hand. Each gives the embedding's output its table's encoding when it has none (AIMET's never has
one: :mod:`genie_build.quantize.embedding_encoding`), validates a graph's full encodings against the full graph, checks
them against the other graph's encodings (Genie rejects a tensor the two graphs share with different encodings) or takes
the other graph's encodings for every tensor this graph has (as AI Hub gives the token graph the prompt graph's),
then writes ``part_{label}/{graph}.encodings.json`` (canonical bytes, in the version of the input file) for every
``part_{label}/{graph}.onnx`` of the parts folder. The workflow's output folder appears complete or not at all; a
graph's slices are rewritten with the same bytes when only the other graph's encodings changed, so nothing behind
them reruns.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from genie_build.conventions import find_parts, part_encodings_path
from genie_build.encodings import (Encodings, check_boundary_consistency, check_graphs_consistent,
                                   check_kv_cache_tied, read_encodings, share_encodings, slice_encodings,
                                   validate_against_model, write_encodings)
from genie_build.fileio import atomic_directory
from genie_build.onnx_graph import embedding_gather, graph_tensors, load_graph, part_tensor_names
from genie_build.quantize.embedding_encoding import encode_embedding_output

__all__ = ["GraphSliceFiles", "slice_graph_encodings", "slice_model_encodings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphSliceFiles:
    """One graph's files for the encodings stage: the full graph and its encodings."""

    model: Path
    encodings: Path


def slice_model_encodings(prompt: GraphSliceFiles, token: GraphSliceFiles, parts_dir: str | os.PathLike[str],
                          out_dir: str | os.PathLike[str], *, token_shares_prompt: bool = False,
                          kv_cache_tied: bool = False) -> None:
    """Write both graphs' slices into ``out_dir`` (see the module doc), which appears whole once both graphs' check
    out, or not at all.

    Args:
        token_shares_prompt: the token graph takes the prompt graph's encoding for every tensor it has; otherwise
            the tensors both graphs have must have identical encodings in both.
        kv_cache_tied: require each ``past_*_out`` to have its ``past_*_in``'s encoding (a bundle will be built).

    Raises:
        GenieBuildError: as :func:`slice_graph_encodings`, for either graph.
    """
    prompt_encodings, prompt_slices = _graph_slices("prompt", read_encodings(prompt.encodings), prompt.encodings,
                                                    prompt.model, parts_dir, kv_cache_tied=kv_cache_tied)
    consistent_with, share_from = (None, prompt_encodings) if token_shares_prompt else (prompt_encodings, None)
    _, token_slices = _graph_slices("token", read_encodings(token.encodings), token.encodings, token.model,
                                    parts_dir, consistent_with=consistent_with, share_from=share_from,
                                    kv_cache_tied=kv_cache_tied)
    with atomic_directory(Path(out_dir)) as staging:
        _write_slices(staging, "prompt", prompt_slices)
        _write_slices(staging, "token", token_slices)


def slice_graph_encodings(graph: str, model: str | os.PathLike[str], encodings: str | os.PathLike[str],
                          parts_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                          consistent_with: str | os.PathLike[str] | None = None,
                          share_from: str | os.PathLike[str] | None = None,
                          kv_cache_tied: bool = False) -> None:
    """Write ``out_dir/part_{label}/{graph}.encodings.json`` for every part of ``graph`` in ``parts_dir``, each file
    atomically (see the module doc).

    Args:
        graph: ``"prompt"`` or ``"token"`` (which side of a consistency message this graph is).
        consistent_with: the other graph's encodings, which must agree on every tensor both have.
        share_from: the other graph's encodings, whose entries this graph takes for every tensor it has.
        kv_cache_tied: require each ``past_*_out`` to have its ``past_*_in``'s encoding (a bundle will be built).

    Raises:
        GenieBuildError: invalid encodings, encodings that do not fit the graph or the other graph's, an
            incomplete set of parts, or parts whose shared boundary tensors would get different encodings.
    """
    _, slices = _graph_slices(graph, read_encodings(encodings), encodings, model, parts_dir,
                              consistent_with=_read_if_given(consistent_with), share_from=_read_if_given(share_from),
                              kv_cache_tied=kv_cache_tied)
    _write_slices(Path(out_dir), graph, slices)


def _read_if_given(path: str | os.PathLike[str] | None) -> Encodings | None:
    return None if path is None else read_encodings(path)


def _graph_slices(graph: str, enc: Encodings, encodings_path: str | os.PathLike[str], model: str | os.PathLike[str],
                  parts_dir: str | os.PathLike[str], *, consistent_with: Encodings | None = None,
                  share_from: Encodings | None = None,
                  kv_cache_tied: bool) -> tuple[Encodings, dict[str, Encodings]]:
    """One graph's checked encodings (the embedding's output given its table's encoding when it has none,
    :mod:`genie_build.quantize.embedding_encoding`), and cut per part: label -> the part's encodings."""
    graph_model = load_graph(model)
    tensors = graph_tensors(graph_model)
    enc = encode_embedding_output(enc, embedding_gather(graph_model))
    if share_from is not None:
        enc = share_encodings(share_from, enc, tensors.tensor_names)
    validate_against_model(enc, encodings_path, tensors.tensor_names, tensors.param_shapes, tensors.param_layouts)
    if consistent_with is not None:
        check_graphs_consistent(*((enc, consistent_with) if graph == "prompt" else (consistent_with, enc)))
    if kv_cache_tied:
        check_kv_cache_tied(enc, tensors.tensor_names)
    slices = {label: slice_encodings(enc, *part_tensor_names(path))
              for label, path in find_parts(Path(parts_dir), graph).items()}
    check_boundary_consistency(slices)
    _log_coverage(graph, enc, slices)
    return enc, slices


def _write_slices(out_dir: Path, graph: str, slices: dict[str, Encodings]) -> None:
    for label, part_enc in slices.items():
        path = part_encodings_path(out_dir, label, graph)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_encodings(path, part_enc)


def _log_coverage(graph: str, enc: Encodings, slices: dict[str, Encodings]) -> None:
    """Log each part's share; encodings no part uses point at tensors the split dropped."""
    for label, part_enc in slices.items():
        log.info("%s part %s: %d activation and %d param encodings", graph, label,
                 len(part_enc.activations), len(part_enc.params))
    used = {name for part_enc in slices.values() for name in (*part_enc.activations, *part_enc.params)}
    unused = sorted(set(enc.activations).union(enc.params) - used)
    if unused:
        log.warning("%s: %d encodings are used by no part, e.g. %s", graph, len(unused), ", ".join(unused[:5]))
