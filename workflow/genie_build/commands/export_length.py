"""``export-length``: an exported part's prompt and token graphs at another context length, reading its weights.

They are written beside the part's own graphs, in export-part's folder, as ``prompt_cl{CL}.onnx`` and
``token_cl{CL}.onnx``, their weights references into the part's ``weights.onnx.data``: no weight is written and the
part's own files are left as they are (docs/export.md, Several context lengths)."""

from __future__ import annotations

import argparse

from genie_build.commands.export_part import HF_EXTRA_HINT, add_part_arguments, part_argument
from genie_build.errors import GenieBuildError

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("export-length", help=__doc__.splitlines()[0], description=__doc__)
    add_part_arguments(parser, context_help="the context length CL to add (not the part's own)",
                       out_dir_help="the part's folder (export-part's --out-dir): gets prompt_cl{CL}.onnx and "
                                    "token_cl{CL}.onnx")
    return parser


def run(args: argparse.Namespace) -> int:
    part = part_argument(args)
    try:  # torch only here, as for export-part
        from genie_build.export.export_length import export_length
    except ImportError as exc:
        raise GenieBuildError("export-length", f"needs torch, transformers and onnxscript ({HF_EXTRA_HINT}): "
                                               f"{exc}") from None
    export_length(args.checkpoint, part, args.out_dir, num_parts=args.num_parts, ar=args.ar, context=args.context)
    return 0
