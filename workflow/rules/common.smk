# Plumbing: the config validated, the model's source (genie_build.sources), the wildcard vocabulary, the paths and
# input functions the stages share, and the targets. What a config means is decided in genie_build; a rule asks the
# source object, never which kind of source it is.
import json
import os
import re
import shlex
import sys

from snakemake.exceptions import WorkflowError

from genie_build import conventions, job_memory
from genie_build.config import bundle_config, calibration_chain, validate_config
from genie_build.errors import GenieBuildError
from genie_build.plan.plan_file import read_plan
from genie_build.run.genie_run import genie_job_mb
from genie_build.sources import SOURCE_ENCODINGS, source_of
from genie_build.toolchains import HOST_RUN_TOOLCHAINS, Converter


# One validator for Snakemake and the tests (genie_build.config): the schema with its defaults filled, then the
# rules across keys; every failure is one line "config <dotted.key>: <problem>". Then the source, read as the
# workflow is parsed: a user's graphs (their AR and CL, their weights files checked), or a checkpoint (planned).
try:
    config.update(validate_config(config))
    # split.num_parts auto keeps a part's jobs within a share of what the run is given (docs/memory-plan.md)
    RUN_MEMORY = job_memory.run_memory({name: getattr(value, "value", value)
                                         for name, value in workflow.global_resources.items()})
    SOURCE = source_of(config, RUN_MEMORY)
except GenieBuildError as exc:
    raise WorkflowError(str(exc)) from None

MODEL = config["model"]["name"]
OUT = SOURCE.out
CALIBRATION_CHAIN = calibration_chain(config)   # whether the chain calibrates (rules/calibrate.smk)
# Filled by the source's own .smk files (Snakefile), for those after them. The checkpoints every part's files wait
# for, and those of one graph's parts; the whole-model checks the bundle waits for; the verification reports; which
# bound chose a checkpoint's part count; the AR and CL check_contract expects of generated graphs.
PART_CHECKPOINTS, GRAPH_CHECKPOINTS, MODEL_CHECKS, VERIFY_REPORTS, SPLIT_CHOICE = [], {}, [], [], []
CONTRACT_EXPECT = {"expect_ar": None, "expect_context": None}
# The graphs at the largest context length, which the plan, the calibration, the evaluation and the unsplit reference
# read; every graph a part's context binary holds adds those at the other lengths (docs/context-lengths.md).
GRAPHS = conventions.GRAPH_KINDS
BUNDLE_GRAPHS = tuple(SOURCE.graphs)
# Every job runs `{params.python} -m genie_build <command>`, with the interpreter running Snakemake (the project venv)
# or for the qairt toolchain's jobs the interpreter of toolchains.qairt.python (a QAIRT build box's).
PYTHON = shlex.quote(sys.executable)
# The load model's device parameters the config overrides (report.load), for the memory plan and split auto.
LOAD_JSON = json.dumps(config["report"]["load"], sort_keys=True)
BUNDLE_VARIANT = config["bundle"]["variant"]


def toolchain_of(variant):
    return config["variants"][variant]["toolchain"]


def python_for(toolchain):
    """The interpreter of a toolchain's jobs (shlex.quote()d)."""
    if toolchain == "qairt":
        return shlex.quote(config["toolchains"]["qairt"].get("python") or sys.executable)
    return PYTHON


def variant_json(variant):
    return json.dumps(config["variants"][variant], sort_keys=True)


def encodings_of(variant):
    """The variant's encodings: its recipe's, in a build that calibrates, else the source's own."""
    return config["variants"][variant]["recipe"] or SOURCE_ENCODINGS


def converter_of(variant):
    """The name of the variant's converter: variants that convert alike share one convert job."""
    return Converter.of_variant(config["variants"][variant]).name


CONVERTERS = sorted({converter_of(variant) for variant in config["variants"]})
ENCODINGS = sorted({encodings_of(variant) for variant in config["variants"]})


wildcard_constraints:
    graph="|".join(sorted(BUNDLE_GRAPHS, key=len, reverse=True)) or "(?!)",
    part=conventions.PART_LABEL_PATTERN,
    variant="|".join(map(re.escape, config["variants"])),
    converter="|".join(map(re.escape, CONVERTERS)),
    encodings="|".join(map(re.escape, ENCODINGS)),


def part_labels():
    """Part labels from the plan, once the checkpoints the source's parts wait for have run.

    Calling the checkpoints here is what makes one invocation rebuild only the parts whose bytes changed:
    Snakemake re-evaluates every job behind a checkpoint after it ran (docs/snakemake.md, "Checkpoints"). A
    checkpoint's plan is made when the workflow is parsed, and its parts are regular jobs.
    """
    run_checkpoints(PART_CHECKPOINTS)
    return plan_labels()


