"""``check-model``: the prompt and token graphs' weights are all there and shared ones agree in shape, dtype and
value (streamed sha256). Its own job in the workflow, so that only a change of the model repeats it."""

from __future__ import annotations

import argparse

from genie_build.fileio import write_json
from genie_build.onnx_graph import check_external_data, check_shared_initializers, initializer_specs, load_graph


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("check-model", help=__doc__.splitlines()[0], description=__doc__)
    parser.add_argument("--prompt", required=True, help="prompt graph (AR > 1) .onnx")
    parser.add_argument("--token", required=True, help="token graph (AR = 1) .onnx")
    parser.add_argument("--out", required=True, help="JSON summary to write when the check passes")
    return parser


def run(args: argparse.Namespace) -> int:
    graphs = {"prompt": load_graph(args.prompt), "token": load_graph(args.token)}
    check_external_data(graphs["prompt"], args.prompt)
    check_external_data(graphs["token"], args.token)
    check_shared_initializers(args.prompt, args.token)
    specs = {kind: initializer_specs(model) for kind, model in graphs.items()}
    shared = sorted(set(specs["prompt"]) & set(specs["token"]))
    write_json(args.out, {"prompt": args.prompt, "token": args.token, "shared_initializers": len(shared),
                          "shared_bytes": sum(specs["prompt"][name].nbytes for name in shared)})
    return 0
