# The shape-only estimate: the plan, A/B size table and memory plan predicted from the model's shapes and a
# precision (the config's 'precision' section, or quantize.recipe's when the build calibrates), without weights,
# encodings or a compile (docs/field-report-comparison.md), with the load model's verdict on which contexts will map
# (docs/memory-plan.md). Target: 'estimate'.
# An estimate-only config (model.hf_config, no ONNX paths, e.g. config/qwen2_5_7b_6parts.yaml) runs this target alone.
PREDICTED = f"{OUT}/predicted"
# The whole prompt graph when the workflow has one (the demo's or the user's: its own weight names,
# split.boundaries apply), else the HF config.json, named and shaped as docs/conventions.md says (estimate_sizes_extra).
WHOLE_PROMPT = SOURCE.graphs["prompt"].onnx if "prompt" in SOURCE.graphs else None
ESTIMATE_MODEL = WHOLE_PROMPT or SOURCE.hf_config


rule estimate_sizes:
    input:
        model=ESTIMATE_MODEL,
    output:
        plan=f"{PREDICTED}/plan.json",
        estimate=f"{PREDICTED}/estimate.json",
        csv=f"{PREDICTED}/size_table.csv",
        md=f"{PREDICTED}/size_table.md",
        png=f"{PREDICTED}/size_table.png",
        memory_json=f"{PREDICTED}/memory_plan.json",
        memory_md=report(f"{PREDICTED}/memory_plan.md", caption="../report/memory_plan.rst", category="Estimate"),
        memory_png=report(f"{PREDICTED}/memory_plan.png", caption="../report/memory_plan.rst", category="Estimate"),
    params:
        split=json.dumps(config["split"], sort_keys=True),
        max_context_mb=config["report"]["max_context_mb"],
        max_session_mb=config["report"]["max_session_mb"],
        chipset=config["target"]["chipset"],
        embedding=config["bundle"]["embedding"],
        load=LOAD_JSON,
        # split.num_parts auto: each job holding a part within a share of what the run is given (docs/memory-plan.md)
        run_memory_mb=RUN_MEMORY.given_mb,
        run_memory_source=RUN_MEMORY.source,
        evaluate=config["evaluate"]["enabled"],
        toolchains=sorted({variant["toolchain"] for variant in config["variants"].values()}),
        extra=estimate_sizes_extra,
        out_dir=directory_of("plan"),
        python=PYTHON,
    log:
        f"{OUT}/logs/estimate_sizes.log",
    benchmark:
        f"{OUT}/benchmarks/estimate_sizes.tsv"
    shell:
        "{params.python} -m genie_build estimate {params.extra:q} --split-json {params.split:q}"
        " --max-context-mb {params.max_context_mb} --max-session-mb {params.max_session_mb}"
        " --run-memory-mb {params.run_memory_mb:q} --run-memory-source {params.run_memory_source:q}"
        " --evaluate {params.evaluate:q} --toolchains {params.toolchains:q}"
        " --chipset {params.chipset:q} --embedding {params.embedding:q}"
        " --load-json {params.load:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule estimate:
    input:
        rules.estimate_sizes.output,
    localrule: True
