# The calibration and evaluation texts as token ids, each tokenized once by a job of its own (genie_build.tokens):
# the calibration chain's units and the evaluation map the ids and read only the windows they use, so their memory
# does not grow with the text. The job refuses a text that cannot fill the windows asked (a text is never repeated)
# and an id beyond config.json's vocab_size, before any unit or evaluation reads it.

rule tokenize_text:
    input:
        text=lambda wc: text_of(wc.text)["path"],
        tokenizer=lambda wc: SOURCE.tokenizer,
        graph_config=lambda wc: SOURCE.graph_config,
    output:
        TOKENS,
    params:
        needed=lambda wc: text_of(wc.text)["needed"],
        use=lambda wc: text_of(wc.text)["use"],
        python=PYTHON,
    wildcard_constraints:
        text="calibration|evaluation",
    resources:
        mem_mb=lambda wc, input: job_memory.tokenize_mb(input.size_mb),
    log:
        f"{OUT}/logs/tokenize_text/{{text}}.log",
    benchmark:
        f"{OUT}/benchmarks/tokenize_text/{{text}}.tsv"
    shell:
        "{params.python} -m genie_build tokenize-text --text {input.text:q} --tokenizer {input.tokenizer:q}"
        " --hf-config {input.graph_config:q} --needed {params.needed:q} --use {params.use:q} --out {output:q}"
        " > {log:q} 2>&1"
