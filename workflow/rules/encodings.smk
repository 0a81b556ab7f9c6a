# Cut each graph's encodings per part. A checkpoint per graph, so an edit to one tensor's encodings reruns
# only the parts whose slice bytes changed.

def _other_encodings_option(wildcards, input):
    """The token graph's job checks that the graphs' encodings agree (the one place that check runs); with
    encodings.share_from: prompt it takes the prompt's instead. The prompt graph's job reads only its own."""
    if wildcards.graph != "token":
        return ""
    option = "--share-from" if config["encodings"]["share_from"] == "prompt" else "--consistent-with"
    return f"{option} {shlex.quote(input.other_encodings[0])}"


checkpoint slice_encodings:
    input:
        parts=split_part_files,
        model=lambda wc: SOURCE[f"{wc.graph}_onnx"],
        encodings=lambda wc: SOURCE[f"{wc.graph}_encodings"],
        other_encodings=lambda wc: [SOURCE["prompt_encodings"]] if wc.graph == "token" else [],
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
