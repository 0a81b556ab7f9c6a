# Host run (reference toolchain only): the bundle generates text on the CPU, and its greedy tokens must equal those of
# the model without its bundle: the unsplit model converted with the whole encodings and compiled with the same
# options; a model calibrated part by part has no whole encodings (nor, exported part by part, a whole graph), so
# there the parts' converted graphs, chained on the host, stand in for it (the run's report says which).


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


rule run_bundle:
    input:
        manifest=BUNDLE,
        check=f"{OUT}/bundle_check.json",
        reference=host_run_reference,
        twins=host_run_twins,
    output:
        f"{OUT}/host_run.json",
    params:
        prompt=config["bundle"]["host_prompt"] or SOURCE.host_prompt,
        compare=lambda wc, input: ["--compare-with-parts", *(f for f in input.reference if f.endswith(".onnx"))]
        if SOURCE.calibrates or HOST_TWINS else ["--compare-with", input.reference[0]],
        twins=lambda wc, input: ["--twin", *input.twins] if input.twins else [],
        bundle_dir=directory_of("manifest"),
        python=PYTHON,
    log:
        f"{OUT}/logs/run_bundle.log",
    benchmark:
        f"{OUT}/benchmarks/run_bundle.tsv"
    shell:
        "{params.python} -m genie_build run-bundle {params.bundle_dir:q} --prompt {params.prompt:q} --max-new-tokens 16"
        " {params.compare:q} {params.twins:q} --out {output:q} > {log:q} 2>&1"
