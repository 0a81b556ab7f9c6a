# The input functions of the stages, each named for what it returns, the paths they share, and each rule's optional
# arguments: one `<rule>_extra` function per rule whose command takes options only some builds have (as the
# snakemake-workflows catalog's `get_<tool>_extra`); every other value reaches its command as a value. Snakemake's
# lint wants functions apart from rules. Each asks the source object (genie_build.sources), never its kind.
import dataclasses

from genie_build.bundle_layout import BundleLayout
from genie_build.config import calibration_windows, context_lengths
from genie_build.plan.calibration_units import part_units, read_units, unit_before, unit_named
from genie_build.tokens import host_prompt

# --- the texts (rules/tokens.smk)

TOKENS = f"{OUT}/tokens/{{text}}.npy"


def text_of(name):
    """A text the workflow tokenizes, with the tokens its readers need at least: the calibration's windows, or one
    evaluation window and the token after it."""
    ar = SOURCE.graphs["prompt"].ar
    windows = calibration_windows(config["quantize"], ar)
    return {
        "calibration": {"path": config["quantize"]["corpus"], "needed": windows * ar,
                        "use": f"calibration (quantize.num_samples: {windows} windows of {ar} tokens)"},
        "evaluation": {"path": config["evaluate"]["text"], "needed": ar + 1,
                       "use": f"evaluation (one window of {ar} tokens and the token after it)"},
    }[name]


def tokens_of(name):
    return TOKENS.format(text=name)


# --- the whole graphs' plan and checks (rules/split.smk), the shape-only estimate (rules/estimate.smk), the demo

def check_model_extra(wildcards):
    """The graphs at the other context lengths, each checked against its kind's weights."""
    return [arg for key, graph in SOURCE.graphs.items() if key not in GRAPHS
            for arg in ("--length-graph", f"{graph.kind}={graph.onnx}")]


PLAN_UNITS = f"{OUT}/calibration_units.json"  # the calibration chain's units, written beside the plan


def plan_extra(wildcards):
    """How the plan weighs the pieces: by the prompt graph's encodings, or by the recipe with the calibration chain's
    units written beside the plan; and the device, the embedding's layout and every context length's IO, which
    matter to split.num_parts auto only (another chipset, layout or length does not replan a fixed split). Of the
    wildcards only, not of the job's input and output: Snakemake compares such params with the last run's, so a
    changed value replans."""
    quantize = config["quantize"]
    weighing = (["--recipe", quantize["recipe"], "--unit-memory-mb", str(quantize["unit_memory_mb"]),
                 "--out-units", PLAN_UNITS] if CALIBRATION_CHAIN
                else ["--encodings-prompt", SOURCE.encodings["prompt"]])
    load = (["--chipset", config["target"]["chipset"], "--load-json", LOAD_JSON, "--embedding",
             config["bundle"]["embedding"], "--other-lengths", *map(str, SOURCE.context_lengths[:-1])]
            if config["split"].get("num_parts") == "auto" else [])
    return [*weighing, *load]


def estimate_sizes_extra(wildcards):
    """The estimate's model: the whole prompt graph, which carries its AR and CL, or config.json with the export's;
    and its precision: quantize.recipe's when the build calibrates (the schema then refuses a 'precision' section),
    else the config's 'precision' section, or the default."""
    if WHOLE_PROMPT:
        model = ["--onnx", ESTIMATE_MODEL]
    else:
        model = ["--hf-config", ESTIMATE_MODEL, "--ar", str(config["export"]["ar"]),
                 "--context", *map(str, context_lengths(config["export"]))]
    if CALIBRATION_CHAIN:
        return [*model, "--recipe", config["quantize"]["recipe"]]
    return [*model, *optional("--precision-json", [json.dumps(config["precision"], sort_keys=True)]
                              if "precision" in config else [])]


def generate_demo_extra(wildcards, input):
    """The trained demo's weights, for the demo's own shape (another shape gets random weights)."""
    return optional("--weights", input.weights)


# --- the calibration chain (rules/calibrate.smk)

CALIBRATION = f"{OUT}/calibration/{{recipe}}"
# Each recipe a variant names has a chain; the source's own encodings have none.
CALIBRATED_RECIPES = sorted(set(ENCODINGS) - {SOURCE_ENCODINGS})


def chain_units():
    """The chain's units: known as the workflow is parsed, or written by the plan checkpoint with the plan."""
    return SOURCE.units or read_units(checkpoints.plan.get().output.units)


def unit_inputs(wildcards):
    """The unit's part graph (with its weights' SHA-1: changed weights recalibrate) and the stream it is fed."""
    units = chain_units()
    before = unit_before(units, wildcards.unit)
    calibration = CALIBRATION.format(recipe=wildcards.recipe)
    return {"part_graph": part_graph("prompt", unit_named(units, wildcards.unit).part),
            "boundary": [f"{calibration}/{before.label}.boundary.npy"] if before else []}


