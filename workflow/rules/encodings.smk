# Cut both graphs' encodings per part, in one job: one checkpoint, so Snakemake learns of both graphs' slices at
# once (two per-graph checkpoints ran one after the other: part_labels() stops at the first incomplete one). An edit
# to one tensor's encodings reruns only the parts whose slice bytes changed.

checkpoint slice_encodings:
    input:
        prompt_parts=graph_part_files("prompt"),
        token_parts=graph_part_files("token"),
        prompt_model=SOURCE["prompt_onnx"],
        token_model=SOURCE["token_onnx"],
        prompt_encodings=SOURCE["prompt_encodings"],
        token_encodings=SOURCE["token_encodings"],
    output:
        # one directory holding prompt/ and token/: a checkpoint with one output, as every other checkpoint here
        slices=directory(f"{OUT}/encodings"),
    priority: CRITICAL_PATH
    log:
        f"{OUT}/logs/slice_encodings.log",
    benchmark:
        f"{OUT}/benchmarks/slice_encodings.tsv"
    params:
        token_shares_prompt=["--token-shares-prompt"] if config["encodings"]["share_from"] == "prompt" else [],
        # Genie refuses a KV cache output quantized unlike its input; only a bundle needs that
        kv_cache_tied=["--kv-cache-tied"] if config["bundle"]["enabled"] else [],
        # the parts' directories, from the part files (see graph_part_files for why not the checkpoints' directories)
        prompt_parts_dir=directory_of("prompt_parts"),
        token_parts_dir=directory_of("token_parts"),
        python=PYTHON,
    shell:
        "{params.python} -m genie_build slice-encodings"
        " --prompt-model {input.prompt_model:q} --prompt-encodings {input.prompt_encodings:q}"
        " --prompt-parts-dir {params.prompt_parts_dir:q} --prompt-out-dir {output.slices:q}/prompt"
        " --token-model {input.token_model:q} --token-encodings {input.token_encodings:q}"
        " --token-parts-dir {params.token_parts_dir:q} --token-out-dir {output.slices:q}/token"
        " {params.token_shares_prompt:q} {params.kv_cache_tied:q} > {log:q} 2>&1"
