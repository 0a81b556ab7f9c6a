"""Argument parsing shared by the commands."""

from __future__ import annotations

import argparse
import json

from genie_build.errors import GenieBuildError


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
