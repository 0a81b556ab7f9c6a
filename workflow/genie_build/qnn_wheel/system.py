"""QNN context binaries and DLCs read back by the vendor's own ``libQnnSystem.so`` (from the onnxruntime-qnn wheel).

What a binary says about itself is what ``inspect``, the accounting, check-bundle, metadata.yaml and the memory
plan need: its graphs and their IO tensors (names, shapes, dtypes, the scale/offset Genie quantizes with), the SoC
and HTP architecture it was compiled for, the QNN build, and per graph the HTP's spill-fill and VTCM sizes.

Why a child process: check-bundle reads bundles it did not make, and the library crashes on some corrupt files (one
changed byte of a valid binary can make ``QnnSystemContext_getMetadata`` segfault). Every library call therefore
runs in ``python -m genie_build.qnn_wheel.system``, under an address-space limit (headroom plus the file's size: a
binary is mapped, not copied), without core dumps, killed after a timeout; it prints JSON. Whatever goes wrong there
is one :class:`GenieBuildError` line naming the file and the cause (the library's refusal, the signal, the
timeout), never a crash of the caller.

Layouts: the vendor's headers are not part of this project. The structures below are written from the public facts
of QNN's C ABI (field order, sizes, offsets; x86-64) and checked against the library and tests/test_qnn_system.py:
``Qnn_Tensor_t`` 144 B, ``QnnSystemContext_GraphInfo_t`` 88 B, ``QnnSystemContext_BinaryInfoV3_t`` with
``numGraphs`` at 88 and ``graphs`` at 96. The system interface's functions are taken from its table by position.
"""

from __future__ import annotations

import ctypes as C
import errno
import json
import mmap
import os
import struct
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genie_build.errors import GenieBuildError
from genie_build.qnn_wheel import library_path
from genie_build.qnn_wheel.child import answer_stream, child_environment, limit_resources, signal_name
from genie_build.toolchains.base import GraphInfo, QuantInfo, TensorInfo

__all__ = ["ADDRESS_SPACE_HEADROOM", "TIMEOUT_S", "ContextBinary", "Dlc", "HtpGraphBlob", "QnnGraph",
           "read_context_binary", "read_dlc"]

TIMEOUT_S = 60.0
# The child's address space beyond the file's size: the interpreter, libQnnSystem and what it allocates.
ADDRESS_SPACE_HEADROOM = 1 << 30
_WHAT = "reading QNN binaries back (libQnnSystem)"
_REFUSED = {"binary": "not a QNN context binary that libQnnSystem can read",
            "dlc": "not a DLC that libQnnSystem can read"}


# --- What is read -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HtpGraphBlob:
    """What the HTP backend records about one compiled graph (its graph blob info); None: not recorded.

    Version 1 holds spill-fill, VTCM (in bytes, as the library reports it: ``vtcm_mb`` 8 reads 8,388,608) and the
    O level; version 2, which QNN 2.51 appends, the device memory the graph needs by kind. The weights are in
    ``const_bytes`` in an unshared binary and in ``shared_weights_bytes`` in a weight-shared one.
    """

    versions: tuple[int, ...]
    spill_fill_bytes: int | None = None
    vtcm_bytes: int | None = None
    optimization_level: int | None = None
    io_tensor_bytes: int | None = None
    op_data_bytes: int | None = None
    const_bytes: int | None = None
    ddr_tensor_bytes: int | None = None
    shared_weights_bytes: int | None = None


@dataclass(frozen=True)
class QnnGraph:
    """One graph: its IO as every toolchain's ``inspect`` reports it, and what only QNN says about it."""

    info: GraphInfo
    # The QNN encoding of every quantized IO tensor, by name ("scale_offset", "axis_scale_offset",
    # "bw_scale_offset", ...): a QuantInfo without a scale is one of the per-axis or block kinds, named here.
    encodings: dict[str, str] = field(default_factory=dict)
    htp: HtpGraphBlob | None = None     # HTP binaries only

    @property
    def name(self) -> str:
        return self.info.name


