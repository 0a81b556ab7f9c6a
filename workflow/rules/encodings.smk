# Cut each graph's encodings per part. A checkpoint per graph, so an edit to one tensor's encodings reruns
# only the parts whose slice bytes changed.

OTHER_GRAPH = {"prompt": "token", "token": "prompt"}


def _other_encodings_option(wildcards, input):
    """Check the graphs agree; with encodings.share_from: prompt the token graph takes the prompt's instead.
    A bundle needs each KV cache output quantized as its input (Genie)."""
    tied = " --kv-cache-tied" if config["bundle"]["enabled"] else ""
    if config["encodings"]["share_from"] != "prompt":
        return f"--consistent-with {shlex.quote(input.other_encodings)}{tied}"
    return (f"--share-from {shlex.quote(input.other_encodings)}" if wildcards.graph == "token" else "") + tied


checkpoint slice_encodings:
    input:
        parts=split_part_files,
        model=lambda wc: SOURCE[f"{wc.graph}_onnx"],
        encodings=lambda wc: SOURCE[f"{wc.graph}_encodings"],
        other_encodings=lambda wc: SOURCE[f"{OTHER_GRAPH[wc.graph]}_encodings"],
    output:
        slices=directory(f"{OUT}/encodings/{{graph}}"),
    priority: CRITICAL_PATH
    log:
        f"{OUT}/logs/slice_encodings/{{graph}}.log",
    benchmark:
        f"{OUT}/benchmarks/slice_encodings/{{graph}}.tsv"
    params:
        other=_other_encodings_option,
    shell:
        "{GB} slice-encodings --graph {wildcards.graph} --model {input.model:q} --encodings {input.encodings:q}"
        " {params.other} --parts-dir {OUT:q}/parts/{wildcards.graph}"
        " --out-dir {output.slices:q} > {log:q} 2>&1"
