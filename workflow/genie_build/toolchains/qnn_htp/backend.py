"""The vendor's HTP backend (``libQnnHtp.so`` from the onnxruntime-qnn wheel) preparing context binaries on x86-64,
driven through ONNX Runtime's QNN execution provider.

ORT prepares each QDQ graph it is given in a session of its own; with ``ep.share_ep_contexts`` every session of a
part adds its graph to ONE QNN context, which the last session (``ep.stop_share_ep_contexts``) writes as one
``.bin`` with the weights stored once. Two things ORT does not let a caller choose are set on the backend's own
interface, in this process, before ORT loads it (the same ``libQnnHtp.so`` is loaded once per process):

- **graph names**: ORT names every graph ``QNNExecutionProvider_…_<hash>_<n>_0``, while Genie orders a bundle's
  graphs by name and reads AR/CL from it. ``graphCreate`` (entry 16 of the interface's function table) is wrapped
  so each graph is created under the name the bundle uses; the names read back with libQnnSystem prove it.
- **weight sharing**: ORT always asks for it when contexts are shared. ``contextCreate`` (entry 10) is wrapped so
  the HTP custom context option ``WEIGHT_SHARING_ENABLED`` says what the variant says: off gives one binary whose
  graphs hold their own weights (larger, and runnable on x86, which a weight-shared binary is not).

Offsets used (facts of QNN's C interface, as a binding needs them; no vendor header is part of this project):
``QnnInterface_getProviders(const QnnInterface_t*** providers, uint32_t* count)``; in ``QnnInterface_t`` the
function table starts at byte 40, ``contextCreate`` at byte 112 and ``graphCreate`` at byte 160;
``QnnContext_Config_t`` is ``{int32 option; union at 8}`` with option 0 = custom, whose custom config is
``{int32 option; union at 8}`` with HTP option 1 = weight sharing (a one-byte bool).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from genie_build.errors import GenieBuildError
from genie_build.qnn_wheel import library_path, locate_wheel

__all__ = ["EP_NAME", "HtpTarget", "backends_loaded", "ep_devices", "prepare_context", "session_options", "write_dlc"]

EP_NAME = "QNNExecutionProvider"
_WHAT = "toolchain qnn-htp"
_CONTEXT_CREATE, _GRAPH_CREATE = 112, 160          # byte offsets in QnnInterface_t
_CUSTOM_CONTEXT_OPTION, _HTP_WEIGHT_SHARING = 0, 1
_CUSTOM_GRAPH_OPTION, _HTP_WEIGHTS_PACKING = 0, 12
_CONFIG_BYTES, _HTP_GRAPH_CUSTOM_CONFIG_BYTES = 16, 56
_SUCCESS = 0

_GraphCreate = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p)
_ContextCreate = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


@dataclass(frozen=True)
class HtpTarget:
    """What the HTP backend prepares for: the SoC (``Qnn_SocModel_t``), its Hexagon architecture, the graph
    finalization optimization level (QNN's ``O``) and the VTCM to plan for (0: the SoC's maximum)."""

    soc_model: int
    htp_arch: int
    optimization: int = 3
    vtcm_mb: int = 0

    def provider_options(self) -> dict[str, str]:
        return {"backend_type": "htp", "soc_model": str(self.soc_model), "htp_arch": str(self.htp_arch),
                "htp_graph_finalization_optimization_mode": str(self.optimization), "vtcm_mb": str(self.vtcm_mb),
                # graph IO stays quantized (what Genie feeds); tensors without an encoding run in float16
                "offload_graph_io_quantization": "1", "enable_htp_fp16_precision": "1"}


@dataclass
class _Pending:
    """What the wrapped interface applies to the next context and graphs this process creates."""

    names: list[bytes] = field(default_factory=list)
    created: list[tuple[str, str]] = field(default_factory=list)   # (ORT's name, the name given)
    weight_sharing: bool = True
    weights_packing: bool = False


class _Interface:
    """A QNN backend library's interface table with ``graphCreate`` and ``contextCreate`` wrapped (once per process
    and library)."""

    def __init__(self, name: str, pending: _Pending) -> None:
        self.pending = pending
        # RTLD_LOCAL: the EP's own dlopen of the same file gets this instance; no symbol of it becomes global
        library = ctypes.CDLL(os.fspath(library_path(name, _WHAT)), mode=ctypes.RTLD_LOCAL)
        get_providers = library.QnnInterface_getProviders
        get_providers.argtypes = [ctypes.POINTER(ctypes.POINTER(ctypes.c_void_p)), ctypes.POINTER(ctypes.c_uint32)]
        get_providers.restype = ctypes.c_uint64
        providers, count = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_uint32()
        if get_providers(ctypes.byref(providers), ctypes.byref(count)) != _SUCCESS or count.value < 1:
            raise GenieBuildError(_WHAT, f"{name} gives no interface provider")
        self._library, self._table = library, providers[0]
        self._replace(_GRAPH_CREATE, _GraphCreate, self._wrap_graph_create)
        self._replace(_CONTEXT_CREATE, _ContextCreate, self._wrap_context_create)

    def _replace(self, offset: int, prototype: type, wrap) -> None:
        """Point the table's entry at ``offset`` at ``wrap(original)``."""
        slot = self._table + offset
        original = ctypes.c_void_p.from_address(slot).value
        page = slot & ~(mmap.PAGESIZE - 1)
        # the table lies in relocated read-only data: make its page writable for the one pointer
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        if libc.mprotect(page, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_WRITE) != 0:
            raise GenieBuildError(_WHAT, f"cannot patch a QNN backend's interface: {os.strerror(ctypes.get_errno())}")
        wrapper = prototype(wrap(prototype(original)))
        setattr(self, f"_wrapper_{offset}", wrapper)   # kept alive: the table points at it
        ctypes.c_void_p.from_address(slot).value = ctypes.cast(wrapper, ctypes.c_void_p).value

    def _wrap_graph_create(self, original):
        def graph_create(context, name, configs, graph):
            given = self.pending.names.pop(0) if self.pending.names else b""
            self.pending.created.append((name.decode(errors="replace"), given.decode()))
            if self.pending.weights_packing:
                configs = _with_weights_packing(configs)
            return original(context, given or name, configs, graph)
        return graph_create

    def _wrap_context_create(self, original):
        def context_create(backend, device, configs, context):
            entries = ctypes.cast(configs, ctypes.POINTER(ctypes.c_void_p)) if configs else None
            index = 0
            while entries is not None and entries[index]:
                config = entries[index]
                custom = ctypes.c_void_p.from_address(config + 8).value
                if (ctypes.c_int32.from_address(config).value == _CUSTOM_CONTEXT_OPTION and custom
                        and ctypes.c_int32.from_address(custom).value == _HTP_WEIGHT_SHARING):
                    ctypes.c_uint8.from_address(custom + 8).value = int(self.pending.weight_sharing)
                index += 1
            return original(backend, device, configs, context)
        return context_create


