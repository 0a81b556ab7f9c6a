# genie-build: ONNX LLM (prompt + token graphs) + AIMET encodings -> weight-packed, weight-shared Genie bundle.
# Data flow and file layout: README.md and docs/conventions.md.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


# A checkpoint is exported and calibrated part by part; whole graphs (the demo's or the user's) are split, and their
# encodings sliced. An estimate-only config has no graphs: the estimate's rules alone.
if SOURCE_KIND == "hf":

    include: "workflow/rules/export.smk"

elif SOURCE_KIND in ("demo", "files"):
    if SOURCE_KIND == "demo":

        include: "workflow/rules/source.smk"

    include: "workflow/rules/split.smk"


if SOURCE_KIND != "estimate":
    if CALIBRATION_CHAIN:

        include: "workflow/rules/calibrate.smk"

    else:

        include: "workflow/rules/encodings.smk"

    include: "workflow/rules/tokens.smk"
    include: "workflow/rules/convert.smk"
    include: "workflow/rules/compile.smk"
    include: "workflow/rules/sizes.smk"
    include: "workflow/rules/bundle.smk"
    include: "workflow/rules/evaluate.smk"


include: "workflow/rules/estimate.smk"


# Snakemake leaves a timer behind that would keep the finished process alive for up to a second.
onsuccess:
    cancel_rescheduling_timers()


onerror:
    cancel_rescheduling_timers()


rule all:
    input:
        final_outputs,
    default_target: True