@dataclass(frozen=True)
class ContextBinary:
    """A QNN context binary as libQnnSystem reads it."""

    path: str
    file_bytes: int
    backend_id: int                     # 6: HTP
    build_id: str                       # the QNN SDK build that wrote it, e.g. "v2.51.0.260929181845"
    core_api_version: str               # e.g. "2.40.0"
    backend_api_version: str            # e.g. "5.51.0"
    context_blob_version: str           # e.g. "4.0.6"
    context_blob_bytes: int
    soc_model: int | None               # e.g. 69 (SM8750); binary info version 3 only
    dsp_arch: str | None                # e.g. "v79", from the HTP context metadata
    graphs: tuple[QnnGraph, ...]


@dataclass(frozen=True)
class Dlc:
    """A DLC's composable graphs as libQnnSystem reads them."""

    path: str
    file_bytes: int
    graphs: tuple[QnnGraph, ...]


def read_context_binary(path: str | os.PathLike[str], *, timeout: float = TIMEOUT_S,
                        address_space: int | None = None, library: Path | None = None) -> ContextBinary:
    """Read a context binary with the wheel's libQnnSystem (or ``library``, another libQnnSystem.so: a QAIRT SDK's),
    in a child process.

    Args:
        timeout: seconds the child may take.
        address_space: the child's address-space limit in bytes (default: the file's size +
            :data:`ADDRESS_SPACE_HEADROOM`).

    Raises:
        GenieBuildError: the wheel is missing (one line from ``locate_wheel``), or the file is missing, empty or
            not a binary the library reads (the library's refusal, the child's signal or the timeout).
    """
    path = Path(path)
    data, size = _run_child("binary", path, timeout, address_space, library)
    return ContextBinary(path=str(path), file_bytes=size, backend_id=data["backend_id"], build_id=data["build_id"],
                         core_api_version=data["core_api_version"], backend_api_version=data["backend_api_version"],
                         context_blob_version=data["context_blob_version"],
                         context_blob_bytes=data["context_blob_bytes"], soc_model=data["soc_model"],
                         dsp_arch=data["dsp_arch"], graphs=tuple(_graph(graph) for graph in data["graphs"]))


def read_dlc(path: str | os.PathLike[str], *, timeout: float = TIMEOUT_S, address_space: int | None = None) -> Dlc:
    """Read a DLC's composable graphs and their IO, as :func:`read_context_binary` (the library opens the file)."""
    path = Path(path)
    data, size = _run_child("dlc", path, timeout, address_space)
    return Dlc(path=str(path), file_bytes=size, graphs=tuple(_graph(graph) for graph in data["graphs"]))


def _graph(data: dict[str, Any]) -> QnnGraph:
    tensors = data["inputs"] + data["outputs"]
    return QnnGraph(info=GraphInfo(name=data["name"], inputs=tuple(_tensor(tensor) for tensor in data["inputs"]),
                                   outputs=tuple(_tensor(tensor) for tensor in data["outputs"])),
                    encodings={tensor["name"]: tensor["quant"]["encoding"] for tensor in tensors if tensor["quant"]},
                    htp=HtpGraphBlob(**{**data["htp"], "versions": tuple(data["htp"]["versions"])})
                    if data["htp"] else None)


def _tensor(data: dict[str, Any]) -> TensorInfo:
    quant = data["quant"]
    return TensorInfo(name=data["name"], shape=tuple(data["shape"]), dtype=data["dtype"],
                      quant=QuantInfo(dtype=data["dtype"], scale=quant.get("scale"), offset=quant.get("offset"),
                                      bitwidth=quant.get("bitwidth")) if quant else None)


# --- The parent: run the child, turn every failure into one line ---------------------------------------------------

def _run_child(kind: str, path: Path, timeout: float, address_space: int | None,
               library: Path | None = None) -> tuple[dict[str, Any], int]:
    """The child's JSON about ``path``, and the file's size."""
    refused = _REFUSED[kind]
    if not path.is_file():
        raise GenieBuildError(path, "no such file")
    size = path.stat().st_size
    if size == 0:
        raise GenieBuildError(path, f"{refused}: the file is empty")
    # resolved: the library finds the ones it needs beside its real path ($ORIGIN), not beside a link to it
    library = (library or library_path("libQnnSystem.so", _WHAT)).resolve()
    limit = address_space if address_space is not None else size + ADDRESS_SPACE_HEADROOM
    try:
        done = subprocess.run(_child_command(kind, path, library, limit), check=False, capture_output=True,
                              timeout=timeout, env=child_environment())
    except subprocess.TimeoutExpired:
        raise GenieBuildError(path, f"{refused}: libQnnSystem gave no answer within {timeout:g} s") from None
    return _child_result(done, path, refused), size


