"""``evaluate``: one variant's reference context binaries on held-out text, one part at a time, against the float
model's logits ``evaluate-float`` wrote: top-1 agreement, mean KL(float || variant) and both perplexities, the share
of activation values outside their grids and the tensors that clip most, and (``--weights-only``) the same
binaries with every activation in float, which tells what the activation encodings cost (JSON)."""

from __future__ import annotations

import argparse
from pathlib import Path

from genie_build.cli_args import add_switch, json_object, positive_int
from genie_build.errors import GenieBuildError
from genie_build.evaluate.evaluate import ClipSums, quality_of
from genie_build.fileio import write_json
from genie_build.genie_config import make_genie_config
from genie_build.hf_config import load_hf_config
from genie_build.run.run_bundle import host_rope

__all__ = ["add_text_arguments", "register_parser", "rope_of", "run"]


def add_text_arguments(parser: argparse.ArgumentParser) -> None:
    """The held-out text's token ids and what cuts them into the windows both models run: the same for both
    commands."""
    parser.add_argument("--tokens", required=True, type=Path,
                        help="the held-out text's token ids (what tokenize-text wrote), not the calibration text's")
    parser.add_argument("--tokenizer", required=True, type=Path, help="tokenizer.json (RoPE as Genie gets it)")
    parser.add_argument("--hf-config", required=True, type=Path, help="config.json (RoPE as Genie gets it)")
    parser.add_argument("--max-windows", required=True, type=positive_int, help="windows of the prompt graph's AR")


def rope_of(args: argparse.Namespace) -> dict:
    """RoPE as the bundle's Genie config gives it to the host run."""
    genie_config = make_genie_config(load_hf_config(args.hf_config), args.tokenizer, ["model.bin"], 1,
                                     hf_config_path=args.hf_config)
    return host_rope(genie_config["dialog"]["engine"], args.hf_config)


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("evaluate", help="a variant's binaries against the float model on held-out text",
                                   description=__doc__)
    parser.add_argument("--variant", required=True, help="the variant's name (recorded)")
    parser.add_argument("--binaries", required=True, nargs="+", type=Path, help="its context binaries, part order")
    parser.add_argument("--encodings", required=True, nargs="+", type=Path,
                        help="the parts' prompt-graph encodings (their activation encodings are applied)")
    parser.add_argument("--float-logits", required=True, type=Path, help="what evaluate-float wrote for this text")
    add_switch(parser, "--weights-only", "also run the binaries with every activation in float (twice the time)")
    parser.add_argument("--calibration-json", default="{}",
                        help="what the calibration saw (calibrator, windows, tokens, text), recorded in the report")
    add_text_arguments(parser)
    parser.add_argument("--out", required=True, type=Path, help="the report (JSON)")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.out.resolve() in {path.resolve() for path in (*args.binaries, args.float_logits, args.tokens)}:
        raise GenieBuildError(args.out, "is one of the inputs; write the report elsewhere")
    calibration = json_object(args.calibration_json, "--calibration-json")
    common = {"float_logits": args.float_logits, "tokens_path": args.tokens,
              "rope": rope_of(args), "max_windows": args.max_windows}
    sums = ClipSums()
    quality = quality_of(args.binaries, args.encodings, clipping=sums, **common)
    clipping = sums.clipping()
    weights_only = quality_of(args.binaries, args.encodings, activations=False, **common) if args.weights_only \
        else None
    write_json(args.out, {"variant": args.variant, "tokens": str(args.tokens), **quality.to_dict(),
                          "clipping": clipping.to_dict(), "calibration": calibration,
                          "weights_only": None if weights_only is None else weights_only.to_dict()})
    print(f"{args.variant}: top-1 agreement {quality.top1_agreement:.1%} over {quality.positions} tokens, "
          f"mean KL {quality.mean_kl:.4g} nats, perplexity {quality.variant_perplexity:.2f} "
          f"(float {quality.float_perplexity:.2f}); {clipping.share:.3%} of {clipping.values:,} activation values "
          "outside their grids" + (f" (most: {clipping.tensors[0].describe()})" if clipping.tensors else ""))
    if weights_only is not None:
        print(f"{args.variant}, weights only: top-1 agreement {weights_only.top1_agreement:.1%}, mean KL "
              f"{weights_only.mean_kl:.4g} nats")
    return 0
