# The built-in demo model (genie_build.sources.DemoSource): generated decoder, tokenizer trained on text in
# resources/, calibrated encodings (by the light built-in calibrator; with demo.calibrator: aimet, the calibration
# chain of rules/calibrate.smk makes them). Its own shape is the trained model's (resources/demo_model.safetensors,
# scripts/train_demo.py); another shape gets random weights.
SRC = SOURCE.source_dir
# Genie's IO contract holds the graphs to the AR and CL the demo was asked for.
CONTRACT_EXPECT.update(expect_ar=SOURCE.graphs["prompt"].ar, expect_context=SOURCE.graphs["prompt"].context)


rule generate_demo:
    input:
        weights=list(SOURCE.weights),
    output:
        prompt=f"{SRC}/prompt.onnx",
        prompt_data=f"{SRC}/prompt.onnx.data",
        token=f"{SRC}/token.onnx",
        token_data=f"{SRC}/token.onnx.data",
        hf_config=f"{SRC}/config.json",
    params:
        out_dir=directory_of("prompt"),
        shape=json.dumps(SOURCE.shape, sort_keys=True),
        extra=generate_demo_extra,
        python=PYTHON,
    log:
        f"{OUT}/logs/generate_demo.log",
    benchmark:
        f"{OUT}/benchmarks/generate_demo.tsv"
    shell:
        "{params.python} -m genie_build generate-demo --out-dir {params.out_dir:q} --shape-json {params.shape:q}"
        " {params.extra:q} > {log:q} 2>&1"


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
        shape=json.dumps(SOURCE.shape, sort_keys=True),
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


# The built-in calibrator's encodings of both graphs, unless the chain calibrates the demo (demo.calibrator: aimet).
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
