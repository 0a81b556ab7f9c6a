# The Genie bundle of the chosen variant, then the load-time checks Genie would apply on the phone.

BUNDLE_VARIANT = config["bundle"]["variant"]
# The rule's output is the manifest, not directory(): Snakemake puts a .snakemake_timestamp marker into every
# directory() output, and the bundle directory must hold the bundle only. The command writes the whole
# directory atomically, the manifest (listing every other file) among it.
BUNDLE_DIR = f"{OUT}/genie_bundle"
BUNDLE = f"{BUNDLE_DIR}/manifest.json"
# No bundle of a model whose whole-model checks failed: the graphs' shared weights (whole graphs), Genie's IO
# contract (a checkpoint exported part by part), the plan against the encodings the chain calibrated.
# The memory plan among them: with report.strict, a plan whose contexts will not all map publishes no bundle.
BUNDLE_CHECKS = [f"{OUT}/contract_check.json" if SOURCE_KIND == "hf" else f"{OUT}/model_check.json",
                 *([f"{OUT}/plan_check.json"] if CALIBRATION_CHAIN else []), f"{OUT}/memory_plan.json"]


# bundle.embedding: lut -- the table Genie reads on the CPU, from part 1's graph and encodings (no convert or compile
# of part 1 for the bundle).
rule embedding_table:
    input:
        unpack(embedding_part_files),
    output:
        table=EMBEDDING_TABLE,
        description=f"{EMBEDDING_TABLE}.json",
    params:
        python=PYTHON,
    log:
        f"{OUT}/logs/embedding_table.log",
    benchmark:
        f"{OUT}/benchmarks/embedding_table.tsv"
    shell:
        "{params.python} -m genie_build embedding-table --onnx {input.onnx:q} --encodings {input.encodings:q}"
        " --out {output.table:q} > {log:q} 2>&1"


rule bundle:
    input:
        binaries=lambda wc: [f"{OUT}/compiled/{BUNDLE_VARIANT}/part_{label}.bin" for label in bundle_part_labels()],
        table=[EMBEDDING_TABLE] if EMBEDDING_LUT else [],
        tokenizer=SOURCE["tokenizer"],
        hf_config=SOURCE["hf_config"],
        checks=BUNDLE_CHECKS,
    output:
        manifest=BUNDLE,
    params:
        model=MODEL,
        toolchain=config["variants"][BUNDLE_VARIANT]["toolchain"],
        chipset=config["target"]["chipset"],
        context_size=config["bundle"].get("context_size") or 0,  # 0: the compiled context length
        share_resources=config["bundle"]["share_resources"],
        # a lambda: a param that is an empty list vanishes (unset graph_switching: Genie's config leaves the key out)
        table=lambda wc: ["--embedding-table", EMBEDDING_TABLE] if EMBEDDING_LUT else [],
        graph_switching=lambda wc: ([] if config["bundle"].get("graph_switching") is None
                                    else ["--graph-switching", str(config["bundle"]["graph_switching"])]),
        # The bundle's own variant only: another variant's options do not change the bundle; nor does the
        # calibration's memory budget (the chain's encodings are the same whatever its units).
        config_used=json.dumps({**config, "variants": {BUNDLE_VARIANT: config["variants"][BUNDLE_VARIANT]},
                                "quantize": {key: value for key, value in config["quantize"].items()
                                             if key != "unit_memory_mb"}}, sort_keys=True),
        bundle_dir=directory_of("manifest"),
        python=PYTHON,
    log:
        f"{OUT}/logs/bundle.log",
    benchmark:
        f"{OUT}/benchmarks/bundle.tsv"
    shell:
        "{params.python} -m genie_build bundle --out-dir {params.bundle_dir:q} --model-name {params.model:q} --binaries {input.binaries:q}"
        " --toolchain {params.toolchain:q} --tokenizer {input.tokenizer:q} --hf-config {input.hf_config:q}"
        " --chipset {params.chipset:q} --context-size {params.context_size}"
        " --share-resources {params.share_resources} {params.graph_switching:q} {params.table:q} --config-json {params.config_used:q}"
        " > {log:q} 2>&1"


# The bundle job checks the bundle before it publishes it; this job records the check (warnings too) and verifies the
# manifest's hashes. A bundle that fails here is moved aside (--withdraw), so it does not look finished and a rerun
# builds it again.
rule check_bundle:
    input:
        manifest=BUNDLE,
        hf_config=SOURCE["hf_config"],
    output:
        f"{OUT}/bundle_check.json",
    params:
        chipset=config["target"]["chipset"],
        bundle_dir=directory_of("manifest"),
        python=PYTHON,
    log:
        f"{OUT}/logs/check_bundle.log",
    benchmark:
        f"{OUT}/benchmarks/check_bundle.tsv"
    shell:
        "{params.python} -m genie_build check-bundle {params.bundle_dir:q} --hf-config {input.hf_config:q} --chipset {params.chipset:q}"
        " --withdraw --out {output:q} > {log:q} 2>&1"


# Host run (reference toolchain only): the bundle generates text on the CPU, and its greedy tokens must equal those of
# the model without its bundle: the unsplit model converted with the whole encodings and compiled with the same
# options; a model calibrated part by part has no whole encodings (nor, exported part by part, a whole graph), so
# there the parts' converted graphs, chained on the host, stand in for it (the run's report says which).
UNSPLIT = f"{OUT}/unsplit"

if not CALIBRATION_CHAIN:

    rule convert_unsplit:
        input:
            onnx=lambda wc: SOURCE[f"{wc.graph}_onnx"],
            weights=lambda wc: SOURCE_DATA[wc.graph],
            encodings=lambda wc: SOURCE[f"{wc.graph}_encodings"],
            contract=f"{OUT}/contract_check.json",  # no convert job for graphs Genie could not load
        output:
            onnx=f"{UNSPLIT}/{{graph}}.onnx",
            data=f"{UNSPLIT}/{{graph}}.onnx.data",
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
            graphs=lambda wc, input: graph_items({graph: unsplit_graph_name(graph) for graph in GRAPHS}, input),
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
    output:
        f"{OUT}/host_run.json",
    params:
        prompt=HOST_PROMPT,
        compare=lambda wc, input: ["--compare-with-parts", *(f for f in input.reference if f.endswith(".onnx"))]
        if CALIBRATION_CHAIN else ["--compare-with", input.reference[0]],
        bundle_dir=directory_of("manifest"),
        python=PYTHON,
    log:
        f"{OUT}/logs/run_bundle.log",
    benchmark:
        f"{OUT}/benchmarks/run_bundle.tsv"
    shell:
        "{params.python} -m genie_build run-bundle {params.bundle_dir:q} --prompt {params.prompt:q} --max-new-tokens 16"
        " {params.compare:q} --out {output:q} > {log:q} 2>&1"
