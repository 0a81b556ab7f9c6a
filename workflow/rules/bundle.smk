# The Genie bundle of the chosen variant, then the load-time checks Genie would apply on the phone.

BUNDLE_VARIANT = config["bundle"]["variant"]


rule assemble_bundle:
    input:
        binaries=lambda wc: variant_part_files(f"{OUT}/compiled/{{variant}}/part_{{part}}.bin", [BUNDLE_VARIANT]),
        tokenizer=SOURCE["tokenizer"],
        hf_config=SOURCE["hf_config"],
    output:
        bundle=directory(f"{OUT}/genie_bundle"),
    params:
        model=MODEL,
        toolchain=config["variants"][BUNDLE_VARIANT]["toolchain"],
        chipset=config["target"]["chipset"],
        context_size=(
            f"--context-size {config['bundle']['context_size']}" if config["bundle"].get("context_size") else ""
        ),
        config_used=json.dumps(config, sort_keys=True),
    log:
        f"{OUT}/logs/assemble_bundle.log",
    shell:
        "{GB} bundle --out-dir {output.bundle:q} --model-name {params.model:q} --binaries {input.binaries:q}"
        " --toolchain {params.toolchain:q} --tokenizer {input.tokenizer:q} --hf-config {input.hf_config:q}"
        " --chipset {params.chipset:q} {params.context_size} --config-json {params.config_used:q} > {log:q} 2>&1"


rule check_bundle:
    input:
        bundle=f"{OUT}/genie_bundle",
        hf_config=SOURCE["hf_config"],
    output:
        f"{OUT}/bundle_check.json",
    params:
        chipset=config["target"]["chipset"],
    log:
        f"{OUT}/logs/check_bundle.log",
    shell:
        "{GB} check-bundle {input.bundle:q} --hf-config {input.hf_config:q} --chipset {params.chipset:q}"
        " --out {output:q} > {log:q} 2>&1"
