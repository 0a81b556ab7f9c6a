# genie-build: a model (the demo, ONNX graphs with or without encodings, a Hugging Face checkpoint) -> a weight-packed,
# weight-shared Genie bundle and the A/B size table. Data flow and file layout: README.md and docs/conventions.md.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/scheduling.smk"
include: "workflow/rules/inputs.smk"


# The source's own rules: what makes its parts and their encodings (genie_build.sources: a checkpoint's export, or
# the split of whole graphs; the slices of the source's encodings, or the calibration chain).
for rules_file in SOURCE.rule_files:

    include: rules_file


include: "workflow/rules/check_contract.smk"
include: "workflow/rules/tokens.smk"
include: "workflow/rules/convert.smk"
include: "workflow/rules/compile.smk"
include: "workflow/rules/embedding.smk"
include: "workflow/rules/sizes.smk"
include: "workflow/rules/bundle.smk"
include: "workflow/rules/host_run.smk"
include: "workflow/rules/genie_run.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/estimate.smk"


rule all:
    input:
        final_outputs,
    default_target: True
