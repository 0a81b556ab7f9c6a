"""The toolchain interface and what ``inspect`` reads back from a compiled binary."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from genie_build.chipsets import Chipset
from genie_build.errors import GenieBuildError

__all__ = ["AppliedOptions", "BinaryInfo", "CompileOptions", "GraphInfo", "QuantInfo", "SDK_ROOT_VARIABLE",
           "TensorInfo", "Toolchain", "VARIANT_SOURCE_KEYS", "variant_options"]

# Where the QAIRT SDK is unpacked: the SDK toolchains' environment variable (genie_build.toolchains.qnn_sdk).
SDK_ROOT_VARIABLE = "QAIRT_SDK_ROOT"


@dataclass(frozen=True)
class QuantInfo:
    """Quantization of one IO tensor as recorded in the binary (None fields: float tensor)."""

    dtype: str                          # "uint16", "int8", "float16", "float32", "int32", ...
    scale: float | None = None
    offset: int | None = None
    bitwidth: int | None = None


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    quant: QuantInfo | None = None


@dataclass(frozen=True)
class GraphInfo:
    """A graph of a binary and its IO; the HTP buffers it needs where the binary says (a QNN binary read by
    libQnnSystem: spill-fill and op data; None: not told)."""

    name: str                           # e.g. "prompt_ar32_cl256_01_of_06"
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    spill_fill_bytes: int | None = field(default=None, compare=False)
    op_data_bytes: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class AppliedOptions:
    """The options a compiled binary says were applied; None: the binary does not say.

    The reference container reports every field but ``vtcm_size``: the options as given, and the counts of
    packable, packed and shared weights, so a reader can tell "not applied" from "nothing to pack". The SDK's
    ``qnn-context-binary-utility`` reports only the O level and the VTCM size, per graph (graph name -> value).
    On disk (the container's header, accounting records, metadata.yaml) it is :meth:`to_dict`'s mapping.
    """

    weights_packing: bool | None = None
    packable_weights: int | None = None     # weights whose values fit 4 bits
    packed_weights: int | None = None
    weight_sharing_enabled: bool | None = None
    shared_weights: int | None = None       # weights stored once for several graphs
    optimization_type: int | dict[str, int] | None = None
    vtcm_mb: int | None = None
    vtcm_size: dict[str, int] | None = None
    soc_model: int | None = None
    dsp_arch: str | None = None
    float_bitwidth: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields the binary reports, keys sorted (as the container's header stores them)."""
        return {spec.name: getattr(self, spec.name) for spec in sorted(fields(self), key=lambda spec: spec.name)
                if getattr(self, spec.name) is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "applied_options") -> AppliedOptions:
        """Raises: GenieBuildError: a key that is not a field."""
        unknown = sorted(set(data) - {spec.name for spec in fields(cls)})
        if unknown:
            raise GenieBuildError(where, f"unknown applied options {unknown}")
        return cls(**data)


@dataclass(frozen=True)
class BinaryInfo:
    """What a compiled context binary holds, read from the binary itself (never from the request)."""

    path: str
    file_bytes: int
    weight_bytes: int                   # bytes of the weight section as stored
    graphs: tuple[GraphInfo, ...]
    toolchain: str
    tool_version: str
    applied_options: AppliedOptions = field(default_factory=AppliedOptions)
    # what a device must run to load it (a QNN binary: the QNN runtime it was made with or a newer one); None: none
    device_runtime: str | None = None


@dataclass(frozen=True)
class CompileOptions:
    """A variant's options, as the config's ``variants.<name>`` gives them, plus the device (the fields in
    :data:`DEVICE_FIELDS`). Every other field is a variant option: this class is their one definition."""

    weights_packing: bool
    optimization_type: int
    weight_sharing_enabled: bool
    vtcm_mb: int
    soc_model: int
    dsp_arch: str
    float_bitwidth: int = 16

    @classmethod
    def from_variant(cls, variant: dict, chipset: Chipset, where: str = "--variant-json") -> CompileOptions:
        """A variant's options (``variants.<name>``; its ``toolchain`` and ``recipe`` keys say what is compiled,
        not how) plus the chipset's device.

        Raises:
            GenieBuildError: an option is missing, unknown or of the wrong JSON type.
        """
        options = variant_options()
        unknown = sorted(set(variant) - set(options) - set(VARIANT_SOURCE_KEYS))
        missing = sorted(set(options) - set(variant))
        if unknown or missing:
            raise GenieBuildError(where, f"unknown options {unknown}, missing options {missing} "
                                         f"(expected {', '.join(options)})")
        for key, kind in options.items():
            # bool is an int in Python; neither may stand in for the other here.
            if not isinstance(variant[key], kind) or (kind is int and isinstance(variant[key], bool)):
                raise GenieBuildError(where, f"{key} is {variant[key]!r}, expected a JSON "
                                             f"{'boolean' if kind is bool else 'integer'}")
        return cls(**{key: variant[key] for key in options}, soc_model=chipset.soc_model, dsp_arch=chipset.dsp_arch)


DEVICE_FIELDS = ("soc_model", "dsp_arch")
# A variant's keys that choose what is compiled (the toolchain, the recipe of its encodings), not a compile option.
VARIANT_SOURCE_KEYS = ("toolchain", "recipe")
_FIELD_TYPES = {"bool": bool, "int": int}


def variant_options() -> dict[str, type]:
    """The variant options (every :class:`CompileOptions` field but the device's) and their types, in order."""
    return {spec.name: _FIELD_TYPES[spec.type] for spec in fields(CompileOptions) if spec.name not in DEVICE_FIELDS}


class Toolchain(Protocol):
    name: str

    def check_available(self) -> None:
        """Raise GenieBuildError naming what is missing (an SDK, an executable, a module)."""

    def convert(self, onnx_path: Path, encodings_path: Path, out_path: Path, *, graph_name: str,
                float_bitwidth: int) -> None:
        """ONNX part + its encodings -> the toolchain's converted graph (DLC, or reference ONNX)."""

    def compile(self, converted: dict[str, Path], out_path: Path, options: CompileOptions) -> None:
        """Converted graphs keyed by graph name -> one context binary (weight-shared when asked)."""

    def inspect(self, binary_path: Path) -> BinaryInfo:
        """Read a context binary back."""
