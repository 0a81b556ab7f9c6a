# The input functions of the stages after the source, each named for what it returns, and the paths they share
# (Snakemake's lint wants functions apart from rules). Each asks the source object (genie_build.sources), never its
# kind.
import dataclasses

from genie_build.bundle_layout import BundleLayout
from genie_build.calibration_units import part_units, read_units, unit_before, unit_named
from genie_build.config import calibration_windows
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


def part_encodings_inputs(wildcards):
    previous, calibration = previous_unit(wildcards), CALIBRATION.format(recipe=wildcards.recipe)
    return {"units": [f"{calibration}/{unit.label}.encodings.json"
                      for unit in part_units(chain_units(), wildcards.part)],
            "previous": [f"{calibration}/{previous.label}.encodings.json"] if previous else [],
            "prompt_graph": part_graph("prompt", wildcards.part), "token_graph": part_graph("token", wildcards.part)}


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
    """The convert option of the part after the embedding table, which takes the embedding vectors as inputs_embeds
    (none without the table)."""
    return ["--takes-embeddings"] if BUNDLE_LAYOUT.takes_embeddings(wildcards.part) else []


def converted_graphs(wildcards, variant=None):
    """The compile's inputs: each graph (named by its key) and its data files, of the variant's converter."""
    variant = variant or wildcards.variant
    files = {key: variant_converted_files(variant, key, wildcards.part) for key in BUNDLE_GRAPHS}
    return {**{key: paths[0] for key, paths in files.items()},
            **{f"{key}_data": paths[1:] for key, paths in files.items()}}


def dlc_files():
    """With convert.dlc: the DLC of every graph of every part the qnn-htp variants' converters convert."""
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


# --- the host run (rules/host_run.smk)

UNSPLIT = f"{OUT}/unsplit"
HOST_PROMPT = host_prompt(config)
HOST_PROMPT_IDS = f"{OUT}/host_prompt.json"
HOST_NEW_TOKENS = 16  # what the host run generates


HOST_TWINS = toolchain_of(BUNDLE_VARIANT) == "qnn-htp"


def host_run_twins(wildcards):
    """A qnn-htp bundle's twins, one per ctx-bin (its weight-shared binaries do not run on x86)."""
    return [f"{OUT}/twin/part_{label}" for label in bundle_part_labels()] if HOST_TWINS else []


def host_run_reference(wildcards):
    """The unsplit model compiled alike, or the bundle variant's converted prompt and token graphs of the parts in the
    bundle (with the table, the parts after it, fed part 1's rows as the table must hold them): a qnn-htp bundle's QDQ
    graphs, the graphs its binaries were compiled from."""
    if CALIBRATION_CHAIN or HOST_TWINS:
        return [path for label in bundle_part_labels() for key in GRAPHS
                for path in variant_converted_files(BUNDLE_VARIANT, key, label)]
    return [f"{UNSPLIT}/model.bin"]


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


def genie_mem_mb(wildcards, input):
    return genie_job_mb(GENIE_RUN, os.path.dirname(input.manifest), input.twins)
