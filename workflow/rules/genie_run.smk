# Genie's run on the build box (docs/genie-run.md): the vendor's Genie (libGenie.so of the onnxruntime-qnn wheel)
# loads a qnn-htp bundle through its twins, with the bundle's own genie_config.json changed only where x86 or a
# deterministic run needs it, and answers the host prompt: tokens other than the host run's are a warning (an error
# with report.strict). bundle.genie_run: auto runs it beside the host run on a bundle small enough for the HTP
# simulation and records why not on a larger one; load (a load check) and generate are asked for.


rule genie_run:
    input:
        manifest=BUNDLE,
        check=f"{OUT}/bundle_check.json",
        twins=host_run_twins,
        prompt=HOST_PROMPT_IDS,
        host_run=[f"{OUT}/host_run.json"] if config["bundle"]["host_run"] else [],
        float_graphs=lambda wc: list(genie_float_graphs(wc).values()),
    output:
        report(f"{OUT}/genie_run.json", caption="../report/genie_run.rst", category="Genie bundle"),
    params:
        mode=GENIE_RUN,
        strict=config["report"]["strict"],
        float_graphs=lambda wc: [f"{name}={path}" for name, path in genie_float_graphs(wc).items()],
        extra=genie_run_extra,
        bundle_dir=directory_of("manifest"),
        python=PYTHON,
    resources:
        mem_mb=genie_mem_mb,
    log:
        f"{OUT}/logs/genie_run.log",
    benchmark:
        f"{OUT}/benchmarks/genie_run.tsv"
    shell:
        "{params.python} -m genie_build genie-run {params.bundle_dir:q} --twin {input.twins:q} --mode {params.mode:q}"
        " --prompt {input.prompt:q} --float-graph {params.float_graphs:q} --strict {params.strict} {params.extra:q}"
        " --out {output:q}"
        " > {log:q} 2>&1"
