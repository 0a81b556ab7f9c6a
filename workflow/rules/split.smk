# Whole graphs (the demo's or the user's ONNX): plan the cut points, split the graphs into the parts folder with
# bounded memory, and check that the chained parts equal the whole graph and that the graphs share their weights.
# Every part's files wait for the plan and the split (checkpoints, common.smk); the bundle waits for the graphs'
# shared weights, the build for one verification per graph.
PART_CHECKPOINTS += [("plan", {}), ("split", {})]
GRAPH_CHECKPOINTS.update({key: [("plan", {}), ("split", {})] for key in SOURCE.graphs})
MODEL_CHECKS.append(f"{OUT}/model_check.json")
VERIFY_REPORTS += [f"{OUT}/verify/{key}.json" for key in SOURCE.graphs]

# Hashes every shared weight of the graphs: its own job, so an encodings change does not repeat it, and one that runs
# beside the split (the bundle, not the split, waits for it). It waits for the plan only so that it starts when the
# splits already hold the cores (they have the priority): ready at the start, it took a core for 6-9 s while the
# second split waited for it, and Snakemake then hashed its 5 GB of inputs before starting anything else. A replan
# with the same bytes does not rerun it (the plan is a checkpoint).
rule check_model:
    input:
        prompt=SOURCE.graphs["prompt"].onnx,
        token=SOURCE.graphs["token"].onnx,
        weights=sorted({path for graph in SOURCE.graphs.values() for path in graph.data}),
        # the graphs at other lengths: their kind's weights
        lengths=[graph.onnx for key, graph in SOURCE.graphs.items() if key not in GRAPHS],
        plan=f"{OUT}/plan.json",
    output:
        f"{OUT}/model_check.json",
    priority: LONG_CHECKS
    log:
        f"{OUT}/logs/check_model.log",
    benchmark:
        f"{OUT}/benchmarks/check_model.tsv"
    params:
        extra=check_model_extra,
        python=PYTHON,
    shell:
        "{params.python} -m genie_build check-model --prompt {input.prompt:q} --token {input.token:q}"
        " {params.extra:q} --out {output:q} > {log:q} 2>&1"


# A checkpoint, so that a plan rewritten with the same bytes does not force a new split. The plan reads the graphs'
# structure and the weights' sizes, not their bytes: the weights are not inputs, so a weights-only change does not
# replan, and Snakemake does not hash GBs of weights for this job. It weighs the pieces with the prompt graph's
# encodings only (whether the graphs' encodings agree is the slice_encodings job's check), so a change to the token
# graph's encodings does not replan either. Graphs without encodings are weighed by the recipe instead, and the plan
# comes with the calibration chain's units.
checkpoint plan:
    input:
        prompt=SOURCE.graphs["prompt"].onnx,
        token=SOURCE.graphs["token"].onnx,
        contract=f"{OUT}/contract_check.json",  # nothing is split or converted for graphs Genie could not load
        **({} if CALIBRATION_CHAIN else {"encodings": SOURCE.encodings["prompt"]}),
    output:
        plan=f"{OUT}/plan.json",
        **({"units": PLAN_UNITS} if CALIBRATION_CHAIN else {}),
    params:
        split=json.dumps(config["split"], sort_keys=True),
        extra=plan_extra,
        python=PYTHON,
    log:
        f"{OUT}/logs/plan.log",
    benchmark:
        f"{OUT}/benchmarks/plan.tsv"
    shell:
        "{params.python} -m genie_build plan --prompt {input.prompt:q} --token {input.token:q}"
        " --split-json {params.split:q} {params.extra:q}"
        " --skip-weight-check --out {output.plan:q} > {log:q} 2>&1"


# A checkpoint: after it runs, Snakemake compares each part's bytes with what the next jobs last saw, so only parts
# whose bytes changed are converted again. Every graph in one job, so that a part's graphs (each kind at each
# length, parts/part_{NN_of_N}/{graph}.onnx) read one weights file, each shared weight stored once, as a
# checkpoint's export writes a part: the weights are written once, not once per graph.
checkpoint split:
    input:
        plan=f"{OUT}/plan.json",
        models=[graph.onnx for graph in SOURCE.graphs.values()],
        weights=sorted({path for graph in SOURCE.graphs.values() for path in graph.data}),
    output:
        f"{OUT}/split.json",
    priority: CRITICAL_PATH
    log:
        f"{OUT}/logs/split.log",
    benchmark:
        f"{OUT}/benchmarks/split.tsv"
    params:
        graphs=[f"{key}={graph.onnx}" for key, graph in SOURCE.graphs.items()],
        parts_dir=SOURCE.parts_dir,
        python=PYTHON,
    shell:
        "{params.python} -m genie_build split --plan {input.plan:q} --graph {params.graphs:q}"
        " --parts-dir {params.parts_dir:q} --out {output:q} > {log:q} 2>&1"


# Weights are read but not inputs: a part's .onnx carries its weights' SHA-1, and a changed source weight changes
# the part holding it. Listing them would have Snakemake hash GBs more per build, in its main process.
rule verify_split:
    input:
        parts=lambda wc: graph_parts(wc.graph),
        model=lambda wc: SOURCE.graphs[wc.graph].onnx,
    output:
        f"{OUT}/verify/{{graph}}.json",
    priority: LONG_CHECKS
    log:
        f"{OUT}/logs/verify_split/{{graph}}.log",
    benchmark:
        f"{OUT}/benchmarks/verify_split/{{graph}}.tsv"
    params:
        parts_dir=SOURCE.parts_dir,
        python=PYTHON,
    shell:
        "{params.python} -m genie_build verify-split --model {input.model:q} --parts-dir {params.parts_dir:q}"
        " --graph {wildcards.graph:q} --out {output:q} > {log:q} 2>&1"
