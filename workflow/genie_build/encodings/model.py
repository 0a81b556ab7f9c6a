"""The in-memory model of AIMET encodings, the same for every file version (the semantics are in
:mod:`genie_build.encodings`), and the names the file formats give its parts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ENC_TYPE_TO_KIND", "EncodingKind", "Encodings", "KIND_TO_ENC_TYPE", "SUPPORTED_FLOAT_BITWIDTHS",
           "SUPPORTED_INT_BITWIDTHS", "SUPPORTED_VERSIONS", "TensorEncoding", "V1_SECTIONS", "V2_SECTION",
           "WRITTEN_VERSION", "short_repr"]

EncodingKind = Literal["per_tensor", "per_channel", "per_block", "lpbq"]

SUPPORTED_INT_BITWIDTHS = (4, 8, 16, 32)
SUPPORTED_FLOAT_BITWIDTHS = (16, 32)


@dataclass(frozen=True)
class TensorEncoding:
    """One tensor's encoding. ``scale``/``offset`` have one entry (per tensor) or one per channel/block."""

    name: str
    dtype: Literal["int", "float"]
    bitwidth: int
    kind: EncodingKind = "per_tensor"
    is_symmetric: bool = False
    scale: tuple[float, ...] = ()
    offset: tuple[int, ...] = ()
    block_size: int | None = None
    compressed_bitwidth: int | None = None
    per_block_int_scale: tuple[int, ...] | None = None
    axis: int | None = None  # the channel axis a 2.0.0 file states; None: the consumer's rule decides


@dataclass(frozen=True)
class Encodings:
    """A whole encodings file: activation and parameter encodings keyed by tensor name.

    ``version`` is the version of the file it was read from; ``header`` its other top-level keys
    (``producer``, ``quantizer_args``, ...) and ``entries`` each entry as read with the encoding read from
    it, keyed by ``(section, name)``. None of them take part in equality, since the content means the same
    in any format.
    """

    activations: dict[str, TensorEncoding] = field(default_factory=dict)
    params: dict[str, TensorEncoding] = field(default_factory=dict)
    quantizer_args: dict = field(default_factory=dict)
    version: str = field(default="1.0.0", compare=False)
    header: dict = field(default_factory=dict, compare=False, repr=False)
    entries: dict[tuple[str, str], Any] = field(default_factory=dict, compare=False, repr=False)

    def of_initializer(self, name: str) -> TensorEncoding | None:
        """The encoding a weight is stored with: its param encoding, else an activation encoding AIMET
        gives the initializer itself (the embedding table, which AIMET quantizes as an activation)."""
        return self.params.get(name) or self.activations.get(name)


SUPPORTED_VERSIONS = ("0.6.1", "1.0.0", "2.0.0")
WRITTEN_VERSION = "1.0.0"

ENC_TYPE_TO_KIND: dict[str, EncodingKind] = {
    "PER_TENSOR": "per_tensor", "PER_CHANNEL": "per_channel", "PER_BLOCK": "per_block", "LPBQ": "lpbq",
}
KIND_TO_ENC_TYPE = {kind: enc_type for enc_type, kind in ENC_TYPE_TO_KIND.items()}
V1_SECTIONS = (("activation_encodings", "activation"), ("param_encodings", "param"))
V2_SECTION = "encodings"


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: a value quoted in a one-line error."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."

