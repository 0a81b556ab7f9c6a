# bundle.embedding: lut -- the embedding as the table Genie reads on the CPU (dialog.embedding): part 1's rows for every
# token, computed from part 1's graph and quantized with its encodings (of the bundle variant's recipe); part 1, the
# embedding alone, is then not one of the bundle's context binaries, and the part after it takes the embedding vectors
# as inputs_embeds (rules/convert.smk).

rule embedding_table:
    # each a function of its own: while a checkpoint is pending (a dry run) Snakemake names its output in their place
    input:
        onnx=lambda wc: embedding_part_files(wc)["onnx"],
        encodings=lambda wc: embedding_part_files(wc)["encodings"],
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
