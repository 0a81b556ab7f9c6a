"""Another context length for a part :func:`genie_build.export.export.export_part` exported: ``prompt_cl{CL}.onnx`` and
``token_cl{CL}.onnx`` in the part's folder (:func:`length_files`), its graphs at context CL, whose weights are the
part's ``prompt.onnx``'s references into its ``weights.onnx.data`` (same names, dtypes, shapes, offsets, lengths
and checksum). No weight is written and the part's own graphs and data file are left as they are: calibration
reads ``prompt.onnx``, so adding a length recalibrates nothing, and a context binary holding the part's graphs at
several lengths stores each weight once.

The graphs are exported as the part's (:func:`genie_build.export.export.export_part_graphs`): the part's modules are
built from its tensors alone, so memory is one part's float32 weights, as for ``export_part``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import onnx

from genie_build.conventions import GRAPH_KINDS, length_graph_key, read_cl
from genie_build.errors import GenieBuildError
from genie_build.export.export import ExportSummary, export_part_graphs, part_files
from genie_build.hf_checkpoint import check_checkpoint
from genie_build.onnx_graph import check_external_data, graph_io, load_graph
from genie_build.plan.plan_file import PartPlan

__all__ = ["export_length", "length_files"]

log = logging.getLogger(__name__)


def export_length(checkpoint_dir: str | os.PathLike[str], part: PartPlan, out_dir: str | os.PathLike[str], *,
                  num_parts: int, ar: int, context: int) -> ExportSummary:
    """Write ``part``'s prompt (AR ``ar``) and token (AR 1) graphs at context ``context`` into ``out_dir``, the
    folder :func:`genie_build.export.export.export_part` wrote it to (:func:`length_files`), referring to the weights
    of the folder's ``prompt.onnx``. Both graphs are written only once both have their weights.

    Raises:
        GenieBuildError: as ``export_part``; the folder has no ``prompt.onnx`` or ``weights.onnx.data``; its
            prompt graph is at ``context`` already, or has weights elsewhere than in the data file; the new graphs
            read a weight it lacks or holds in another dtype or shape. Each names the file.
    """
    checkpoint = check_checkpoint(checkpoint_dir, ar=ar, context=context)
    base, data = part_files(out_dir)
    weights = _base_weights(base["prompt"], data, context)
    log.info("part %s: adding context %d, its graphs reading the %d weights of %s", part.label, context,
             len(weights), base["prompt"])
    return export_part_graphs(checkpoint, part, length_files(out_dir, context), data, num_parts=num_parts, ar=ar,
                              context=context, base=(base["prompt"], weights))


def length_files(out_dir: str | os.PathLike[str], context: int) -> dict[str, Path]:
    """An exported part's graphs at context ``context`` other than its own, kind -> path: in the part's folder,
    beside the graphs whose data file they read (:func:`genie_build.export.export.part_files`)."""
    return {kind: Path(out_dir) / f"{length_graph_key(kind, context)}.onnx" for kind in GRAPH_KINDS}


def _base_weights(prompt: Path, data: Path, context: int) -> dict[str, onnx.TensorProto]:
    """The initializers of the part's prompt graph, by name, as it stores them: references into ``data``, read
    from the graph alone."""
    for path in (prompt, data):
        if not path.is_file():
            raise GenieBuildError(path, "not found: export the part (export-part) before adding a context length")
    model = load_graph(prompt)
    io = graph_io(model)
    base_context = read_cl(model.graph.name, io.inputs, io.outputs)
    if base_context.value is None:
        raise GenieBuildError(prompt, f"its context length cannot be read: {base_context.source}")
    if base_context.value == context:
        raise GenieBuildError(prompt, f"is at context {context} already ({base_context.source}): export-length "
                                      "adds a context length the part does not have")
    stored = check_external_data(model, prompt)
    inline = [tensor.name for tensor in model.graph.initializer if tensor.data_location != onnx.TensorProto.EXTERNAL]
    if inline or stored != [data]:
        raise GenieBuildError(prompt, f"its weights are not all in {data.name} (inline: {inline[:3]}, data files: "
                                      f"{[path.name for path in stored]}): graphs at another length could not share "
                                      "them")
    return {tensor.name: tensor for tensor in model.graph.initializer}
