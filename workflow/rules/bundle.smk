# The Genie bundle of the chosen variant, then the load-time checks Genie would apply on the phone.

# The rule's output is the manifest, not directory(): Snakemake puts a .snakemake_timestamp marker into every
# directory() output, and the bundle directory must hold the bundle only. The command writes the whole
# directory atomically, the manifest (listing every other file) among it.
BUNDLE_DIR = f"{OUT}/genie_bundle"
BUNDLE = f"{BUNDLE_DIR}/manifest.json"


rule bundle:
    input:
        binaries=lambda wc: [f"{OUT}/compiled/{BUNDLE_VARIANT}/part_{label}.bin" for label in bundle_part_labels()],
        table=[EMBEDDING_TABLE] if EMBEDDING_LUT else [],
        tokenizer=lambda wc: SOURCE.tokenizer,
        hf_config=lambda wc: SOURCE.hf_config,
        # no bundle of a model whose whole-model checks failed (MODEL_CHECKS, the source's rule files'), nor, with
        # report.strict, of a plan whose contexts will not all map
        checks=[*MODEL_CHECKS, f"{OUT}/memory_plan.json"],
    output:
        manifest=BUNDLE,
    params:
        model=MODEL,
        toolchain=toolchain_of(BUNDLE_VARIANT),
        chipset=config["target"]["chipset"],
        context_size=config["bundle"].get("context_size") or 0,  # 0: the compiled context length
        share_resources=config["bundle"]["share_resources"],
        extra=bundle_extra,
        # what the bundle is made from, as its manifest records it (genie_build.config.bundle_config): not another
        # variant's options, the report, the host run's prompt, the calibration's memory budget or another source's
        # section, nor the order the context lengths are listed in
        config_used=json.dumps(bundle_config(config), sort_keys=True),
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
        " --share-resources {params.share_resources} {params.extra:q} --config-json {params.config_used:q}"
        " > {log:q} 2>&1"


# The bundle job checks the bundle before it publishes it; this job records the check (warnings too) and verifies the
# manifest's hashes. A bundle that fails here is moved aside (--withdraw), so it does not look finished and a rerun
# builds it again.
rule check_bundle:
    input:
        manifest=BUNDLE,
        hf_config=lambda wc: SOURCE.hf_config,
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


