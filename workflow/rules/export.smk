# A Hugging Face checkpoint (model.hf_checkpoint), part by part: the plan from config.json (made and written down
# when the workflow is parsed, rules/common.smk), one export job per part reading only the safetensors files that
# hold its tensors, and the checks a whole graph would have had: Genie's IO contract on the parts together, and each
# part against the checkpoint's transformers modules. Only included when model.hf_checkpoint is set.

rule export_part:
    input:
        graph_config=GRAPH_CONFIG,   # what its graphs take of config.json, read from the checkpoint
        weights=lambda wc: PART_WEIGHT_FILES[wc.part],  # the index, the shards holding the part's tensors
    output:
        prompt=f"{EXPORTED}/prompt.onnx",
        token=f"{EXPORTED}/token.onnx",
        weights=f"{EXPORTED}/weights.onnx.data",
    params:
        checkpoint=CHECKPOINT,
        part=part_json,
        num_parts=PLAN.num_parts,
        ar=config["export"]["ar"],
        context=CONTEXT_LENGTHS[-1],
        out_dir=directory_of("prompt"),
        python=PYTHON,
    resources:
        # measured: the part's float32 weights and about 0.8 GB of torch and transformers (docs/large-models.md)
        mem_mb=lambda wc: int(1.25 * part_float_mb(wc.part) + 1000),
    log:
        f"{OUT}/logs/export_part/part_{{part}}.log",
    benchmark:
        f"{OUT}/benchmarks/export_part/part_{{part}}.tsv"
    shell:
        "{params.python} -m genie_build export-part --checkpoint {params.checkpoint:q} --part-json {params.part:q}"
        " --num-parts {params.num_parts:q} --ar {params.ar:q} --context {params.context:q} --out-dir {params.out_dir:q}"
        " > {log:q} 2>&1"


# A part's graphs at another context length (export.context a list): a job per part and length, beside the part's
# graphs at the largest, whose weights file they read, so that adding a length re-exports and recalibrates nothing.
rule export_length:
    input:
        graph_config=GRAPH_CONFIG,
        weights=lambda wc: PART_WEIGHT_FILES[wc.part],
        prompt=f"{EXPORTED}/prompt.onnx",   # the graphs at the largest length, whose weight entries these share
        token=f"{EXPORTED}/token.onnx",
        data=f"{EXPORTED}/weights.onnx.data",
    output:
        prompt=f"{EXPORTED}/prompt_cl{{length}}.onnx",
        token=f"{EXPORTED}/token_cl{{length}}.onnx",
    wildcard_constraints:
        length=r"\d+",
    params:
        checkpoint=CHECKPOINT,
        part=part_json,
        num_parts=PLAN.num_parts,
        ar=config["export"]["ar"],
        out_dir=directory_of("prompt"),
        python=PYTHON,
    resources:
        mem_mb=lambda wc: int(1.25 * part_float_mb(wc.part) + 1000),  # as export_part's: it loads the part's modules
    log:
        f"{OUT}/logs/export_length/part_{{part}}_cl{{length}}.log",
    benchmark:
        f"{OUT}/benchmarks/export_length/part_{{part}}_cl{{length}}.tsv"
    shell:
        "{params.python} -m genie_build export-length --checkpoint {params.checkpoint:q} --part-json {params.part:q}"
        " --num-parts {params.num_parts:q} --ar {params.ar:q} --context {wildcards.length:q} --out-dir {params.out_dir:q}"
        " > {log:q} 2>&1"


# Genie's IO contract on the model the parts make together (their IO less what passes between them), and the model,
# tokenizer and config.json against each other; the bundle waits for it. Structure only.
rule check_contract:
    input:
        prompt=part_files(f"{EXPORTED}/prompt.onnx"),
        token=part_files(f"{EXPORTED}/token.onnx"),
        tokenizer=SOURCE["tokenizer"],
        hf_config=SOURCE["hf_config"],
    output:
        f"{OUT}/contract_check.json",
    params:
        checks=contract_checks,
        python=PYTHON,
    log:
        f"{OUT}/logs/check_contract.log",
    benchmark:
        f"{OUT}/benchmarks/check_contract.tsv"
    shell:
        "{params.python} -m genie_build check-contract --prompt {input.prompt:q} --token {input.token:q}"
        " --tokenizer {input.tokenizer:q} --hf-config {input.hf_config:q} --checks-json {params.checks:q}"
        " --out {output:q} > {log:q} 2>&1"


# Each part's graph against the checkpoint's transformers modules, the parts chained on one feed: memory holds one
# part's session or one piece's modules, never the model.
rule verify_parts:
    input:
        plan=f"{OUT}/plan.json",
        parts=lambda wc: part_files(f"{EXPORTED}/{{graph}}.onnx", graph=wc.graph),
        graph_config=GRAPH_CONFIG,
        weights=sorted({path for paths in PART_WEIGHT_FILES.values() for path in paths}),
    output:
        f"{OUT}/verify/{{graph}}.json",
    params:
        checkpoint=CHECKPOINT,
        kind=lambda wc: GRAPH_KIND[wc.graph],
        context=lambda wc: GRAPH_DIMS[wc.graph][1],
        python=PYTHON,
    priority: LONG_CHECKS
    resources:
        mem_mb=lambda wc: int(1.5 * max(map(part_float_mb, PARTS)) + 1000),
    log:
        f"{OUT}/logs/verify_parts/{{graph}}.log",
    benchmark:
        f"{OUT}/benchmarks/verify_parts/{{graph}}.tsv"
    shell:
        "{params.python} -m genie_build verify-parts --checkpoint {params.checkpoint:q} --plan {input.plan:q}"
        " --graph {params.kind:q} --context {params.context:q} --parts {input.parts:q} --out {output:q} > {log:q} 2>&1"
