# Plumbing: config validation, paths, wildcard vocabulary, scheduling settings and the targets. What a config means
# (its source kind, the calibration chain, the converters, a toolchain's build) is decided in genie_build.
import dataclasses
import json
import os
import re
import shlex
import sys
import threading

from snakemake.exceptions import WorkflowError

from genie_build import conventions, genie_contract, onnx_graph
from genie_build.config import calibration_chain, context_lengths, source_kind, validate_config
from genie_build.calibrate import DEFAULT_NUM_SAMPLES as BUILTIN_NUM_SAMPLES
from genie_build.demo import TRAINED_WEIGHTS, DemoShape, is_trained_shape, shape_config
from genie_build.errors import GenieBuildError
from genie_build.calibration_units import part_units, predicted_peak_mb, read_units, write_units
from genie_build.chipsets import load_params
from genie_build.conventions import PART_LABEL_PATTERN, UNIT_LABEL_PATTERN
from genie_build.graph_config import write_graph_config
from genie_build.hf_checkpoint import check_checkpoint, weight_files as _hf_weight_files
from genie_build.shape_plan import part_weight_files, piece_float_bytes, plan_checkpoint
from genie_build.plan_file import read_plan, write_plan
from genie_build.tokens import check_tokenizer
from genie_build.toolchains import SDK_TOOLCHAINS, Converter, converter_pattern, toolchain_version


# One validator for Snakemake and the tests (genie_build.config): the schema with its defaults filled, then the
# rules across keys; every failure is one line "config <dotted.key>: <problem>".
try:
    config.update(validate_config(config))
except GenieBuildError as exc:
    raise WorkflowError(str(exc)) from None


def _config_error(key, problem):
    raise WorkflowError(f"config {key}: {problem}")


MODEL = config["model"]["name"]
OUT = f"results/{MODEL}"
SRC = f"{OUT}/source"
# The graphs at the largest context length, which the plan, the calibration, the evaluation and the unsplit reference
# read; the others (LENGTH_GRAPHS, below) are split or exported beside them and share their weights and encodings.
GRAPHS = conventions.GRAPH_KINDS
# Where the graphs come from: the generated demo, a Hugging Face checkpoint the workflow exports (rules/export.smk),
# the user's own files (model.prompt_onnx and the other paths), or none: an estimate-only config.
SOURCE_KIND = source_kind(config)
# Encodings that no source brings are made by the calibration chain (rules/calibrate.smk).
CALIBRATION_CHAIN = calibration_chain(config)
# Every job runs `{params.python} -m genie_build <command>`, with the interpreter running Snakemake (the project venv)
# or for the qairt toolchain's jobs the interpreter of toolchains.qairt.python (a QAIRT build box's).
PYTHON = shlex.quote(sys.executable)
# The load model's device parameters the config overrides (report.load), for the memory plan and split auto.
LOAD_JSON = json.dumps(config["report"]["load"], sort_keys=True)
# The plan reads them only for split.num_parts auto: another chipset does not replan a fixed split.
PLAN_LOAD_ARGS = (["--chipset", config["target"]["chipset"], "--load-json", LOAD_JSON]
                  if config["split"].get("num_parts") == "auto" else [])


def toolchain_of(variant):
    return config["variants"][variant]["toolchain"]


def python_for(toolchain):
    """The interpreter of a toolchain's jobs (shlex.quote()d)."""
    if toolchain == "qairt":
        return shlex.quote(config["toolchains"]["qairt"].get("python") or sys.executable)
    return PYTHON


