"""``convert``: one ONNX part + its AIMET encodings -> the toolchain's converted graph (DLC, or the
reference toolchain's quantized ONNX), named with the graph name the context binary will carry."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.cli_args import add_switch
from genie_build.errors import GenieBuildError
from genie_build.toolchains import TOOLCHAINS, get_toolchain

__all__ = ["RENAMING_TOOLCHAINS", "register_parser", "run"]

# The toolchains whose converter writes ONNX: it renames a graph input (inputs_embeds, the part after an embedding
# table) and refers to another graph's data file for the weights they share.
RENAMING_TOOLCHAINS = ("reference", "qnn-htp")


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("convert", help="convert one ONNX part with its encodings", description=__doc__)
    parser.add_argument("--toolchain", required=True, choices=sorted(TOOLCHAINS))
    parser.add_argument("--onnx", required=True, type=Path, help="the part's ONNX graph (external data beside it)")
    parser.add_argument("--encodings", required=True, type=Path, help="the part's AIMET encodings")
    parser.add_argument("--graph-name", required=True, help="e.g. prompt_ar32_cl256_01_of_06")
    parser.add_argument("--float-bitwidth", required=True, type=int, choices=(16, 32),
                        help="float width of tensors without an integer encoding")
    parser.add_argument("--out", required=True, type=Path, help="the converted graph (.onnx or .dlc)")
    add_switch(parser, "--takes-embeddings",
               "the first part after an embedding table (bundle.embedding: lut; reference and qnn-htp toolchains): its "
               "hidden-state input becomes inputs_embeds, the input Genie feeds from the table")
    parser.add_argument("--share-weights-with", type=Path,
                        help="reference and qnn-htp toolchains: a converted graph in --out's folder (the part's prompt "
                             "graph) whose data file holds the weights this graph shares; they are not written again")
    return parser


def run(args: argparse.Namespace) -> int:
    toolchain = get_toolchain(args.toolchain)
    toolchain.check_available()
    extra = {}
    if args.takes_embeddings:
        if args.toolchain not in RENAMING_TOOLCHAINS:
            raise GenieBuildError("--takes-embeddings", f"only the {' and '.join(RENAMING_TOOLCHAINS)} toolchains "
                                                        f"rename graph inputs, not {args.toolchain}")
        extra["input_names"] = {_hidden_state_input(args.onnx): "inputs_embeds"}
    if args.share_weights_with is not None:
        if args.toolchain not in RENAMING_TOOLCHAINS:
            raise GenieBuildError("--share-weights-with", f"only the {' and '.join(RENAMING_TOOLCHAINS)} toolchains' "
                                                          f"graphs share a data file, not {args.toolchain}'s")
        extra["share_weights_with"] = args.share_weights_with
    toolchain.convert(args.onnx, args.encodings, args.out, graph_name=args.graph_name,
                      float_bitwidth=args.float_bitwidth, **extra)
    return 0


def _hidden_state_input(onnx_path: Path) -> str:
    """The one input of a part that is neither fed by Genie nor a cache entry: the previous part's hidden states.

    Raises:
        GenieBuildError: none, or several.
    """
    from genie_build.conventions import KV_TENSOR
    from genie_build.genie_contract import FED_INPUTS
    from genie_build.onnx_graph import graph_io, load_graph

    names = [spec.name for spec in graph_io(load_graph(onnx_path)).inputs
             if spec.name not in FED_INPUTS and not KV_TENSOR.match(spec.name)]
    if len(names) != 1:
        raise GenieBuildError(onnx_path, f"a part after the embedding table has one hidden-state input; this one "
                                         f"has {len(names)}: {names}")
    return names[0]
