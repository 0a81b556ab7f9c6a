# Host run (reference toolchain only): the bundle generates text on the CPU, and its greedy tokens must equal those of
# the model without its bundle: the unsplit model converted with the whole encodings and compiled with the same
# options; a model calibrated part by part has no whole encodings (nor, exported part by part, a whole graph), so
# there the parts' converted graphs, chained on the host, stand in for it (the run's report says which). With the
# embedding as a table, the reference starts after part 1 and is fed part 1's rows, computed from part 1's graph and
# quantized as the table stores them: the bundle's table is checked, not used.


rule convert_unsplit:
    input:
        onnx=lambda wc: SOURCE.graphs[wc.graph].onnx,
        weights=lambda wc: SOURCE.graphs[wc.graph].data,
        encodings=lambda wc: SOURCE.encodings[wc.graph],
        contract=f"{OUT}/contract_check.json",  # no convert job for graphs Genie could not load
    output:
        onnx=f"{UNSPLIT}/{{graph}}.onnx",
        data=f"{UNSPLIT}/{{graph}}.onnx.data",
    wildcard_constraints:
        graph="|".join(GRAPHS),
    params:
        graph_name=lambda wc: unsplit_graph_name(wc.graph),
        float_bitwidth=config["variants"][BUNDLE_VARIANT]["float_bitwidth"],
        tool_version=toolchain_version("reference"),
        python=PYTHON,
    log:
        f"{OUT}/logs/convert_unsplit/{{graph}}.log",
    benchmark:
        f"{OUT}/benchmarks/convert_unsplit/{{graph}}.tsv"
    shell:
        "{params.python} -m genie_build convert --toolchain reference --onnx {input.onnx:q}"
        " --encodings {input.encodings:q} --graph-name {params.graph_name:q}"
        " --float-bitwidth {params.float_bitwidth} --out {output.onnx:q} > {log:q} 2>&1"


rule compile_unsplit:
    input:
        prompt=f"{UNSPLIT}/prompt.onnx",
        token=f"{UNSPLIT}/token.onnx",
    output:
        f"{UNSPLIT}/model.bin",
    params:
        graphs=lambda wc, input: [f"{unsplit_graph_name(key)}={input[key]}" for key in GRAPHS],
        options=variant_json(BUNDLE_VARIANT),
        chipset=config["target"]["chipset"],
        tool_version=toolchain_version("reference"),
        python=PYTHON,
    log:
        f"{OUT}/logs/compile_unsplit.log",
    benchmark:
        f"{OUT}/benchmarks/compile_unsplit.tsv"
    shell:
        "{params.python} -m genie_build compile --toolchain reference --graph {params.graphs:q}"
        " --variant-json {params.options:q} --chipset {params.chipset:q} --out {output:q} > {log:q} 2>&1"


# The host run's prompt checked as soon as the tokenizer is there: a prompt that leaves no room for the tokens the run
# generates stops the build before the jobs the host run would end it after.
rule check_host_prompt:
    input:
        tokenizer=lambda wc: SOURCE.tokenizer,
    output:
        HOST_PROMPT_IDS,
    params:
        prompt=HOST_PROMPT,
        # the tokens a run may hold: bundle.context_size, at most the largest context length
        context_size=lambda wc: min(config["bundle"].get("context_size") or SOURCE.graphs["prompt"].context,
                                    SOURCE.graphs["prompt"].context),
        new_tokens=HOST_NEW_TOKENS,
        python=PYTHON,
    priority: QUICK_REFUSALS
    log:
        f"{OUT}/logs/check_host_prompt.log",
    benchmark:
        f"{OUT}/benchmarks/check_host_prompt.tsv"
    shell:
        "{params.python} -m genie_build check-host-prompt --tokenizer {input.tokenizer:q} --prompt {params.prompt:q}"
        " --context-size {params.context_size:q} --max-new-tokens {params.new_tokens:q} --out {output:q} > {log:q} 2>&1"


rule run_bundle:
    input:
        manifest=BUNDLE,
        prompt=HOST_PROMPT_IDS,
        check=f"{OUT}/bundle_check.json",
        reference=host_run_reference,
        twins=host_run_twins,
        # with the table: part 1's graph and encodings, from which the reference computes the rows the table must
        # hold (each a function of its own, as the table's rule has them)
        embedding_onnx=lambda wc: embedding_part_files(wc)["onnx"] if EMBEDDING_LUT else [],
        embedding_encodings=lambda wc: embedding_part_files(wc)["encodings"] if EMBEDDING_LUT else [],
    output:
        f"{OUT}/host_run.json",
    params:
        prompt=HOST_PROMPT,
        new_tokens=HOST_NEW_TOKENS,
        extra=run_bundle_extra,
        bundle_dir=directory_of("manifest"),
        python=PYTHON,
    log:
        f"{OUT}/logs/run_bundle.log",
    benchmark:
        f"{OUT}/benchmarks/run_bundle.tsv"
    shell:
        "{params.python} -m genie_build run-bundle {params.bundle_dir:q} --prompt {params.prompt:q} --max-new-tokens {params.new_tokens:q}"
        " {params.extra:q} --out {output:q} > {log:q} 2>&1"
