"""``slice-encodings``: cut one graph's full AIMET encodings into one file per split part.

Runs once per graph (prompt or token), so each graph's slices are their own checkpoint output and a change
to one graph's encodings leaves the other's untouched. It validates the full encodings against the full
graph, optionally checks them against the other graph's encodings (``--consistent-with``) or takes the
other graph's encodings for every tensor this graph has (``--share-from``, as AI Hub gives the token graph
the prompt graph's), then writes ``part_{label}.encodings.json`` (canonical bytes, in the version of the
input file) for every ``part_{label}.onnx`` in the parts directory. The output directory appears complete
or not at all.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from genie_build.encodings import (
    Encodings,
    check_boundary_consistency,
    check_graphs_consistent,
    check_kv_cache_tied,
    part_tensor_names,
    read_encodings,
    read_graph_tensors,
    share_encodings,
    slice_encodings,
    validate_against_model,
    write_encodings,
)
from genie_build.errors import GenieBuildError
from genie_build.fileio import atomic_directory
from genie_build.naming import GRAPH_KINDS, parse_part_label, part_label

log = logging.getLogger(__name__)

PART_GLOB = "part_*.onnx"


def register_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("slice-encodings", help="cut a graph's encodings into one file per part",
                                   description=__doc__)
    parser.add_argument("--graph", required=True, choices=GRAPH_KINDS, help="which graph these encodings are for")
    parser.add_argument("--model", required=True, type=Path, help="the full (unsplit) ONNX graph")
    parser.add_argument("--encodings", required=True, type=Path, help="its AIMET encodings (0.6.1, 1.0.0, 2.0.0)")
    parser.add_argument("--parts-dir", required=True, type=Path, help="directory holding part_*.onnx")
    parser.add_argument("--out-dir", required=True, type=Path, help="directory to write the slices into")
    other = parser.add_mutually_exclusive_group()
    other.add_argument("--consistent-with", type=Path, metavar="ENCODINGS",
                       help="the other graph's encodings: tensors in both must have identical encodings")
    other.add_argument("--share-from", type=Path, metavar="ENCODINGS",
                       help="the other graph's encodings: every tensor of it this graph has takes its encoding")
    parser.add_argument("--kv-cache-tied", action="store_true",
                        help="a bundle will be built: each past_*_out must have its past_*_in's encoding (Genie)")
    return parser


def run(args: argparse.Namespace) -> int:
    enc = read_encodings(args.encodings)
    model = read_graph_tensors(args.model)
    if args.share_from is not None:
        enc = share_encodings(read_encodings(args.share_from), enc, model.tensor_names)
    validate_against_model(enc, args.encodings, model.tensor_names, model.param_shapes, model.param_layouts)
    if args.consistent_with is not None:
        other = read_encodings(args.consistent_with)
        check_graphs_consistent(*((enc, other) if args.graph == "prompt" else (other, enc)))
    if args.kv_cache_tied:
        check_kv_cache_tied(enc, model.tensor_names)

    slices = {label: slice_encodings(enc, *part_tensor_names(path))
              for label, path in find_parts(args.parts_dir).items()}
    check_boundary_consistency(slices)
    _log_coverage(args.graph, enc, slices)

    with atomic_directory(args.out_dir) as staging:
        for label, part_enc in slices.items():
            write_encodings(staging / slice_file_name(label), part_enc)
    return 0


def slice_file_name(label: str) -> str:
    """``slice_file_name("01_of_06") == "part_01_of_06.encodings.json"``."""
    return f"part_{label}.encodings.json"


def find_parts(parts_dir: Path) -> dict[str, Path]:
    """The part files of a split, label -> path, in part order.

    Raises:
        GenieBuildError: no parts, a file name that is not a part label, or a set that is not exactly
            parts 1..N of one N.
    """
    paths = sorted(parts_dir.glob(PART_GLOB))
    if not paths:
        raise GenieBuildError(parts_dir, f"no {PART_GLOB} files")
    parts: dict[str, Path] = {}
    for path in paths:
        label = path.name.removeprefix("part_").removesuffix(".onnx")
        try:
            _, num_parts = parse_part_label(label)
        except ValueError as exc:
            raise GenieBuildError(path, str(exc)) from None
        parts[label] = path
    expected = [part_label(index, num_parts) for index in range(1, num_parts + 1)]
    if list(parts) != expected:
        raise GenieBuildError(parts_dir, f"part files {', '.join(parts)} are not exactly parts {', '.join(expected)}")
    return parts


def _log_coverage(graph: str, enc: Encodings, slices: dict[str, Encodings]) -> None:
    """Log each part's share; encodings no part uses point at tensors the split dropped."""
    for label, part_enc in slices.items():
        log.info("%s part %s: %d activation and %d param encodings", graph, label,
                 len(part_enc.activations), len(part_enc.params))
    used = {name for part_enc in slices.values() for name in (*part_enc.activations, *part_enc.params)}
    unused = sorted(set(enc.activations).union(enc.params) - used)
    if unused:
        log.warning("%s: %d encodings are used by no part, e.g. %s", graph, len(unused), ", ".join(unused[:5]))
