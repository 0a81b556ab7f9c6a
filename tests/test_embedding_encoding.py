"""The embedding lookup's output takes its table's encoding when the encodings give it none (AIMET's never do:
genie_build.quantize.embedding_encoding), in every encodings version, written in that version; an output with an
encoding of its own, a per-channel table or a graph without a lookup keep what they have. The workflow cases (the AIMET
demo, a user's AIMET export) are tests/test_aimet.py and tests/test_real_exports.py."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from genie_build.encodings import format_encodings, parse_encodings
from genie_build.onnx_graph import embedding_gather
from genie_build.quantize.embedding_encoding import encode_embedding_output

TABLE, OUTPUT = "model.embed_tokens.weight", "/model/embed_tokens/Gather_output_0"
ENTRIES = {  # the table's per-tensor 16-bit encoding as each version writes it (scale 2e-6, offset -32768)
    "0.6.1": {"version": "0.6.1", "param_encodings": {}, "activation_encodings": {TABLE: [
        {"bitwidth": 16, "dtype": "int", "is_symmetric": "False", "max": 0.065534, "min": -0.065536,
         "offset": -32768, "scale": 2e-6}]}},
    "1.0.0": {"version": "1.0.0", "param_encodings": [], "activation_encodings": [
        {"name": TABLE, "dtype": "INT", "enc_type": "PER_TENSOR", "bw": 16, "is_sym": False, "scale": [2e-6],
         "offset": [-32768]}]},
    "2.0.0": {"version": "2.0.0", "encodings": [
        {"name": TABLE, "output_dtype": "uint16", "y_scale": 2e-6, "y_zero_point": 32768}]},
}


def lookup_graph() -> onnx.ModelProto:
    """input_ids -> Cast -> Gather of the table: the demo's part 1."""
    nodes = [helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
             helper.make_node("Gather", [TABLE, "ids32"], [OUTPUT])]
    graph = helper.make_graph(nodes, "part_1", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 4])],
                              [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, [1, 4, 8])],
                              [numpy_helper.from_array(np.zeros((10, 8), np.float32), TABLE)])
    return helper.make_model(graph)


@pytest.mark.parametrize("version", sorted(ENTRIES))
def test_the_gather_output_takes_the_tables_encoding_in_the_files_own_version(version):
    enc = parse_encodings(ENTRIES[version], "in.encodings")
    lookup = embedding_gather(lookup_graph())
    assert (lookup.token_input, lookup.output, lookup.table, lookup.rows) == ("input_ids", OUTPUT, TABLE, 10)
    encoded = encode_embedding_output(enc, lookup)
    assert encoded.activations[OUTPUT] == replace(enc.of_initializer(TABLE), name=OUTPUT)
    text = format_encodings(encoded)
    assert json.loads(text)["version"] == version    # written as read: the SDK converter reads what AIMET wrote
    again = parse_encodings(json.loads(text), "out.encodings")
    assert again.activations[OUTPUT] == encoded.activations[OUTPUT] and again.of_initializer(TABLE) == \
        enc.of_initializer(TABLE)


def test_an_encoded_output_a_per_channel_table_or_no_lookup_keep_their_encodings():
    graph = lookup_graph()
    own = parse_encodings({**ENTRIES["1.0.0"], "activation_encodings": ENTRIES["1.0.0"]["activation_encodings"] + [
        {"name": OUTPUT, "dtype": "INT", "enc_type": "PER_TENSOR", "bw": 16, "is_sym": False, "scale": [3e-6],
         "offset": [-30000]}]}, "own.encodings")
    assert encode_embedding_output(own, embedding_gather(graph)) is own
    per_row = parse_encodings({"version": "1.0.0", "activation_encodings": [], "param_encodings": [
        {"name": TABLE, "dtype": "INT", "enc_type": "PER_CHANNEL", "bw": 8, "is_sym": True, "scale": [1e-3] * 10,
         "offset": [-128] * 10}]}, "per-row.encodings")
    assert encode_embedding_output(per_row, embedding_gather(graph)) is per_row
    plain = parse_encodings(ENTRIES["1.0.0"], "plain.encodings")
    graph.graph.node[1].input[1] = "input_ids_elsewhere"   # a Gather that no graph input indexes
    assert embedding_gather(graph) is None and encode_embedding_output(plain, None) is plain