def previous_unit(wildcards):
    """The unit before the part's first: its output is the part's input boundary, whose encoding it gives."""
    units = chain_units()
    return unit_before(units, part_units(units, wildcards.part)[0].label)


def calibrate_unit_extra(wildcards, input):
    """The residual stream the unit before it stored (none for the chain's first unit)."""
    return optional("--boundary-in", input.boundary)


def part_encodings_inputs(wildcards):
    previous, calibration = previous_unit(wildcards), CALIBRATION.format(recipe=wildcards.recipe)
    return {"units": [f"{calibration}/{unit.label}.encodings.json"
                      for unit in part_units(chain_units(), wildcards.part)],
            "previous": [f"{calibration}/{previous.label}.encodings.json"] if previous else [],
            "prompt_graph": part_graph("prompt", wildcards.part), "token_graph": part_graph("token", wildcards.part)}


def part_encodings_extra(wildcards):
    """The unit before the part's first and its encodings, which give the part's input boundary its encoding (none
    for part 1)."""
    previous = part_encodings_inputs(wildcards)["previous"]
    if not previous:
        return []
    return ["--previous-unit-json", json.dumps(dataclasses.asdict(previous_unit(wildcards)), sort_keys=True),
            "--previous-encodings", *previous]


def units_json(units):
    return json.dumps([dataclasses.asdict(unit) for unit in units], sort_keys=True)


# --- the embedding as a CPU table (rules/embedding.smk): part 1, the embedding alone, then not in the bundle

BUNDLE_LAYOUT = BundleLayout(config["bundle"]["embedding"])
EMBEDDING_LUT = BUNDLE_LAYOUT.table
EMBEDDING_TABLE = f"{OUT}/embedding/embedding_table.bin"


def bundle_part_labels():
    """The parts whose context binaries go into the bundle: all, or with the table all but part 1."""
    return [label for label in part_labels() if BUNDLE_LAYOUT.holds(label)]


def embedding_part_files(wildcards):
    """Part 1 of the prompt graph (which carries its weights' SHA-1, as for its convert job) and its encodings."""
    label = part_labels()[0]
    return {"onnx": SOURCE.part_graph("prompt", label),
            "encodings": SOURCE.part_encodings("prompt", label, encodings_of(BUNDLE_VARIANT))}


# --- the converts and compiles (rules/convert.smk, rules/compile.smk)

def convert_inputs(wildcards):
    """The part's graph (with its weights' SHA-1: a changed weight reconverts and re-keys the cache) and its kind's
    encodings. Named without asking the checkpoints: the converts are asked for only once every checkpoint has run
    (:func:`part_labels`), and a convert that asked its own graph's checkpoints was marked to run behind each pending
    one, and so was every compile (docs/snakemake.md, "Checkpoints")."""
    return {"onnx": SOURCE.part_graph(wildcards.graph, wildcards.part),
            "encodings": SOURCE.part_encodings(kind_of(wildcards.graph), wildcards.part, wildcards.encodings)}


def shared_weights_graph(wildcards):
    """The part's converted prompt graph, whose data file the part's other graphs refer to (none for itself)."""
    if wildcards.graph == "prompt":
        return []
    return converted_files(wildcards.encodings, wildcards.converter, "prompt", wildcards.part)


def takes_embeddings(wildcards):
    """Whether the part takes the embedding vectors as inputs_embeds: the part after the embedding table (no part
    without the table)."""
    return BUNDLE_LAYOUT.takes_embeddings(wildcards.part)


def convert_part_extra(wildcards, input):
    """The converted prompt graph whose data file this graph refers to for the weights they share (none for the
    prompt graph itself): the first of its files (shared_weights_graph)."""
    return optional("--share-weights-with", input.shared[:1])


def converted_graphs(wildcards, variant=None):
    """The compile's inputs: each graph (named by its key) and its data files, of the variant's converter."""
    variant = variant or wildcards.variant
    files = {key: variant_converted_files(variant, key, wildcards.part) for key in BUNDLE_GRAPHS}
    return {**{key: paths[0] for key, paths in files.items()},
            **{f"{key}_data": paths[1:] for key, paths in files.items()}}


def dlc_files(wildcards):
    """With convert.dlc: the DLC of every graph of every part the qnn-htp variants' converters convert (an input
    function of its own: the parts are known once the checkpoints ran, which must not hold back the other targets)."""
    if not config["convert"]["dlc"]:
        return []
    converters = {(encodings_of(variant), converter_of(variant)) for variant in config["variants"]
                  if toolchain_of(variant) == "qnn-htp"}
    return [CONVERTED.format(encodings=encodings, converter=converter, part=label, graph=key) + ".dlc"
            for encodings, converter in sorted(converters) for label in bundle_part_labels() for key in BUNDLE_GRAPHS]


# --- the evaluation (rules/evaluate.smk)

EVALUATION = f"{OUT}/evaluation"
FLOAT_LOGITS = f"{EVALUATION}/float_logits.npy"
# A binary of another toolchain runs only on the device.
EVALUATED_VARIANTS = [variant for variant in config["variants"] if toolchain_of(variant) == "reference"]


