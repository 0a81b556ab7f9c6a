# Read every binary back, then the A/B size table, its chart and the memory plan (the load model's verdict on the
# bundled variant: with report.strict, a context that will not map fails the build before the bundle is assembled).


rule account:
    input:
        binary=f"{OUT}/compiled/{{variant}}/part_{{part}}.bin",
    output:
        f"{OUT}/sizes/{{variant}}/part_{{part}}.json",
    params:
        toolchain=lambda wc: toolchain_of(wc.variant),
        options=lambda wc: variant_json(wc.variant),
        python=lambda wc: python_for(toolchain_of(wc.variant)),
    group: GROUP_PER_PART
    log:
        f"{OUT}/logs/account/{{variant}}/part_{{part}}.log",
    benchmark:
        f"{OUT}/benchmarks/account/{{variant}}/part_{{part}}.tsv"
    shell:
        "{params.python} -m genie_build account --toolchain {params.toolchain:q} --binary {input.binary:q}"
        " --part-label {wildcards.part} --variant {wildcards.variant}"
        " --variant-json {params.options:q} --out {output:q} > {log:q} 2>&1"


rule size_table:
    input:
        # the bundle's contexts of every variant: with the embedding table, not part 1 (a table on the CPU)
        records=lambda wc: [f"{OUT}/sizes/{variant}/part_{label}.json" for variant in config["variants"]
                            for label in bundle_part_labels()],
        quality=lambda wc: evaluation_reports(wc) if config["evaluate"]["enabled"] else [],
        memory_plan=f"{OUT}/memory_plan.json",
    output:
        csv=report(f"{OUT}/size_table.csv", caption="../report/size_table.rst", category="Sizes"),
        md=f"{OUT}/size_table.md",
        png=report(f"{OUT}/size_table.png", caption="../report/size_chart.rst", category="Sizes"),
    params:
        baseline=config["report"]["baseline_variant"],
        strict=config["report"]["strict"],
        extra=size_table_extra,
        python=PYTHON,
    log:
        f"{OUT}/logs/size_table.log",
    benchmark:
        f"{OUT}/benchmarks/size_table.tsv"
    shell:
        "{params.python} -m genie_build size-table --records {input.records:q} --baseline {params.baseline:q}"
        " --strict {params.strict} {params.extra:q} --memory-plan {input.memory_plan:q}"
        " --csv {output.csv:q} --md {output.md:q} --png {output.png:q} > {log:q} 2>&1"


rule memory_plan:
    input:
        # the bundle's contexts: with the embedding table, the parts after it, and the table beside them
        records=lambda wc: [f"{OUT}/sizes/{BUNDLE_VARIANT}/part_{label}.json" for label in bundle_part_labels()],
        table=[EMBEDDING_TABLE] if EMBEDDING_LUT else [],
        split_choice=SPLIT_CHOICE,
    output:
        json=f"{OUT}/memory_plan.json",
        md=report(f"{OUT}/memory_plan.md", caption="../report/memory_plan.rst", category="Memory plan"),
        png=report(f"{OUT}/memory_plan.png", caption="../report/memory_plan.rst", category="Memory plan"),
    params:
        variant=BUNDLE_VARIANT,
        chipset=config["target"]["chipset"],
        load=LOAD_JSON,
        strict=config["report"]["strict"],
        extra=memory_plan_extra,
        max_context_mb=config["report"]["max_context_mb"],
        max_session_mb=config["report"]["max_session_mb"],
        python=PYTHON,
    log:
        f"{OUT}/logs/memory_plan.log",
    benchmark:
        f"{OUT}/benchmarks/memory_plan.tsv"
    shell:
        "{params.python} -m genie_build memory-plan --records {input.records:q} --variant {params.variant:q}"
        " --max-context-mb {params.max_context_mb} --max-session-mb {params.max_session_mb}"
        " --chipset {params.chipset:q} --load-json {params.load:q} --strict {params.strict} {params.extra:q}"
        " --json {output.json:q} --md {output.md:q} --png {output.png:q} > {log:q} 2>&1"
