"""The embedding lookup's output takes its table's encoding when the encodings give it none.

AIMET quantizes the embedding table (an activation quantizer on the initializer) but not the Gather's output, which
only moves the table's values, so an AIMET calibration (aimet-onnx's, the calibration chain's, a user's export)
leaves the residual stream's first tensor unencoded. Split there, part 2 takes ``inputs_embeds`` as float32, while a
bundle's CPU table stores that part's rows as ``ufixed16`` codes at the table's encoding; Genie (2.51) converts a
table's values into a quantized ``inputs_embeds``, from float32 codes or at another scale, but not into a float32
one: it answers one token over and over (measured, docs/genie-run.md). The Gather's output holds the table's values
only, so the table's per-tensor encoding represents it exactly: the output takes it, as qai-hub-models' Llama 3
export copies the embedding weight's encoding onto the Gather output (``_adapt_aimet_encodings``). Part 1's output,
part 2's ``inputs_embeds`` and the table then share one encoding, and Genie copies the table's codes as they are.
"""

from __future__ import annotations

from dataclasses import replace

from genie_build.encodings import Encodings
from genie_build.encodings.model import V2_SECTION
from genie_build.onnx_graph import EmbeddingGather

__all__ = ["encode_embedding_output"]

_ACTIVATIONS = "activation_encodings"


def encode_embedding_output(enc: Encodings, lookup: EmbeddingGather | None) -> Encodings:
    """``enc`` with the output of the graph's embedding lookup (:func:`genie_build.onnx_graph.embedding_gather`;
    None: the graph has none) given its table's encoding, when the output has none and the table's is one
    per-tensor integer encoding; else ``enc``."""
    if lookup is None or lookup.output in enc.activations:
        return enc
    table = enc.of_initializer(lookup.table)
    if table is None or table.dtype != "int" or table.kind != "per_tensor":
        return enc
    encoding = replace(table, name=lookup.output)
    entries = dict(enc.entries)
    found = next((key for key in enc.entries if key[1] == lookup.table), None)
    if found is not None:  # the table's entry as read, under the output's name: the file keeps its version
        entry = enc.entries[found][0]
        entry = {**entry, "name": lookup.output} if isinstance(entry, dict) and "name" in entry else entry
        entries[V2_SECTION if enc.version == "2.0.0" else _ACTIVATIONS, lookup.output] = (entry, encoding)
    return replace(enc, activations=dict(sorted({**enc.activations, lookup.output: encoding}.items())),
                   entries=entries)
