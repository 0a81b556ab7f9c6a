"""The JSON ``qnn-context-binary-utility`` writes about a context binary, read into a :class:`BinaryInfo`
(what the SDK toolchains' ``inspect`` returns; the tool itself is run by :mod:`genie_build.toolchains.qnn_sdk`)."""

from __future__ import annotations

import re
from pathlib import Path

from genie_build.errors import GenieBuildError
from genie_build.toolchains.base import AppliedOptions, BinaryInfo, GraphInfo, QuantInfo, TensorInfo

__all__ = ["CONTEXT_BINARY_UTILITY", "binary_info_from_utility_json"]

CONTEXT_BINARY_UTILITY = "qnn-context-binary-utility"
_QNN_DATATYPE = re.compile(r"^QNN_DATATYPE_([A-Z_]+?)_(\d+)$")
_DTYPE_PREFIX = {"UFIXED_POINT": "uint", "SFIXED_POINT": "int", "FIXED_POINT": "int", "UINT": "uint",
                 "INT": "int", "FLOAT": "float"}


def binary_info_from_utility_json(document: object, binary_path: Path, file_bytes: int,
                                  toolchain: str) -> BinaryInfo:
    """Turn ``qnn-context-binary-utility``'s JSON into a :class:`BinaryInfo`.

    The shape assumed (the one ONNX Runtime's ``gen_qnn_ctx_onnx_model.py`` and qairt-dev's ``cache_module.py``
    parse; see docs/toolchains.md): ``{"info": {"buildId": ..., "graphs": [{"info": {"graphName": ...,
    "graphInputs": [{"info": {"name", "dimensions", "dataType": "QNN_DATATYPE_...", "quantizeParams":
    {"definition", "quantizationEncoding", "scaleOffset": {"scale", "offset"}}}}], "graphOutputs": [...],
    "graphBlobInfo": {"info": {"optimizationLevel", "vtcmSize"}}}}]}}``. Keys some SDK versions write as spaced
    words (``"graph blob info"``) are first turned into camelCase, as qairt-dev does. The O level and VTCM size
    each graph was compiled with become ``applied_options`` (``optimization_type``, ``vtcm_size``: graph name ->
    value, for the graphs that report one). The JSON reports no weight-section size, so ``weight_bytes`` is 0
    (unknown) and accounting relies on ``file_bytes``. Offsets are kept in QNN's convention, which is AIMET's:
    ``x = (q + offset) * scale``.

    Raises:
        GenieBuildError: a required key is missing.
    """
    info = _mapping(_camel_case_keys(document), "info", binary_path)
    graphs = info.get("graphs")
    if not isinstance(graphs, list):
        raise GenieBuildError(binary_path, f"{CONTEXT_BINARY_UTILITY} JSON has no info.graphs list")
    graph_infos = tuple(_graph_info(entry, binary_path) for entry in graphs)
    applied: dict[str, dict[str, int]] = {}
    for graph, entry in zip(graph_infos, graphs, strict=True):
        blob = (entry["info"].get("graphBlobInfo") or {}).get("info") or {}
        for option, key in (("optimization_type", "optimizationLevel"), ("vtcm_size", "vtcmSize")):
            if _is_count(blob.get(key)):
                applied.setdefault(option, {})[graph.name] = blob[key]
    return BinaryInfo(path=str(binary_path), file_bytes=file_bytes, weight_bytes=0, graphs=graph_infos,
                      toolchain=toolchain, tool_version=str(info.get("buildId", "unknown")),
                      applied_options=AppliedOptions(**applied))


def _camel_case_keys(document: object) -> object:
    """``{"graph blob info": {"vtcm size": 8}}`` -> ``{"graphBlobInfo": {"vtcmSize": 8}}``, through lists too
    (qairt-dev ``cache_module.get_cache_info_from_binary`` does the same for dicts; keys without spaces stay)."""
    if isinstance(document, dict):
        return {_camel_case(str(key)): _camel_case_keys(value) for key, value in document.items()}
    if isinstance(document, list):
        return [_camel_case_keys(item) for item in document]
    return document


def _camel_case(key: str) -> str:
    first, *rest = key.split(" ")
    return first + "".join(word.capitalize() for word in rest)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _graph_info(entry: object, binary_path: Path) -> GraphInfo:
    graph = _mapping(entry, "info", binary_path)
    name = graph.get("graphName")
    if not isinstance(name, str):
        raise GenieBuildError(binary_path, f"{CONTEXT_BINARY_UTILITY} JSON has a graph without graphName")
    return GraphInfo(name=name,
                     inputs=tuple(_tensor_info(item, binary_path) for item in graph.get("graphInputs", [])),
                     outputs=tuple(_tensor_info(item, binary_path) for item in graph.get("graphOutputs", [])))


def _tensor_info(entry: object, binary_path: Path) -> TensorInfo:
    tensor = _mapping(entry, "info", binary_path)
    if not isinstance(tensor.get("name"), str):
        raise GenieBuildError(binary_path, f"{CONTEXT_BINARY_UTILITY} JSON has an IO tensor without a name")
    dtype, bits, fixed_point = _dtype(str(tensor.get("dataType", "")))
    return TensorInfo(name=tensor["name"], shape=tuple(int(dim) for dim in tensor.get("dimensions", [])),
                      dtype=dtype, quant=_quant(tensor.get("quantizeParams") or {}, dtype, bits, fixed_point))


def _dtype(qnn_datatype: str) -> tuple[str, int | None, bool]:
    """``"QNN_DATATYPE_UFIXED_POINT_16"`` -> ``("uint16", 16, True)``; unknown strings pass through."""
    if qnn_datatype == "QNN_DATATYPE_BOOL_8":
        return "bool", 8, False
    match = _QNN_DATATYPE.match(qnn_datatype)
    if not match or match.group(1) not in _DTYPE_PREFIX:
        return qnn_datatype, None, False
    bits = int(match.group(2))
    return f"{_DTYPE_PREFIX[match.group(1)]}{bits}", bits, match.group(1).endswith("FIXED_POINT")


def _quant(params: dict, dtype: str, bits: int | None, fixed_point: bool) -> QuantInfo | None:
    if not fixed_point or params.get("definition") != "QNN_DEFINITION_DEFINED":
        return None
    scale_offset = params.get("scaleOffset") or {}
    if params.get("quantizationEncoding") != "QNN_QUANTIZATION_ENCODING_SCALE_OFFSET" or not scale_offset:
        return QuantInfo(dtype=dtype, bitwidth=bits)  # per-axis IO quantization: no single scale to report
    return QuantInfo(dtype=dtype, scale=float(scale_offset["scale"]), offset=int(scale_offset["offset"]),
                     bitwidth=bits)


def _mapping(container: object, key: str, binary_path: Path) -> dict:
    value = container.get(key) if isinstance(container, dict) else None
    if not isinstance(value, dict):
        raise GenieBuildError(binary_path, f"{CONTEXT_BINARY_UTILITY} JSON lacks an {key!r} object where expected")
    return value
