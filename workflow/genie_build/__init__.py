"""genie-build: ONNX LLM + AIMET encodings -> weight-packed, weight-shared Qualcomm Genie bundle.

One module per stage of the data flow (see README): ``demo``, ``calibrate``, ``tokenizer_train``, ``export`` (a
Hugging Face checkpoint, read by ``hf_checkpoint`` and ``hf_config``), ``shape_plan``, ``quantize`` (by the named
recipes of ``recipes``), ``part_encodings``, ``plan``, ``split``, ``slice_encodings`` (over the ``encodings``
package), ``verify``, ``toolchains``, ``sizes``, ``memory_plan``, ``bundle``, ``check_bundle``, ``run_bundle``,
``evaluate``, ``estimate`` (with ``weight_inventory`` and ``precision``). Every stage takes Genie's names, formats
and feeds from ``conventions`` (docs/conventions.md in code); the config schema is package data
(``schema/config.schema.yaml``).
The CLI (``python -m genie_build``) is a thin layer over them; the package never imports Snakemake.
"""

__version__ = "0.1.0"
