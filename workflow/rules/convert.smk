# Convert each graph of each part with its kind's encodings. Variants that convert alike share one job (the converter:
# genie_build.toolchains.Converter, under the variant's encodings); the reference toolchain writes ONNX, the SDK ones
# a DLC. A part's graphs sit in one folder: the reference converter's graphs other than the prompt graph refer to its
# data file for the weights they share with it (the token graph's, every context length's), so a part's weights are
# on disk once, not once per graph.
# Converted graphs weigh about a byte per weight (8 GB for a 7B model); with convert.keep false they are temp():
# Snakemake deletes them once the compiles (and a host run without whole encodings) have read them, and does not
# make them again while the binaries are up to date.
from genie_build.toolchains import SDK_TOOLCHAINS, converter_pattern, toolchain_version

CONVERTED_FILE = (lambda path: path) if config["convert"]["keep"] else temp
# Rules eligible for between-workflow caching may not have benchmark:, so the job writes its own TSV.
CONVERT_BENCHMARK = f"{OUT}/benchmarks/convert_part/{{encodings}}/{{converter}}/part_{{part}}/{{graph}}.tsv"
CONVERT_LOG = f"{OUT}/logs/convert_part/{{encodings}}/{{converter}}/part_{{part}}/{{graph}}.log"


rule convert_part_reference:
    input:
        unpack(convert_inputs),
        shared=shared_weights_graph,
    output:
        onnx=CONVERTED_FILE(f"{CONVERTED}.onnx"),
        data=CONVERTED_FILE(f"{CONVERTED}.onnx.data"),
    wildcard_constraints:
        converter=converter_pattern(["reference"]),
    params:
        graph_name=graph_name_of,
        float_bitwidth=lambda wc: Converter.named(wc.converter).float_bitwidth,
        takes_embeddings=takes_embeddings,
        extra=convert_part_extra,
        tool_version=toolchain_version("reference"),
        part=CACHE_KEY_PART,
        benchmark=CONVERT_BENCHMARK,
        python=PYTHON,
    cache: CACHE_PER_PART
    group: GROUP_PER_PART
    resources:
        mem_mb=lambda wc, input: job_memory.convert_mb(job_memory.graph_weights(input.onnx)),
    log:
        CONVERT_LOG,
    shell:
        "{params.python} -m genie_build --benchmark {params.benchmark:q} convert --toolchain reference"
        " --onnx {input.onnx:q} --encodings {input.encodings:q}"
        " --graph-name {params.graph_name:q} --float-bitwidth {params.float_bitwidth}"
        " --takes-embeddings {params.takes_embeddings:q} {params.extra:q} --out {output.onnx:q} > {log:q} 2>&1"


rule convert_part_sdk:
    input:
        unpack(convert_inputs),
    output:
        dlc=CONVERTED_FILE(f"{CONVERTED}.dlc"),
    wildcard_constraints:
        converter=converter_pattern(SDK_TOOLCHAINS),
    params:
        graph_name=graph_name_of,
        toolchain=lambda wc: Converter.named(wc.converter).toolchain,
        float_bitwidth=lambda wc: Converter.named(wc.converter).float_bitwidth,
        python=lambda wc: python_for(Converter.named(wc.converter).toolchain),
        tool_version=lambda wc: toolchain_version(Converter.named(wc.converter).toolchain),
        part=CACHE_KEY_PART,
        benchmark=CONVERT_BENCHMARK,
    cache: CACHE_PER_PART
    group: GROUP_PER_PART
    resources:
        mem_mb=lambda wc, input: job_memory.convert_mb(job_memory.graph_weights(input.onnx), sdk=True),
    log:
        CONVERT_LOG,
    shell:
        "{params.python} -m genie_build --benchmark {params.benchmark:q} convert --toolchain {params.toolchain:q}"
        " --onnx {input.onnx:q} --encodings {input.encodings:q} --graph-name {params.graph_name:q}"
        " --float-bitwidth {params.float_bitwidth} --out {output.dlc:q} > {log:q} 2>&1"


# qnn-htp: the QDQ graph the vendor's HTP compiler takes (temp, as the reference's).
rule convert_part_qnn_htp:
    input:
        unpack(convert_inputs),
        shared=shared_weights_graph,
    output:
        onnx=CONVERTED_FILE(f"{CONVERTED}.onnx"),
        data=CONVERTED_FILE(f"{CONVERTED}.onnx.data"),
    wildcard_constraints:
        converter=converter_pattern(["qnn-htp"]),
    params:
        graph_name=graph_name_of,
        float_bitwidth=lambda wc: Converter.named(wc.converter).float_bitwidth,
        takes_embeddings=takes_embeddings,
        extra=convert_part_extra,
        tool_version=toolchain_version("qnn-htp"),
        part=CACHE_KEY_PART,
        benchmark=CONVERT_BENCHMARK,
        python=PYTHON,
    cache: CACHE_PER_PART
    group: GROUP_PER_PART
    resources:
        mem_mb=lambda wc, input: job_memory.convert_mb(job_memory.graph_weights(input.onnx)),
    log:
        CONVERT_LOG,
    shell:
        "{params.python} -m genie_build --benchmark {params.benchmark:q} convert --toolchain qnn-htp"
        " --onnx {input.onnx:q} --encodings {input.encodings:q}"
        " --graph-name {params.graph_name:q} --float-bitwidth {params.float_bitwidth}"
        " --takes-embeddings {params.takes_embeddings:q} {params.extra:q} --out {output.onnx:q} > {log:q} 2>&1"


# With convert.dlc: the DLC QNN's IR backend makes of each qnn-htp converted graph, kept: the graph in the vendor's own
# form, for the vendor's tools (about 1.1 bytes a weight a graph: docs/qnn-htp.md).
rule convert_dlc:
    input:
        onnx=f"{CONVERTED}.onnx",
        data=f"{CONVERTED}.onnx.data",
    output:
        f"{CONVERTED}.dlc",
    wildcard_constraints:
        converter=converter_pattern(["qnn-htp"]),
    params:
        graph_name=graph_name_of,
        python=PYTHON,
    group: GROUP_PER_PART
    resources:
        mem_mb=lambda wc, input: job_memory.convert_mb(job_memory.graph_weights(input.onnx)),
    log:
        f"{OUT}/logs/convert_dlc/{{encodings}}/{{converter}}/part_{{part}}/{{graph}}.log",
    benchmark:
        f"{OUT}/benchmarks/convert_dlc/{{encodings}}/{{converter}}/part_{{part}}/{{graph}}.tsv"
    shell:
        "{params.python} -m genie_build convert-dlc --graph {input.onnx:q} --graph-name {params.graph_name:q}"
        " --out {output:q} > {log:q} 2>&1"