# Between-workflow cache of the per-part convert and compile jobs (docs/cluster.md). "omit-software": this workflow
# deploys no conda env or container; what built an output is the tool_version param instead. Snakemake refuses
# benchmark: on a cacheable rule, so those rules have none.
CACHE_PER_PART = "omit-software"
# The cache key hashes params but not wildcards: without the part in a param, parts could share one entry
# (docs/snakemake.md, "Between-workflow cache").
CACHE_KEY_PART = "{part}"
# No convert starts before both graphs are split and sliced (part_labels), so those jobs go before other ready ones
# (the shared-weights check, the chain == full checks), which nothing waits for until the bundle.
CRITICAL_PATH = 10
# A unit of the calibration chain holds every core, and the chain is the longest path of a build that has one:
# Snakemake weighs the priorities of the jobs it could start together, so a unit must outweigh any set of other
# jobs that would fill the cores instead (two checks beside each other outweighed CRITICAL_PATH).
CHAIN_FIRST = 100
# ... and takes every core on a box of two (aimet-onnx's session; the converts wait, as the next unit goes first),
# every core but one on a larger box, where finished parts' converts and compiles then run beside the chain.
# A cluster executor needs no --cores (each job is its own allocation): there a unit asks for the two cores it was
# measured on, which the profile's set-threads can raise.
_CORES = workflow.resource_settings.cores
CHAIN_THREADS = max(min(_CORES, 2), _CORES - 1) if _CORES else 2
# Then the whole-model checks (check_model, verify_split: 5-12 s each, against 1-3 s for a per-part job): left to
# Snakemake's own order they ran last, one alone on a core while the other idled and the bundle waited for it.
LONG_CHECKS = 5
# On a cluster, one submission per part holds its converts, compiles and accounts (no effect on local runs).
GROUP_PER_PART = "part_{part}"

def checkpoint_weight_files(directory):
    """The checkpoint's safetensors files (and shard index) at parse time; a broken layout is a config error."""
    try:
        return _hf_weight_files(directory)
    except GenieBuildError as exc:
        _config_error("model.hf_checkpoint", str(exc))


def _user_encodings(graph):
    encodings = config["model"]["encodings"]
    return encodings if isinstance(encodings, str) else encodings[graph]


def _read_user_graph(kind, path):
    """A user's graph at parse time (structure only, no weights): its external data files, every stored tensor checked
    before any job (onnx_graph.check_external_data: inside the model's folder, regular files, ranges), and (AR, CL)."""
    try:
        model = onnx_graph.load_graph(path)
        data_files = [str(p) for p in onnx_graph.external_data_files(model, path)]
    except GenieBuildError as exc:
        _config_error(f"model.{kind}_onnx", str(exc))
    dims = onnx_graph.ar_and_context_length(model)
    if dims is None:  # the graph names carry AR and CL, so not even bundle.enabled: false can build this graph
        io = onnx_graph.graph_io(model)
        violations = genie_contract.model_violations({kind: (io.inputs, io.outputs)})[1]
        _config_error(f"model.{kind}_onnx", f"{path}: Genie cannot read AR and CL from this graph: "
                      + "; ".join(map(str, violations)))
    return data_files, dims


def _user_graphs_by_length():
    """The user's graphs of each kind by context length, each read (:func:`_read_user_graph`): one path, or a list of
    one per length, the prompt and token graphs at the same lengths."""
    graphs = {}
    for kind in GRAPHS:
        paths = config["model"][f"{kind}_onnx"]
        graphs[kind] = {}
        for path in paths if isinstance(paths, list) else [paths]:
            data_files, dims = _read_user_graph(kind, path)
            if dims[1] in graphs[kind]:
                _config_error(f"model.{kind}_onnx", f"{path} and {graphs[kind][dims[1]][0]} are both at context "
                                                    f"length {dims[1]}: give one graph per length")
            graphs[kind][dims[1]] = (path, data_files, dims)
    if set(graphs["prompt"]) != set(graphs["token"]):
        _config_error("model.token_onnx", f"the token graphs' context lengths {sorted(graphs['token'])} are not the "
                                          f"prompt graphs' {sorted(graphs['prompt'])}")
    ars = {dims[0] for _, _, dims in graphs["prompt"].values()}
    if len(ars) > 1:
        _config_error("model.prompt_onnx", f"the prompt graphs take different ARs {sorted(ars)}: give one AR")
    return graphs


