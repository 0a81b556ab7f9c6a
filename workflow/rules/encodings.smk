# Cut the encodings per part and graph. A checkpoint, so an edit to one tensor's encodings reruns only the
# parts whose slice bytes changed.


checkpoint slice_encodings:
    input:
        parts=f"{OUT}/parts",
        prompt=SOURCE["prompt_onnx"],
        token=SOURCE["token_onnx"],
        prompt_encodings=SOURCE["prompt_encodings"],
        token_encodings=SOURCE["token_encodings"],
    output:
        slices=directory(f"{OUT}/encodings"),
    log:
        f"{OUT}/logs/slice_encodings.log",
    shell:
        "{GB} slice-encodings --parts-dir {input.parts:q} --out-dir {output.slices:q}"
        " --model-prompt {input.prompt:q} --model-token {input.token:q}"
        " --encodings-prompt {input.prompt_encodings:q} --encodings-token {input.token_encodings:q} > {log:q} 2>&1"