def _child_command(kind: str, path: Path, library: Path, address_space: int) -> list[str]:
    return [sys.executable, "-m", __name__, kind, str(path.resolve()), str(library), str(address_space)]


def _child_result(done: subprocess.CompletedProcess[bytes], path: Path, refused: str) -> dict[str, Any]:
    if done.returncode < 0:
        raise GenieBuildError(path, f"{refused}: reading it crashed ({signal_name(-done.returncode)})")
    try:
        data = json.loads(done.stdout)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise GenieBuildError(path, f"{refused}: the reader failed (exit {done.returncode}): {last[0]}")
    if "error" in data:
        raise GenieBuildError(path, f"{refused}: {data['error']}")
    return data


# --- The layouts (facts of QNN's C ABI on x86-64, see the module docstring) ----------------------------------------

def _struct(name: str, fields: list[tuple[str, Any]], base: type[Any] = C.Structure) -> type[Any]:
    return type(name, (base,), {"_fields_": fields})


_Version = _struct("_Version", [("major", C.c_uint32), ("minor", C.c_uint32), ("patch", C.c_uint32)])
_ScaleOffset = _struct("_ScaleOffset", [("scale", C.c_float), ("offset", C.c_int32)])
_BwScaleOffset = _struct("_BwScaleOffset", [("bitwidth", C.c_uint32), ("scale", C.c_float), ("offset", C.c_int32)])
# Qnn_QuantizeParams_t: definition, encoding, then a 32 B 8-aligned union (its largest member: bitwidth, axis,
# count and two pointers); only the two single-scale members are read.
_QuantizeParams = _struct("_QuantizeParams", [("definition", C.c_uint32), ("encoding", C.c_uint32), ("u", _struct(
    "_QuantUnion", [("scale_offset", _ScaleOffset), ("bw_scale_offset", _BwScaleOffset),
                    ("size", C.c_void_p * 4)], C.Union))])
_TENSOR_V1 = [("id", C.c_uint32), ("name", C.c_char_p), ("type", C.c_uint32), ("data_format", C.c_uint32),
              ("data_type", C.c_uint32), ("quantize_params", _QuantizeParams), ("rank", C.c_uint32),
              ("dimensions", C.POINTER(C.c_uint32)), ("mem_type", C.c_uint32), ("memory", C.c_void_p * 2)]
# Version 2 adds dynamic-dimension flags, sparse parameters (a type and two counts) and isProduced.
_TENSOR_V2 = [*_TENSOR_V1, ("is_dynamic_dimensions", C.c_void_p), ("sparse", C.c_uint32 * 3),
              ("is_produced", C.c_uint8)]
_Tensor = _struct("_Tensor", [("version", C.c_uint32), ("u", _struct(
    "_TensorUnion", [("v1", _struct("_TensorV1", _TENSOR_V1)), ("v2", _struct("_TensorV2", _TENSOR_V2))], C.Union))])
_GRAPH_V1 = [("name", C.c_char_p), ("num_inputs", C.c_uint32), ("inputs", C.POINTER(_Tensor)),
             ("num_outputs", C.c_uint32), ("outputs", C.POINTER(_Tensor))]
_GRAPH_V2 = [*_GRAPH_V1, ("num_updateable", C.c_uint32), ("updateable", C.POINTER(_Tensor))]
_GRAPH_V3 = [*_GRAPH_V2, ("blob_info_size", C.c_uint32), ("blob_info", C.c_void_p), ("start_op", C.c_uint32),
             ("end_op", C.c_uint32)]
_GraphInfo = _struct("_GraphInfo", [("version", C.c_uint32), ("u", _struct("_GraphUnion", [
    (f"v{number}", _struct(f"_GraphV{number}", fields))
    for number, fields in ((1, _GRAPH_V1), (2, _GRAPH_V2), (3, _GRAPH_V3))], C.Union))])
