"""AIMET quantization encodings: read (0.6.1, 1.0.0 and 2.0.0), validate, slice per part, write.

The in-memory model is version-independent. AIMET semantics for integer encodings:
``q = clamp(round(x / scale) - offset, 0, 2**bw - 1)`` and ``x_hat = (q + offset) * scale``; for a
symmetric encoding ``offset = -2**(bw - 1)``, so the signed value ``q + offset`` lies in
``[-2**(bw-1), 2**(bw-1) - 1]``. A 2.0.0 entry (``output_dtype``, ``y_scale``, ``y_zero_point``) is read
into the same terms: ``offset = -y_zero_point`` for an unsigned dtype, ``-(y_zero_point + 2**(bw-1))``
for a signed one.

Per-channel and per-block layout (``docs/conventions.md`` cites the aimet-onnx source of each rule):
- the channel and block axes of a weight follow the op consuming it (:func:`consumer_layouts`, AIMET's
  ``QuantizationSimModel._get_quantization_axes``): last/second-to-last axis of a MatMul ``[in, out]``
  weight, axis 0/1 of a ``[out, in]`` weight reaching MatMul through a Transpose, of a Gemm weight with
  ``transB=1`` and of a Conv weight; a 1-D tensor (a bias) is per channel along axis 0. Version 2.0.0
  states the axis; 1.0.0 and 0.6.1 do not, and a count never decides it.
- in memory, per-channel scales are listed by channel; per-block scales (and LPBQ's
  ``per_block_int_scale``) channel-major, ``[channels, blocks]`` -- the order 1.0.0 writes for every
  2-D weight.
- LPBQ: per-block scale = ``scale[channel] * per_block_int_scale[channel, block]``; ``bitwidth`` is the
  decompressed width, ``compressed_bitwidth`` the stored one.

Every entry is also kept as read, so a part's slice is written in the version (and with the ``producer``

The package: :mod:`~genie_build.encodings.model` (the in-memory model), :mod:`~genie_build.encodings.readers` (one
reader per version) and :mod:`~genie_build.encodings.values` (values checked as stored),
:mod:`~genie_build.encodings.writer`, :mod:`~genie_build.encodings.layout` (axes and the fit to a model) and
:mod:`~genie_build.encodings.slicing` (slices, sharing, and the consistency rules across parts and graphs). Import
from ``genie_build.encodings``: every name below is re-exported here.
"""

from __future__ import annotations

from genie_build.encodings.layout import block_grid, blocked_shape, check_scale_count, layout_of, validate_against_model
from genie_build.encodings.model import (SUPPORTED_FLOAT_BITWIDTHS, SUPPORTED_INT_BITWIDTHS, SUPPORTED_VERSIONS,
                                         WRITTEN_VERSION, EncodingKind, Encodings, TensorEncoding)
from genie_build.encodings.readers import parse_encodings, read_encodings
from genie_build.encodings.slicing import (check_boundary_consistency, check_graphs_consistent, check_kv_cache_tied,
                                           share_encodings, slice_encodings)
from genie_build.encodings.writer import format_encodings, write_encodings

__all__ = ["SUPPORTED_FLOAT_BITWIDTHS", "SUPPORTED_INT_BITWIDTHS", "SUPPORTED_VERSIONS", "WRITTEN_VERSION",
           "EncodingKind", "Encodings", "TensorEncoding", "block_grid", "blocked_shape", "check_boundary_consistency",
           "check_graphs_consistent", "check_kv_cache_tied", "check_scale_count", "format_encodings", "layout_of",
           "parse_encodings", "read_encodings", "share_encodings", "slice_encodings", "validate_against_model",
           "write_encodings"]
