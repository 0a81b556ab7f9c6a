# genie-build: a model (the demo, ONNX graphs with or without encodings, a Hugging Face checkpoint) -> a weight-packed,
# weight-shared Genie bundle and the A/B size table. Data flow and file layout: README.md and docs/conventions.md.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/scheduling.smk"
include: "workflow/rules/inputs.smk"


# The source's own rules (genie_build.sources): what makes its parts (the demo's generation and the split of whole
# graphs, or a checkpoint's export) and their encodings (the slices of the source's own, or the calibration chain).
# Each declares the checkpoints its parts wait for and the checks the bundle waits for (common.smk).
SOURCE_RULES = {"DemoSource": ["demo", "split"], "OnnxSource": ["split"], "CheckpointSource": ["export"],
                "EstimateSource": []}[type(SOURCE).__name__]
ENCODINGS_RULES = ["calibrate"] if CALIBRATION_CHAIN else ["encodings"] if SOURCE.encodings else []
for rules_file in [*SOURCE_RULES, *ENCODINGS_RULES]:

    include: f"workflow/rules/{rules_file}.smk"


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
        dlc_files,
    default_target: True