def _with_weights_packing(configs: int | None) -> ctypes.Array:
    """The graph's config list (``const QnnGraph_Config_t**``, NULL-terminated) with the HTP custom graph option
    WEIGHTS_PACKING on appended; the arrays stay referenced by the returned list's ``_keep``."""
    entries = ctypes.cast(configs, ctypes.POINTER(ctypes.c_void_p)) if configs else None
    given = []
    while entries is not None and entries[len(given)]:
        given.append(entries[len(given)])
    custom = (ctypes.c_uint8 * _HTP_GRAPH_CUSTOM_CONFIG_BYTES)()
    ctypes.c_int32.from_buffer(custom).value = _HTP_WEIGHTS_PACKING
    custom[8] = 1
    config = (ctypes.c_uint8 * _CONFIG_BYTES)()
    ctypes.c_int32.from_buffer(config).value = _CUSTOM_GRAPH_OPTION
    ctypes.c_void_p.from_buffer(config, 8).value = ctypes.addressof(custom)
    extended = (ctypes.c_void_p * (len(given) + 2))(*given, ctypes.addressof(config), None)
    _KEEP.append((custom, config, extended))
    return extended


_KEEP: list = []   # config arrays handed to the backend, alive until the process ends (the backend may keep them)


# The backends ORT loads: the HTP backend (prepares context binaries) and the IR backend (writes DLCs).
_BACKENDS = ("libQnnHtp.so", "libQnnIr.so")
_PENDING = _Pending()
_LOCK = threading.Lock()
_INTERFACES: list[_Interface] = []


