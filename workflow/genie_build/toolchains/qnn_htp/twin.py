"""The twin of a qnn-htp part: the same graphs, names and encodings in one context binary whose graphs hold their own
weights, because a weight-shared binary cannot run on x86 ("Shared weights buffer isn't supported on this
platform"), and one EPContext model per graph through which ONNX Runtime runs it in the HTP simulation of the
vendor's x86 libraries.

A twin folder holds ``context.bin`` and ``<graph name>.onnx`` per graph (ORT's own EPContext model, pointed at
``context.bin`` and at the graph's name in it). The host run and Genie's run on the build box load twins; what makes
them stand for the shipped binaries is :func:`require_same_io`: every graph's name, IO tensors and their
quantization read back equal.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import onnx

from genie_build.errors import GenieBuildError
from genie_build.fileio import atomic_directory
from genie_build.toolchains.base import CompileOptions

__all__ = ["TWIN_BINARY", "require_same_io", "twin_models", "twin_target", "write_twin"]

TWIN_BINARY = "context.bin"


def write_twin(converted: Mapping[str, Path], out_dir: str | os.PathLike[str], options: CompileOptions) -> None:
    """Compile ``converted`` (graph name -> QDQ graph) without weight sharing into the twin folder ``out_dir``
    (replaced only once complete).

    Raises:
        GenieBuildError: as :func:`genie_build.toolchains.qnn_htp.backend.prepare_context`.
    """
    from genie_build.toolchains.qnn_htp.backend import prepare_context
    from genie_build.toolchains.qnn_htp.toolchain import htp_target

    with atomic_directory(out_dir) as staging:
        models = prepare_context(converted, staging, htp_target(options), weight_sharing=False)
        binaries = sorted(staging.glob("*.bin"))
        if len(binaries) != 1:
            raise GenieBuildError(out_dir, f"the HTP backend wrote {len(binaries)} context binaries, not one")
        binaries[0].rename(staging / TWIN_BINARY)
        for name, model in zip(converted, models):
            _point_at(model, name)


def _point_at(path: Path, graph_name: str) -> None:
    """Point ORT's EPContext model at ``graph_name`` in :data:`TWIN_BINARY`, as the context's main node."""
    model = onnx.load(os.fspath(path))
    for node in model.graph.node:
        if node.op_type != "EPContext":
            continue
        node.name = graph_name
        for attribute in node.attribute:
            if attribute.name == "partition_name":
                attribute.s = graph_name.encode()
            elif attribute.name == "ep_cache_context":
                attribute.s = TWIN_BINARY.encode()
            elif attribute.name == "main_context":
                attribute.i = 1
    onnx.save(model, os.fspath(path))


def twin_models(twin_dir: str | os.PathLike[str], graph_names: list[str]) -> dict[str, Path]:
    """The EPContext model of each graph in a twin folder.

    Raises:
        GenieBuildError: a graph without its model.
    """
    twin_dir = Path(twin_dir)
    missing = [name for name in graph_names if not (twin_dir / f"{name}.onnx").is_file()]
    if missing or not (twin_dir / TWIN_BINARY).is_file():
        raise GenieBuildError(twin_dir, f"not a complete twin: missing {missing or [TWIN_BINARY]}")
    return {name: twin_dir / f"{name}.onnx" for name in graph_names}


def require_same_io(shipped: str | os.PathLike[str], twin_dir: str | os.PathLike[str]) -> list[str]:
    """The shipped binary's graph names, after checking that the twin holds the same graphs with the same IO
    tensors (names, shapes, types, quantization), both read back by libQnnSystem.

    Raises:
        GenieBuildError: a graph or tensor that differs, named.
    """
    from genie_build.qnn_wheel.system import read_context_binary

    ours = {graph.info.name: graph.info for graph in read_context_binary(shipped).graphs}
    theirs = {graph.info.name: graph.info for graph in read_context_binary(Path(twin_dir) / TWIN_BINARY).graphs}
    if sorted(ours) != sorted(theirs):
        raise GenieBuildError(twin_dir, f"holds graphs {sorted(theirs)}, the shipped {shipped} {sorted(ours)}")
    for name, graph in ours.items():
        for side in ("inputs", "outputs"):
            if getattr(graph, side) != getattr(theirs[name], side):
                raise GenieBuildError(twin_dir, f"graph {name}: its {side} differ from those of {shipped}")
    return list(ours)


def twin_target(twin_dir: str | os.PathLike[str]):
    """The HTP target a twin runs on in the simulation: the SoC its binary was compiled for, read back.

    Raises:
        GenieBuildError: a SoC the chipset table does not know.
    """
    from genie_build.chipsets import CHIPSETS
    from genie_build.qnn_wheel.system import read_context_binary
    from genie_build.toolchains.qnn_htp.backend import HtpTarget

    soc_model = read_context_binary(Path(twin_dir) / TWIN_BINARY).soc_model
    chipset = next((chipset for chipset in CHIPSETS.values() if chipset.soc_model == soc_model), None)
    if chipset is None:
        raise GenieBuildError(twin_dir, f"compiled for soc_model {soc_model}, which the chipset table does not know")
    return HtpTarget(soc_model=soc_model, htp_arch=int(chipset.dsp_arch.lstrip("v")))
