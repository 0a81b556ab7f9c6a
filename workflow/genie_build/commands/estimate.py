"""``estimate``: plan the split and predict every part's context binary per variant from shapes alone: an HF
config.json or an ONNX graph read without its weights, plus a precision (bits per weight role), given as such or as
the named quantization recipe the build calibrates by. Takes seconds, even for 7B.

Writes into ``--out-dir`` (``results/{model}/predicted/``): ``plan.json``, ``estimate.json``,
``size_table.{csv,md,png}`` and ``memory_plan.{json,md,png}`` (the load model's verdict on the bundled variant).
"""

from __future__ import annotations

import argparse

from genie_build.chipsets import HTP_MODEL_BYTES, HTP_SESSION_BYTES
from genie_build.cli_args import (add_embedding_option, add_load_options, add_split_options, add_switch, json_object,
                                 load_params, positive_float, positive_int, split_options)
from genie_build.job_memory import RunMemory
from genie_build.plan.precision import Precision, precision_from_dict, read_precision
from genie_build.plan.recipes import RECIPES, precision_of, recipe_named
from genie_build.sizes.estimate import MEMORY_VARIANT, PREDICTED_VARIANTS, estimate_to_dir
from genie_build.sizes.memory_plan import MemoryLimits
from genie_build.toolchains import TOOLCHAINS
from genie_build.units import MIB

__all__ = ["register_parser", "run"]


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("estimate", help="plan and predict context binary sizes from shapes alone",
                                   description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--hf-config", help="the model's HF config.json (Qwen2, Llama or Mistral)")
    source.add_argument("--onnx", help="the prompt graph .onnx; its external data is not read")
    add_split_options(parser)  # as the plan command weighs them; --boundaries with --onnx only
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--precision",
                           help="YAML file whose top-level 'precision' mapping is the precision (e.g. an estimate "
                                "config); default: 4-bit layers, 8-bit embedding and LM head, float16 norms and "
                                "biases, per channel")
    precision.add_argument("--precision-json",
                           help="the precision mapping as JSON (the workflow passes config 'precision')")
    precision.add_argument("--recipe", choices=sorted(RECIPES),
                           help="the precision AIMET's LLM recipe gives each weight under this named quantization "
                                "recipe (the workflow passes quantize.recipe when it calibrates)")
    parser.add_argument("--memory-variant", default=MEMORY_VARIANT, choices=[variant.name for variant in PREDICTED_VARIANTS],
                        help="the variant the memory plan checks (default %(default)s)")
    parser.add_argument("--max-context-mb", type=positive_float, default=HTP_MODEL_BYTES / MIB,
                        help="memory plan: per context binary, MiB (default %(default)s)")
    parser.add_argument("--max-session-mb", type=positive_float, default=HTP_SESSION_BYTES / MIB,
                        help="memory plan: per HTP session, MiB (default %(default)s)")
    parser.add_argument("--ar", type=positive_int, default=128,
                        help="with --hf-config: the export's prompt AR (default %(default)s)")
    parser.add_argument("--context", type=positive_int, nargs="+", default=[4096],
                        help="with --hf-config: the export's context length CL, or several (default %(default)s)")
    parser.add_argument("--run-memory-mb", type=positive_int,
                        help="with --hf-config and split.num_parts auto: the memory the build is given, a share of which "
                             "each job holding a part may take (docs/memory-plan.md)")
    parser.add_argument("--run-memory-source", default="the build is given",
                        help="where --run-memory-mb comes from, for the memory plan")
    add_switch(parser, "--evaluate", "the build evaluates (its jobs hold a part too)")
    parser.add_argument("--toolchains", nargs="*", default=[], choices=sorted(TOOLCHAINS),
                        help="with --run-memory-mb: the build's variants' toolchains, whose compile of each part's "
                             "binary is weighed too")
    add_embedding_option(parser)
    add_load_options(parser)
    parser.add_argument("--out-dir", required=True, help="results/{model}/predicted")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.precision_json is not None:
        precision = precision_from_dict(json_object(args.precision_json, "--precision-json"), "--precision-json")
    elif args.recipe is not None:
        precision = precision_of(recipe_named(args.recipe))
    else:
        precision = read_precision(args.precision) if args.precision else Precision()
    limits = MemoryLimits(max_context_bytes=round(args.max_context_mb * MIB),
                          max_session_bytes=round(args.max_session_mb * MIB))
    estimate_to_dir(args.out_dir, precision, split_options(args), hf_config=args.hf_config, onnx=args.onnx,
                    ar=args.ar, context_length=args.context, load=load_params(args),
                    memory_variant=args.memory_variant, limits=limits, embedding=args.embedding,
                    memory=None if args.run_memory_mb is None else RunMemory(args.run_memory_mb, args.run_memory_source),
                    evaluate=args.evaluate, toolchains=args.toolchains)
    return 0
