# Cut each graph's encodings per part. A checkpoint per graph, so an edit to one tensor's encodings reruns
# only the parts whose slice bytes changed.

OTHER_GRAPH = {"prompt": "token", "token": "prompt"}


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
    shell:
        "{GB} slice-encodings --graph {wildcards.graph} --model {input.model:q} --encodings {input.encodings:q}"
        " --consistent-with {input.other_encodings:q} --parts-dir {OUT:q}/parts/{wildcards.graph}"
        " --out-dir {output.slices:q} > {log:q} 2>&1"
