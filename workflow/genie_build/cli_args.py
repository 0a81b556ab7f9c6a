"""Argument parsing shared by the commands."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from genie_build.chipsets import LoadParams
from genie_build.chipsets import load_params as chipset_load_params
from genie_build.conventions import EMBEDDING_LAYOUTS
from genie_build.errors import GenieBuildError
from genie_build.split_request import check_split_request

__all__ = ["add_embedding_option", "add_genie_run_arguments", "add_load_options", "add_split_options",
           "add_strict_option", "add_switch", "boolean", "json_object", "load_params", "part_count", "positive_float", "positive_int",
           "split_options"]


def json_object(text: str, option: str) -> dict:
    """Parse a JSON object given on the command line (e.g. ``--variant-json``).

    Raises:
        GenieBuildError: naming ``option``, when the text is not JSON or not an object.
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GenieBuildError(option, f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise GenieBuildError(option, f"expected a JSON object, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse ``type``: a number > 0 (also refuses nan)."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def boolean(text: str) -> bool:
    """An argparse ``type`` for a switch a rule passes as a value (``--strict False``): true/false, any case."""
    value = {"true": True, "false": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text}")
    return value


def add_switch(parser: argparse.ArgumentParser, flag: str, help: str) -> None:
    """A yes/no option that a rule passes as a value (``--kv-cache-tied False``), the config's boolean as it is; on
    the command line alone it means true. Default false."""
    parser.add_argument(flag, nargs="?", const=True, default=False, type=boolean, metavar="{true,false}",
                        help=f"{help} (also {flag} true/false)")


def add_strict_option(parser: argparse.ArgumentParser, flagged: str) -> None:
    """``--strict``, as ``report.strict`` reaches a command: fail on a flagged ``flagged`` instead of warning."""
    add_switch(parser, "--strict", f"fail on a flagged {flagged} instead of warning")


def add_genie_run_arguments(parser: argparse.ArgumentParser, modes: Sequence[str]) -> None:
    """What Genie's run and its perplexity are given: the bundle, each ctx-bin's twin and ``bundle.genie_run``."""
    parser.add_argument("bundle", metavar="DIR", help="the bundle directory (a qnn-htp bundle)")
    parser.add_argument("--twin", metavar="DIR", nargs="+", required=True,
                        help="each ctx-bin's twin folder, in order (compile-twin)")
    parser.add_argument("--mode", choices=modes, default="auto",
                        help="generate: the token query and the perplexity; load: create the dialog only; auto "
                             "(default): generate when the bundle's ctx-bins hold at most 64 MB, else record why "
                             "nothing ran")


def part_count(text: str) -> int | str:
    """An argparse ``type``: a part count, or ``auto``."""
    return text if text == "auto" else int(text)


def add_load_options(parser: argparse.ArgumentParser) -> None:
    """The load model's device: ``--chipset`` (its parameters in the chipset table) and ``--load-json``
    (``report.load``: any of usable_mb, sessions, budget_mb, alignment; null keeps the chipset's)."""
    parser.add_argument("--chipset", default="SM8750", help="target.chipset (default %(default)s)")
    parser.add_argument("--load-json", default="{}", metavar="JSON",
                        help="report.load: overrides of the chipset's load parameters")


def add_embedding_option(parser: argparse.ArgumentParser) -> None:
    """``--embedding``: ``bundle.embedding``, which decides the load model's contexts (the plan's ``auto``, the
    estimate's memory plan)."""
    parser.add_argument("--embedding", choices=EMBEDDING_LAYOUTS, default="graph",
                        help="bundle.embedding: the embedding as part 1's context (graph) or a CPU table (lut), "
                             "which the load model leaves out of the HTP sessions (default %(default)s)")


def load_params(args: argparse.Namespace) -> LoadParams:
    """:func:`genie_build.chipsets.load_params` of ``--chipset`` and ``--load-json``."""
    return chipset_load_params(args.chipset, json_object(args.load_json, "--load-json"))


def add_split_options(parser: argparse.ArgumentParser) -> None:
    """How to split (plan, estimate): ``--num-parts`` or ``--max-part-mb`` with ``--embedding-with-layers`` and
    ``--boundaries``, or all of them as one ``--split-json`` (the config's ``split`` section, as the workflow
    passes it)."""
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--num-parts", type=part_count,
                      help="number of parts (context binaries), at least 2, or auto: the fewest that map")
    size.add_argument("--max-part-mb", type=positive_float,
                      help="largest part in MiB (2**20 bytes): use the fewest parts that fit")
    size.add_argument("--split-json", metavar="JSON",
                      help="the config's split section: num_parts or max_part_mb, embedding_alone, boundaries")
    parser.add_argument("--embedding-with-layers", action="store_true",
                        help="put the embedding in part 1 with the first layer(s) instead of alone")
    parser.add_argument("--boundaries", nargs="+", metavar="TENSOR",
                        help="the L + 1 residual tensors (after the embedding, after each layer); "
                             "default: found from node scopes")


def split_options(args: argparse.Namespace) -> dict:
    """``num_parts``, ``max_part_mb``, ``embedding_alone`` and ``boundaries`` from :func:`add_split_options`'
    arguments.

    Raises:
        GenieBuildError: ``--split-json`` is not an object with exactly one of num_parts and max_part_mb, or is
            given with ``--embedding-with-layers``/``--boundaries``.
    """
    if args.split_json is None:
        return {"num_parts": args.num_parts, "max_part_mb": args.max_part_mb,
                "embedding_alone": not args.embedding_with_layers, "boundaries": args.boundaries}
    if args.embedding_with_layers or args.boundaries:
        raise GenieBuildError("--split-json", "holds embedding_alone and boundaries: give them there")
    split = json_object(args.split_json, "--split-json")
    num_parts, max_part_mb = split.get("num_parts"), split.get("max_part_mb")
    check_split_request(num_parts, max_part_mb, "--split-json")
    return {"num_parts": num_parts, "max_part_mb": max_part_mb,
            "embedding_alone": split.get("embedding_alone", True), "boundaries": split.get("boundaries") or None}
