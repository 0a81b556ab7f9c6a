# A Hugging Face checkpoint (model.hf_checkpoint) exported to Genie's prompt and token graphs. The inputs are the
# checkpoint's config.json and safetensors files (and the shard index), so a changed checkpoint re-exports; the
# tokenizer is read from the checkpoint where it is. Only included when model.hf_checkpoint is set.

rule export_hf_graphs:
    input:
        hf_config=SOURCE["hf_config"],
        weights=[str(path) for path in checkpoint_weight_files(CHECKPOINT)],
    output:
        prompt=f"{SRC}/prompt.onnx",
        prompt_data=f"{SRC}/prompt.onnx.data",
        token=f"{SRC}/token.onnx",
        token_data=f"{SRC}/token.onnx.data",
    params:
        checkpoint=CHECKPOINT,
        out_dir=directory_of("prompt"),
        ar=config["export"]["ar"],
        context=config["export"]["context"],
        python=PYTHON,
    log:
        f"{OUT}/logs/export_hf_graphs.log",
    benchmark:
        f"{OUT}/benchmarks/export_hf_graphs.tsv"
    shell:
        "{params.python} -m genie_build export-hf --checkpoint {params.checkpoint:q} --out-dir {params.out_dir:q}"
        " --ar {params.ar:q} --context {params.context:q} > {log:q} 2>&1"
