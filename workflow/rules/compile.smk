# Compile each part's prompt and token graphs into one context binary per variant.


def converted_graphs(wildcards):
    converter = converter_of(wildcards.variant)
    extension = ".onnx" if converter.startswith("reference-") else ".dlc"
    return {
        graph: f"{OUT}/converted/{converter}/{graph}/part_{wildcards.part}{extension}" for graph in GRAPHS
    }


def graph_args(wildcards, input):
    return " ".join(f"--graph {shlex.quote(f'{graph_name_for(graph, wildcards.part)}={input[graph]}')}" for graph in GRAPHS)


rule compile_part:
    input:
        unpack(converted_graphs),
    output:
        f"{OUT}/compiled/{{variant}}/part_{{part}}.bin",
    params:
        graphs=graph_args,
        toolchain=lambda wc: config["variants"][wc.variant]["toolchain"],
        options=lambda wc: variant_json(wc.variant),
        chipset=config["target"]["chipset"],
        python=lambda wc: QAIRT_PY if config["variants"][wc.variant]["toolchain"] == "qairt" else shlex.quote(sys.executable),
        tool_version=lambda wc: toolchain_version(config["variants"][wc.variant]["toolchain"]),
        part=CACHE_KEY_PART,
        # Rules eligible for between-workflow caching may not have benchmark:, so the job writes its own TSV.
        benchmark=f"{OUT}/benchmarks/compile_part/{{variant}}/part_{{part}}.tsv",
    cache: CACHE_PER_PART
    group: GROUP_PER_PART
    resources:
        mem_mb=lambda wc, input: max(1000, int(4 * onnx_with_data_mb(input))),
    log:
        f"{OUT}/logs/compile_part/{{variant}}/part_{{part}}.log",
    shell:
        "{params.python} -m genie_build --benchmark {params.benchmark:q} compile --toolchain {params.toolchain:q} {params.graphs}"
        " --variant-json {params.options:q} --chipset {params.chipset:q} --out {output:q} > {log:q} 2>&1"
