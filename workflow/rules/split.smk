# Plan the cut points, split both graphs with bounded memory, and check that the chained parts equal the full graph.

# Genie's IO contract, and the graphs, tokenizer and config.json against each other, before any split or convert
# job (the plan waits for it). It reads the graphs' structure only: the .onnx files are its inputs, not the weights,
# so a weights-only change does not rerun it and Snakemake hashes no weights for it; its report has the same bytes
# for the same result, so a rerun that finds the same does not rerun the plan. With bundle.enabled false it records
# the violations instead of failing.
rule check_contract:
    input:
        prompt=SOURCE["prompt_onnx"],
        token=SOURCE["token_onnx"],
        tokenizer=SOURCE["tokenizer"],
        hf_config=SOURCE["hf_config"],
    output:
        f"{OUT}/contract_check.json",
    params:
        checks=contract_checks,
        python=PYTHON,
    priority: CRITICAL_PATH
    log:
        f"{OUT}/logs/check_contract.log",
    benchmark:
        f"{OUT}/benchmarks/check_contract.tsv"
    shell:
        "{params.python} -m genie_build check-contract --prompt {input.prompt:q} --token {input.token:q}"
        " --tokenizer {input.tokenizer:q} --hf-config {input.hf_config:q} --checks-json {params.checks:q}"
        " --out {output:q} > {log:q} 2>&1"


# Hashes every shared weight of both graphs: its own job, so an encodings change does not repeat it, and one that
# runs beside the split (the bundle, not the split, waits for it). It waits for the plan only so that it starts when
# the two splits already hold the cores (they have the priority): ready at the start, it took a core for 6-9 s while
# the second split waited for it, and Snakemake then hashed its 5 GB of inputs before starting anything else. A
# replan with the same bytes does not rerun it (the plan is a checkpoint).
rule check_model:
    input:
        prompt=SOURCE["prompt_onnx"],
        token=SOURCE["token_onnx"],
        weights=sorted({path for graph in BUNDLE_GRAPHS for path in SOURCE_DATA[graph]}),
        lengths=[SOURCE[f"{key}_onnx"] for key in LENGTH_GRAPHS],  # the graphs at other lengths: their kind's weights
        plan=f"{OUT}/plan.json",
    output:
        f"{OUT}/model_check.json",
    priority: LONG_CHECKS
    log:
        f"{OUT}/logs/check_model.log",
    benchmark:
        f"{OUT}/benchmarks/check_model.tsv"
    params:
        lengths=[arg for key, (kind, _) in LENGTH_GRAPHS.items()
                 for arg in ("--length-graph", f"{kind}={SOURCE[f'{key}_onnx']}")],
        python=PYTHON,
    shell:
        "{params.python} -m genie_build check-model --prompt {input.prompt:q} --token {input.token:q}"
        " {params.lengths:q} --out {output:q} > {log:q} 2>&1"


# A checkpoint, so that a plan rewritten with the same bytes does not force a new split. The plan reads the
# graphs' structure and the weights' sizes, not their bytes: the weights are not inputs, so a weights-only
# change does not replan, and Snakemake does not hash GBs of weights for this job. It weighs the pieces with the
# prompt graph's encodings only (whether the graphs' encodings agree is the token graph's slice_encodings job's
# check), so a change to the token graph's encodings does not replan either.
# Graphs without encodings are weighed by the recipe instead, and the plan comes with the calibration chain's units.
PLAN_WEIGHING = ({"units": f"{OUT}/calibration_units.json"} if CALIBRATION_CHAIN
                 else {"prompt_encodings": SOURCE["prompt_encodings"]})


checkpoint plan:
    input:
        prompt=SOURCE["prompt_onnx"],
        token=SOURCE["token_onnx"],
        contract=f"{OUT}/contract_check.json",  # nothing is split or converted for graphs Genie could not load
        **({} if CALIBRATION_CHAIN else PLAN_WEIGHING),
    output:
        plan=f"{OUT}/plan.json",
        **(PLAN_WEIGHING if CALIBRATION_CHAIN else {}),
    params:
        split=json.dumps(config["split"], sort_keys=True),
        load=PLAN_LOAD_ARGS,
        weighing=lambda wc, input, output: (
            ["--recipe", config["quantize"]["recipe"], "--unit-memory-mb", str(config["quantize"]["unit_memory_mb"]),
             "--out-units", output.units] if CALIBRATION_CHAIN else ["--encodings-prompt", input.prompt_encodings]),
        python=PYTHON,
    log:
        f"{OUT}/logs/plan.log",
    benchmark:
        f"{OUT}/benchmarks/plan.tsv"
    shell:
        "{params.python} -m genie_build plan --prompt {input.prompt:q} --token {input.token:q}"
        " {params.weighing:q} --split-json {params.split:q} {params.load:q}"
        " --skip-weight-check --out {output.plan:q} > {log:q} 2>&1"


# A checkpoint per graph: after it runs, Snakemake compares each part's bytes with what the next jobs last saw,
# so only parts whose bytes changed are converted again. The two graphs split side by side.
checkpoint split:
    input:
        plan=f"{OUT}/plan.json",
        model=lambda wc: SOURCE[f"{wc.graph}_onnx"],
        weights=lambda wc: SOURCE_DATA[wc.graph],
    output:
        parts=directory(f"{OUT}/parts/{{graph}}"),
    priority: CRITICAL_PATH
    log:
        f"{OUT}/logs/split/{{graph}}.log",
    benchmark:
        f"{OUT}/benchmarks/split/{{graph}}.tsv"
    params:
        kind=lambda wc: GRAPH_KIND[wc.graph],  # a graph at another context length is split as its kind
        python=PYTHON,
    shell:
        "{params.python} -m genie_build split --plan {input.plan:q} --graph {params.kind:q} --model {input.model:q}"
        " --out-dir {output.parts:q} > {log:q} 2>&1"


# Weights are read but not inputs: a part's .onnx carries its weights' SHA-1, and a changed source weight changes
# the part holding it. Listing them would have Snakemake hash GBs more per build, in its main process.
rule verify_split:
    input:
        parts=split_part_files,
        model=lambda wc: SOURCE[f"{wc.graph}_onnx"],
    output:
        f"{OUT}/verify/{{graph}}.json",
    priority: LONG_CHECKS
    log:
        f"{OUT}/logs/verify_split/{{graph}}.log",
    benchmark:
        f"{OUT}/benchmarks/verify_split/{{graph}}.tsv"
    params:
        parts_dir=directory_of("parts"),  # from the part files (see graph_part_files for why not the checkpoint's)
        python=PYTHON,
    shell:
        "{params.python} -m genie_build verify-split --model {input.model:q} --parts-dir {params.parts_dir:q}"
        " --out {output:q} > {log:q} 2>&1"
