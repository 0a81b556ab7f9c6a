"""check-bundle's checks of an embedding table Genie reads on the CPU (``dialog.embedding``, ``type: lut``).

Genie mmaps the table as headerless row-major ``[n_vocab][n_embd]`` and strides its rows by ``size`` times the
``datatype``'s width (``qualla::LUT``, SDK 2.48), indexing it with a ``uint32_t``; nothing in the file says its shape
or datatype, so a table of the wrong size or datatype loads and gives plausible garbage. The checks: the datatype is
one Genie knows and comes with the ``quant-param`` it needs, the file is exactly ``n-vocab x size x bytes`` and within
the 4 GiB the index reaches, and the first part's graphs take ``inputs_embeds`` of width ``size``, quantized when
the table holds codes. Genie converts the table's values into a quantized ``inputs_embeds`` (float32 values, or
codes at another encoding), but not codes into a float one: measured with Genie 2.51 on x86, such a bundle answers
one token over and over (docs/genie-run.md).
"""

from __future__ import annotations

from pathlib import Path

from genie_build.bundle.bundle_files import Finding, bundle_file_problem, bundle_path, config_value
from genie_build.bundle.embedding_table import table_bytes
from genie_build.conventions import INPUT_IDS, INPUTS_EMBEDS
from genie_build.fileio import is_json_int, is_json_number, regular_file_size
from genie_build.toolchains.base import GraphInfo
from genie_build.units import GIB

__all__ = ["DATATYPE_BITS", "MAX_TABLE_BYTES", "RULE", "check_embedding"]

RULE = "embedding-table"
# dialog.embedding.datatype -> bits per entry (Dialog.cpp's list; "native" is the graph input's own type: unchecked)
DATATYPE_BITS = {"float32": 32, "ufixed4": 4, "ufixed8": 8, "sfixed8": 8, "ufixed16": 16, "sfixed16": 16,
                 "native": None}
MAX_TABLE_BYTES = 4 * GIB  # Genie indexes the table with a uint32_t offset


def check_embedding(bundle: Path, config: dict, first_graphs: tuple[GraphInfo, ...] | None) -> list[Finding]:
    """The findings for the bundle's embedding table (none without ``dialog.embedding``).

    Args:
        bundle: the bundle directory.
        config: its ``genie_config.json``.
        first_graphs: the first ctx-bin's graphs, when known.
    """
    block = config_value(config, "dialog.embedding")
    if block is None:
        return [Finding(RULE, "warning", f"graph {graph.name!r} of the first part takes {INPUTS_EMBEDS} but "
                                         "genie_config.json has no dialog.embedding: the app must give Genie the "
                                         "embeddings itself")
                for graph in first_graphs or () if _takes(graph, INPUTS_EMBEDS) and not _takes(graph, INPUT_IDS)]
    if not isinstance(block, dict):
        return [Finding(RULE, "error", "dialog.embedding must be an object")]
    if block.get("type") != "lut":
        return [] if block.get("type") == "callback" else \
            [Finding(RULE, "error", f"dialog.embedding.type is {block.get('type')!r}, not lut or callback")]
    findings = _check_block(block)
    if findings:
        return findings
    findings += _check_file(bundle, block, config_value(config, "dialog.context.n-vocab", int))
    findings += _check_first_graphs(block["size"], block["datatype"], first_graphs or ())
    return findings


def _check_block(block: dict) -> list[Finding]:
    findings = [Finding(RULE, "error", f"dialog.embedding lacks {key!r}") for key in ("lut-path", "size", "datatype")
                if key not in block]
    if findings:
        return findings
    if not (is_json_int(block["size"]) and block["size"] > 0):
        findings.append(Finding(RULE, "error", f"dialog.embedding.size must be a positive int, got {block['size']!r}"))
    datatype = block["datatype"]
    if datatype not in DATATYPE_BITS:
        return findings + [Finding(RULE, "error", f"dialog.embedding.datatype {datatype!r} is not one of "
                                                  f"{', '.join(DATATYPE_BITS)}")]
    quant = block.get("quant-param")
    if "fixed" in datatype:
        scale, offset = (quant.get("scale"), quant.get("offset")) if isinstance(quant, dict) else (None, None)
        if not (is_json_number(scale) and scale > 0 and is_json_int(offset)):
            findings.append(Finding(RULE, "error", f"dialog.embedding.datatype {datatype} needs quant-param "
                                                   f"{{scale > 0, offset int}} to read the codes, got {quant!r}"))
    elif quant is not None:
        findings.append(Finding(RULE, "warning", f"dialog.embedding.quant-param is given for a {datatype} table, "
                                                 "which has no codes to read with it"))
    return findings


def _check_file(bundle: Path, block: dict, n_vocab: int | None) -> list[Finding]:
    name = block["lut-path"]
    problem = bundle_file_problem(bundle, name, MAX_TABLE_BYTES) if isinstance(name, str) else "is not a string"
    if problem is not None:
        return [Finding(RULE, "error", f"dialog.embedding.lut-path {name!r} {problem}")]
    bits = DATATYPE_BITS[block["datatype"]]
    if bits is None or n_vocab is None:
        return []
    size = regular_file_size(bundle / bundle_path(name), inside=[bundle])
    expected = table_bytes(n_vocab, block["size"], bits)
    if size != expected:
        return [Finding(RULE, "error", f"{name} is {size} bytes, but n-vocab {n_vocab} x size {block['size']} x "
                                       f"{bits / 8:g} bytes ({block['datatype']}) is {expected}: Genie would read "
                                       "its rows at the wrong stride")]
    return []


def _check_first_graphs(size: int, datatype: str, graphs: tuple[GraphInfo, ...]) -> list[Finding]:
    findings = []
    for graph in graphs:
        embeds = next((tensor for tensor in graph.inputs if tensor.name == INPUTS_EMBEDS), None)
        if embeds is None:
            findings.append(Finding(RULE, "error", f"graph {graph.name!r} of the first part has no {INPUTS_EMBEDS} "
                                                   "input for the table's vectors"))
        elif embeds.shape and embeds.shape[-1] != size:
            findings.append(Finding(RULE, "error", f"graph {graph.name!r} takes {INPUTS_EMBEDS} "
                                                   f"{list(embeds.shape)}, but the table's rows are "
                                                   f"dialog.embedding.size {size} wide"))
        elif "fixed" in datatype and embeds.quant is None and embeds.dtype.startswith("float"):
            findings.append(Finding(RULE, "error", f"graph {graph.name!r} takes {INPUTS_EMBEDS} as {embeds.dtype}, "
                                                   f"but the table holds {datatype} codes: Genie does not "
                                                   "dequantize them for a float input, and the model answers one "
                                                   "token over and over (give the input the table's encoding)"))
    return findings


def _takes(graph: GraphInfo, name: str) -> bool:
    return any(tensor.name == name for tensor in graph.inputs)