_BINARY_HEAD = [("backend_id", C.c_uint32), ("build_id", C.c_char_p), ("core_api_version", _Version),
                ("backend_api_version", _Version), ("soc_version", C.c_char_p)]
_BINARY_GRAPHS = [("num_context_tensors", C.c_uint32), ("context_tensors", C.POINTER(_Tensor)),
                  ("num_graphs", C.c_uint32), ("graphs", C.POINTER(_GraphInfo))]
_BINARY_V1 = [*_BINARY_HEAD, ("hw_info_blob_version", _Version), ("context_blob_version", _Version),
              ("hw_info_blob_size", C.c_uint32), ("hw_info_blob", C.c_void_p), ("context_blob_size", C.c_uint64),
              *_BINARY_GRAPHS]
_BINARY_V2 = [*_BINARY_V1, ("platform_info", C.c_void_p)]
# Version 3 drops the hardware-info blob and adds the context metadata and the SoC model.
_BINARY_V3 = [*_BINARY_HEAD, ("context_blob_version", _Version), ("context_blob_size", C.c_uint64),
              *_BINARY_GRAPHS, ("platform_info", C.c_void_p), ("context_metadata_size", C.c_uint32),
              ("context_metadata", C.c_void_p), ("soc_model", C.c_uint32)]
_BinaryInfo = _struct("_BinaryInfo", [("version", C.c_uint32), ("u", _struct("_BinaryUnion", [
    (f"v{number}", _struct(f"_BinaryV{number}", fields))
    for number, fields in ((1, _BINARY_V1), (2, _BINARY_V2), (3, _BINARY_V3))], C.Union))])

_HTP = 6                                # QNN's backend id of the HTP
_DEFINED = 1                            # Qnn_Definition_t: the encoding was given, not chosen by the backend
_ENCODINGS = ("scale_offset", "axis_scale_offset", "bw_scale_offset", "bw_axis_scale_offset", "block",
              "blockwise_expansion", "vector", "float_block", "bw_axis_scale_offset_mapped", "bw_block_mapped",
              "bw_blockwise_expansion_mapped", "bw_float_block")
# Qnn_DataType_t: the high byte is the kind, the low byte the bit count written in hex digits (0x16: 16 bits).
_DTYPE_KINDS = {0: "int", 1: "uint", 2: "float", 3: "int", 4: "uint"}    # 3, 4: signed, unsigned fixed point
_FIXED_POINT_KINDS = (3, 4)
_SPECIAL_DTYPES = {0x0226: ("bfloat16", 16), 0x0508: ("bool", 8), 0x0608: ("string", 8)}
_QNN_ERRORS = {1000: "not supported", 1002: "memory allocation failed", 1004: "invalid argument",
               1100: "general error", 30000: "invalid handle", 30001: "invalid argument",
               30002: "operation failed", 30010: "malformed binary"}
# Far above any real part (a Genie part has a few graphs of at most a few hundred IO tensors): a count beyond is
# a corrupt file, refused before it is walked.
_LIMITS = {"graphs": 4096, "tensors": 4096, "dimensions": 64, "blob bytes": 1 << 16}


# --- The child: decode what the library returns (pure functions over the structures) ------------------------------

class _Refused(Exception):
    """The library, or this reader, refuses the file; the message is the reason."""


def _binary_dict(info: Any) -> dict[str, Any]:
    """A BinaryInfo (version 1, 2 or 3) as JSON-ready values."""
    body = _versioned(info, "binary info", (1, 2, 3))
    v3 = info.version == 3
    spill_fill = {} if v3 else _hw_blob_spill_fill(_bytes(body.hw_info_blob, body.hw_info_blob_size))
    metadata = _bytes(body.context_metadata, body.context_metadata_size) if v3 else b""
    graphs = [_graph_dict(body.graphs[index], body.backend_id, spill_fill.get(index))
              for index in range(_count(body.num_graphs, "graphs"))]
    return {"backend_id": body.backend_id, "build_id": _text(body.build_id),
            "core_api_version": _version(body.core_api_version),
            "backend_api_version": _version(body.backend_api_version),
            "context_blob_version": _version(body.context_blob_version), "context_blob_bytes": body.context_blob_size,
            "soc_model": body.soc_model if v3 else None,
            "dsp_arch": _dsp_arch(metadata) if body.backend_id == _HTP else None, "graphs": graphs}


