# The calibration chain (a source that brings no encodings: a checkpoint, float graphs without model.encodings, the
# demo with demo.calibrator: aimet): aimet-onnx calibrates one unit (consecutive pieces of one part, as many as
# quantize.unit_memory_mb holds) at a time, fed the residual stream the unit before it stored, so every encoding
# equals a whole-model calibration's (docs/quantize.md). A part's encodings are merged as soon as its last unit is
# done, so its converts start while later units still calibrate. The units read the calibration text's token ids
# (rules/tokens.smk), only the windows they use. Each recipe the variants name has a chain of its
# own (calibration/<recipe>/). A new corpus, recipe or sample count reruns the chain and what follows, never the
# export or the split. A checkpoint's units are known when the workflow is parsed; split graphs' come with their
# plan (a checkpoint of Snakemake's).
from genie_build.config import calibration_windows
from genie_build.plan.calibration_units import unit_peak_mb

# The bundle waits for the plan checked against the encodings the chain calibrated (check_plan).
MODEL_CHECKS.append(f"{OUT}/plan_check.json")

wildcard_constraints:
    recipe="|".join(map(re.escape, CALIBRATED_RECIPES)) or "(?!)",


rule calibrate_unit:
    input:
        unpack(unit_inputs),
        graph_config=SOURCE.graph_config,
        tokens=tokens_of("calibration"),
    output:
        encodings=f"{CALIBRATION}/{{unit}}.encodings.json",
        boundary=f"{CALIBRATION}/{{unit}}.boundary.npy",
    params:
        part_units=lambda wc: units_json(part_units(chain_units(), unit_named(chain_units(), wc.unit).part)),
        extra=calibrate_unit_extra,
        num_samples=calibration_windows(config["quantize"], SOURCE.graphs["prompt"].ar),
        calibrator=config["quantize"]["calibrator"],
        ar=SOURCE.graphs["prompt"].ar,
        context=SOURCE.graphs["prompt"].context,
        python=PYTHON,
    wildcard_constraints:
        unit=conventions.UNIT_LABEL_PATTERN,
    # the chain is the build's longest path: its units go first, on most of the cores (aimet-onnx's session)
    priority: CHAIN_FIRST
    threads: CHAIN_THREADS
    resources:
        mem_mb=lambda wc: unit_peak_mb(unit_named(chain_units(), wc.unit)),
    log:
        f"{OUT}/logs/calibrate_unit/{{recipe}}/{{unit}}.log",
    benchmark:
        f"{OUT}/benchmarks/calibrate_unit/{{recipe}}/{{unit}}.tsv"
    shell:
        "{params.python} -m genie_build calibrate-unit --part-graph {input.part_graph:q}"
        " --part-units-json {params.part_units:q} --unit {wildcards.unit} {params.extra:q}"
        " --hf-config {input.graph_config:q} --tokens {input.tokens:q}"
        " --recipe {wildcards.recipe:q} --num-samples {params.num_samples:q}"
        " --calibrator {params.calibrator:q} --ar {params.ar:q} --context {params.context:q}"
        " --out-encodings {output.encodings:q} --out-boundary {output.boundary:q} > {log:q} 2>&1"


rule part_encodings:
    input:
        unpack(part_encodings_inputs),
    output:
        prompt=SOURCE.part_encodings("prompt", "{part}", "{recipe}"),
        token=SOURCE.part_encodings("token", "{part}", "{recipe}"),
    params:
        part_units=lambda wc: units_json(part_units(chain_units(), wc.part)),
        extra=part_encodings_extra,
        # Genie refuses a KV cache output quantized unlike its input; only a bundle needs that
        kv_cache_tied=config["bundle"]["enabled"],
        python=PYTHON,
    priority: CRITICAL_PATH
    log:
        f"{OUT}/logs/part_encodings/{{recipe}}/part_{{part}}.log",
    benchmark:
        f"{OUT}/benchmarks/part_encodings/{{recipe}}/part_{{part}}.tsv"
    shell:
        "{params.python} -m genie_build part-encodings --part-units-json {params.part_units:q}"
        " --unit-encodings {input.units:q} {params.extra:q}"
        " --prompt-graph {input.prompt_graph:q} --token-graph {input.token_graph:q} --kv-cache-tied {params.kv_cache_tied:q}"
        " --out-prompt {output.prompt:q} --out-token {output.token:q} > {log:q} 2>&1"


# The plan was made from shapes, weighed by quantize.recipe; that recipe's calibrated encodings must cut the model into
# the same parts (the bundle waits).
rule check_plan:
    input:
        plan=f"{OUT}/plan.json",
        graphs=lambda wc: [part_graph("prompt", label) for label in part_labels()],
        encodings=lambda wc: [SOURCE.part_encodings("prompt", label, config["quantize"]["recipe"])
                              for label in part_labels()],
    output:
        f"{OUT}/plan_check.json",
    params:
        python=PYTHON,
    log:
        f"{OUT}/logs/check_plan.log",
    benchmark:
        f"{OUT}/benchmarks/check_plan.tsv"
    shell:
        "{params.python} -m genie_build check-plan --plan {input.plan:q} --graphs {input.graphs:q}"
        " --encodings {input.encodings:q} --out {output:q} > {log:q} 2>&1"
