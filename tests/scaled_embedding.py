"""A user's export whose part 1 does more than the embedding Gather: the demo's graphs with the Gather's rows
multiplied by sqrt(hidden) before layer 0 reads them, as Gemma's embedding is (MiniCPM's scale_emb and Granite's
embedding_multiplier alike)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from genie_build.conventions import INPUT_IDS

SCALE_NAME = "/model/embed_tokens/scale"


def scaled_export(source: Path, dest: Path, hidden: int) -> float:
    """Copy the demo's source files (graphs, weights, encodings, tokenizer, config.json) from ``source`` into ``dest``
    with each graph's embedding output ``E`` computed as ``Gather(table, input_ids) * sqrt(hidden)``: the Gather now
    gives ``E/unscaled`` and a Mul gives ``E``, whose activation encoding is widened by the same factor. Returns the
    factor."""
    factor = math.sqrt(hidden)
    dest.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file():
            shutil.copy2(path, dest / path.name)
    for graph_path in sorted(dest.glob("*.onnx")):
        model = onnx.load(graph_path, load_external_data=False)
        gather = next(node for node in model.graph.node if node.op_type == "Gather" and node.input[1] == INPUT_IDS)
        output = gather.output[0]
        gather.output[0] = f"{output}/unscaled"
        mul = helper.make_node("Mul", [gather.output[0], SCALE_NAME], [output], name="/model/embed_tokens/Mul")
        position = list(model.graph.node).index(gather) + 1
        model.graph.node.insert(position, mul)
        model.graph.initializer.append(numpy_helper.from_array(np.array(factor, dtype=np.float32), SCALE_NAME))
        onnx.save(model, graph_path)
    for encodings_path in sorted(dest.glob("*.encodings.json")):
        encodings = json.loads(encodings_path.read_text())
        for entry in encodings["activation_encodings"]:
            if entry["name"].startswith("/model/embed_tokens/"):
                entry["scale"] = [scale * factor for scale in entry["scale"]]
        encodings_path.write_text(json.dumps(encodings))
    return factor
