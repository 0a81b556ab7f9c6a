"""The reference toolchain: what QAIRT's convert and compile do to weights, in numpy, onnx and onnxruntime.

- :mod:`.quantize`: AIMET quantization (per tensor, per channel, per block, LPBQ) and its inverse.
- :mod:`.packing`: 4-bit values two per byte.
- :mod:`.convert`: ONNX part + encodings -> a runnable ONNX with integer weights behind DequantizeLinear
  and float16 fallback weights behind a Cast.
- :mod:`.container`: the prompt and token graphs linked into one documented container file (weights shared
  and packed when asked), read back as runnable models or as an accounting record.
- :mod:`.toolchain`: :class:`~.toolchain.ReferenceToolchain`, the :class:`~genie_build.toolchains.base.Toolchain`
  the workflow calls.
"""
