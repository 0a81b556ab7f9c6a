"""Recording double of QAIRT's ``qairt`` package: ``convert``, ``load``, ``compile`` and the models they return.

Signatures follow qairt's sources: ``convert(model, encodings=None, calibration_config=None, backend="HTP",
**extra_args)`` (the DLC takes the model file's stem as its name), ``load(path)``, ``compile(model | [models], *,
backend=None, config=None)``, ``Model.save(path) -> str``, ``CompiledModel.save(path) -> str``.
"""

from __future__ import annotations

import os

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

    def save(self, path: str | os.PathLike = "") -> str:
        record({"call": "CompiledModel.save", "path": os.fspath(path)})
        write_json(path, self.binary)
        return os.fspath(path)


def convert(model, encodings=None, calibration_config=None, backend="HTP", **extra_args) -> Model:
    record({"call": "qairt.convert", "model": os.fspath(model),
            "encodings": None if encodings is None else os.fspath(encodings),
            "calibration_config": calibration_config, "backend": backend, "extra_args": extra_args})
    if asked_to_fail("qairt.convert"):
        raise RuntimeError("Model conversion failed: double asked to fail")
    return Model(dlc_placeholder(model, encodings, extra_args))


def load(path, **load_args) -> Model:
    record({"call": "qairt.load", "path": os.fspath(path), "load_args": load_args})
    return Model(read_placeholder(path, DLC_FORMAT))


def compile(model, *, backend=None, config=None) -> CompiledModel:  # noqa: A001 - qairt's own name
    models = model if isinstance(model, list) else [model]
    record({"call": "qairt.compile", "graph_names": [item.dlc["graph_name"] for item in models],
            "backend": backend, "config": None if config is None else config.to_record()})
    if asked_to_fail("qairt.compile"):
        raise RuntimeError("Compilation failed: double asked to fail")
    return CompiledModel(binary_placeholder([item.dlc for item in models], "qairt.compile"))

