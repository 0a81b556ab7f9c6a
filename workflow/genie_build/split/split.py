"""Split a model's graphs (prompt and token, at every context length) into the plan's parts, streaming the weights.

Memory stays bounded by a copy chunk, not by the model: the graphs are loaded without their external data, each
part's nodes are extracted by name, and each external tensor's bytes are copied from the source data file into the
part's one data file (``weights.onnx.data``, which all of the part's graphs read, as a checkpoint's export writes a
part) in chunks (:func:`genie_build.fileio.copy_range`), 4 KiB aligned, with a relative ``location`` and the data
file's SHA-1 as ``checksum``. A weight the graphs share (an initializer of one name) is stored once. Tensors stored
inline in the source stay inline.

Which tensors a part gives and takes:

- outputs: its output boundary (none for the last part) and every graph output its own nodes produce. A
  node belongs to part ``i`` when it depends on part ``i``'s input boundary (every node does for part 1)
  and not on its output boundary; a graph output belongs to the part of the node that produces it.
- inputs: its input boundary (none for part 1) and exactly the graph inputs its nodes need, found by a
  backward walk from its outputs that stops at the input boundary. Nodes that depend on graph inputs only
  (the RoPE and mask preamble) are copied into every part that needs them.

``onnx.utils.Extractor`` is not used for the node walk because it does not see the outer-scope tensors
that If/Loop bodies read; :func:`node_inputs` does.

Output is deterministic byte for byte, and a part's bytes depend only on its own nodes and tensors, so a
weight change in one layer changes only the part that holds it (the workflow rebuilds only that part).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import onnx

from genie_build import __version__
from genie_build.conventions import (PART_WEIGHTS_NAME, graph_name, key_kind, part_folder, part_graph_path,
                                     part_weights_path)
from genie_build.errors import GenieBuildError
from genie_build.fileio import HashingWriter, copy_range, open_regular, staging_directory
from genie_build.onnx_graph import (ar_and_context_length, check_external_data, dtype_name, external_data, graph_io,
                                    load_graph, model_folders, model_tensors, subgraphs)
from genie_build.plan.plan_file import PartPlan, Plan

__all__ = ["CHECKSUM_KEY", "DATA_ALIGNMENT", "PartSpec", "build_part", "check_part", "cut_graph", "ensure_value_info",
           "node_inputs", "split_graphs"]

logger = logging.getLogger(__name__)

DATA_ALIGNMENT = 4096
# External tensors smaller than this go inline into the part (onnx.save's default size_threshold).
INLINE_MAX_BYTES = 1024
# ONNX external data: "checksum (optional) - SHA1 digest of file specified in under 'location' key" (onnx/IR.md)
CHECKSUM_KEY = "checksum"


@dataclass(frozen=True)
class PartSpec:
    """What one part takes and gives, by tensor name, in the order the part declares them."""

    label: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    node_indices: tuple[int, ...]   # into the source graph's node list, in topological (source) order


@dataclass(frozen=True)
class _Whole:
    """One whole graph and the plan's parts of it: its key, kind, file, structure (no weights) and each part's spec."""

    key: str
    kind: str
    path: Path
    model: onnx.ModelProto
    specs: list[PartSpec]


def split_graphs(models: Mapping[str, str | os.PathLike[str]], plan: Plan, parts_dir: str | os.PathLike[str]
                 ) -> dict[str, list[Path]]:
    """Split a model's graphs into ``parts_dir/part_{label}/{key}.onnx``, every graph of a part reading the part's one
    data file (:func:`genie_build.conventions.part_weights_path`), as a checkpoint's export writes a part.

    A weight the graphs share (an initializer of one name) is stored once, where the first graph of ``models`` that
    holds it put it; that they hold the same bytes for it is the check-model stage's (the bundle waits for it), and a
    graph whose bytes differ would differ from its chained parts in verify-split. Every part's files are written and
    checked in a staging folder inside ``parts_dir`` first and moved into place only when all are (a part's data file
    before its graphs, which are what readers name), so no part of a failed split replaces a good one. Graph and data
    files the split did not write (in the folders of another plan's parts, of a graph no longer given) are removed.

    Args:
        models: the whole graphs by key, each with its external data beside it: ``prompt`` and ``token``, and those
            at another context length (``prompt_cl512``, :func:`genie_build.conventions.length_graph_key`). The key
            names the part graphs' files, its kind the part graphs.
        plan: the split plan (boundary tensor names per part).
        parts_dir: the model's parts folder.

    Returns:
        Each key's part ``.onnx`` paths, in part order.

    Raises:
        GenieBuildError: a model cannot be read, the plan does not cut one cleanly, or two graphs store a weight of
            one name as different tensors (dtype or shape).
        ValueError: no graph, or a key of no kind.
    """
    if not models:
        raise ValueError("no graph to split")
    wholes = [_cut(key, Path(path), plan) for key, path in models.items()]
    target = Path(parts_dir)
    with staging_directory(target, "split", mirrors=target) as staging:
        for index, part in enumerate(plan.parts):
            _write_part(wholes, index, plan, staging)
        labels = [part.label for part in plan.parts]
        for label in labels:
            _move_part(staging / part_folder(label), target / part_folder(label))
        for folder in target.glob("part_*"):
            if folder.is_dir() and folder.name.removeprefix("part_") not in labels:
                _remove_split_files(folder, keep=set())
                with contextlib.suppress(OSError):
                    folder.rmdir()
    return {key: [part_graph_path(target, label, key) for label in labels] for key in models}


def _cut(key: str, model_path: Path, plan: Plan) -> _Whole:
    """One whole graph read (structure only, its external data checked) and cut into the plan's parts."""
    kind = key_kind(key)
    model = load_graph(model_path)
    check_external_data(model, model_path)
    specs = _plan_parts(model, plan, model_path)
    # Shape inference only adds value_info, so the specs' node indices stay valid.
    model = ensure_value_info(model, [name for spec in specs for name in (*spec.inputs, *spec.outputs)], model_path)
    return _Whole(key, kind, model_path, model, specs)


def _write_part(wholes: Sequence[_Whole], index: int, plan: Plan, out_dir: Path) -> None:
    """Write part ``index`` of every graph and the part's data file into ``out_dir`` (a staging folder), checking
    each graph."""
    part = plan.parts[index]
    (out_dir / part_folder(part.label)).mkdir()
    graphs = [build_part(whole.model, whole.specs[index], _part_graph_name(whole.model, whole.kind, part,
                                                                          plan.num_parts)) for whole in wholes]
    _store_weights([(graph, whole.path) for graph, whole in zip(graphs, wholes)],
                   part_weights_path(out_dir, part.label))
    for graph, whole in zip(graphs, wholes):
        onnx_path = part_graph_path(out_dir, part.label, whole.key)
        onnx_path.write_bytes(graph.SerializeToString(deterministic=True))
        check_part(onnx_path, whole.path)
        spec = whole.specs[index]
        logger.info("%s part %s: %d nodes, inputs %s, %d outputs", whole.key, spec.label, len(spec.node_indices),
                    list(spec.inputs), len(spec.outputs))


def _move_part(written: Path, final: Path) -> None:
    """Move a part's files from the staging folder into the part's folder, its data file first, and remove the graph
    and data files there that the split did not write."""
    final.mkdir(exist_ok=True)
    names = [PART_WEIGHTS_NAME, *sorted(name for name in os.listdir(written) if name != PART_WEIGHTS_NAME)]
    for name in names:
        os.replace(written / name, final / name)
    _remove_split_files(final, keep=set(names))


def _remove_split_files(folder: Path, keep: set[str]) -> None:
    """Remove the graph and data files (``*.onnx``, ``*.onnx.data``) of a part folder but those in ``keep``."""
    for path in folder.iterdir():
        if path.name not in keep and path.name.endswith((".onnx", ".onnx.data")) and path.is_file():
            path.unlink()


def ensure_value_info(model: onnx.ModelProto, names: Iterable[str], where: Path) -> onnx.ModelProto:
    """Run shape inference (on the graph only) when a cut tensor has no type and shape recorded.

    A part's boundary inputs and outputs need a type and shape; exports often omit intermediate ones.

    Raises:
        GenieBuildError: a cut tensor has no type even after shape inference.
    """
    wanted = list(names)
    if _missing_types(model, wanted):
        model = onnx.shape_inference.infer_shapes(model)
    missing = _missing_types(model, wanted)
    if missing:
        raise GenieBuildError(where, f"no type and shape for boundary tensor(s) {missing}, even after "
                                     "shape inference")
    return model


def _missing_types(model: onnx.ModelProto, names: list[str]) -> list[str]:
    graph = model.graph
    known = {v.name for v in (*graph.value_info, *graph.input, *graph.output)}
    return [name for name in names if name not in known]


def _plan_parts(model: onnx.ModelProto, plan: Plan, where: Path) -> list[PartSpec]:
    """Work out each part's inputs, outputs and nodes from the plan's boundary tensors.

    Args:
        model: the full graph (external data not loaded).
        plan: cuts between parts, as ``input_boundary``/``output_boundary`` tensor names.
        where: the model path, for error messages.

    Returns:
        One :class:`PartSpec` per plan part, in part order.

    Raises:
        GenieBuildError: the plan's cuts do not chain or are not in the graph, a tensor other than the
            boundary crosses a cut, or a graph output is computed by no node.
    """
    _check_plan_chain(plan, where)
    return cut_graph(model, [part.label for part in plan.parts],
                     [part.output_boundary for part in plan.parts[:-1]], where)


def cut_graph(model: onnx.ModelProto, labels: Sequence[str], cuts: Sequence[str], where: Path) -> list[PartSpec]:
    """The subgraphs of a graph cut at ``cuts`` (tensor names, in data-flow order; ``len(labels) - 1`` of them), each
    labelled, with their inputs, outputs and nodes as :func:`_plan_parts` describes a part's.

    Raises:
        GenieBuildError: as :func:`_plan_parts`.
    """
    graph, cuts = model.graph, list(cuts)
    producers = _producers(graph)
    depths = _node_depths(graph, labels, cuts, producers, where)
    owners = {}
    for output in graph.output:
        if output.name not in producers:
            raise GenieBuildError(where, f"graph output {output.name!r} is not computed by any node, so it "
                                         "belongs to no part")
        owners[output.name] = depths[producers[output.name]]
    graph_inputs = [spec.name for spec in graph_io(model).inputs]
    specs = []
    for position, label in enumerate(labels):
        outputs = cuts[position:position + 1] + [v.name for v in graph.output if owners[v.name] == position]
        nodes, needed = _walk_back(graph, outputs, labels, cuts, position, depths, producers, where)
        inputs = cuts[position - 1:position] if position else []
        inputs += [name for name in graph_inputs if name in needed]
        specs.append(PartSpec(label, tuple(inputs), tuple(outputs), tuple(sorted(nodes))))
    return specs


def _check_plan_chain(plan: Plan, where: Path) -> None:
    """Part 1 takes no cut, the last gives none, and each part takes what the one before gives."""
    parts = plan.parts
    if not parts or len(parts) != plan.num_parts:
        raise GenieBuildError(where, f"plan has {len(parts)} parts but num_parts is {plan.num_parts}")
    if parts[0].input_boundary is not None or parts[-1].output_boundary is not None:
        raise GenieBuildError(where, "plan: the first part must take no boundary and the last give none "
                                     f"(got {parts[0].input_boundary!r}, {parts[-1].output_boundary!r})")
    for before, after in zip(parts, parts[1:]):
        if before.output_boundary is None or before.output_boundary != after.input_boundary:
            raise GenieBuildError(where, f"plan: part {after.label} takes {after.input_boundary!r} but part "
                                         f"{before.label} gives {before.output_boundary!r}")


def _node_depths(graph: onnx.GraphProto, labels: Sequence[str], cuts: Sequence[str], producers: dict[str, int],
                 where: Path) -> list[int]:
    """For each node, how many of the ``cuts`` it depends on: the 0-based piece it belongs to.

    Piece ``i`` owns the nodes that depend on its input cut but not on its output cut. Nodes that depend on no
    cut (the embedding, and the RoPE/mask preamble) get 0.

    Raises:
        GenieBuildError: a cut tensor is not produced by a node, or a cut does not depend on the one
            before it (the cuts are out of order).
    """
    consumers = _consumers(graph)
    depths = [0] * len(graph.node)
    for position, cut in enumerate(cuts):
        if cut not in producers:
            raise GenieBuildError(where, f"part {labels[position]}: boundary tensor {cut!r} is not "
                                         "produced by any node of the graph")
        if depths[producers[cut]] != position:
            raise GenieBuildError(where, f"plan: boundary {cut!r} of part {labels[position]} does "
                                         f"not depend on the boundary before it ({cuts[position - 1]!r})")
        for index in _descendants(cut, consumers, graph):
            depths[index] += 1
    return depths


def _walk_back(graph: onnx.GraphProto, outputs: list[str], labels: Sequence[str], cuts: Sequence[str],
               position: int, depths: list[int], producers: dict[str, int], where: Path
               ) -> tuple[set[int], set[str]]:
    """Collect the nodes that compute piece ``position``'s ``outputs``, stopping at its input cut.

    Nodes of depth 0 that are reached (the preamble) are copied into the piece; reaching a node of an
    earlier piece (depth 1 .. position - 1) means a tensor other than the cut crosses it.

    Returns:
        The node indices, and the names they read that no collected node produces (graph inputs and
        initializers; the input cut is left out).

    Raises:
        GenieBuildError: a tensor other than the cut crosses it, or a tensor is neither produced, an
            initializer nor a graph input.
    """
    input_cut = cuts[position - 1] if position else None
    initializers = {t.name for t in graph.initializer}
    graph_inputs = {v.name for v in graph.input}
    nodes: set[int] = set()
    needed: set[str] = set()
    stack = list(outputs)
    while stack:
        name = stack.pop()
        if name == input_cut or name in needed:
            continue
        if name in producers:
            index = producers[name]
            if 0 < depths[index] < position:
                raise GenieBuildError(where, f"part {labels[position]} reads {name!r}, computed in part "
                                             f"{labels[depths[index]]}: only the boundary {input_cut!r} may "
                                             "cross the cut")
            if index not in nodes:
                nodes.add(index)
                stack.extend(node_inputs(graph.node[index]))
        elif name in initializers or name in graph_inputs:
            needed.add(name)
        else:
            raise GenieBuildError(where, f"part {labels[position]} needs tensor {name!r}, which no node, "
                                         "initializer or graph input provides")
    return nodes, needed


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """A node's input names plus the outer-scope names its If/Loop/Scan bodies read, in first-use order."""
    names = [name for name in node.input if name]
    for graph in subgraphs(node):
        names.extend(name for name in _outer_scope_names(graph) if name not in names)
    return names


def _outer_scope_names(graph: onnx.GraphProto) -> list[str]:
    """Names a subgraph (and the subgraphs in it) reads that it does not define itself."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {name for node in graph.node for name in node.output}
    names: list[str] = []
    for node in graph.node:
        names.extend(name for name in node_inputs(node) if name not in defined and name not in names)
    return names


def _producers(graph: onnx.GraphProto) -> dict[str, int]:
    return {name: index for index, node in enumerate(graph.node) for name in node.output if name}


def _consumers(graph: onnx.GraphProto) -> dict[str, list[int]]:
    consumers: dict[str, list[int]] = {}
    for index, node in enumerate(graph.node):
        for name in node_inputs(node):
            consumers.setdefault(name, []).append(index)
    return consumers


def _descendants(name: str, consumers: dict[str, list[int]], graph: onnx.GraphProto) -> set[int]:
    """Indices of the nodes that depend on tensor ``name``, directly or through other nodes."""
    found: set[int] = set()
    stack = list(consumers.get(name, ()))
    while stack:
        index = stack.pop()
        if index not in found:
            found.add(index)
            stack.extend(i for output in graph.node[index].output for i in consumers.get(output, ()))
    return found


def build_part(model: onnx.ModelProto, spec: PartSpec, name: str) -> onnx.ModelProto:
    """Assemble a part model from the source graph's nodes, initializers and type information.

    External initializers still point at the source data file; :func:`_copy_external_data` moves them.
    Value infos are kept for the part's intermediate tensors so the part needs no shape inference.
    """
    graph = model.graph
    nodes = [graph.node[index] for index in spec.node_indices]
    types = {v.name: v for v in (*graph.value_info, *graph.input, *graph.output)}
    read = {name for node in nodes for name in node_inputs(node)}
    produced = {name for node in nodes for name in node.output}
    boundary = set(spec.inputs) | set(spec.outputs)
    part_graph = onnx.helper.make_graph(
        nodes, name,
        inputs=[types[name] for name in spec.inputs],
        outputs=[types[name] for name in spec.outputs],
        initializer=[t for t in graph.initializer if t.name in read],
        value_info=[v for v in graph.value_info if v.name in produced and v.name not in boundary],
    )
    return onnx.helper.make_model(
        part_graph, ir_version=model.ir_version, opset_imports=model.opset_import,
        functions=_used_functions(model, nodes), producer_name="genie-build", producer_version=__version__)


def _used_functions(model: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> list[onnx.FunctionProto]:
    """The model-local functions the nodes call, directly or through other functions, in model order."""
    functions = {(f.domain, f.name): f for f in model.functions}
    used: set[tuple[str, str]] = set()
    pending = list(nodes)
    while pending:
        node = pending.pop()
        pending.extend(n for graph in subgraphs(node) for n in graph.node)
        key = (node.domain, node.op_type)
        if key in functions and key not in used:
            used.add(key)
            pending.extend(functions[key].node)
    return [f for f in model.functions if (f.domain, f.name) in used]


def _store_weights(graphs: Sequence[tuple[onnx.ModelProto, Path]], data_path: Path) -> None:
    """Copy the part graphs' external tensors into ``data_path``, the part's one data file, and point them at it.

    ``graphs``: each part graph and the whole graph it was cut from. Every tensor a graph stores is copied
    (:func:`genie_build.onnx_graph.model_tensors`: initializers, node attributes such as ``Constant``'s value,
    subgraphs, functions), its source range resolved and checked by :func:`genie_build.onnx_graph.external_data`,
    but an initializer an earlier graph stored under its name: it points at that one's bytes. Each tensor starts at a
    multiple of :data:`DATA_ALIGNMENT`; ``location`` is the data file's name (relative, beside the part). Every
    external tensor also gets the data file's SHA-1 as ``checksum`` (the ONNX external-data key for it), so a part's
    graphs change whenever its weights do: the workflow's jobs depend on the ``.onnx`` files alone and Snakemake
    never hashes the weights again. The file is written even when no tensor is external, so every part has one.

    Tensors under :data:`INLINE_MAX_BYTES` are moved into the part instead, as onnx's own writer keeps them: shape
    inference (the part's check, a converter's) reads Reshape shapes and other small constants only from the graph.

    Raises:
        GenieBuildError: naming the source model and the tensor: a data file missing, outside the model's folder,
            not a regular file, or shorter than a tensor says; an initializer of a name an earlier graph stored with
            another dtype or shape (naming both).
    """
    external, stored_first = [], {}
    with open(data_path, "wb") as out, contextlib.ExitStack() as stack:
        dst = HashingWriter(hashlib.sha1(), out)
        sources: dict[Path, BinaryIO] = {}
        for part, source_path in graphs:
            for stored in model_tensors(part):
                tensor = stored.tensor
                if tensor.data_location != onnx.TensorProto.EXTERNAL:
                    continue
                ref = external_data(stored, source_path)
                if ref.real_path not in sources:
                    sources[ref.real_path] = stack.enter_context(open_regular(ref.path,
                                                                              inside=model_folders(source_path)))
                src = sources[ref.real_path]
                first = stored_first.get(tensor.name) if stored.initializer else None
                if ref.length < INLINE_MAX_BYTES:
                    src.seek(ref.offset)
                    tensor.raw_data = src.read(ref.length)
                    del tensor.external_data[:]
                    tensor.data_location = onnx.TensorProto.DEFAULT
                    continue
                if first is not None:
                    _check_same_tensor(first, tensor, source_path)
                    entries = [(entry.key, entry.value) for entry in first[0].external_data]
                else:
                    dst.write(b"\0" * (-dst.tell() % DATA_ALIGNMENT))
                    entries = [("location", data_path.name), ("offset", str(dst.tell())), ("length", str(ref.length))]
                    copy_range(src, dst, ref.offset, ref.length)
                    if stored.initializer:
                        stored_first[tensor.name] = (tensor, source_path)
                del tensor.external_data[:]
                for key, value in entries:
                    tensor.external_data.add(key=key, value=value)
                external.append(tensor)
    checksum = dst.digest.hexdigest()
    for tensor in external:
        tensor.external_data.add(key=CHECKSUM_KEY, value=checksum)


def _check_same_tensor(first: tuple[onnx.TensorProto, Path], tensor: onnx.TensorProto, source_path: Path) -> None:
    """An initializer stored once for the part's graphs must be one tensor in each: the same dtype and shape.

    Raises:
        GenieBuildError: naming ``source_path``, the tensor and the graph that stored it first.
    """
    stored, stored_path = first
    if stored.data_type != tensor.data_type or list(stored.dims) != list(tensor.dims):
        raise GenieBuildError(source_path, f"weight {tensor.name!r} is {dtype_name(tensor.data_type)} "
                                           f"{list(tensor.dims)}, but {dtype_name(stored.data_type)} "
                                           f"{list(stored.dims)} in {stored_path}: a model's graphs share a weight "
                                           "by its name, so one name must be one tensor")


def check_part(onnx_path: Path, source_path: Path | None = None) -> None:
    """Run the ONNX checker with shape inference on a written part (reads the graph, not the weights).

    Raises:
        GenieBuildError: the part is not a valid model; naming ``source_path`` (the user's model the part was cut
            from, where the fault is) and the part, when given.
    """
    try:
        onnx.checker.check_model(onnx_path, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        if source_path is None:
            raise GenieBuildError(onnx_path.name, f"invalid part: {exc}") from None
        label = onnx_path.parent.name.removeprefix("part_")
        raise GenieBuildError(source_path, f"part {label} cut from it is not a valid "
                                           f"ONNX model: {exc}") from None


def _part_graph_name(model: onnx.ModelProto, kind: str, part: PartPlan, num_parts: int) -> str:
    """Genie's graph name (``prompt_ar32_cl256_01_of_06``) when AR and CL can be read from the graph;
    otherwise ``{kind}_{label}``."""
    dims = ar_and_context_length(model)
    return graph_name(kind, *dims, part.index, num_parts) if dims else f"{kind}_{part.label}"

