# Plumbing only: config validation, paths, wildcard vocabulary, and the targets. Logic lives in genie_build.
import json
import re
import shlex
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from genie_build import chipsets, naming
from genie_build.plan import read_plan


validate(config, schema="../../config/schema/config.schema.yaml")


def _config_error(key, problem):
    raise WorkflowError(f"config {key}: {problem}")


if (config["split"].get("num_parts") is None) == (config["split"].get("max_part_mb") is None):
    _config_error("split", "set exactly one of num_parts and max_part_mb (the other to null)")
for _key, _name in (("bundle.variant", config["bundle"]["variant"]),
                    ("report.baseline_variant", config["report"]["baseline_variant"])):
    if _name not in config["variants"]:
        _config_error(_key, f"{_name!r} is not one of the variants: {', '.join(config['variants'])}")
try:
    CHIPSET = chipsets.lookup(config["target"]["chipset"])
except Exception as exc:  # GenieBuildError: unknown chipset, with the known ones listed
    _config_error("target.chipset", str(exc))

MODEL = config["model"]["name"]
OUT = f"results/{MODEL}"
SRC = f"{OUT}/source"
GRAPHS = naming.GRAPH_KINDS
IS_DEMO = "prompt_onnx" not in config["model"]
# Every rule runs the package with the interpreter running Snakemake (the project venv).
GB = f"{shlex.quote(sys.executable)} -m genie_build"
QAIRT_PY = shlex.quote(config["toolchains"]["qairt"].get("python") or sys.executable)


def _user_encodings(graph):
    encodings = config["model"]["encodings"]
    return encodings if isinstance(encodings, str) else encodings[graph]


if IS_DEMO:
    SOURCE = {
        "prompt_onnx": f"{SRC}/prompt.onnx",
        "token_onnx": f"{SRC}/token.onnx",
        "prompt_encodings": f"{SRC}/prompt.encodings.json",
        "token_encodings": f"{SRC}/token.encodings.json",
        "tokenizer": f"{SRC}/tokenizer.json",
        "hf_config": f"{SRC}/config.json",
    }
else:
    SOURCE = {
        "prompt_onnx": config["model"]["prompt_onnx"],
        "token_onnx": config["model"]["token_onnx"],
        "prompt_encodings": _user_encodings("prompt"),
        "token_encodings": _user_encodings("token"),
        "tokenizer": config["model"]["tokenizer"],
        "hf_config": config["model"]["hf_config"],
    }


def converter_of(variant):
    """Variants that convert the same way share one convert job: '{toolchain}-fp{float_bitwidth}'."""
    options = config["variants"][variant]
    return f"{options['toolchain']}-fp{options['float_bitwidth']}"


def variant_json(variant):
    return json.dumps(config["variants"][variant], sort_keys=True)


CONVERTERS = sorted({converter_of(v) for v in config["variants"]})


wildcard_constraints:
    graph="|".join(GRAPHS),
    part=r"\d+_of_\d+",
    variant="|".join(map(re.escape, config["variants"])),
    converter="|".join(map(re.escape, CONVERTERS)),


def split_part_files(wildcards):
    """One graph's part files, named after the split checkpoint has run: files inside a checkpoint's directory
    have no producing job, so jobs reading them rerun only when their bytes changed (not merely because the
    plan was rewritten)."""
    plan = read_plan(checkpoints.plan_split.get().output.plan)
    parts = checkpoints.split_model.get().output.parts
    return [f"{parts}/{wildcards.graph}/part_{part.label}.onnx{ext}" for part in plan.parts for ext in ("", ".data")]


def part_labels():
    """Part labels from the plan and, through the checkpoints, the per-part files they name.

    Calling the checkpoints here is what makes one invocation rebuild only the parts whose bytes changed:
    Snakemake re-evaluates every job behind a checkpoint after it ran (see snakemake-findings §2.3).
    """
    plan = read_plan(checkpoints.plan_split.get().output.plan)
    checkpoints.split_model.get()
    for graph in GRAPHS:
        checkpoints.slice_encodings.get(graph=graph)
    return [part.label for part in plan.parts]


def graph_name_for(graph, label):
    """The QNN graph name of one part of one graph, e.g. 'prompt_ar32_cl256_01_of_06' (AR and CL from the plan)."""
    plan = read_plan(checkpoints.plan_split.get().output.plan)
    index, _ = naming.parse_part_label(label)
    return plan.graph_name(graph, index)


def variant_part_files(pattern, variants):
    return [pattern.format(variant=v, part=p) for v in variants for p in part_labels()]


def final_outputs(wildcards):
    return [
        *(f"{OUT}/verify/{graph}.json" for graph in GRAPHS),
        f"{OUT}/size_table.csv",
        f"{OUT}/size_table.md",
        f"{OUT}/size_table.png",
        f"{OUT}/memory_plan.md",
        f"{OUT}/bundle_check.json",
    ]