if SOURCE_KIND == "files":
    _user_graphs = _user_graphs_by_length()
    CONTEXT_LENGTHS = tuple(sorted(_user_graphs["prompt"]))
    SOURCE = {
        **{f"{graph}_onnx": _user_graphs[graph][CONTEXT_LENGTHS[-1]][0] for graph in GRAPHS},
        "tokenizer": config["model"]["tokenizer"],
        "hf_config": config["model"]["hf_config"],
    }
    if not CALIBRATION_CHAIN:
        SOURCE.update({f"{graph}_encodings": _user_encodings(graph) for graph in GRAPHS})
elif SOURCE_KIND == "hf":  # no whole graphs: the checkpoint is exported, calibrated and converted part by part
    CHECKPOINT = config["model"]["hf_checkpoint"]
    SOURCE = {"tokenizer": f"{CHECKPOINT}/tokenizer.json", "hf_config": f"{CHECKPOINT}/config.json"}
elif SOURCE_KIND == "estimate":  # a config.json and no graphs: the estimate's rules alone (Snakefile)
    SOURCE = {"hf_config": config["model"]["hf_config"]}
else:  # the demo's generated files
    SOURCE = {
        "prompt_onnx": f"{SRC}/prompt.onnx",
        "token_onnx": f"{SRC}/token.onnx",
        "tokenizer": f"{SRC}/tokenizer.json",
        "hf_config": f"{SRC}/config.json",
    }
    if not CALIBRATION_CHAIN:
        SOURCE.update({f"{graph}_encodings": f"{SRC}/{graph}.encodings.json" for graph in GRAPHS})
# SOURCE_DATA: the weights; a changed weight must rerun what reads the graph even when the .onnx is unchanged.
# GRAPH_DIMS: (AR, CL) of each graph, which the QNN graph names carry.
# The demo's and the export's (AR, CL) are the config's: their graphs do not exist yet when the workflow is parsed.
# LENGTH_GRAPHS: the graphs at the other context lengths, key (prompt_cl512) -> (kind, CL); GRAPH_KIND: the kind of
# every graph key; BUNDLE_GRAPHS: every graph a part's context binary holds (docs/context-lengths.md).
GENERATED_AR_CL = {"demo": config["demo"], "hf": config["export"]}
if SOURCE_KIND in GENERATED_AR_CL:
    CONTEXT_LENGTHS = context_lengths(GENERATED_AR_CL[SOURCE_KIND])
    _ar, _cl = GENERATED_AR_CL[SOURCE_KIND]["ar"], CONTEXT_LENGTHS[-1]
if SOURCE_KIND in ("demo", "hf", "files"):
    LENGTH_GRAPHS = {conventions.length_graph_key(kind, cl): (kind, cl)
                     for cl in CONTEXT_LENGTHS[:-1] for kind in GRAPHS}
else:
    LENGTH_GRAPHS = {}
GRAPH_KIND = {**{graph: graph for graph in GRAPHS}, **{key: kind for key, (kind, _) in LENGTH_GRAPHS.items()}}
BUNDLE_GRAPHS = tuple(GRAPH_KIND)
if SOURCE_KIND in GENERATED_AR_CL:
    GRAPH_DIMS = {key: (conventions.graph_ar(kind, _ar), cl) for key, (kind, cl) in
                  {"prompt": ("prompt", _cl), "token": ("token", _cl), **LENGTH_GRAPHS}.items()}
    # the graphs at other lengths read the weights the demo wrote for those at the largest
    SOURCE_DATA = {key: [f"{SRC}/{kind}.onnx.data"] for key, kind in GRAPH_KIND.items()}
    if SOURCE_KIND == "demo":
        SOURCE.update({f"{key}_onnx": f"{SRC}/{key}.onnx" for key in LENGTH_GRAPHS})