def graph_labels(key):
    """The part labels, once one graph's split (if any) has run: its readers wait for nothing else."""
    run_checkpoints(GRAPH_CHECKPOINTS.get(key, ()))
    return plan_labels()


def plan_labels():
    return [part.label for part in (SOURCE.plan or read_plan(f"{OUT}/plan.json")).parts]


def run_checkpoints(names):
    """``checkpoints.<name>.get(**wildcards)`` of each: raises until that checkpoint has run."""
    for name, wildcards in names:
        getattr(checkpoints, name).get(**wildcards)


def part_graph(key, label):
    """One part's graph, named once its graph's split (if any) has run. A split part's .onnx carries its data file's
    SHA-1 (ONNX external-data ``checksum``), so it changes with the part's weights and Snakemake need not hash GBs of
    weights to see that; files a checkpoint's job wrote have no producing job, so jobs reading them rerun only when
    their bytes changed."""
    run_checkpoints(GRAPH_CHECKPOINTS.get(key, ()))
    return SOURCE.part_graph(key, label)


def graph_parts(key):
    """One graph's part files, in part order, once its split (if any) has run."""
    return [SOURCE.part_graph(key, label) for label in graph_labels(key)]


def part_files(pattern, **fields):
    """``pattern`` filled in for every part, in part order."""
    return [pattern.format(part=label, **fields) for label in part_labels()]


def kind_of(key):
    return SOURCE.graphs[key].kind


def graph_name_for(key, label):
    """The QNN graph name of one part of one graph, e.g. 'prompt_ar32_cl256_01_of_06'."""
    graph = SOURCE.graphs[key]
    return conventions.graph_name(graph.kind, graph.ar, graph.context, *conventions.parse_part_label(label))


def graph_name_of(wildcards):
    return graph_name_for(wildcards.graph, wildcards.part)


def unsplit_graph_name(key):
    """The graph name of the whole (unsplit) model, e.g. 'prompt_ar32_cl256'."""
    graph = SOURCE.graphs[key]
    return conventions.unsplit_graph_name(graph.kind, graph.ar, graph.context)


CONVERTED = f"{OUT}/converted/{{encodings}}/{{converter}}/part_{{part}}/{{graph}}"


def converted_files(encodings, converter, key, label):
    """A converted graph's files: the reference converter's ONNX and its data (which the compile reads, so its
    input, also for temp() to keep it until then), or an SDK converter's DLC."""
    path = CONVERTED.format(encodings=encodings, converter=converter, part=label, graph=key)
    return [f"{path}{suffix}" for suffix in Converter.named(converter).suffixes]


def variant_converted_files(variant, key, label):
    return converted_files(encodings_of(variant), converter_of(variant), key, label)


def directory_of(name):
    """A param function: the directory holding the rule's input or output file ``name`` (input first)."""
    def directory(wildcards, input, output):
        files = input.get(name) or output.get(name)
        return os.path.dirname(files[0] if isinstance(files, list) else files)
    return directory


def optional(flag, values):
    """``flag`` and its ``values``, or nothing without values: how a rule's ``*_extra`` function (inputs.smk) gives a
    command an option that only some builds have (an input only some jobs take)."""
    values = list(values)
    return [flag, *values] if values else []


def largest_part_float_mb():
    """MB of the largest part's weights, for the memory of a job holding one part at a time."""
    return max(map(SOURCE.part_float_mb, graph_labels("prompt")))


def final_outputs(wildcards):
    if not BUNDLE_GRAPHS:
        raise WorkflowError("config model: an estimate-only config (hf_config without prompt_onnx) builds only the "
                            "'estimate' target: snakemake estimate --cores 1 --configfile <file>")
    return [
        *VERIFY_REPORTS,
        f"{OUT}/size_table.csv",
        f"{OUT}/size_table.md",
        f"{OUT}/size_table.png",
        f"{OUT}/memory_plan.md",
        *([f"{OUT}/plan_check.json"] if CALIBRATION_CHAIN else []),
        *(f"{OUT}/evaluation.{suffix}" for suffix in ("md", "csv", "png") if config["evaluate"]["enabled"]),
        *([f"{OUT}/bundle_check.json"] if config["bundle"]["enabled"] else []),
        *([f"{OUT}/host_run.json"] if config["bundle"]["enabled"] and config["bundle"]["host_run"]
          and toolchain_of(BUNDLE_VARIANT) in HOST_RUN_TOOLCHAINS else []),
        *([f"{OUT}/genie_run.json"] if GENIE_RUNS else []),
    ]
