"""The reference toolchain as the workflow calls it (see :class:`genie_build.toolchains.base.Toolchain`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from genie_build.toolchains.base import BinaryInfo, CompileOptions
from genie_build.toolchains.reference.container_format import TOOLCHAIN, inspect_container

__all__ = ["ReferenceToolchain"]


class ReferenceToolchain:
    """Quantization, packing and weight sharing in numpy/onnx; runs wherever the package runs."""

    name = TOOLCHAIN

    def check_available(self) -> None:
        """Nothing to check: everything it uses is a dependency of the package."""

    def convert(self, onnx_path: Path, encodings_path: Path, out_path: Path, *, graph_name: str,
                float_bitwidth: int, input_names: Mapping[str, str] | None = None,
                share_weights_with: Path | None = None) -> None:
        """See :func:`genie_build.toolchains.reference.convert.convert_model`."""
        # imported here, as in compile: numpy and onnx take 0.2 s that the commands only reading a binary
        # (account, bundle, check-bundle) need not pay
        from genie_build.toolchains.reference.convert import convert_model
        convert_model(onnx_path, encodings_path, out_path, graph_name=graph_name, float_bitwidth=float_bitwidth,
                      input_names=input_names, share_weights_with=share_weights_with)

    def compile(self, converted: dict[str, Path], out_path: Path, options: CompileOptions) -> None:
        """See :func:`genie_build.toolchains.reference.container.write_container`."""
        from genie_build.toolchains.reference.container import write_container
        write_container(converted, out_path, options)

    def inspect(self, binary_path: Path) -> BinaryInfo:
        """See :func:`genie_build.toolchains.reference.container_format.inspect_container`."""
        return inspect_container(binary_path)
