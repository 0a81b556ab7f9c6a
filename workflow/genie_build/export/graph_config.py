"""The fields of a model's ``config.json`` that its graphs are made of: all of them but those only the bundle's
``genie_config.json`` reads (:data:`BUNDLE_ONLY_KEYS`).

The workflow writes them, when it is parsed, to a file of its own (:func:`write_graph_config`) that the export, the
calibration, the tokenizing and the evaluation depend on instead of ``config.json``: a new ``eos_token_id`` rebuilds
the bundle, not the parts. The file is rewritten only when its content changes, so Snakemake sees it unchanged.
"""

from __future__ import annotations

import os
from typing import Any

from genie_build.fileio import write_json

__all__ = ["BUNDLE_ONLY_KEYS", "graph_config", "write_graph_config"]

# The special token ids the bundle tells Genie; no graph, no calibration window and no logit depends on them.
BUNDLE_ONLY_KEYS = frozenset({"bos_token_id", "eos_token_id", "pad_token_id"})


def graph_config(hf_config: dict[str, Any]) -> dict[str, Any]:
    """``config.json``'s contents less :data:`BUNDLE_ONLY_KEYS`."""
    return {key: value for key, value in hf_config.items() if key not in BUNDLE_ONLY_KEYS}


def write_graph_config(hf_config: dict[str, Any], out: str | os.PathLike[str]) -> bool:
    """Write :func:`graph_config` of ``config.json``'s contents (as read once) to ``out`` unless ``out`` already
    holds it.

    Returns:
        Whether ``out`` was written.
    """
    return write_json(out, graph_config(hf_config), unless_same=True)
