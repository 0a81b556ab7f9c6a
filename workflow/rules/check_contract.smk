# Genie's IO contract on the graphs, and the graphs, tokenizer and config.json against each other: of whole graphs
# before any split or convert job (the plan waits for it), of a checkpoint's exported parts together (their IO less
# what passes between them; the bundle waits for it). It reads the graphs' structure only: the .onnx files are its
# inputs, not the weights, so a weights-only change does not rerun it and Snakemake hashes no weights for it; its
# report has the same bytes for the same result, so a rerun that finds the same reruns nothing after it. With
# bundle.enabled false it records the violations instead of failing.

rule check_contract:
    input:
        unpack(lambda wc: {**SOURCE.contract_inputs(), "tokenizer": SOURCE.tokenizer, "hf_config": SOURCE.hf_config}),
    output:
        f"{OUT}/contract_check.json",
    params:
        checks=json.dumps({**CONTRACT_EXPECT, "context_size": config["bundle"].get("context_size"),
                           "report_only": not config["bundle"]["enabled"]}, sort_keys=True),
        python=PYTHON,
    priority: CRITICAL_PATH
    log:
        f"{OUT}/logs/check_contract.log",
    benchmark:
        f"{OUT}/benchmarks/check_contract.tsv"
    shell:
        "{params.python} -m genie_build check-contract --prompt {input.prompt:q} --token {input.token:q}"
        " --tokenizer {input.tokenizer:q} --hf-config {input.hf_config:q} --checks-json {params.checks:q}"
        " --out {output:q} > {log:q} 2>&1"
