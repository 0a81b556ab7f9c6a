# A Hugging Face checkpoint (model.hf_checkpoint, genie_build.sources.CheckpointSource), part by part: the plan from
# config.json (made and written down when the workflow is parsed), one export job per part reading only the
# safetensors files that hold its tensors, and the check a whole graph would have had: each part against the
# checkpoint's transformers modules (Genie's IO contract on the parts together: rules/check_contract.smk).
# Both graphs of a part in one folder, reading one weights file (ONNX refuses hard-linked or outside data).
EXPORTED = f"{SOURCE.parts_dir}/part_{{part}}"
# What config.json gives, written down now, each file only when its bytes change (docs/snakemake.md, "Files written
# when the workflow is parsed"): the plan, the units, and which bound chose the part count, for the memory plan.
SPLIT_CHOICE.append(f"{OUT}/split_choice.json")
SOURCE.write_down(plan=f"{OUT}/plan.json", units=PLAN_UNITS, split_choice=SPLIT_CHOICE[0])
# The bundle waits for Genie's IO contract on the exported parts together; the build for one verification per part.
# The contract holds the graphs to the AR and CL the export was asked for.
MODEL_CHECKS.append(f"{OUT}/contract_check.json")
VERIFY_REPORTS += [f"{OUT}/verify/part_{part.label}.json" for part in SOURCE.plan.parts]
CONTRACT_EXPECT.update(expect_ar=SOURCE.graphs["prompt"].ar, expect_context=SOURCE.graphs["prompt"].context)

rule export_part:
    input:
        graph_config=SOURCE.graph_config,   # what its graphs take of config.json, read from the checkpoint
        weights=lambda wc: SOURCE.part_weight_files[wc.part],  # the index, the shards holding the part's tensors
    output:
        prompt=f"{EXPORTED}/prompt.onnx",
        token=f"{EXPORTED}/token.onnx",
        weights=f"{EXPORTED}/weights.onnx.data",
    params:
        checkpoint=SOURCE.checkpoint,
        part=lambda wc: SOURCE.part_json(wc.part),
        num_parts=SOURCE.plan.num_parts,
        ar=config["export"]["ar"],
        context=SOURCE.graphs["prompt"].context,
        out_dir=directory_of("prompt"),
        python=PYTHON,
    resources:
        mem_mb=lambda wc: job_memory.export_mb(SOURCE.part_float_mb(wc.part)),
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
        graph_config=SOURCE.graph_config,
        weights=lambda wc: SOURCE.part_weight_files[wc.part],
        prompt=f"{EXPORTED}/prompt.onnx",   # the graphs at the largest length, whose weight entries these share
        token=f"{EXPORTED}/token.onnx",
        data=f"{EXPORTED}/weights.onnx.data",
    output:
        prompt=f"{EXPORTED}/prompt_cl{{length}}.onnx",
        token=f"{EXPORTED}/token_cl{{length}}.onnx",
    wildcard_constraints:
        length=r"\d+",
    params:
        checkpoint=SOURCE.checkpoint,
        part=lambda wc: SOURCE.part_json(wc.part),
        num_parts=SOURCE.plan.num_parts,
        ar=config["export"]["ar"],
        out_dir=directory_of("prompt"),
        python=PYTHON,
    resources:
        mem_mb=lambda wc: job_memory.export_mb(SOURCE.part_float_mb(wc.part)),  # as export_part's: it loads the part's modules
    log:
        f"{OUT}/logs/export_length/part_{{part}}_cl{{length}}.log",
    benchmark:
        f"{OUT}/benchmarks/export_length/part_{{part}}_cl{{length}}.tsv"
    shell:
        "{params.python} -m genie_build export-length --checkpoint {params.checkpoint:q} --part-json {params.part:q}"
        " --num-parts {params.num_parts:q} --ar {params.ar:q} --context {wildcards.length:q} --out-dir {params.out_dir:q}"
        " > {log:q} 2>&1"


# Each part's graphs (every kind at every length) against the checkpoint's transformers modules, a job per part as
# soon as it is exported, reading only its own shards: memory holds the part's session or one piece's modules.
rule verify_parts:
    input:
        graphs=[f"{EXPORTED}/{key}.onnx" for key in BUNDLE_GRAPHS],
        data=f"{EXPORTED}/weights.onnx.data",
        graph_config=SOURCE.graph_config,
        weights=lambda wc: SOURCE.part_weight_files[wc.part],
    output:
        f"{OUT}/verify/part_{{part}}.json",
    params:
        checkpoint=SOURCE.checkpoint,
        part=lambda wc: SOURCE.part_json(wc.part),
        ar=config["export"]["ar"],
        graphs=json.dumps([[key, graph.kind, graph.context] for key, graph in SOURCE.graphs.items()]),
        python=PYTHON,
    priority: LONG_CHECKS
    resources:
        mem_mb=lambda wc: job_memory.verify_parts_mb(SOURCE.part_float_mb(wc.part),
                                                     SOURCE.part_largest_mb(wc.part)),
    log:
        f"{OUT}/logs/verify_parts/part_{{part}}.log",
    benchmark:
        f"{OUT}/benchmarks/verify_parts/part_{{part}}.tsv"
    shell:
        "{params.python} -m genie_build verify-parts --checkpoint {params.checkpoint:q} --part-json {params.part:q}"
        " --ar {params.ar:q} --graphs-json {params.graphs:q} --paths {input.graphs:q} --out {output:q} > {log:q} 2>&1"
