"""The ``qnn-htp`` toolchain: the vendor's own HTP compiler on any x86-64 Linux box, from the PyPI wheel
onnxruntime-qnn (see :class:`genie_build.toolchains.base.Toolchain`).

- convert: a part's graph + its encodings -> the QDQ ONNX graph saying what the encodings say
  (:mod:`genie_build.toolchains.qnn_htp.qdq`); :func:`convert_dlc`: the DLC QNN's IR backend makes of it;
- compile: every graph of a part into one HTP context binary for the chipset, under the bundle's graph names, the
  weights stored once (:mod:`genie_build.toolchains.qnn_htp.backend`);
- inspect: the binary read back by the vendor's libQnnSystem (:mod:`genie_build.qnn_wheel.system`).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from genie_build.errors import GenieBuildError
from genie_build.qnn_wheel import locate_wheel
from genie_build.toolchains.base import AppliedOptions, BinaryInfo, CompileOptions

__all__ = ["NAME", "QnnHtpToolchain", "convert_dlc", "device_runtime", "htp_target", "qnn_binary_info"]

NAME = "qnn-htp"


def htp_target(options: CompileOptions):
    """The backend's target for a variant's options."""
    from genie_build.toolchains.qnn_htp.backend import HtpTarget
    return HtpTarget(soc_model=options.soc_model, htp_arch=int(options.dsp_arch.lstrip("v")),
                     optimization=options.optimization_type, vtcm_mb=options.vtcm_mb)


class QnnHtpToolchain:
    """The vendor's HTP backend through ONNX Runtime's QNN execution provider; runs on x86-64 Linux."""

    name = NAME

    def check_available(self) -> None:
        """Raises GenieBuildError naming the extra that installs the wheel, or the platform that has none."""
        locate_wheel(f"toolchain {NAME}")

    def convert(self, onnx_path: Path, encodings_path: Path, out_path: Path, *, graph_name: str,
                float_bitwidth: int, input_names: Mapping[str, str] | None = None,
                share_weights_with: Path | None = None) -> None:
        """The QDQ graph at ``out_path`` (+ ``.data``).

        ``float_bitwidth`` does not apply: every float constant the encodings leave out is quantized
        (:data:`genie_build.toolchains.qnn_htp.qdq.CONSTANT_BITWIDTH`), as the HTP runs integer graphs."""
        from genie_build.toolchains.qnn_htp.qdq import write_qdq_model

        write_qdq_model(onnx_path, encodings_path, out_path, graph_name=graph_name, input_names=input_names,
                        share_weights_with=share_weights_with)

    def compile(self, converted: dict[str, Path], out_path: Path, options: CompileOptions) -> None:
        """Every converted graph into one context binary at ``out_path`` (staged beside it)."""
        from genie_build.toolchains.qnn_htp.backend import prepare_context

        out_path = Path(out_path)
        with tempfile.TemporaryDirectory(dir=out_path.parent, prefix=f".{out_path.name}.") as folder:
            prepare_context(converted, Path(folder), htp_target(options),
                            weight_sharing=options.weight_sharing_enabled,
                            weights_packing=options.weights_packing)
            binaries = sorted(Path(folder).glob("*.bin"))
            if len(binaries) != 1:
                raise GenieBuildError(out_path, f"the HTP backend wrote {len(binaries)} context binaries, not one")
            _require_graph_names(binaries[0], list(converted))
            os.replace(binaries[0], out_path)

    def inspect(self, binary_path: Path) -> BinaryInfo:
        """The binary as libQnnSystem reads it: graphs with their IO and quantization, the SoC, the QNN build."""
        return qnn_binary_info(binary_path, NAME)


def convert_dlc(qdq_path: Path, graph_name: str, out_path: Path) -> None:
    """The DLC QNN's IR backend makes of a converted QDQ graph, named ``graph_name`` inside, at ``out_path``: the graph
    in the vendor's own form, for the vendor's tools. Whatever the SoC: any chipset's target writes the same one.

    Raises:
        GenieBuildError: the wheel is missing, or the IR backend refuses the graph.
    """
    from genie_build.chipsets import CHIPSETS
    from genie_build.toolchains.qnn_htp.backend import HtpTarget, write_dlc

    locate_wheel(f"toolchain {NAME}")
    device = CHIPSETS["SM8750"]
    target = HtpTarget(device.soc_model, int(device.dsp_arch.lstrip("v")))
    write_dlc(Path(qdq_path), graph_name, Path(out_path), target)


def qnn_binary_info(binary_path: Path, toolchain: str, library: Path | None = None) -> BinaryInfo:
    """A QNN context binary read back by libQnnSystem (the wheel's, or ``library``): graphs with their IO,
    quantization, spill-fill and op data, the weights as stored, the SoC, the QNN build and the device runtime it
    needs, and what it says was applied (O level and VTCM per graph, weight sharing)."""
    from genie_build.qnn_wheel.system import read_context_binary

    binary = read_context_binary(binary_path, library=library)
    blobs = {graph.info.name: graph.htp for graph in binary.graphs if graph.htp is not None}
    shared = max((blob.shared_weights_bytes or 0 for blob in blobs.values()), default=0)
    applied = AppliedOptions(soc_model=binary.soc_model, dsp_arch=binary.dsp_arch,
                             weight_sharing_enabled=shared > 0 if blobs else None,
                             optimization_type={name: blob.optimization_level for name, blob in blobs.items()},
                             vtcm_size={name: blob.vtcm_bytes for name, blob in blobs.items()})
    graphs = tuple(dataclasses.replace(graph.info, spill_fill_bytes=_blob(graph, "spill_fill_bytes"),
                                       op_data_bytes=_blob(graph, "op_data_bytes")) for graph in binary.graphs)
    # the weights as stored: once for all graphs when shared, else each graph's constants
    weights = shared or sum(blob.const_bytes or 0 for blob in blobs.values())
    return BinaryInfo(path=os.fspath(binary_path), file_bytes=binary.file_bytes, weight_bytes=weights,
                      graphs=graphs, toolchain=toolchain, tool_version=f"QNN {binary.build_id}", applied_options=applied,
                      device_runtime=device_runtime(binary.build_id, binary.context_blob_version))


def device_runtime(build_id: str, blob_version: str) -> str:
    """The oldest device runtime that loads a binary: a QNN runtime refuses a context binary from a newer QNN
    ("newer context binary on old SDK"), so the QNN release that wrote it (``v2.51.0.260929181845`` -> 2.51)."""
    release = ".".join(build_id.lstrip("v").split(".")[:2])
    return f"QNN (QAIRT) {release} or newer on the device (context blob {blob_version})"


def _blob(graph, field: str) -> int | None:
    return None if graph.htp is None else getattr(graph.htp, field)


def _require_graph_names(binary: Path, expected: list[str]) -> None:
    """The binary holds exactly the graph names the bundle uses, read back by libQnnSystem.

    Raises:
        GenieBuildError: other names (the graph names Genie orders and parses were not applied).
    """
    from genie_build.qnn_wheel.system import read_context_binary

    found = [graph.info.name for graph in read_context_binary(binary).graphs]
    if sorted(found) != sorted(expected):
        raise GenieBuildError(binary, f"holds graphs {found}, expected {expected}")
