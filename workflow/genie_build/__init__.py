"""genie-build: ONNX LLM + AIMET encodings -> weight-packed, weight-shared Qualcomm Genie bundle.

A package per step of the data flow, in its order (docs/stages.md is the map): ``demo``, ``plan``, ``split``
or ``export``, ``quantize``, ``toolchains`` (convert, compile), ``bundle``, ``run``, ``evaluate``, ``sizes``. In
each, a module per stage, named as its rule and command (``plan.plan``, ``quantize.calibrate_unit``,
``bundle.check_bundle``), beside the helpers of that step. At the top: the workflow config (``config``), the
source object the rules ask (``sources``), and what every step shares; every stage takes Genie's names, formats and
feeds from ``conventions`` (docs/conventions.md in code); the config schema is package data
(``schema/config.schema.yaml``).
The CLI (``python -m genie_build``) is a thin layer over them; the package never imports Snakemake.
"""

__version__ = "0.1.0"