def _graph_dict(graph: Any, backend_id: int, spill_fill: int | None = None) -> dict[str, Any]:
    """A GraphInfo (version 1, 2 or 3); ``spill_fill`` from the binary's hardware blob where there is no graph
    blob (binary info versions 1 and 2)."""
    body = _versioned(graph, "graph info", (1, 2, 3))
    htp = None
    if backend_id == _HTP and graph.version == 3 and body.blob_info:
        htp = _htp_blob(_bytes(body.blob_info, body.blob_info_size))
    elif backend_id == _HTP and spill_fill is not None:
        htp = {"versions": [], "spill_fill_bytes": spill_fill}
    return {"name": _text(body.name), "htp": htp,
            "inputs": [_tensor_dict(body.inputs[index]) for index in range(_count(body.num_inputs, "tensors"))],
            "outputs": [_tensor_dict(body.outputs[index]) for index in range(_count(body.num_outputs, "tensors"))]}


def _tensor_dict(tensor: Any) -> dict[str, Any]:
    """A Qnn_Tensor_t (version 1 or 2: version 2 begins with version 1's fields)."""
    body = _versioned(tensor, "tensor", (1, 2))
    dtype, bits, fixed_point = _dtype(body.data_type)
    params = body.quantize_params
    return {"name": _text(body.name), "dtype": dtype,
            "shape": [body.dimensions[axis] for axis in range(_count(body.rank, "dimensions"))],
            "quant": _quant_dict(params.definition, params.encoding, bits, _scale_offset(params))
            if fixed_point else None}


def _versioned(value: Any, what: str, known: tuple[int, ...]) -> Any:
    """The union member a versioned struct's ``version`` selects."""
    if value.version not in known:
        raise _Refused(f"{what} version {value.version} is unknown to this reader")
    return getattr(value.u, f"v{value.version}")


def _count(value: int, what: str) -> int:
    if value > _LIMITS[what]:
        raise _Refused(f"{value:,} {what} (at most {_LIMITS[what]:,} expected)")
    return value


def _scale_offset(params: Any) -> tuple[float, int, int | None] | None:
    """(scale, offset, bitwidth) of the two single-scale encodings; None for the per-axis and block kinds."""
    if params.encoding == 0:
        return params.u.scale_offset.scale, params.u.scale_offset.offset, None
    if params.encoding == 2:
        return params.u.bw_scale_offset.scale, params.u.bw_scale_offset.offset, params.u.bw_scale_offset.bitwidth
    return None


def _quant_dict(definition: int, encoding: int, bits: int | None,
                scale_offset: tuple[float, int, int | None] | None) -> dict[str, Any] | None:
    """The quantization of a fixed-point tensor; a kind without a single scale is named, never read as one."""
    if definition != _DEFINED:
        return None
    name = _ENCODINGS[encoding] if encoding < len(_ENCODINGS) else f"encoding {encoding}"
    if scale_offset is None:
        return {"encoding": name, "bitwidth": bits}
    scale, offset, bitwidth = scale_offset
    return {"encoding": name, "scale": scale, "offset": offset, "bitwidth": bitwidth or bits}


def _dtype(code: int) -> tuple[str, int | None, bool]:
    """``0x0416`` (UFIXED_POINT_16) -> ``("uint16", 16, True)``; an unknown code is named by its number."""
    if code in _SPECIAL_DTYPES:
        return *_SPECIAL_DTYPES[code], False
    kind, digits = code >> 8, f"{code & 0xFF:x}"
    if kind not in _DTYPE_KINDS or not digits.isdigit():
        return f"qnn_datatype_{code:#06x}", None, False
    return f"{_DTYPE_KINDS[kind]}{digits}", int(digits), kind in _FIXED_POINT_KINDS


