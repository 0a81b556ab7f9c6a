# The quantize stage of model.hf_checkpoint: aimet-onnx encodings for the exported prompt/token graphs by the
# config's recipe, calibrated on text. Its own rule, so a new recipe or corpus reruns only this (params, inputs),
# never the export. Included only with model.hf_checkpoint (in demo mode calibrate_demo_encodings writes these).

rule quantize_encodings:
    input:
        prompt=f"{SRC}/prompt.onnx",
        prompt_data=f"{SRC}/prompt.onnx.data",
        token=f"{SRC}/token.onnx",
        token_data=f"{SRC}/token.onnx.data",
        tokenizer=SOURCE["tokenizer"],
        hf_config=SOURCE["hf_config"],
        corpus=config["quantize"]["corpus"],
    output:
        prompt=f"{SRC}/prompt.encodings.json",
        token=f"{SRC}/token.encodings.json",
    params:
        recipe=config["quantize"]["recipe"],
        num_samples=config["quantize"]["num_samples"],
        python=PYTHON,
    log:
        f"{OUT}/logs/quantize_encodings.log",
    benchmark:
        f"{OUT}/benchmarks/quantize_encodings.tsv"
    shell:
        "{params.python} -m genie_build quantize --prompt {input.prompt:q} --token {input.token:q}"
        " --hf-config {input.hf_config:q} --tokenizer {input.tokenizer:q} --corpus {input.corpus:q}"
        " --recipe {params.recipe:q} --num-samples {params.num_samples:q}"
        " --out-prompt {output.prompt:q} --out-token {output.token:q} > {log:q} 2>&1"
