"""``slice-encodings``: cut both graphs' full AIMET encodings into one file per split part, in one run
(:func:`genie_build.quantize.slice_encodings.slice_model_encodings`; the workflow's encodings stage)."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.cli_args import add_switch
from genie_build.conventions import GRAPH_KINDS
from genie_build.quantize import slice_encodings as stage

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("slice-encodings", help="cut both graphs' encodings into one file per part",
                                   description=__doc__)
    for graph in GRAPH_KINDS:
        parser.add_argument(f"--{graph}-model", required=True, type=Path, help=f"the full {graph} graph")
        parser.add_argument(f"--{graph}-encodings", required=True, type=Path,
                            help="its AIMET encodings (0.6.1, 1.0.0, 2.0.0)")
    parser.add_argument("--parts-dir", required=True, type=Path,
                        help="the parts folder (part_{NN_of_N}/{prompt,token}.onnx)")
    parser.add_argument("--out-dir", required=True, type=Path,
                        help="written whole: part_{NN_of_N}/{prompt,token}.encodings.json")
    add_switch(parser, "--token-shares-prompt",
               "the token graph takes the prompt graph's encoding for every tensor it has (otherwise tensors in both "
               "graphs must have identical encodings)")
    add_switch(parser, "--kv-cache-tied", "a bundle will be built: each past_*_out must have its past_*_in's encoding "
                                          "(Genie)")
    return parser


def run(args: argparse.Namespace) -> int:
    prompt, token = (stage.GraphSliceFiles(*(getattr(args, f"{graph}_{key}")
                                             for key in ("model", "encodings")))
                     for graph in GRAPH_KINDS)
    stage.slice_model_encodings(prompt, token, args.parts_dir, args.out_dir,
                                token_shares_prompt=args.token_shares_prompt, kv_cache_tied=args.kv_cache_tied)
    return 0
