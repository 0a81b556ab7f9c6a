"""The records the reference toolchain's stages hand on, without numpy or onnx, so that a command that only reads
them (account, bundle, check-bundle) does not import those: how convert stored a quantized weight
(:class:`Quantization`, in the converted model's metadata) and an entry of a container's weight table
(:class:`WeightEntry`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["Quantization", "WeightEntry"]


@dataclass(frozen=True)
class Quantization:
    """How convert stored one quantized weight: the record under ``QUANTIZED_WEIGHTS_KEY`` of the converted model
    (keyed by the values tensor), which the container reads to pack and unpack the values. Tensor names, not
    arrays."""

    weight: str                 # the original initializer
    bitwidth: int               # of the stored values (quantize.stored_bitwidth)
    encoding: str               # the encoding's kind: per_tensor, per_channel, per_block, lpbq
    axis: int | None            # the channel axis of the scale and zero point; None: per tensor
    block_axis: int | None
    block_size: int | None
    scale: str
    zero_point: str
    block_int_scale: str | None = None           # LPBQ only: the per-block integer scales
    block_int_scale_bitwidth: int | None = None  # LPBQ only

    def to_dict(self) -> dict:
        """The JSON record; the LPBQ-only keys appear for LPBQ alone."""
        record = dataclasses.asdict(self)
        return {key: value for key, value in record.items() if value is not None or key not in _LPBQ_ONLY}

    @classmethod
    def from_dict(cls, record: dict) -> Quantization:
        return cls(**record)


_LPBQ_ONLY = ("block_int_scale", "block_int_scale_bitwidth")


@dataclass(frozen=True)
class WeightEntry:
    """One stored tensor of the header's weight table (``docs/reference-container.md``): the graphs holding it,
    how it is stored and where, at ``offset`` of the weight section."""

    name: str
    graphs: tuple[str, ...]
    dtype: str                  # numpy dtype name of the values
    shape: tuple[int, ...]
    storage: str                # a raw code ("u8", "f16", ...), "packed4" or "packed4_signed"
    packable_int4: bool         # the values fit 4 bits (the HTP packing rule), packed or not
    offset: int
    length: int
    quantization: Quantization | None = None

    def to_dict(self) -> dict:
        record = {"name": self.name, "graphs": list(self.graphs), "dtype": self.dtype, "shape": list(self.shape),
                  "storage": self.storage, "packable_int4": self.packable_int4, "offset": self.offset,
                  "length": self.length}
        return record if self.quantization is None else {**record, "quantization": self.quantization.to_dict()}

    @classmethod
    def from_dict(cls, record: dict) -> WeightEntry:
        quantization = record.get("quantization")
        return cls(**{**record, "graphs": tuple(record["graphs"]), "shape": tuple(record["shape"]),
                      "quantization": None if quantization is None else Quantization.from_dict(quantization)})