def backends_loaded() -> bool:
    """Whether this process has loaded (and wrapped) the vendor's QNN backends."""
    return bool(_INTERFACES)


def _wrap_backends() -> None:
    """Wrap every backend's interface once per process, before ORT loads them (and after ORT itself is imported:
    importing it after the QNN libraries are loaded crashed it)."""
    import onnxruntime  # noqa: F401

    if not _INTERFACES:
        _INTERFACES.extend(_Interface(name, _PENDING) for name in _BACKENDS)


def ep_devices():
    """ORT with the wheel's execution provider registered, and the EP's devices.

    Raises:
        GenieBuildError: the wheel is missing, or ORT cannot register it.
    """
    locate_wheel(_WHAT)
    import onnxruntime as ort
    import onnxruntime_qnn

    _wrap_backends()

    if not any(device.ep_name == EP_NAME for device in ort.get_ep_devices()):
        try:
            ort.register_execution_provider_library(EP_NAME, onnxruntime_qnn.get_library_path())
        except Exception as exc:  # ORT raises its own exception types, with the reason
            raise GenieBuildError(_WHAT, f"onnxruntime {ort.__version__} cannot register the QNN execution "
                                         f"provider of {locate_wheel(_WHAT)}: {exc}") from None
    return ort, [device for device in ort.get_ep_devices() if device.ep_name == EP_NAME]


def session_options(target: HtpTarget, configs: Mapping[str, str] | None = None):
    """Session options running on the HTP backend for ``target``; ``configs``: ORT session config entries."""
    ort, devices = ep_devices()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_provider_for_devices(devices, target.provider_options())
    for key, value in (configs or {}).items():
        options.add_session_config_entry(key, value)
    return options


@contextlib.contextmanager
def _pending(weight_sharing: bool, weights_packing: bool = False) -> Iterator[_Pending]:
    """The names and weight sharing the wrapped backends apply while the caller creates sessions."""
    _wrap_backends()
    with _LOCK:
        _PENDING.names.clear()
        _PENDING.created.clear()
        _PENDING.weight_sharing, _PENDING.weights_packing = weight_sharing, weights_packing
        try:
            yield _PENDING
        finally:
            _PENDING.names.clear()
            _PENDING.weight_sharing, _PENDING.weights_packing = True, False


def prepare_context(graphs: Mapping[str, Path], folder: Path, target: HtpTarget, *,
                    weight_sharing: bool, weights_packing: bool = False) -> list[Path]:
    """Prepare every graph into one context in ``folder``: ``<first graph>_ctx_qnn.bin`` (ORT's name for it) and one
    EPContext model per graph, ``<name>.onnx``, returned in ``graphs``' order.

    Args:
        graphs: graph name (the name the binary will carry) -> its QDQ ONNX graph.
        folder: an empty folder of the caller's, on the output's file system.
        target: the SoC and options.
        weight_sharing: store weights once for all graphs (the binary then cannot run on x86).
        weights_packing: set the HTP graph option WEIGHTS_PACKING on every graph.

    Raises:
        GenieBuildError: ORT or the backend refuses a graph (with their reason), or a graph does not go to the
            HTP backend whole.
    """
    ort, _ = ep_devices()
    models = []
    with _pending(weight_sharing, weights_packing) as pending:
        for index, (name, path) in enumerate(graphs.items()):
            model = folder / f"{name}.onnx"
            configs = {"ep.context_enable": "1", "ep.context_embed_mode": "0", "ep.context_file_path": str(model),
                       "ep.share_ep_contexts": "1"}
            if index == len(graphs) - 1:
                configs["ep.stop_share_ep_contexts"] = "1"
            pending.names.append(name.encode())
            before = len(pending.created)
            try:
                with _readable_by_ort(path, folder / f".{name}.in") as readable:
                    ort.InferenceSession(os.fspath(readable), session_options(target, configs))
            except Exception as exc:  # ORT's own exception types; the message says what the EP refused
                raise GenieBuildError(path, f"the HTP backend cannot prepare graph {name}: "
                                            f"{' '.join(str(exc).split())}") from None
            _require_one_graph(path, name, len(pending.created) - before, model)
            models.append(model)
    return models