def _htp_blob(raw: bytes) -> dict[str, Any]:
    """The HTP graph blob info: version 1 (``{u32 version; u64 spillFill; u32 vtcm; u32 O level; u8 dlbc; u64 hvx
    threads}``, 40 B), which QNN 2.51 follows with version 2 (``{u32 version; u64 nativeK, nativeV; u32
    safeShareIO; u64 io, opData, const, ddrTensor, sharedWeights}``, 72 B); either may come alone."""
    blob: dict[str, Any] = {"versions": []}
    offset = 0
    while offset + 4 <= len(raw):
        version = struct.unpack_from("<I", raw, offset)[0]
        if version == 1 and offset + 40 <= len(raw):
            spill, vtcm, level = struct.unpack_from("<QII", raw, offset + 8)
            blob.update(spill_fill_bytes=spill, vtcm_bytes=vtcm, optimization_level=level)
            offset += 40
        elif version == 2 and offset + 72 <= len(raw):
            blob.update(zip(("io_tensor_bytes", "op_data_bytes", "const_bytes", "ddr_tensor_bytes",
                             "shared_weights_bytes"), struct.unpack_from("<5Q", raw, offset + 32)))
            offset += 72
        else:
            raise _Refused(f"its HTP graph blob info is cut short or of an unknown version ({version} at byte "
                           f"{offset} of {len(raw)})")
        blob["versions"].append(version)
    return blob


def _hw_blob_spill_fill(raw: bytes) -> dict[int, int]:
    """Binary info versions 1 and 2: the HTP hardware blob, one ``{u32 version; u32 graph index; u64 spillFill}``
    entry (24 B, version 1) per graph, as graph index -> spill-fill bytes."""
    entries = (struct.unpack_from("<I4xI4xQ", raw, offset) for offset in range(0, len(raw) - 23, 24))
    return {index: spill for version, index, spill in entries if version == 1}


def _dsp_arch(metadata: bytes) -> str | None:
    """The HTP context metadata (version 1: ``{u32 version; u32 dspArch}``) -> ``"v79"``."""
    if len(metadata) >= 8 and struct.unpack_from("<I", metadata)[0] == 1:
        return f"v{struct.unpack_from('<I', metadata, 4)[0]}"
    return None


def _bytes(address: int | None, size: int) -> bytes:
    return C.string_at(address, _count(size, "blob bytes")) if address and size else b""


def _text(value: bytes | None) -> str:
    return (value or b"").decode("utf-8", errors="replace")


def _version(version: Any) -> str:
    return f"{version.major}.{version.minor}.{version.patch}"


# --- The child: the library ----------------------------------------------------------------------------------------

