"""``plan``: check the prompt/token graphs and their encodings, find the boundaries, write ``plan.json``."""

from __future__ import annotations

import argparse
import dataclasses
import logging

import onnx

from genie_build.boundaries import CONFIG_KEY as BOUNDARIES_KEY
from genie_build.boundaries import find_boundaries
from genie_build.encodings import Encodings, read_encodings
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import (ar_and_context_length, check_external_data, check_shared_initializers,
                                    load_graph)
from genie_build.plan import MIB, model_pieces, plan_by_max_part_bytes, plan_by_num_parts, write_plan

log = logging.getLogger(__name__)


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("plan", help="choose the split boundaries and write plan.json",
                                   description=__doc__)
    parser.add_argument("--prompt", required=True, help="prompt graph (AR > 1) .onnx")
    parser.add_argument("--token", required=True, help="token graph (AR = 1) .onnx, same weights")
    parser.add_argument("--encodings-prompt", required=True, help="AIMET encodings of the prompt graph")
    parser.add_argument("--encodings-token", required=True, help="AIMET encodings of the token graph")
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--num-parts", type=int, help="number of parts (context binaries), at least 2")
    size.add_argument("--max-part-mb", type=_positive_float,
                      help="largest part in MiB (2**20 bytes): use the fewest parts that fit")
    parser.add_argument("--embedding-with-layers", action="store_true",
                        help="put the embedding in part 1 with the first layer(s) instead of alone")
    parser.add_argument("--boundaries", nargs="+", metavar="TENSOR",
                        help="the L + 1 residual tensors (after the embedding, after each layer); "
                             "default: found from node scopes")
    parser.add_argument("--skip-weight-check", action="store_true",
                        help="do not compare the graphs' shared weights (the workflow runs check-model for that, "
                             "once per model change, not once per encodings change)")
    parser.add_argument("--token-shares-prompt", action="store_true",
                        help="the token graph takes the prompt graph's encodings (encodings.share_from: prompt): "
                             "do not require the two files' parameter encodings to agree")
    parser.add_argument("--out", required=True, help="plan.json to write")
    return parser


def run(args: argparse.Namespace) -> int:
    prompt, token = load_graph(args.prompt), load_graph(args.token)
    check_external_data(prompt, args.prompt)
    check_external_data(token, args.token)
    if not args.skip_weight_check:
        check_shared_initializers(args.prompt, args.token)
    prompt_encodings = read_encodings(args.encodings_prompt)
    if not args.token_shares_prompt:
        check_shared_param_encodings(prompt_encodings, args.encodings_prompt,
                                     read_encodings(args.encodings_token), args.encodings_token)

    boundaries = find_boundaries(prompt, args.prompt, args.boundaries)
    token_boundaries = find_boundaries(token, args.token, args.boundaries)
    if token_boundaries != boundaries:
        raise GenieBuildError(args.token, f"the token graph's boundaries {list(token_boundaries)} differ from the "
                                          f"prompt graph's {list(boundaries)}; set {BOUNDARIES_KEY}")

    pieces = model_pieces(prompt, prompt_encodings, boundaries)
    embedding_alone = not args.embedding_with_layers
    if args.num_parts is not None:
        plan = plan_by_num_parts(pieces, args.num_parts, embedding_alone)
    else:
        plan = plan_by_max_part_bytes(pieces, int(args.max_part_mb * MIB), embedding_alone)
    plan = dataclasses.replace(plan, **graph_shapes({"prompt": (prompt, args.prompt), "token": (token, args.token)}))
    write_plan(args.out, plan)
    for part in plan.parts:
        log.info("part %s: %s, %.2f MiB", part.label, "+".join(part.pieces), part.estimated_bytes / MIB)
    return 0


def graph_shapes(graphs: dict[str, tuple[onnx.ModelProto, str]]) -> dict:
    """AR of each graph and their common context length, as Genie reads them, for the graph names.

    Raises:
        GenieBuildError: a graph lacks static ``input_ids``/``attention_mask`` inputs, or the graphs' context
            lengths differ.
    """
    graph_ar, lengths = {}, {}
    for kind, (model, path) in graphs.items():
        dims = ar_and_context_length(model)
        if dims is None:
            raise GenieBuildError(path, "cannot read AR and context length: Genie needs statically shaped inputs "
                                        "input_ids [1, AR] and attention_mask [..., CL]")
        graph_ar[kind], lengths[path] = dims
    if len(set(lengths.values())) != 1:
        raise GenieBuildError(next(iter(lengths)), f"context lengths differ between the graphs: {lengths}")
    return {"graph_ar": graph_ar, "context_length": next(iter(lengths.values()))}


def check_shared_param_encodings(prompt: Encodings, prompt_path: str, token: Encodings, token_path: str) -> None:
    """Weights shared by the two graphs must be quantized the same way in both encodings files.

    Raises:
        GenieBuildError: naming the first tensor whose parameter encodings differ.
    """
    for name, encoding in token.params.items():
        if name in prompt.params and prompt.params[name] != encoding:
            raise GenieBuildError(token_path, f"parameter encoding of {name!r} differs from the one in "
                                              f"{prompt_path}; shared weights need identical encodings (or set "
                                              "encodings.share_from: prompt)")


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value
