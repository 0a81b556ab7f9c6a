# Quality beside size (target 'evaluate', docs/evaluate.md): the float parts run once on held-out text, and each
# variant of the reference toolchain is run on it, one part at a time with every activation encoding applied, and
# compared with the float logits window by window; evaluation.md puts each variant's top-1 agreement, KL and
# perplexity beside its size, and a qnn-htp bundle's perplexity by Genie itself beside the float model's on the same
# tokens (docs/genie-run.md). A changed binary re-evaluates only its variant.
from genie_build.evaluate.evaluation_table import calibration_seen


rule evaluate_float:
    input:
        float_parts=lambda wc: graph_parts("prompt"),
        tokens=tokens_of("evaluation"),
        tokenizer=lambda wc: SOURCE.tokenizer,
        hf_config=lambda wc: SOURCE.hf_config,
    output:
        FLOAT_LOGITS,
    resources:
        mem_mb=evaluation_mem_mb,
    params:
        max_windows=config["evaluate"]["max_windows"],
        python=PYTHON,
    log:
        f"{OUT}/logs/evaluate_float.log",
    benchmark:
        f"{OUT}/benchmarks/evaluate_float.tsv"
    shell:
        "{params.python} -m genie_build evaluate-float --float-parts {input.float_parts:q} --tokens {input.tokens:q}"
        " --tokenizer {input.tokenizer:q} --hf-config {input.hf_config:q} --max-windows {params.max_windows:q}"
        " --out {output:q} > {log:q} 2>&1"


rule evaluate_variant:
    input:
        binaries=lambda wc: part_files(f"{OUT}/compiled/{wc.variant}/part_{{part}}.bin"),
        encodings=lambda wc: [SOURCE.part_encodings("prompt", label, encodings_of(wc.variant))
                              for label in part_labels()],
        float_logits=FLOAT_LOGITS,
        tokens=tokens_of("evaluation"),
        tokenizer=lambda wc: SOURCE.tokenizer,
        hf_config=lambda wc: SOURCE.hf_config,
    output:
        f"{EVALUATION}/{{variant}}.json",
    resources:
        mem_mb=evaluation_mem_mb,
    params:
        max_windows=config["evaluate"]["max_windows"],
        weights_only=config["evaluate"]["weights_only"],
        calibration=lambda wc: json.dumps(calibration_seen(config, config["variants"][wc.variant]["recipe"],
                                                           SOURCE.graphs["prompt"].ar), sort_keys=True),
        python=PYTHON,
    wildcard_constraints:
        variant="|".join(map(re.escape, EVALUATED_VARIANTS)) or "(?!)",
    log:
        f"{OUT}/logs/evaluate_variant/{{variant}}.log",
    benchmark:
        f"{OUT}/benchmarks/evaluate_variant/{{variant}}.tsv"
    shell:
        "{params.python} -m genie_build evaluate --variant {wildcards.variant:q} --binaries {input.binaries:q}"
        " --encodings {input.encodings:q} --float-logits {input.float_logits:q} --tokens {input.tokens:q}"
        " --tokenizer {input.tokenizer:q} --hf-config {input.hf_config:q} --max-windows {params.max_windows:q}"
        " --weights-only {params.weights_only:q} --calibration-json {params.calibration:q} --out {output:q} > {log:q} 2>&1"


rule genie_accuracy:
    input:
        manifest=BUNDLE,
        check=f"{OUT}/bundle_check.json",
        twins=host_run_twins,
        tokens=tokens_of("evaluation"),
        float_parts=lambda wc: graph_parts("prompt"),
    output:
        f"{EVALUATION}/genie_accuracy.json",
    params:
        variant=BUNDLE_VARIANT,
        mode=GENIE_RUN,
        max_windows=config["evaluate"]["max_windows"],
        bundle_dir=directory_of("manifest"),
        python=PYTHON,
    resources:
        # Genie's child first, then the float parts one at a time
        mem_mb=lambda wc, input: max(genie_mem_mb(wc, input), evaluation_mem_mb(wc)),
    log:
        f"{OUT}/logs/genie_accuracy.log",
    benchmark:
        f"{OUT}/benchmarks/genie_accuracy.tsv"
    shell:
        "{params.python} -m genie_build genie-accuracy {params.bundle_dir:q} --twin {input.twins:q}"
        " --variant {params.variant:q} --tokens {input.tokens:q} --float-parts {input.float_parts:q}"
        " --max-windows {params.max_windows:q} --mode {params.mode:q} --out {output:q} > {log:q} 2>&1"


rule evaluation_table:
    input:
        reports=evaluation_reports,
        size_table=f"{OUT}/size_table.csv",
        genie=[f"{EVALUATION}/genie_accuracy.json"] if GENIE_RUNS else [],
    output:
        md=report(f"{OUT}/evaluation.md", caption="../report/evaluation.rst", category="Sizes"),
        csv=f"{OUT}/evaluation.csv",
        png=report(f"{OUT}/evaluation.png", caption="../report/evaluation.rst", category="Sizes"),
    params:
        strict=config["report"]["strict"],
        extra=evaluation_table_extra,
        python=PYTHON,
    log:
        f"{OUT}/logs/evaluation_table.log",
    benchmark:
        f"{OUT}/benchmarks/evaluation_table.tsv"
    shell:
        "{params.python} -m genie_build evaluation-table --reports {input.reports:q} --size-table {input.size_table:q}"
        " --strict {params.strict} {params.extra:q} --md {output.md:q} --csv {output.csv:q}"
        " --png {output.png:q}"
        " > {log:q} 2>&1"


rule evaluate:
    input:
        rules.evaluation_table.output,
    localrule: True
