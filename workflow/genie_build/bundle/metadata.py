"""``metadata.yaml``: what each ctx-bin of a bundle holds, per graph. The bundler writes it (:func:`dump_metadata`),
the bundle checker reads it (:func:`parse_metadata`), so neither depends on the other::

    model_files:
      demo_part_1_of_6.bin:
        toolchain: reference
        tool_version: ...
        graphs:
          prompt_ar32_cl256_1_of_6:
            inputs:
              input_ids: {shape: [1, 32], dtype: int32}
              attention_mask: {shape: [1, 32, 256], dtype: uint16,
                               quantization: {dtype: uint16, scale: 0.0007, offset: -65535, bitwidth: 16}}
            outputs: {...}

``model_files``, ``inputs``/``outputs`` keyed by tensor name and ``shape``/``dtype`` follow AIHM's
metadata.yaml; the ``graphs`` level is added because Genie's checks are per graph. The reader also accepts
AIHM's ``quantization_parameters: {scale, zero_point}``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from genie_build.errors import GenieBuildError
from genie_build.fileio import is_json_int
from genie_build.toolchains.base import BinaryInfo, GraphInfo, QuantInfo, TensorInfo

__all__ = ["METADATA_NAME", "UNNAMED_GRAPH", "dump_metadata", "parse_metadata"]

METADATA_NAME = "metadata.yaml"
UNNAMED_GRAPH = ""  # the graph of a metadata.yaml entry that gives IO per ctx-bin, not per graph (AIHM)

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _YamlDumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """Writes every value out, never as an alias of an earlier one: the reader refuses aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_YAML_DUMPER = _YamlDumper


def dump_metadata(infos: Mapping[str, BinaryInfo]) -> str:
    """``metadata.yaml`` text for ctx-bins keyed by their bundle file name (see the module docstring)."""
    document = {"model_files": {name: {"toolchain": info.toolchain, "tool_version": info.tool_version,
                                       **({"device_runtime": info.device_runtime} if info.device_runtime else {}),
                                       "file_bytes": info.file_bytes, "weight_bytes": info.weight_bytes,
                                       "applied_options": info.applied_options.to_dict(),
                                       "graphs": {graph.name: {"inputs": _tensors_document(graph.inputs),
                                                               "outputs": _tensors_document(graph.outputs)}
                                                  for graph in info.graphs}}
                                for name, info in infos.items()}}
    return yaml.dump(document, Dumper=_YAML_DUMPER, sort_keys=False, default_flow_style=None, width=120)


def parse_metadata(text: str, where: str | os.PathLike[str]) -> dict[str, tuple[GraphInfo, ...]]:
    """Graphs per ctx-bin file name from ``metadata.yaml`` text.

    A file entry with ``inputs``/``outputs`` and no ``graphs`` (AIHM's layout, IO per file) becomes one
    graph named :data:`UNNAMED_GRAPH`: its tensors can be checked, its graph names cannot.

    Raises:
        GenieBuildError: not YAML, a YAML alias, or not the layout of the module docstring (naming the offending
            entry).
    """
    try:
        # An alias repeats a node without its text: a few kB of nested aliases make billions of tensors to walk.
        # A metadata file has no use for them, so none is read at all.
        if any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text, Loader=_YAML_LOADER)):
            raise GenieBuildError(where, "uses a YAML alias (*name): metadata.yaml must spell every entry out")
        document = yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        raise GenieBuildError(where, f"not valid YAML: {' '.join(str(exc).split())}") from None
    files = document.get("model_files") if isinstance(document, dict) else None
    if not isinstance(files, dict):
        raise GenieBuildError(where, "no 'model_files' mapping (ctx-bin name -> graphs)")
    result = {}
    for file_name, entry in files.items():
        graphs = entry.get("graphs") if isinstance(entry, dict) else None
        if graphs is None and isinstance(entry, dict) and "inputs" in entry:
            graphs = {UNNAMED_GRAPH: entry}
        if not isinstance(graphs, dict) or not graphs:
            raise GenieBuildError(where, f"model_files[{file_name!r}] has neither a 'graphs' mapping nor "
                                         "'inputs'/'outputs'")
        result[str(file_name)] = tuple(_graph_from_document(str(name), body, f"{where}: {file_name}")
                                       for name, body in graphs.items())
    return result


def _tensors_document(tensors: Sequence[TensorInfo]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for tensor in tensors:
        entry: dict[str, Any] = {"shape": [int(d) for d in tensor.shape], "dtype": tensor.dtype}
        if tensor.quant is not None:
            # plain Python numbers: a toolchain may hand back numpy scalars, which YAML cannot represent
            entry["quantization"] = {"dtype": tensor.quant.dtype, "scale": _plain(tensor.quant.scale, float),
                                     "offset": _plain(tensor.quant.offset, int),
                                     "bitwidth": _plain(tensor.quant.bitwidth, int)}
        document[tensor.name] = entry
    return document


def _plain(value: Any, kind: type) -> Any:
    return None if value is None else kind(value)


def _graph_from_document(name: str, body: object, where: str) -> GraphInfo:
    if not isinstance(body, dict):
        raise GenieBuildError(where, f"graph {name!r} must be a mapping with inputs and outputs")
    return GraphInfo(name=name, inputs=_tensors_from_document(body.get("inputs"), f"{where}: {name} inputs"),
                     outputs=_tensors_from_document(body.get("outputs"), f"{where}: {name} outputs"))


def _tensors_from_document(tensors: object, where: str) -> tuple[TensorInfo, ...]:
    if not isinstance(tensors, dict):
        raise GenieBuildError(where, "must be a mapping of tensor name -> {shape, dtype}")
    result = []
    for name, spec in tensors.items():
        shape = spec.get("shape") if isinstance(spec, dict) else None
        if not (isinstance(shape, list) and all(is_json_int(d) for d in shape)):
            raise GenieBuildError(where, f"tensor {name!r} needs a shape given as a list of integers")
        dtype = str(spec.get("dtype", ""))
        result.append(TensorInfo(name=str(name), shape=tuple(shape), dtype=dtype,
                                 quant=_quant_from_document(spec, dtype, f"{where}: {name}")))
    return tuple(result)


def _quant_from_document(spec: dict, dtype: str, where: str) -> QuantInfo | None:
    ours, aihm = spec.get("quantization"), spec.get("quantization_parameters")
    if ours is None and aihm is None:
        return None
    if isinstance(ours, dict):
        return QuantInfo(dtype=str(ours.get("dtype", dtype)), scale=_number(ours.get("scale"), where),
                         offset=_integer(ours.get("offset"), where), bitwidth=_integer(ours.get("bitwidth"), where))
    if isinstance(aihm, dict):
        zero_point = _integer(aihm.get("zero_point"), where)
        return QuantInfo(dtype=dtype, scale=_number(aihm.get("scale"), where),
                         offset=None if zero_point is None else -zero_point)
    raise GenieBuildError(where, "quantization must be a mapping")


def _number(value: object, where: str) -> float | None:
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    raise GenieBuildError(where, f"scale must be a number, got {value!r}")


def _integer(value: object, where: str) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise GenieBuildError(where, f"offset/bitwidth must be integers, got {value!r}")
