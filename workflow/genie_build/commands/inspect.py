"""``inspect``: what a compiled context binary holds, read from the binary itself: its size, weight bytes,
graphs with their IO tensors (shapes, dtypes, quantization) and the options it says were applied."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from genie_build.toolchains import TOOLCHAINS, get_toolchain
from genie_build.toolchains.base import BinaryInfo, TensorInfo

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("inspect", help="show what a context binary holds", description=__doc__)
    parser.add_argument("--toolchain", required=True, choices=sorted(TOOLCHAINS))
    parser.add_argument("binary", type=Path, help="the context binary")
    parser.add_argument("--json", action="store_true", help="print the record as JSON")
    return parser


def run(args: argparse.Namespace) -> int:
    info = get_toolchain(args.toolchain).inspect(args.binary)
    print(json.dumps(binary_info_json(info), indent=2) if args.json else describe(info))
    return 0


def binary_info_json(info: BinaryInfo) -> dict:
    """The binary's fields as JSON; applied options as the binary reports them (no null for what it does not)."""
    return {**dataclasses.asdict(info), "applied_options": info.applied_options.to_dict()}


def describe(info: BinaryInfo) -> str:
    """A few lines for people: sizes, applied options, then each graph's IO."""
    lines = [f"{info.path}: {info.toolchain} {info.tool_version}, {info.file_bytes} bytes, "
             f"weights {info.weight_bytes} bytes",
             "applied: " + ", ".join(f"{key}={value}" for key, value in info.applied_options.to_dict().items())]
    for graph in info.graphs:
        lines.append(f"graph {graph.name}")
        lines += [f"  in  {_describe_tensor(tensor)}" for tensor in graph.inputs]
        lines += [f"  out {_describe_tensor(tensor)}" for tensor in graph.outputs]
    return "\n".join(lines)


def _describe_tensor(tensor: TensorInfo) -> str:
    text = f"{tensor.name} {list(tensor.shape)} {tensor.dtype}"
    quant = tensor.quant
    if quant is not None:
        text += f" as {quant.dtype}"
        if quant.scale is not None:
            text += f" scale={quant.scale:.6g} offset={quant.offset}"
    return text
