"""The ``qnn-htp`` toolchain: the vendor's HTP compiler on x86-64 Linux, from the onnxruntime-qnn wheel
(:mod:`genie_build.toolchains.qnn_htp.toolchain`)."""

__all__: list[str] = []