elif SOURCE_KIND == "files":
    _by_key = {key: _user_graphs[kind][cl] for key, (kind, cl) in
               {"prompt": ("prompt", CONTEXT_LENGTHS[-1]), "token": ("token", CONTEXT_LENGTHS[-1]),
                **LENGTH_GRAPHS}.items()}
    SOURCE.update({f"{key}_onnx": path for key, (path, _, _) in _by_key.items()})
    SOURCE_DATA = {key: data_files for key, (_, data_files, _) in _by_key.items()}
    GRAPH_DIMS = {key: dims for key, (_, _, dims) in _by_key.items()}

# A checkpoint's plan and calibration chain come from its config.json alone, so the part and unit labels are known
# now, and each part is exported, calibrated and converted by jobs of its own (rules/export.smk, calibrate.smk). Its
# tokenizer is checked against vocab_size now, the logits' width of every part it exports. Once every check passed,
# the plan, the units and the fields of config.json the graphs are made of (genie_build.graph_config) are written
# down, each only when it changes, so Snakemake sees them unchanged: a budget that leaves the units as they were
# reruns nothing, and a key only the bundle reads (eos_token_id) rebuilds the bundle alone, as the export, the
# calibration and the tokenizing depend on that file, not on config.json. Elsewhere config.json is what they read.
GRAPH_CONFIG = f"{OUT}/graph_config.json" if SOURCE_KIND == "hf" else SOURCE.get("hf_config")
if SOURCE_KIND == "hf":
    try:  # the checkpoint against its config.json first: a model the export cannot build is refused before any job
        for _length in CONTEXT_LENGTHS:
            check_checkpoint(CHECKPOINT, ar=_ar, context=_length)
        PLAN, UNITS = plan_checkpoint(SOURCE["hf_config"], config["split"], recipe=config["quantize"]["recipe"],
                                      ar=_ar, context=CONTEXT_LENGTHS, unit_memory_mb=config["quantize"]["unit_memory_mb"],
                                      load=load_params(config["target"]["chipset"], config["report"]["load"]))
        PIECE_FLOAT_BYTES = piece_float_bytes(SOURCE["hf_config"])
        PART_WEIGHT_FILES = {part.label: [str(p) for p in part_weight_files(CHECKPOINT, part)] for part in PLAN.parts}
        check_tokenizer(SOURCE["tokenizer"], SOURCE["hf_config"])
        write_plan(f"{OUT}/plan.json", PLAN, unless_same=True)
        write_units(f"{OUT}/calibration_units.json", UNITS, unless_same=True)
        write_graph_config(SOURCE["hf_config"], GRAPH_CONFIG)
    except GenieBuildError as exc:
        _config_error("model.hf_checkpoint", str(exc))
    PARTS = {part.label: part for part in PLAN.parts}
    UNIT_BY_LABEL = {unit.label: unit for unit in UNITS}
    # both graphs of a part in one folder, reading one weights file (ONNX refuses hard-linked or outside data)
    PART_ONNX = f"{OUT}/parts/part_{{part}}/{{graph}}.onnx"
else:
    PART_ONNX = f"{OUT}/parts/{{graph}}/part_{{part}}.onnx"
# A build that calibrates keeps each recipe's encodings apart (variants name their recipe); the source's own
# encodings are sliced once.
PART_ENCODINGS = (f"{OUT}/encodings/{{recipe}}/{{graph}}/part_{{part}}.encodings.json" if CALIBRATION_CHAIN
                  else f"{OUT}/encodings/{{graph}}/part_{{part}}.encodings.json")


def converter_of(variant):
    """The name of the variant's converter: variants that convert alike share one convert job."""
    return Converter.of_variant(config["variants"][variant]).name


def recipe_of(variant):
    """The recipe of the variant's encodings in a build that calibrates; None: the source's own encodings."""
    return config["variants"][variant]["recipe"]


def part_encodings_of(graph, recipe):
    """The pattern of one graph's part encodings of ``recipe`` (None: the source's), ``{part}`` left to fill."""
    return PART_ENCODINGS.replace("{graph}", graph).replace("{recipe}", recipe or "")