_P, _VOID, _U32 = C.POINTER, C.c_void_p, C.POINTER(C.c_uint32)
_OUT_HANDLE, _GET_U32 = (_VOID, _P(_VOID)), (_VOID, _U32)
# QnnSystemInterface_t: u32 backend id, a name pointer, the system API version (u32 major, minor, patch) at 16,
# then the function table at 32, read by position (positions as in system API 1.15, the wheel's; newer 1.x
# libraries append). Every function returns a Qnn_ErrorHandle_t (u64, 0: success).
_SYSTEM_API_OFFSET, _TABLE_OFFSET, _MIN_SYSTEM_API = 16, 32, (1, 15)
_FUNCTIONS: dict[str, tuple[int, tuple[Any, ...]]] = {
    "Context_create": (0, (_P(_VOID),)), "Context_free": (3, (_VOID,)),
    "Context_getMetadata": (2, (_VOID, _VOID, C.c_uint64, _P(_P(_BinaryInfo)))),
    "Dlc_createFromFile": (8, (_VOID, C.c_char_p, _P(_VOID))), "Dlc_free": (12, (_VOID,)),
    "Dlc_getComposableGraphInfoHandles": (27, (_VOID, _P(_P(_VOID)), _U32)),
    "Dlc_getComposableGraphInfoGraphName": (31, (_VOID, _P(C.c_char_p))),
    "Dlc_getComposableGraphInfoNumInputTensors": (32, _GET_U32),
    "Dlc_getComposableGraphInfoNumOutputTensors": (33, _GET_U32),
    "Dlc_getGraphInfoInputTensorInfo": (34, (_VOID, C.c_uint32, _P(_VOID))),
    "Dlc_getGraphInfoOutputTensorInfo": (35, (_VOID, C.c_uint32, _P(_VOID))),
    "Dlc_getTensorInfoName": (36, (_VOID, _P(C.c_char_p))), "Dlc_getTensorInfoDataType": (40, _GET_U32),
    "Dlc_getTensorInfoRank": (41, _GET_U32), "Dlc_getTensorInfoDimensions": (42, _GET_U32),
    "Dlc_getTensorInfoQuantParams": (43, _OUT_HANDLE),
    "Dlc_getQuantParamsEncodingDefinition": (44, _GET_U32), "Dlc_getQuantParamsEncoding": (45, _GET_U32),
    "Dlc_getQuantParamsScaleOffsetScale": (46, (_VOID, _P(C.c_float))),
    "Dlc_getQuantParamsScaleOffsetOffset": (47, (_VOID, _P(C.c_int32))),
    "Dlc_getQuantParamsBwScaleOffsetBitwidth": (48, _GET_U32),
    "Dlc_getQuantParamsBwScaleOffsetScale": (49, (_VOID, _P(C.c_float))),
    "Dlc_getQuantParamsBwScaleOffsetOffset": (50, (_VOID, _P(C.c_int32))),
}
# The accessors of a DLC quantization's single scale/offset, by encoding (scale, offset, bitwidth).
_DLC_SCALE_OFFSET = {0: ("ScaleOffsetScale", "ScaleOffsetOffset", None),
                     2: ("BwScaleOffsetScale", "BwScaleOffsetOffset", "BwScaleOffsetBitwidth")}


