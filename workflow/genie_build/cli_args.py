"""Argument parsing shared by the commands."""

from __future__ import annotations

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