def evaluation_reports(wildcards):
    """Every reference variant's evaluation report; none is a config error at the target."""
    if not EVALUATED_VARIANTS:
        raise WorkflowError("target 'evaluate': no variant of the reference toolchain (the binaries of the other "
                            "toolchains run only on a device)")
    return expand(f"{EVALUATION}/{{variant}}.json", variant=EVALUATED_VARIANTS)


def evaluation_mem_mb(wildcards):
    return job_memory.evaluation_mb(largest_part_float_mb())


def evaluation_table_extra(wildcards):
    """The quality bounds the config sets (report.*), and Genie's perplexity when Genie runs."""
    settings = config["report"]
    bounds = [f"--{key.replace('_', '-')}={settings[key]}"
              for key in ("min_top1_agreement", "max_mean_kl", "max_clipped_share") if settings[key] is not None]
    return [*bounds, *optional("--genie-accuracy", [f"{EVALUATION}/genie_accuracy.json"] if GENIE_RUNS else [])]


# --- the size table and the memory plan (rules/sizes.smk), the bundle (rules/bundle.smk)

def size_table_extra(wildcards, input):
    """The evaluation's reports, put beside the sizes when the build evaluates."""
    return optional("--quality", input.quality)


def memory_plan_extra(wildcards, input):
    """The embedding table beside the contexts (bundle.embedding: lut), and which bound chose a checkpoint's part
    count."""
    return [*optional("--embedding-table", input.table), *optional("--split-choice", input.split_choice)]


def bundle_extra(wildcards):
    """The embedding table (bundle.embedding: lut), and Genie's graph switching when the config sets it (unset, Genie's
    config leaves the key out)."""
    switching = config["bundle"].get("graph_switching")
    return [*optional("--embedding-table", [EMBEDDING_TABLE] if EMBEDDING_LUT else []),
            *optional("--graph-switching", [] if switching is None else [str(switching)])]


# --- the host run (rules/host_run.smk)

UNSPLIT = f"{OUT}/unsplit"
HOST_PROMPT = host_prompt(config)
HOST_PROMPT_IDS = f"{OUT}/host_prompt.json"
HOST_NEW_TOKENS = 16  # what the host run generates


HOST_TWINS = toolchain_of(BUNDLE_VARIANT) == "qnn-htp"
# The host run's reference is the bundle's converted part graphs, chained on the host, not the unsplit model's binary.
HOST_REFERENCE_PARTS = CALIBRATION_CHAIN or HOST_TWINS


def host_run_twins(wildcards):
    """A qnn-htp bundle's twins, one per ctx-bin (its weight-shared binaries do not run on x86)."""
    return [f"{OUT}/twin/part_{label}" for label in bundle_part_labels()] if HOST_TWINS else []


def host_run_reference(wildcards):
    """The unsplit model compiled alike, or the bundle variant's converted prompt and token graphs of the parts in the
    bundle (with the table, the parts after it, fed part 1's rows as the table must hold them): a qnn-htp bundle's QDQ
    graphs, the graphs its binaries were compiled from."""
    if HOST_REFERENCE_PARTS:
        return [path for label in bundle_part_labels() for key in GRAPHS
                for path in variant_converted_files(BUNDLE_VARIANT, key, label)]
    return [f"{UNSPLIT}/model.bin"]


def run_bundle_extra(wildcards, input):
    """What the host run compares the bundle with (host_run_reference's graphs, or its binary), a qnn-htp bundle's
    twins, and with the embedding table part 1's graph and encodings."""
    compare = (["--compare-with-parts", *(path for path in input.reference if path.endswith(".onnx"))]
               if HOST_REFERENCE_PARTS else ["--compare-with", *input.reference])
    embedding = [input.embedding_onnx, input.embedding_encodings] if EMBEDDING_LUT else []
    return [*compare, *optional("--twin", input.twins), *optional("--embedding-part", embedding)]


# --- Genie's run on the build box (rules/genie_run.smk, the evaluation's genie_accuracy)

GENIE_RUN = config["bundle"]["genie_run"]
# a qnn-htp bundle (a reference container is genie-build's own format): asked for, or auto beside the host run, whose
# twins it loads and whose tokens it must give (the job itself skips a bundle too large for the simulation)
GENIE_RUNS = config["bundle"]["enabled"] and HOST_TWINS and (
    GENIE_RUN in ("generate", "load") or (GENIE_RUN == "auto" and config["bundle"]["host_run"]))


def genie_float_graphs(wildcards):
    """Every part's float prompt and token graph by its graph name: the float model whose tokens stand beside
    Genie's."""
    return {graph_name_for(key, label): part_graph(key, label) for label in part_labels() for key in GRAPHS}


def genie_run_extra(wildcards, input):
    """The host run's tokens, which Genie's must equal, when the build runs the bundle on the host."""
    return optional("--host-run", input.host_run)


def genie_mem_mb(wildcards, input):
    return genie_job_mb(GENIE_RUN, os.path.dirname(input.manifest), input.twins)
