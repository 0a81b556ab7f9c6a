# Compile each part's prompt and token graphs, at every context length, into one context binary per variant.


rule compile_part:
    input:
        unpack(converted_graphs),
    output:
        f"{OUT}/compiled/{{variant}}/part_{{part}}.bin",
    params:
        graphs=lambda wc, input: [f"{graph_name_for(key, wc.part)}={input[key]}" for key in BUNDLE_GRAPHS],
        toolchain=lambda wc: toolchain_of(wc.variant),
        options=lambda wc: variant_json(wc.variant),
        chipset=config["target"]["chipset"],
        python=lambda wc: python_for(toolchain_of(wc.variant)),
        tool_version=lambda wc: toolchain_version(toolchain_of(wc.variant)),
        part=CACHE_KEY_PART,
        # Rules eligible for between-workflow caching may not have benchmark:, so the job writes its own TSV.
        benchmark=f"{OUT}/benchmarks/compile_part/{{variant}}/part_{{part}}.tsv",
    cache: CACHE_PER_PART
    group: GROUP_PER_PART
    resources:
        mem_mb=lambda wc, input: job_memory.compile_mb(job_memory.files_mb(input), graphs=len(BUNDLE_GRAPHS),
                                                       toolchain=toolchain_of(wc.variant)),
    log:
        f"{OUT}/logs/compile_part/{{variant}}/part_{{part}}.log",
    shell:
        "{params.python} -m genie_build --benchmark {params.benchmark:q} compile --toolchain {params.toolchain:q}"
        " --graph {params.graphs:q}"
        " --variant-json {params.options:q} --chipset {params.chipset:q} --out {output:q} > {log:q} 2>&1"


# The bundle's qnn-htp parts again, without weight sharing: a weight-shared QNN binary runs only on a device, its twin
# runs on x86 in the HTP simulation (the host run; genie_build.toolchains.qnn_htp.twin).
rule compile_twin:
    input:
        unpack(lambda wc: converted_graphs(wc, BUNDLE_VARIANT)),
    output:
        directory(f"{OUT}/twin/part_{{part}}"),
    params:
        graphs=lambda wc, input: [f"{graph_name_for(key, wc.part)}={input[key]}" for key in BUNDLE_GRAPHS],
        options=variant_json(BUNDLE_VARIANT),
        chipset=config["target"]["chipset"],
        tool_version=toolchain_version("qnn-htp"),
        python=PYTHON,
    resources:
        mem_mb=lambda wc, input: job_memory.compile_mb(job_memory.files_mb(input), graphs=len(BUNDLE_GRAPHS),
                                                       toolchain="qnn-htp"),
    log:
        f"{OUT}/logs/compile_twin/part_{{part}}.log",
    benchmark:
        f"{OUT}/benchmarks/compile_twin/part_{{part}}.tsv"
    shell:
        "{params.python} -m genie_build compile-twin --graph {params.graphs:q} --variant-json {params.options:q}"
        " --chipset {params.chipset:q} --out-dir {output:q} > {log:q} 2>&1"
