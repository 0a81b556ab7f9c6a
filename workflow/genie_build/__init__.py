"""genie-build: ONNX LLM + AIMET encodings -> weight-packed, weight-shared Qualcomm Genie bundle.

One module per stage of the data flow, named as its rule and command (docs/stages.md is the map): ``demo``,
``calibrate``, ``train_tokenizer``, ``genie_contract``, ``check_model``, ``plan``, ``split``, ``verify_split``,
``slice_encodings`` (over the ``encodings`` package), ``export`` (a Hugging Face checkpoint, read by
``hf_checkpoint`` and ``hf_config``; planned by ``shape_plan``), ``verify_parts``, ``tokens``, ``calibrate_unit``
(by the named recipes of ``recipes``), ``part_encodings``, ``check_plan``, ``toolchains``, ``sizes``,
``memory_plan``, ``bundle``, ``check_bundle``, ``run_bundle``, ``evaluate``, ``evaluation_table``, ``estimate``
(with ``weight_inventory`` and ``precision``). Every stage takes Genie's names, formats
and feeds from ``conventions`` (docs/conventions.md in code); the config schema is package data
(``schema/config.schema.yaml``).
The CLI (``python -m genie_build``) is a thin layer over them; the package never imports Snakemake.
"""

__version__ = "0.1.0"
