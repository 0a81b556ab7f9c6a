"""Assemble the Genie bundle from compiled ctx-bins, atomically.

The bundle holds the ctx-bins in part order, genie_config.json, htp_backend_ext_config.json, tokenizer.json,
metadata.yaml (graphs and IO read back from each ctx-bin) and manifest.json (hashes, tool versions, config).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.bundle.bundle import assemble_bundle, runtime_tool_versions
from genie_build.cli_args import add_switch, boolean, json_object
from genie_build.toolchains import TOOLCHAINS

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("bundle", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--binaries", required=True, nargs="+", type=Path, metavar="BIN",
                        help="the compiled ctx-bins, in part order")
    parser.add_argument("--toolchain", required=True, choices=sorted(TOOLCHAINS),
                        help="the toolchain that compiled them (reads them back for metadata.yaml)")
    parser.add_argument("--model-name", required=True, help="ctx-bins are named {model}_part_{NN_of_N}.bin")
    parser.add_argument("--hf-config", required=True, type=Path, help="the model's HF config.json")
    parser.add_argument("--tokenizer", required=True, type=Path, help="the model's tokenizer.json")
    parser.add_argument("--chipset", required=True, help="target chipset, e.g. SM8750")
    parser.add_argument("--context-size", type=int,
                        help="dialog.context.size (default, or 0: the compiled context length)")
    add_switch(parser, "--share-resources",
               "bundle.share_resources: groupContext share_resources with allow-async-init")
    parser.add_argument("--graph-switching", type=boolean, metavar="{true,false}",
                        help="bundle.graph_switching: Genie's QnnHtp enable-graph-switching (default: not written)")
    parser.add_argument("--embedding-table", type=Path, metavar="BIN",
                        help="bundle.embedding: lut: the table (with BIN.json beside it); --binaries are then parts 2..N")
    parser.add_argument("--config-json", default="{}", metavar="JSON",
                        help="the workflow config as a JSON object, recorded in manifest.json")
    parser.add_argument("--out-dir", required=True, type=Path, help="the bundle directory to (re)create")
    return parser


def run(args: argparse.Namespace) -> int:
    assemble_bundle(args.out_dir, args.binaries, args.toolchain, args.hf_config, args.tokenizer, args.chipset,
                    args.context_size or None, json_object(args.config_json, "--config-json"), runtime_tool_versions(),
                    model_name=args.model_name, share_resources=args.share_resources,
                    graph_switching=args.graph_switching,
                    embedding_table=args.embedding_table)
    return 0