class _System:
    """libQnnSystem's system interface, its functions called by name; a non-zero result refuses the file."""

    def __init__(self, library: str) -> None:
        providers, count = C.POINTER(C.c_void_p)(), C.c_uint32()
        get_providers = C.CDLL(library).QnnSystemInterface_getProviders
        get_providers.restype = C.c_uint64
        if get_providers(C.byref(providers), C.byref(count)) or not count.value:
            raise _Refused(f"{library} offers no system interface")
        self._table = providers[0]
        api = tuple(C.c_uint32.from_address(self._table + _SYSTEM_API_OFFSET + 4 * k).value for k in (0, 1))
        if api[0] != _MIN_SYSTEM_API[0] or api < _MIN_SYSTEM_API:
            raise _Refused(f"{library} has system API {api[0]}.{api[1]}; this reader knows 1.15 and later 1.x")

    def call(self, name: str, *args: Any) -> None:
        index, argtypes = _FUNCTIONS[name]
        address = C.c_void_p.from_address(self._table + _TABLE_OFFSET + 8 * index).value
        if not address:
            raise _Refused(f"this libQnnSystem lacks QnnSystem{name}")
        result = C.CFUNCTYPE(C.c_uint64, *argtypes)(address)(*args)
        if result:
            raise _Refused(f"libQnnSystem refused it (QnnSystem{name}: "
                           f"{_QNN_ERRORS.get(result, 'error')}, QNN error {result})")

    def get(self, name: str, handle: Any, kind: type[Any]) -> Any:
        """The value an accessor ``name(handle, &value)`` writes."""
        value = kind()
        self.call(name, handle, C.byref(value))
        return value.value

    def read_binary(self, path: str) -> dict[str, Any]:
        """Map the file copy-on-write (the library gets a writable buffer backed by the page cache) and decode."""
        with open(path, "rb") as file:
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
        buffer = (C.c_char * len(mapped)).from_buffer(mapped)
        handle, info = C.c_void_p(), C.POINTER(_BinaryInfo)()
        self.call("Context_create", C.byref(handle))
        self.call("Context_getMetadata", handle, buffer, len(mapped), C.byref(info))
        result = _binary_dict(info.contents)
        self.call("Context_free", handle)
        return result

    def read_dlc(self, path: str) -> dict[str, Any]:
        """A DLC is a ZIP archive: anything else is refused before the library sees it (given 8 GiB of zeros, it
        filled 7.4 GB of memory before it gave up); a ZIP archive without a composable graph is refused after."""
        try:
            zipfile.ZipFile(path).close()
        except (zipfile.BadZipFile, OSError) as error:
            raise _Refused(f"not a ZIP archive, which a DLC is ({error})") from None
        handle, graphs, count = C.c_void_p(), C.POINTER(C.c_void_p)(), C.c_uint32()
        self.call("Dlc_createFromFile", None, path.encode(), C.byref(handle))
        self.call("Dlc_getComposableGraphInfoHandles", handle, C.byref(graphs), C.byref(count))
        if not count.value:
            raise _Refused("it holds no composable graph")
        result = {"graphs": [self._dlc_graph(graphs[index]) for index in range(_count(count.value, "graphs"))]}
        self.call("Dlc_free", handle)
        return result

    def _dlc_graph(self, graph: int) -> dict[str, Any]:
        tensors = {}
        for kind in ("Input", "Output"):
            count = _count(self.get(f"Dlc_getComposableGraphInfoNum{kind}Tensors", graph, C.c_uint32), "tensors")
            tensors[kind] = [self._dlc_tensor(graph, kind, index) for index in range(count)]
        return {"name": _text(self.get("Dlc_getComposableGraphInfoGraphName", graph, C.c_char_p)), "htp": None,
                "inputs": tensors["Input"], "outputs": tensors["Output"]}

    def _dlc_tensor(self, graph: int, kind: str, index: int) -> dict[str, Any]:
        tensor = C.c_void_p()
        self.call(f"Dlc_getGraphInfo{kind}TensorInfo", graph, index, C.byref(tensor))
        shape = (C.c_uint32 * _count(self.get("Dlc_getTensorInfoRank", tensor, C.c_uint32), "dimensions"))()
        self.call("Dlc_getTensorInfoDimensions", tensor, shape)
        dtype, bits, fixed_point = _dtype(self.get("Dlc_getTensorInfoDataType", tensor, C.c_uint32))
        return {"name": _text(self.get("Dlc_getTensorInfoName", tensor, C.c_char_p)), "shape": list(shape),
                "dtype": dtype, "quant": self._dlc_quant(tensor, bits) if fixed_point else None}

    def _dlc_quant(self, tensor: C.c_void_p, bits: int | None) -> dict[str, Any] | None:
        params = self.get("Dlc_getTensorInfoQuantParams", tensor, C.c_void_p)
        encoding = self.get("Dlc_getQuantParamsEncoding", params, C.c_uint32)
        scale_offset = None
        if encoding in _DLC_SCALE_OFFSET:
            scale, offset, bitwidth = _DLC_SCALE_OFFSET[encoding]
            scale_offset = (self.get(f"Dlc_getQuantParams{scale}", params, C.c_float),
                            self.get(f"Dlc_getQuantParams{offset}", params, C.c_int32),
                            self.get(f"Dlc_getQuantParams{bitwidth}", params, C.c_uint32) if bitwidth else None)
        definition = self.get("Dlc_getQuantParamsEncodingDefinition", params, C.c_uint32)
        return _quant_dict(definition, encoding, bits, scale_offset)


def _child_main(argv: list[str]) -> int:
    """``KIND PATH LIBRARY ADDRESS_SPACE``: print the file's JSON, or ``{"error": reason}``, on the original
    stdout; the library's own prints go to stderr."""
    kind, path, library, address_space = argv
    limit_resources(int(address_space))
    out = answer_stream()
    try:
        system = _System(library)
        result, code = system.read_binary(path) if kind == "binary" else system.read_dlc(path), 0
    except _Refused as refusal:
        result, code = {"error": str(refusal)}, 3
    except ValueError as error:         # ctypes: a NULL pointer where the library's answer promised data
        result, code = {"error": f"libQnnSystem's answer about it is inconsistent ({error})"}, 3
    except (MemoryError, OSError) as error:   # OSError: mapping the file failed; other OSErrors are no refusal
        if isinstance(error, OSError) and error.errno != errno.ENOMEM:
            raise
        result, code = {"error": f"reading it needs more than {int(address_space):,} B of address space"}, 3
    json.dump(result, out)
    out.flush()
    return code


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
