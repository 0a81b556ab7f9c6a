# The built-in demo model: generated decoder, tokenizer trained on text in resources/, calibrated encodings (by the
# light built-in calibrator; with demo.calibrator: aimet, the calibration chain of rules/calibrate.smk makes them).
# Only used when config.model names no files of its own.

rule generate_demo_model:
    output:
        prompt=f"{SRC}/prompt.onnx",
        prompt_data=f"{SRC}/prompt.onnx.data",
        token=f"{SRC}/token.onnx",
        token_data=f"{SRC}/token.onnx.data",
        hf_config=f"{SRC}/config.json",
    params:
        out_dir=directory_of("prompt"),
        shape=json.dumps(shape_config(config["demo"]), sort_keys=True),
        python=PYTHON,
    log:
        f"{OUT}/logs/generate_demo_model.log",
    benchmark:
        f"{OUT}/benchmarks/generate_demo_model.tsv"
    shell:
        "{params.python} -m genie_build generate-demo --out-dir {params.out_dir:q} --shape-json {params.shape:q}"
        " > {log:q} 2>&1"


rule train_demo_tokenizer:
    input:
        corpus="resources/tokenizer_corpus.txt",
    output:
        f"{SRC}/tokenizer.json",
    params:
        vocab=config["demo"]["vocab"],
        python=PYTHON,
    log:
        f"{OUT}/logs/train_demo_tokenizer.log",
    benchmark:
        f"{OUT}/benchmarks/train_demo_tokenizer.tsv"
    shell:
        "{params.python} -m genie_build train-tokenizer --corpus {input.corpus:q} --vocab {params.vocab} --out {output:q} > {log:q} 2>&1"


if not CALIBRATION_CHAIN:

    rule calibrate_demo_encodings:
        input:
            prompt=f"{SRC}/prompt.onnx",
            prompt_data=f"{SRC}/prompt.onnx.data",
            token=f"{SRC}/token.onnx",
            token_data=f"{SRC}/token.onnx.data",
            hf_config=f"{SRC}/config.json",
        output:
            prompt=f"{SRC}/prompt.encodings.json",
            token=f"{SRC}/token.encodings.json",
        params:
            python=PYTHON,
        log:
            f"{OUT}/logs/calibrate_demo_encodings.log",
        benchmark:
            f"{OUT}/benchmarks/calibrate_demo_encodings.tsv"
        shell:
            "{params.python} -m genie_build calibrate --prompt {input.prompt:q} --token {input.token:q} --hf-config {input.hf_config:q}"
            " --out-prompt {output.prompt:q} --out-token {output.token:q}"
            " > {log:q} 2>&1"
