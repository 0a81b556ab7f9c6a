"""The ``qairt`` toolchain: QAIRT's Python API (qairt-dev), called as the field report did, with the settings the
vendor's own LLM build adds.

convert: ``qairt.convert(<graph>.onnx, encodings=E, calibration_config=CalibrationConfig(act_precision=16,
bias_precision=32), graph_name=G, input_tensor_config=[{name, layout: NONTRIVIAL, datatype} per input],
float_bitwidth=16)`` then ``.save(<graph>.dlc)``. compile: ``qairt.compile([prompt, token],
config=CompileConfig(backend="HTP", io_tensor_mem_type="memhandle", ...))`` then ``.save(NAME.bin)``, the config
objects built from the same backend-extension JSON the ``qnn-cli`` toolchain writes
(:func:`genie_build.toolchains.qnn_sdk.backend_extension_config`). qairt hands that JSON to the SDK's
context-binary generator module (in-process or as a subprocess: the SDK decides). It needs its own environment
(``scripts/make_qairt_env.sh`` or ``envs/qairt.yaml``); see docs/toolchains.md for the choices made here.

``import qairt`` is only attempted once the SDK is known to be usable, because qairt-dev 0.13.0 otherwise asks
the vendor's server over HTTPS (no ``QAIRT_SDK_ROOT``), raises ``RuntimeError`` (no ``sdk.yaml``) or calls
``sys.exit(1)`` (the SDK's native Python modules do not import).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from genie_build.errors import GenieBuildError
from genie_build.toolchains.base import SDK_ROOT_VARIABLE, BinaryInfo, CompileOptions
from genie_build.toolchains.context_binary_json import CONTEXT_BINARY_UTILITY
from genie_build.toolchains.qnn_sdk import (
    CALIBRATION,
    INPUT_LAYOUT,
    IO_TENSOR_MEM_TYPE,
    Sdk,
    backend_extension_config,
    check_graph_name,
    graph_inputs,
    inspect_with_sdk,
    locate_sdk,
    publish,
    publish_binary,
    require_file,
    stage_onnx_as_graph,
    staging_directory,
)

__all__ = ["QairtApi", "QairtToolchain", "compile_config", "import_qairt"]

TOOLCHAIN = "qairt"
DISTRIBUTION = "qairt-dev"
CHECKED_QAIRT_DEV = "0.13.0"  # the release envs/requirements-qairt.txt pins and tests/qairt_api checks against
COMPILE_CONFIG_MODULE = "qairt.api.compiler.config"
HTP_CONFIG_MODULE = "qairt.api.common.backends.htp.config"
SDK_VERSION_FILE = "sdk.yaml"  # qairt-dev reads the SDK's version from it (qairt_sdk_helper.get_version_from_path)
QAIRT_DEV_CONFIG = "qairt/qairt_dev_config.yaml"  # holds min_qairt_version, inside the qairt-dev distribution


@dataclass(frozen=True)
class QairtApi:
    """The parts of the ``qairt`` package this toolchain calls."""

    convert: Callable[..., Any]
    compile: Callable[..., Any]
    load: Callable[..., Any]
    CalibrationConfig: type
    CompileConfig: type
    HtpGraphConfig: type
    HtpContextConfig: type
    HtpDeviceConfig: type
    HtpDeviceCoreConfig: type
    HtpMemoryConfig: type


def _check_sdk_version(root: Path) -> str:
    """The SDK version ``root/sdk.yaml`` gives, checked against the minimum the installed qairt-dev accepts.

    Raises:
        GenieBuildError: qairt-dev is not installed, ``sdk.yaml`` is missing or unreadable, or the SDK is older.
    """
    minimum = str(_read_yaml(_qairt_dev_file(QAIRT_DEV_CONFIG), "min_qairt_version"))
    version = str(_read_yaml(root / SDK_VERSION_FILE, "version"))
    if _release(version) < _release(minimum):
        raise GenieBuildError(root / SDK_VERSION_FILE, f"QAIRT SDK {version}, but qairt-dev "
                                                       f"{importlib.metadata.version(DISTRIBUTION)} needs "
                                                       f"{minimum} or newer: point {SDK_ROOT_VARIABLE} at a newer SDK")
    return version


def import_qairt(root: Path) -> QairtApi:
    """Import ``qairt`` (only once :func:`_check_sdk_version` passed) and the classes this adapter uses.

    Raises:
        GenieBuildError: ``qairt`` fails to import -- whatever it raises, ``sys.exit`` included (qairt-dev itself
            is known to be installed by then) -- or lacks a module this adapter needs.
    """
    try:
        qairt = importlib.import_module("qairt")
    except (Exception, SystemExit) as exc:  # qairt calls sys.exit(1) when the SDK's native modules do not load
        raise GenieBuildError(f"toolchain {TOOLCHAIN}",
                              f"import qairt failed with the SDK at {root} ({type(exc).__name__}: {exc}): the "
                              f"SDK's Python modules in {root}/lib/python must load in {sys.executable} (an SDK "
                              "built for this Python version, with its host libraries)") from None
    try:
        compile_config = importlib.import_module(COMPILE_CONFIG_MODULE)
        htp_config = importlib.import_module(HTP_CONFIG_MODULE)
        return QairtApi(convert=qairt.convert, compile=qairt.compile, load=qairt.load,
                        CalibrationConfig=qairt.CalibrationConfig, CompileConfig=compile_config.CompileConfig,
                        HtpGraphConfig=htp_config.HtpGraphConfig, HtpContextConfig=htp_config.HtpContextConfig,
                        HtpDeviceConfig=htp_config.HtpDeviceConfig,
                        HtpDeviceCoreConfig=htp_config.HtpDeviceCoreConfig,
                        HtpMemoryConfig=htp_config.HtpMemoryConfig)
    except (ImportError, AttributeError) as exc:
        raise GenieBuildError(f"toolchain {TOOLCHAIN}",
                              f"the qairt package at {getattr(qairt, '__file__', '?')} lacks what this adapter "
                              f"calls ({exc}): it needs qairt.convert/compile/load/CalibrationConfig, "
                              f"{COMPILE_CONFIG_MODULE} and {HTP_CONFIG_MODULE}; install qairt-dev "
                              f"{CHECKED_QAIRT_DEV}") from exc


def _convert_arguments(api: QairtApi, network: Path, encodings: Path, graph_name: str,
                       float_bitwidth: int) -> dict[str, Any]:
    """The keyword arguments of ``qairt.convert`` besides the model path.

    ``float_bitwidth`` is passed under that name, as the field report did: it is the converter module's own name,
    which qairt renames ``float_precision`` to (``convert_util.py``), and qairt passes unknown keywords through.
    """
    return {"encodings": str(encodings), "calibration_config": api.CalibrationConfig(**CALIBRATION),
            "graph_name": graph_name,
            "input_tensor_config": [{"name": name, "layout": INPUT_LAYOUT, "datatype": datatype}
                                    for name, datatype in graph_inputs(network)],
            "float_bitwidth": float_bitwidth}


def compile_config(api: QairtApi, backend_extension: Mapping[str, Any]) -> Any:
    """The ``CompileConfig`` whose backend extension qairt writes as ``backend_extension`` (the JSON of
    :func:`backend_extension_config`): one ``HtpGraphConfig`` per ``graphs`` entry, the context, device (with its
    cores) and memory configs, and memory-handle IO.

    JSON keys become fields through the serialization aliases qairt declares (``O`` is ``optimization_type``,
    ``vtcm_mb`` is ``vtcm_size_in_mb``, ``core_id`` is ``id``), so a key qairt does not know is refused here
    instead of being carried as an unchecked extra. Every field is set explicitly: qairt writes the JSON with
    ``exclude_unset=True``, so a field left at its default would vanish and the backend would use its own.

    Raises:
        GenieBuildError: a key qairt has no field for. (qairt's own validation errors pass through.)
    """
    graphs = [api.HtpGraphConfig(name=name, **_fields(api.HtpGraphConfig, entry, skip=("graph_names",)))
              for entry in backend_extension["graphs"] for name in entry["graph_names"]]
    devices = [api.HtpDeviceConfig(**_fields(api.HtpDeviceConfig, device, skip=("cores",)),
                                   cores=[api.HtpDeviceCoreConfig(**_fields(api.HtpDeviceCoreConfig, core))
                                          for core in device["cores"]])
               for device in backend_extension["devices"]]
    return api.CompileConfig(
        backend="HTP",
        io_tensor_mem_type=IO_TENSOR_MEM_TYPE,
        graph_custom_configs=graphs,
        context_custom_configs=[api.HtpContextConfig(**_fields(api.HtpContextConfig, context))
                                for context in backend_extension["context"]],
        device_custom_configs=devices,
        memory_custom_config=api.HtpMemoryConfig(**_fields(api.HtpMemoryConfig, backend_extension["memory"])),
    )


def _fields(config_class: type, section: Mapping[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """A backend-extension JSON object -> keyword arguments of the qairt config class it serializes."""
    by_key = {(info.serialization_alias or name): name for name, info in config_class.model_fields.items()}
    unknown = sorted(set(section) - set(by_key) - set(skip))
    if unknown:
        raise GenieBuildError(f"toolchain {TOOLCHAIN}", f"qairt's {config_class.__name__} has no field for "
                                                        f"backend-extension key(s) {unknown}")
    return {by_key[key]: value for key, value in section.items() if key not in skip}


def _qairt_dev_file(relative: str) -> Path:
    """A file of the installed qairt-dev distribution, found without importing ``qairt``."""
    try:
        return Path(str(importlib.metadata.distribution(DISTRIBUTION).locate_file(relative)))
    except importlib.metadata.PackageNotFoundError:
        raise GenieBuildError(f"toolchain {TOOLCHAIN}",
                              f"the qairt Python package (qairt-dev) is not installed for {sys.executable}: "
                              "create the QAIRT environment (scripts/make_qairt_env.sh, or envs/qairt.yaml) and "
                              "point toolchains.qairt.python at its interpreter") from None


def _read_yaml(path: Path, key: str) -> object:
    """``key`` of the YAML mapping in ``path``."""
    if not path.is_file():
        hint = (f"{SDK_ROOT_VARIABLE} must name an unpacked QAIRT SDK (its root holds {SDK_VERSION_FILE})"
                if path.name == SDK_VERSION_FILE else f"reinstall qairt-dev {CHECKED_QAIRT_DEV}")
        raise GenieBuildError(path, f"file not found: {hint}")
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise GenieBuildError(path, f"not readable YAML: {exc}") from None
    if not isinstance(document, dict) or key not in document:
        raise GenieBuildError(path, f"has no {key!r} entry")
    return document[key]


def _release(version: str) -> tuple[int, ...]:
    """``"2.46.0.250724"`` -> ``(2, 46, 0)``: the release numbers qairt-dev's minimum is given in."""
    numbers = re.findall(r"\d+", version)[:3]
    if not numbers:
        raise GenieBuildError(SDK_VERSION_FILE, f"version {version!r} is not a release number")
    return tuple(int(number) for number in numbers)


class QairtToolchain:
    """QAIRT's Python API (``qairt-dev``) with ``$QAIRT_SDK_ROOT``; runs in the interpreter that imports it."""

    name = TOOLCHAIN

    def check_available(self) -> None:
        """Raises GenieBuildError naming what is missing or unusable: the SDK root, its ``sdk.yaml`` and version,
        its utility, or the ``qairt`` module -- checked in that order, so nothing reaches the network."""
        self._ready()

    def convert(self, onnx_path: Path, encodings_path: Path, out_path: Path, *, graph_name: str,
                float_bitwidth: int) -> None:
        """ONNX part + encodings -> DLC whose graph is called ``graph_name`` (see :func:`_convert_arguments`).

        Raises:
            GenieBuildError: a missing input or module, or qairt failed.
        """
        api, _ = self._ready()
        encodings = require_file(encodings_path)
        with staging_directory(out_path) as staging:
            network = stage_onnx_as_graph(onnx_path, graph_name, staging)
            arguments = _convert_arguments(api, network, encodings, graph_name, float_bitwidth)
            try:
                model = api.convert(str(network), **arguments)
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
                config = compile_config(api, backend_extension_config(graph_names, options))
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
        sdk = locate_sdk(self.name, (CONTEXT_BINARY_UTILITY,))
        _check_sdk_version(sdk.root)
        return import_qairt(sdk.root), sdk
