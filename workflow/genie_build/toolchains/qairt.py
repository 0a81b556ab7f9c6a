"""The ``qairt`` toolchain: QAIRT's Python API, called exactly as the field report did.

convert: ``qairt.convert(<graph>.onnx, encodings=E, float_bitwidth=16)`` then ``.save(<graph>.dlc)``.
compile: ``qairt.compile([prompt, token], config=CompileConfig(backend="HTP", graph_custom_configs=[one
HtpGraphConfig per graph], context_custom_configs=[HtpContextConfig(...)], device_custom_configs=[HtpDeviceConfig(
...)]))`` then ``.save(NAME.bin)``. The API hands the options to the QNN C API directly, which is how the field
report got ``weights_packing`` applied where the command-line generator ignored it. It needs its own environment
(``envs/qairt.yaml``); see docs/toolchains.md for the choices made here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genie_build.errors import GenieBuildError
from genie_build.toolchains.base import BinaryInfo, CompileOptions
from genie_build.toolchains.qnn_sdk import (
    CONTEXT_BINARY_UTILITY,
    Sdk,
    check_graph_name,
    inspect_with_sdk,
    locate_sdk,
    publish,
    publish_binary,
    require_file,
    stage_onnx_as_graph,
    staging_directory,
)

TOOLCHAIN = "qairt"
COMPILE_CONFIG_MODULE = "qairt.api.compiler.config"
HTP_CONFIG_MODULE = "qairt.api.common.backends.htp.config"


@dataclass(frozen=True)
class QairtApi:
    """The parts of the ``qairt`` package this toolchain calls."""

    convert: Callable[..., Any]
    compile: Callable[..., Any]
    load: Callable[..., Any]
    CompileConfig: type
    HtpGraphConfig: type
    HtpContextConfig: type
    HtpDeviceConfig: type


def import_qairt() -> QairtApi:
    """Import ``qairt`` and the config classes (``qairt.api.compiler.config.CompileConfig``,
    ``qairt.api.common.backends.htp.config.Htp{Graph,Context,Device}Config``).

    Raises:
        GenieBuildError: ``qairt`` is not importable by this interpreter, or lacks a module this adapter needs.
    """
    try:
        qairt = importlib.import_module("qairt")
    except ImportError as exc:
        raise GenieBuildError(f"toolchain {TOOLCHAIN}",
                              f"the qairt Python package is not importable by {sys.executable}: create the QAIRT "
                              "environment from envs/qairt.yaml (Python 3.12, pip install qairt-dev), set "
                              "QAIRT_SDK_ROOT, and point toolchains.qairt.python at it") from exc
    try:
        compile_config = importlib.import_module(COMPILE_CONFIG_MODULE)
        htp_config = importlib.import_module(HTP_CONFIG_MODULE)
        return QairtApi(convert=qairt.convert, compile=qairt.compile, load=qairt.load,
                        CompileConfig=compile_config.CompileConfig, HtpGraphConfig=htp_config.HtpGraphConfig,
                        HtpContextConfig=htp_config.HtpContextConfig, HtpDeviceConfig=htp_config.HtpDeviceConfig)
    except (ImportError, AttributeError) as exc:
        raise GenieBuildError(f"toolchain {TOOLCHAIN}",
                              f"the qairt package at {getattr(qairt, '__file__', '?')} lacks what this adapter "
                              f"calls ({exc}): it needs qairt.convert/compile/load, {COMPILE_CONFIG_MODULE} and "
                              f"{HTP_CONFIG_MODULE}; install a current qairt-dev") from exc


def compile_config(api: QairtApi, graph_names: list[str], options: CompileOptions) -> Any:
    """The ``CompileConfig``: one ``HtpGraphConfig`` per graph (each gets ``O``, ``weights_packing`` and
    ``vtcm_mb``), weight sharing in the context config, the target device as a device config.

    The device goes in ``device_custom_configs`` rather than ``soc_details``: the same integer ``soc_model``
    and ``dsp_arch`` the qnn-cli JSON carries, no string to format, and ``soc_details`` is ignored whenever
    device configs are given anyway.
    """
    return api.CompileConfig(
        backend="HTP",
        graph_custom_configs=[api.HtpGraphConfig(name=name, optimization_type=options.optimization_type,
                                                 weights_packing=options.weights_packing,
                                                 vtcm_size_in_mb=options.vtcm_mb)
                              for name in graph_names],
        context_custom_configs=[api.HtpContextConfig(weight_sharing_enabled=options.weight_sharing_enabled)],
        device_custom_configs=[api.HtpDeviceConfig(soc_model=options.soc_model, dsp_arch=options.dsp_arch)],
    )


class QairtToolchain:
    """QAIRT's Python API (``qairt-dev``) with ``$QAIRT_SDK_ROOT``; runs in the interpreter that imports it."""

    name = TOOLCHAIN

    def check_available(self) -> None:
        """Raises GenieBuildError naming what is missing: the ``qairt`` module, the SDK, or its utility."""
        self._ready()

    def convert(self, onnx_path: Path, encodings_path: Path, out_path: Path, *, graph_name: str,
                float_bitwidth: int) -> None:
        """ONNX part + encodings -> DLC whose graph is called ``graph_name``.

        ``float_bitwidth`` is passed under that name, as the field report did; qairt documents
        ``float_precision`` and lets unknown keywords through to the converter (see docs/toolchains.md).

        Raises:
            GenieBuildError: a missing input or module, or qairt failed.
        """
        api, _ = self._ready()
        encodings = require_file(encodings_path)
        with staging_directory(out_path) as staging:
            network = stage_onnx_as_graph(onnx_path, graph_name, staging)
            try:
                model = api.convert(str(network), encodings=str(encodings), float_bitwidth=float_bitwidth)
                saved = Path(model.save(str(staging / f"{graph_name}.dlc")))
            except Exception as exc:  # qairt raises its own error types; the job needs one line naming the file
                raise GenieBuildError(onnx_path, f"qairt.convert failed: {exc}") from exc
            publish(saved, out_path, "qairt.convert")

    def compile(self, converted: dict[str, Path], out_path: Path, options: CompileOptions) -> None:
        """DLCs keyed by graph name (prompt first) -> one context binary, checked to hold exactly those graphs.

        The DLCs are loaded from the saved files with ``qairt.load`` (documented for DLCs and binaries), so a
        compile needs nothing from the convert job's process.

        Raises:
            GenieBuildError: a missing input or module, qairt failed, or the binary's graph names differ.
        """
        api, sdk = self._ready()
        graph_names = [check_graph_name(name) for name in converted]
        dlcs = [require_file(path) for path in converted.values()]
        with staging_directory(out_path) as staging:
            try:
                config = compile_config(api, graph_names, options)
                models = [api.load(str(path)) for path in dlcs]
                result = api.compile(models, config=config)
                saved = Path(result.save(str(staging / f"{out_path.stem}.bin")))
            except Exception as exc:  # qairt raises its own error types; the job needs one line naming the file
                raise GenieBuildError(out_path, f"qairt.compile failed: {exc}") from exc
            publish_binary(saved, out_path, "qairt.compile", sdk, self.name, graph_names)

    def inspect(self, binary_path: Path) -> BinaryInfo:
        """Read a context binary back through the SDK's ``qnn-context-binary-utility``."""
        return inspect_with_sdk(self.name, binary_path)

    def _ready(self) -> tuple[QairtApi, Sdk]:
        return import_qairt(), locate_sdk(self.name, (CONTEXT_BINARY_UTILITY,))
