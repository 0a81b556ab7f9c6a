# Cut each graph's encodings per part. A checkpoint per graph, so an edit to one tensor's encodings reruns
# only the parts whose slice bytes changed.

checkpoint slice_encodings:
    input:
        parts=split_part_files,
        model=lambda wc: SOURCE[f"{wc.graph}_onnx"],
        encodings=lambda wc: SOURCE[f"{wc.graph}_encodings"],
        other_encodings=other_encodings,
    output:
        slices=directory(f"{OUT}/encodings/{{graph}}"),
    priority: CRITICAL_PATH
    log:
        f"{OUT}/logs/slice_encodings/{{graph}}.log",
    benchmark:
        f"{OUT}/benchmarks/slice_encodings/{{graph}}.tsv"
    params:
        other_option=other_encodings_option,
        # Genie refuses a KV cache output quantized unlike its input; only a bundle needs that
        kv_cache_tied=["--kv-cache-tied"] if config["bundle"]["enabled"] else [],
        # the parts' directory, from the part files (see split_part_files for why not the checkpoint's directory)
        parts_dir=directory_of("parts"),
        python=PYTHON,
    shell:
        "{params.python} -m genie_build slice-encodings --graph {wildcards.graph} --model {input.model:q}"
        " --encodings {input.encodings:q} {params.other_option:q} {input.other_encodings:q}"
        " {params.kv_cache_tied:q}"
        " --parts-dir {params.parts_dir:q} --out-dir {output.slices:q} > {log:q} 2>&1"
