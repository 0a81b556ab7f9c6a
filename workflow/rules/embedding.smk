# bundle.embedding: lut -- the embedding as the table Genie reads on the CPU (dialog.embedding), made from part 1's
# graph and encodings (of the bundle variant's recipe); part 1, the embedding alone, is then not one of the bundle's
# context binaries, and the part after it takes the embedding vectors as inputs_embeds (rules/convert.smk).

rule embedding_table:
    input:
        # one function per name: an unpack()ed function waiting for the plan leaves the job's input unnamed, and a
        # dry run formatting this command fails
        onnx=embedding_part_graph,
        encodings=embedding_part_encodings,
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