def converter_encodings(wildcards):
    """The part encodings a convert job reads: of its converter's recipe."""
    recipe = Converter.named(wildcards.converter).recipe
    return part_encodings_of(GRAPH_KIND[wildcards.graph], recipe).format(part=wildcards.part)


def variant_json(variant):
    return json.dumps(config["variants"][variant], sort_keys=True)


CONVERTERS = sorted({converter_of(v) for v in config["variants"]})
CALIBRATED_RECIPES = sorted({recipe_of(v) for v in config["variants"]} - {None})


wildcard_constraints:
    graph="|".join(sorted(BUNDLE_GRAPHS, key=len, reverse=True)),
    part=PART_LABEL_PATTERN,
    variant="|".join(map(re.escape, config["variants"])),
    converter="|".join(map(re.escape, CONVERTERS)),
    recipe="|".join(map(re.escape, CALIBRATED_RECIPES)) or "(?!)",


def onnx_with_data_mb(paths):
    """MB of model files with their external ``.data`` files: what a job loads, for its mem_mb (Snakemake's
    ``input.size_mb`` counts only the declared .onnx)."""
    files = [file for path in paths for file in (path, f"{path}.data")]
    return sum(os.path.getsize(file) for file in files if os.path.exists(file)) / 1e6


def graph_part_files(graph):
    """An input function: one graph's part .onnx files, named after the split checkpoint has run. Files inside a
    checkpoint's directory have no producing job, so jobs reading them rerun only when their bytes changed (not
    merely because the plan was rewritten). Each .onnx carries its .data file's SHA-1 (ONNX external-data
    ``checksum``), so it changes with the part's weights, and Snakemake need not hash GBs of weights to see that."""
    def part_files(wildcards):
        plan = read_plan(checkpoints.plan.get().output.plan)
        parts = checkpoints.split.get(graph=graph).output.parts
        return [f"{parts}/part_{part.label}.onnx" for part in plan.parts]
    return part_files


def split_part_files(wildcards):
    """:func:`graph_part_files` of the job's own graph."""
    return graph_part_files(wildcards.graph)(wildcards)


def part_labels():
    """Part labels from the plan and, through the checkpoints, the per-part files they name.

    Calling the checkpoints here is what makes one invocation rebuild only the parts whose bytes changed:
    Snakemake re-evaluates every job behind a checkpoint after it ran (docs/snakemake.md, "Checkpoints"). A
    checkpoint's plan is made when the workflow is parsed, and its parts are regular jobs.
    """
    if SOURCE_KIND == "hf":
        return list(PARTS)
    plan = read_plan(checkpoints.plan.get().output.plan)
    for graph in BUNDLE_GRAPHS:
        checkpoints.split.get(graph=graph)
    if not CALIBRATION_CHAIN:
        checkpoints.slice_encodings.get()
    return [part.label for part in plan.parts]


def part_graph(graph, label):
    """One part's graph, named after the split checkpoint (if any) has run: see :func:`graph_part_files`."""
    if SOURCE_KIND != "hf":
        checkpoints.split.get(graph=graph)
    return PART_ONNX.format(graph=graph, part=label)


def graph_name_for(graph, label):
    """The QNN graph name of one part of one graph, e.g. 'prompt_ar32_cl256_01_of_06'."""
    return conventions.graph_name(GRAPH_KIND[graph], *GRAPH_DIMS[graph], *conventions.parse_part_label(label))


def unsplit_graph_name(graph):
    """The graph name of the whole (unsplit) model, e.g. 'prompt_ar32_cl256'."""
    return conventions.unsplit_graph_name(graph, *GRAPH_DIMS[graph])


def contract_checks(wildcards):
    """check-contract's checks from the config: the demo's or the export's (AR, CL), Genie's context size, whether
    a bundle is built (without one, violations are recorded, not errors)."""
    expected = GENERATED_AR_CL.get(SOURCE_KIND, {})
    # the graphs it checks are those at the largest length
    return json.dumps({"expect_ar": expected.get("ar"), "expect_context": CONTEXT_LENGTHS[-1] if expected else None,
                       "context_size": config["bundle"].get("context_size"),
                       "report_only": not config["bundle"]["enabled"]}, sort_keys=True)


