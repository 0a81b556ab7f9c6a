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
from genie_build.hf_config import load_hf_config

__all__ = ["BUNDLE_ONLY_KEYS", "graph_config", "write_graph_config"]

# The special token ids the bundle tells Genie; no graph, no calibration window and no logit depends on them.
BUNDLE_ONLY_KEYS = frozenset({"bos_token_id", "eos_token_id", "pad_token_id"})


def graph_config(hf_config: dict[str, Any]) -> dict[str, Any]:
    """``config.json``'s contents less :data:`BUNDLE_ONLY_KEYS`."""
    return {key: value for key, value in hf_config.items() if key not in BUNDLE_ONLY_KEYS}


def write_graph_config(hf_config_path: str | os.PathLike[str], out: str | os.PathLike[str]) -> bool:
    """Write :func:`graph_config` of ``hf_config_path`` to ``out`` unless ``out`` already holds it.

    Returns:
        Whether ``out`` was written.

    Raises:
        GenieBuildError: the config cannot be read (:func:`genie_build.hf_config.load_hf_config`).
    """
    return write_json(out, graph_config(load_hf_config(hf_config_path)), unless_same=True)