def _require_one_graph(path: Path, name: str, created: int, model: Path) -> None:
    """Refuse a graph that did not go to the HTP backend whole: more than one QNN graph, or nodes left on the CPU
    other than what ORT keeps there by design (the quantization of graph inputs, the dequantization of outputs).

    Raises:
        GenieBuildError: naming the graph and the ops the backend did not take.
    """
    import onnx

    graph = onnx.load(os.fspath(model), load_external_data=False).graph
    inputs, outputs = {value.name for value in graph.input}, {value.name for value in graph.output}
    contexts = [node for node in graph.node if node.op_type == "EPContext"]
    left = [node for node in graph.node if node.op_type != "EPContext"
            and not (node.op_type == "QuantizeLinear" and node.input[0] in inputs)
            and not (node.op_type == "DequantizeLinear" and node.output[0] in outputs)]
    if created != 1 or len(contexts) != 1 or left:
        ops = sorted({node.op_type for node in left})
        first = f" (first: node {left[0].name!r})" if left else ""
        source = onnx.load(os.fspath(path), load_external_data=False).graph
        tables = {node.input[0] for node in source.node if node.op_type == "Gather"}
        hint = ("; a table quantized per channel stays on the CPU: set bundle.embedding: lut (Genie's CPU table)"
                if any(output in tables for node in left for output in node.output) else "")
        raise GenieBuildError(path, f"graph {name} does not run on the HTP backend whole: {created} QNN graph(s); "
                                    f"ops left on the CPU: {', '.join(ops) or 'none'}{first}{hint}")


def write_dlc(graph: Path, name: str, out: Path, target: HtpTarget) -> None:
    """The DLC QNN's IR backend makes of a QDQ graph (ORT's ``dump_qnn_ir_dlc``), named ``name`` inside, at
    ``out`` (staged beside it: nothing half-written at ``out``).

    Raises:
        GenieBuildError: ORT or the IR backend refuses the graph, or it is not one QNN graph.
    """
    ort, devices = ep_devices()
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as folder:
        options = ort.SessionOptions()
        options.log_severity_level = 4   # the IR backend logs a harmless power-config error on x86
        options.add_provider_for_devices(devices, {**target.provider_options(), "dump_qnn_ir_dlc": "1",
                                                   "dump_qnn_ir_dlc_dir": folder})
        with _pending(weight_sharing=False) as pending:
            pending.names.append(name.encode())
            try:
                with _readable_by_ort(graph, Path(folder) / ".in") as readable:
                    ort.InferenceSession(os.fspath(readable), options)
            except Exception as exc:  # ORT's own exception types; the message says what the EP refused
                raise GenieBuildError(graph, f"QNN's IR backend cannot write graph {name} as a DLC: "
                                             f"{' '.join(str(exc).split())}") from None
            dlcs = sorted(Path(folder).glob("*.dlc"))
            if len(pending.created) != 1 or len(dlcs) != 1:
                raise GenieBuildError(graph, f"graph {name} does not run on the HTP backend whole: it became "
                                             f"{len(pending.created)} QNN graph(s) and {len(dlcs)} DLC(s), the ops "
                                             "between them left on the CPU")
        os.replace(dlcs[0], out)


@contextlib.contextmanager
def _readable_by_ort(model: Path, scratch: Path) -> Iterator[Path]:
    """``model`` as ORT will open it. ORT refuses external data that resolves outside the model's folder, which is
    what a Snakemake cache restores (each output a symlink into the cache): such a model is copied into ``scratch``
    (created inside the caller's staging folder, removed on exit) beside hard links to its data files (copies across
    file systems)."""
    import onnx

    folder = model.parent
    locations = {entry.value for tensor in onnx.load(os.fspath(model), load_external_data=False).graph.initializer
                 for entry in tensor.external_data if entry.key == "location"}
    resolved = {location: (folder / location).resolve() for location in locations}
    if all(path.is_relative_to(folder.resolve()) for path in resolved.values()):
        yield model
        return
    scratch.mkdir()
    try:
        for location, path in resolved.items():
            (scratch / location).parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, scratch / location)
            except OSError:
                shutil.copyfile(path, scratch / location)
        shutil.copyfile(model, scratch / model.name)
        yield scratch / model.name
    finally:
        shutil.rmtree(scratch)
