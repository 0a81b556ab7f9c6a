"""Recording doubles of the three ``qairt`` calls that need the native SDK: ``convert``, ``load``, ``compile``.

Everything else the ``qairt`` toolchain touches is qairt-dev's own code (tests/qairt_api seeds a ``qairt``
package whose ``convert``/``load``/``compile`` are these, and imports the real config classes). Signatures follow
qairt-dev 0.13.0: ``convert(model, encodings=None, calibration_config=None, backend="HTP", **extra_args)``,
``load(path, **load_args)``, ``compile(model | [models], *, backend=None, config=None)``, ``Model.save(path) ->
str``, ``CompiledModel.save(path, asset_type=None) -> str``. Like the real ones, ``convert`` validates its extras
with qairt's ``ConverterConfig`` and names the DLC graph ``graph_name`` (else the model file's stem), and
``compile`` serializes the config with qairt's ``HtpConfigHelper.to_backend_extension_dict`` -- the JSON the SDK
would receive, which is what it records.
"""

from __future__ import annotations

import os
from pathlib import Path

from genie_build_doubles import (
    DLC_FORMAT,
    asked_to_fail,
    binary_placeholder,
    dlc_placeholder,
    read_placeholder,
    record,
    write_json,
)


class Model:
    """A converted (not compiled) model: a placeholder DLC in memory."""

    def __init__(self, dlc: dict) -> None:
        self.dlc = dlc

    def save(self, path: str | os.PathLike = "") -> str:
        record({"call": "Model.save", "path": os.fspath(path), "graph_name": self.dlc["graph_name"]})
        write_json(path, self.dlc)
        return os.fspath(path)


class CompiledModel:
    """A compiled model: a placeholder context binary in memory."""

    def __init__(self, binary: dict) -> None:
        self.binary = binary

    def save(self, path: str | os.PathLike = "", asset_type=None) -> str:
        record({"call": "CompiledModel.save", "path": os.fspath(path)})
        write_json(path, self.binary)
        return os.fspath(path)


def convert(model, encodings=None, calibration_config=None, backend="HTP", **extra_args) -> Model:
    from qairt.api.converter.converter_config import CalibrationConfig, ConverterConfig

    ConverterConfig(**extra_args)  # qairt's first step (_convert.py): validates the extras, then discards it
    if calibration_config is not None and not isinstance(calibration_config, CalibrationConfig):
        raise TypeError(f"calibration_config must be a CalibrationConfig, got {type(calibration_config)}")
    record({"call": "qairt.convert", "model": os.fspath(model),
            "encodings": None if encodings is None else os.fspath(encodings),
            "calibration_config": None if calibration_config is None else calibration_config.model_dump(
                exclude_unset=True),
            "backend": backend, "extra_args": extra_args})
    if asked_to_fail("qairt.convert"):
        raise RuntimeError("Model conversion failed: double asked to fail")
    dlc = dlc_placeholder(model, encodings, {"float_bitwidth": extra_args.get("float_bitwidth")})
    dlc["graph_name"] = extra_args.get("graph_name") or Path(model).stem
    return Model(dlc)


def load(path, **load_args) -> Model:
    record({"call": "qairt.load", "path": os.fspath(path), "load_args": load_args})
    return Model(read_placeholder(path, DLC_FORMAT))


def compile(model, *, backend=None, config=None) -> CompiledModel:  # noqa: A001 - qairt's own name
    from qairt.api.common.backends.htp.config import HtpConfigHelper

    models = model if isinstance(model, list) else [model]
    extension = None if config is None else HtpConfigHelper.to_backend_extension_dict(
        config.context_custom_configs, config.graph_custom_configs, config.device_custom_configs,
        config.memory_custom_config, config.group_context_config)
    record({"call": "qairt.compile", "graph_names": [item.dlc["graph_name"] for item in models],
            "backend": backend, "io_tensor_mem_type": None if config is None else config.io_tensor_mem_type,
            "backend_extension": extension})
    if asked_to_fail("qairt.compile"):
        raise RuntimeError("Compilation failed: double asked to fail")
    return CompiledModel(binary_placeholder([item.dlc for item in models], "qairt.compile", extension))