def graph_name_of(wildcards):
    return graph_name_for(wildcards.graph, wildcards.part)


def converted_files(converter, graph, label):
    """A converted graph's files: the reference converter's ONNX and its data (which the compile reads, so its
    input, also for temp() to keep it until then), or an SDK converter's DLC."""
    path = f"{OUT}/converted/{converter}/part_{label}/{graph}"
    return [f"{path}{suffix}" for suffix in Converter.named(converter).suffixes]


def shared_weights_graph(wildcards):
    """The converted prompt graph of the part, whose data file the part's other graphs refer to (none for itself)."""
    if wildcards.graph == "prompt":
        return []
    return converted_files(wildcards.converter, "prompt", wildcards.part)


def converted_graphs(wildcards):
    """The compile's inputs: each graph (named by the graph kind) and its data files."""
    converter = converter_of(wildcards.variant)
    files = {graph: converted_files(converter, graph, wildcards.part) for graph in BUNDLE_GRAPHS}
    return {**{graph: paths[0] for graph, paths in files.items()},
            **{f"{graph}_data": paths[1:] for graph, paths in files.items()}}


def graph_items(names, input):
    """``NAME=PATH`` of each graph for compile's --graph (quoted item by item with :q)."""
    return [f"{name}={input[graph]}" for graph, name in names.items()]


def directory_of(name):
    """A param function: the directory holding the rule's input or output file ``name`` (input first)."""
    def directory(wildcards, input, output):
        files = input.get(name) or output.get(name)
        return os.path.dirname(files[0] if isinstance(files, list) else files)
    return directory


def variant_part_files(pattern, variants):
    return [pattern.format(variant=v, part=p) for v in variants for p in part_labels()]


def part_files(pattern, **fields):
    """``pattern`` filled in for every part, in part order."""
    return [pattern.format(part=label, **fields) for label in part_labels()]


def converted_part_files(variant, labels):
    """The converted files of the parts ``labels`` (prompt, token, in part order) of ``variant``'s converter."""
    converter = converter_of(variant)
    return [path for label in labels for graph in GRAPHS for path in converted_files(converter, graph, label)]


# The demo's model was trained on the King James Version (resources/training_corpus.txt), so its prompt is from it.
HOST_PROMPT = config["bundle"]["host_prompt"] or (
    "And Moses said unto the LORD" if SOURCE_KIND == "demo" else "What is 2+3? Explain briefly.")


# bundle.embedding: lut -- part 1 (the embedding alone) becomes a table on the CPU, not a context binary of the bundle;
# the part after it takes the embedding vectors as inputs_embeds.
EMBEDDING_LUT = config["bundle"]["embedding"] == "lut"
EMBEDDING_TABLE = f"{OUT}/embedding/embedding_table.bin"


def takes_embeddings(wildcards):
    """The convert option of the part after the embedding table (none in the graph layout)."""
    return ["--takes-embeddings"] if EMBEDDING_LUT and conventions.parse_part_label(wildcards.part)[0] == 2 else []


def bundle_part_labels():
    """The parts whose context binaries go into the bundle: all, or with the table all but part 1."""
    labels = part_labels()
    return labels[1:] if EMBEDDING_LUT else labels


def embedding_part_files(wildcards):
    """Part 1 of the prompt graph (which carries its weights' SHA-1, as for its convert job) and its encodings (of
    the bundle variant's recipe): the table's source."""
    label = part_labels()[0]
    return {"onnx": PART_ONNX.format(graph="prompt", part=label),
            "encodings": part_encodings_of("prompt", recipe_of(BUNDLE_VARIANT)).format(part=label)}


