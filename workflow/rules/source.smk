# The built-in demo model: generated decoder, tokenizer trained on text in resources/, calibrated encodings (by the
# light built-in calibrator; with demo.calibrator: aimet, the calibration chain of rules/calibrate.smk makes them).
# Only used when config.model names no files of its own.

# The demo's own shape is the trained model's (resources/demo_model.safetensors, scripts/train_demo.py); another
# shape gets random weights.
DEMO_WEIGHTS = [TRAINED_WEIGHTS] if is_trained_shape(DemoShape(**shape_config(config["demo"]))) else []


rule generate_demo:
    input:
        weights=DEMO_WEIGHTS,
    output:
        prompt=f"{SRC}/prompt.onnx",
        prompt_data=f"{SRC}/prompt.onnx.data",
        token=f"{SRC}/token.onnx",
        token_data=f"{SRC}/token.onnx.data",
        hf_config=f"{SRC}/config.json",
    params:
        out_dir=directory_of("prompt"),
        shape=json.dumps(shape_config(config["demo"]), sort_keys=True),
        weights=lambda wc, input: ["--weights", *input.weights] if input.weights else [],
        python=PYTHON,
    log:
        f"{OUT}/logs/generate_demo.log",
    benchmark:
        f"{OUT}/benchmarks/generate_demo.tsv"
    shell:
        "{params.python} -m genie_build generate-demo --out-dir {params.out_dir:q} --shape-json {params.shape:q}"
        " {params.weights:q} > {log:q} 2>&1"


# The graphs at the other context lengths (demo.context a list): a job per length, reading the weights of those at
# the largest, so that adding a length leaves them, and what was calibrated from them, as they are.
rule generate_demo_length:
    input:
        prompt=f"{SRC}/prompt.onnx",
        token=f"{SRC}/token.onnx",
    output:
        prompt=f"{SRC}/prompt_cl{{length}}.onnx",
        token=f"{SRC}/token_cl{{length}}.onnx",
    wildcard_constraints:
        length=r"\d+",
    params:
        out_dir=directory_of("prompt"),
        shape=json.dumps(shape_config(config["demo"]), sort_keys=True),
        python=PYTHON,
    log:
        f"{OUT}/logs/generate_demo_length/cl{{length}}.log",
    benchmark:
        f"{OUT}/benchmarks/generate_demo_length/cl{{length}}.tsv"
    shell:
        "{params.python} -m genie_build generate-demo-length --out-dir {params.out_dir:q} --shape-json {params.shape:q}"
        " --context {wildcards.length:q} > {log:q} 2>&1"


rule train_tokenizer:
    input:
        corpus="resources/tokenizer_corpus.txt",
    output:
        f"{SRC}/tokenizer.json",
    params:
        vocab=config["demo"]["vocab"],
        python=PYTHON,
    log:
        f"{OUT}/logs/train_tokenizer.log",
    benchmark:
        f"{OUT}/benchmarks/train_tokenizer.tsv"
    shell:
        "{params.python} -m genie_build train-tokenizer --corpus {input.corpus:q} --vocab {params.vocab} --out {output:q} > {log:q} 2>&1"


if not CALIBRATION_CHAIN:

    rule calibrate:
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
            f"{OUT}/logs/calibrate.log",
        benchmark:
            f"{OUT}/benchmarks/calibrate.tsv"
        shell:
            "{params.python} -m genie_build calibrate --prompt {input.prompt:q} --token {input.token:q} --hf-config {input.hf_config:q}"
            " --out-prompt {output.prompt:q} --out-token {output.token:q}"
            " > {log:q} 2>&1"
