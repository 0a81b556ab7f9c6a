# The source's own encodings (the user's, the demo's built-in calibrator's) cut per part: both graphs in one job,
# one checkpoint, so Snakemake learns of both graphs' slices at once (two per-graph checkpoints ran one after the
# other: part_labels() stops at the first incomplete one). An edit to one tensor's encodings reruns only the parts
# whose slice bytes changed. The graphs at other context lengths read their kind's slices. Every part's files wait
# for it, after the splits (common.smk).
PART_CHECKPOINTS.append(("slice_encodings", {}))

checkpoint slice_encodings:
    input:
        prompt_parts=lambda wc: graph_parts("prompt"),
        token_parts=lambda wc: graph_parts("token"),
        prompt_model=SOURCE.graphs["prompt"].onnx,
        token_model=SOURCE.graphs["token"].onnx,
        prompt_encodings=SOURCE.encodings["prompt"],
        token_encodings=SOURCE.encodings["token"],
    output:
        slices=directory(SOURCE.encodings_dir(SOURCE_ENCODINGS)),
    priority: CRITICAL_PATH
    log:
        f"{OUT}/logs/slice_encodings.log",
    benchmark:
        f"{OUT}/benchmarks/slice_encodings.tsv"
    params:
        token_shares_prompt=config["encodings"]["share_from"] == "prompt",
        # Genie refuses a KV cache output quantized unlike its input; only a bundle needs that
        kv_cache_tied=config["bundle"]["enabled"],
        parts_dir=SOURCE.parts_dir,
        python=PYTHON,
    shell:
        "{params.python} -m genie_build slice-encodings"
        " --prompt-model {input.prompt_model:q} --prompt-encodings {input.prompt_encodings:q}"
        " --token-model {input.token_model:q} --token-encodings {input.token_encodings:q}"
        " --parts-dir {params.parts_dir:q} --out-dir {output.slices:q}"
        " --token-shares-prompt {params.token_shares_prompt:q} --kv-cache-tied {params.kv_cache_tied:q} > {log:q} 2>&1"