def host_run_reference(wildcards):
    """What a host run compares the bundle's tokens with (rules/bundle.smk): the unsplit model compiled alike, or for
    a model calibrated part by part, which has no whole encodings, the parts' converted graphs."""
    if CALIBRATION_CHAIN:  # with the table, the parts after it (the host run looks tokens up in the bundle's table)
        return converted_part_files(BUNDLE_VARIANT, bundle_part_labels())
    return [f"{OUT}/unsplit/model.bin"]


def final_outputs(wildcards):
    if SOURCE_KIND == "estimate":
        raise WorkflowError("config model: an estimate-only config (hf_config without prompt_onnx) builds only the "
                            "'estimate' target: snakemake estimate --cores 1 --configfile <file>")
    return [
        *(f"{OUT}/verify/{graph}.json" for graph in BUNDLE_GRAPHS),
        f"{OUT}/size_table.csv",
        f"{OUT}/size_table.md",
        f"{OUT}/size_table.png",
        f"{OUT}/memory_plan.md",
        *([f"{OUT}/plan_check.json"] if CALIBRATION_CHAIN else []),
        *(f"{OUT}/evaluation.{suffix}" for suffix in ("md", "csv", "png") if config["evaluate"]["enabled"]),
        *([f"{OUT}/bundle_check.json"] if config["bundle"]["enabled"] else []),
        *([f"{OUT}/host_run.json"] if config["bundle"]["enabled"] and config["bundle"]["host_run"]
          and config["variants"][config["bundle"]["variant"]]["toolchain"] == "reference" else []),
    ]


# --- a checkpoint exported part by part (rules/export.smk) -----------------------------------------------------

EXPORTED = f"{OUT}/parts/part_{{part}}"


def part_json(wildcards):
    """The part as the export needs it: its pieces and boundaries, not its estimated bytes (a new recipe re-weighs
    the parts; a part whose layers stay the same keeps its export)."""
    fields = dataclasses.asdict(PARTS[wildcards.part])
    del fields["estimated_bytes"]
    return json.dumps(fields, sort_keys=True)


def part_float_mb(label):
    return sum(PIECE_FLOAT_BYTES[piece] for piece in PARTS[label].pieces) / 1e6


# --- the calibration chain (rules/calibrate.smk) ------------------------------------------------------------------

CALIBRATION = f"{OUT}/calibration/{{recipe}}"


def chain_units():
    if SOURCE_KIND == "hf":
        return UNITS
    return read_units(checkpoints.plan.get().output.units)


def unit_named(label):
    return next(unit for unit in chain_units() if unit.label == label)


def unit_before(label):
    """The unit before ``label`` in the chain, or None for the first."""
    units = chain_units()
    index = units.index(unit_named(label))
    return units[index - 1] if index else None


def units_json(units):
    return json.dumps([dataclasses.asdict(unit) for unit in units], sort_keys=True)


def unit_inputs(wildcards):
    """The unit's part graph (with its weights' SHA-1: changed weights recalibrate) and the stream it is fed."""
    before = unit_before(wildcards.unit)
    calibration = CALIBRATION.format(recipe=wildcards.recipe)
    return {"part_graph": part_graph("prompt", unit_named(wildcards.unit).part),
            "boundary": [f"{calibration}/{before.label}.boundary.npy"] if before else []}


def previous_unit(wildcards):
    """The unit before the part's first: its output is the part's input boundary, whose encoding it gives."""
    return unit_before(part_units(chain_units(), wildcards.part)[0].label)


def part_encodings_inputs(wildcards):
    previous, calibration = previous_unit(wildcards), CALIBRATION.format(recipe=wildcards.recipe)
    return {"units": [f"{calibration}/{unit.label}.encodings.json"
                      for unit in part_units(chain_units(), wildcards.part)],
            "previous": [f"{calibration}/{previous.label}.encodings.json"] if previous else [],
            "prompt_graph": part_graph("prompt", wildcards.part), "token_graph": part_graph("token", wildcards.part)}


# The texts rules/tokens.smk tokenizes, each with the tokens its readers need at least: the calibration's windows
# (a text is never repeated to fill them), one evaluation window and the token after it.
TOKENS = f"{OUT}/tokens/{{text}}.npy"
if SOURCE_KIND != "estimate":
    _prompt_ar = GRAPH_DIMS["prompt"][0]
    _windows = config["quantize"]["num_samples"]
    TEXTS = {
        "calibration": {"path": config["quantize"]["corpus"], "needed": _windows * _prompt_ar,
                        "use": f"calibration (quantize.num_samples: {_windows} windows of {_prompt_ar} tokens)"},
        "evaluation": {"path": config["evaluate"]["text"], "needed": _prompt_ar + 1,
                       "use": f"evaluation (one window of {_prompt_ar} tokens and the token after it)"},
    }


def tokens_of(text):
    return TOKENS.format(text=text)


# Target 'evaluate' (evaluate.smk): a binary of another toolchain runs only on the device.
EVALUATION = f"{OUT}/evaluation"
FLOAT_LOGITS = f"{EVALUATION}/float_logits.npy"
EVALUATED_VARIANTS = [variant for variant in config["variants"] if toolchain_of(variant) == "reference"]
EVALUATION_PART_FACTOR = 1.25


def calibration_seen(recipe):
    """What the calibration of a variant's encodings saw, for its evaluation report (docs/evaluate.md)."""
    ar = GRAPH_DIMS["prompt"][0]
    if CALIBRATION_CHAIN:
        windows = config["quantize"]["num_samples"]
        return {"calibrator": f"aimet-onnx {config['quantize']['calibrator']}", "recipe": recipe, "windows": windows,
                "tokens": windows * ar, "text": os.path.basename(config["quantize"]["corpus"])}
    if SOURCE_KIND == "demo":   # the builtin calibrator: seeded random feeds of each graph (genie_build.calibrate)
        return {"calibrator": "builtin min-max", "windows": BUILTIN_NUM_SAMPLES, "tokens": BUILTIN_NUM_SAMPLES * ar,
                "text": "random token ids and KV caches"}
    return {"calibrator": "the model's own encodings (model.encodings)"}


def evaluation_mem_mb(wildcards):
    """An evaluation job holds one part at a time, in its session, beside a window's logits: at 7B the largest
    part's float32 weights (6.5 GB) took 8.06 GB (docs/large-models.md)."""
    if SOURCE_KIND == "hf":
        largest = max(map(part_float_mb, PARTS))
    else:
        largest = max(onnx_with_data_mb([part_graph("prompt", label)]) for label in part_labels())
    return int(EVALUATION_PART_FACTOR * largest + 1000)


def size_table_quality(wildcards):
    """The evaluation reports the size table shows (evaluate.enabled), or none."""
    return evaluation_reports(wildcards) if config["evaluate"]["enabled"] else []


def evaluation_reports(wildcards):
    """Every reference variant's evaluation report; none is a config error at the target."""
    if not EVALUATED_VARIANTS:
        raise WorkflowError("target 'evaluate': no variant of the reference toolchain (the binaries of the other "
                            "toolchains run only on a device)")
    return expand(f"{EVALUATION}/{{variant}}.json", variant=EVALUATED_VARIANTS)


def cancel_rescheduling_timers():
    """Cancel the re-evaluation timers Snakemake's scheduler leaves behind, once the run is over.

    After every round that starts jobs, Snakemake 9 arms a one-second, non-daemon ``threading.Timer`` to look at
    the queue again (scheduling/job_scheduler.py, ``_schedule_reevalutation``, armed for the job rate limiter that
    ``--max-jobs-per-timespan`` sets up, 100/1s by default). The interpreter waits for the last one before it exits,
    so every run that ran a job ended up to a second after its last job (1.0 s of an 11 s incremental build). Run
    as the onsuccess/onerror hook, when no job is left to schedule; a Timer that is cancelled exits at once and
    never calls its function."""
    for thread in threading.enumerate():
        if isinstance(thread, threading.Timer):
            thread.cancel()
