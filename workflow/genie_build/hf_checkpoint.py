"""A Hugging Face checkpoint directory as genie-build reads it, without torch: which files it has, which shard holds
each tensor, and whether its ``config.json`` describes a model the export supports (its shape:
:func:`genie_build.hf_config.read_model_shape`).

The layout is what ``save_pretrained`` writes: ``config.json``, the weights as one ``model.safetensors`` or as
shards listed by ``model.safetensors.index.json`` (``weight_map``: tensor name -> shard file), ``tokenizer.json``.
The workflow reads :func:`weight_files` and :func:`tensor_files` at parse time, so a changed shard re-exports only
the parts whose tensors it holds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genie_build.errors import GenieBuildError
from genie_build.fileio import read_json
from genie_build.genie_config import TOKENIZER_NAME
from genie_build.hf_config import load_hf_config, read_rope, rope_kind

__all__ = ["CONFIG_NAME", "Checkpoint", "INDEX_NAME", "SUPPORTED_ARCHITECTURES", "read_checkpoint", "tensor_files",
           "weight_files"]

CONFIG_NAME = "config.json"
SINGLE_WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
# config.json model_type -> the transformers class the export builds (its decoder layers, attention, MLP, norms).
SUPPORTED_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# RoPE the export carries through: the graph takes cos/sin as inputs, so only the tables Genie computes differ,
# and Genie computes llama3's (genie_config writes its rope-scaling; conventions.rope_tables computes it).
SUPPORTED_ROPE_TYPES = ("default", "llama3")
SAFETENSORS_HEADER_LIMIT = 100 * 1024 * 1024   # safetensors' own limit on its JSON header
_SUPPORTED_TEXT = ", ".join(f"{kind} ({cls})" for kind, cls in SUPPORTED_ARCHITECTURES.items())


@dataclass(frozen=True)
class Checkpoint:
    """A checked checkpoint directory: its config, its weight files (in name order) and its tokenizer."""

    directory: Path
    config: dict[str, Any]
    weight_files: tuple[Path, ...]
    tokenizer: Path

    @property
    def model_type(self) -> str:
        return self.config["model_type"]


def read_checkpoint(directory: str | os.PathLike[str]) -> Checkpoint:
    """Check a checkpoint directory and read its config (structure only, no weights).

    Raises:
        GenieBuildError: a file is missing or unreadable, config.json is not an object or names an architecture
            or RoPE type the export does not support, the index names a shard that is not there.
    """
    root = Path(directory)
    if not root.is_dir():
        raise GenieBuildError(root, "not a directory (model.hf_checkpoint must be a Hugging Face checkpoint "
                                    "directory: config.json, *.safetensors, tokenizer.json)")
    config_path = root / CONFIG_NAME
    config = load_hf_config(config_path)
    _check_architecture(config, config_path)
    tokenizer = root / TOKENIZER_NAME
    if not tokenizer.is_file():
        raise GenieBuildError(tokenizer, "missing (the export needs the checkpoint's tokenizer.json)")
    return Checkpoint(root, config, weight_files(root), tokenizer)


def weight_files(directory: str | os.PathLike[str]) -> tuple[Path, ...]:
    """The safetensors files of a checkpoint: the shards its index lists (and the index itself), else its single
    ``model.safetensors``.

    Raises:
        GenieBuildError: neither layout is there, the index is not valid, or a listed shard is missing.
    """
    root = Path(directory)
    index = root / INDEX_NAME
    if index.is_file():
        shards = _index_shards(read_json(index), index)
        missing = [name for name in shards if not (root / name).is_file()]
        if missing:
            raise GenieBuildError(index, f"lists shards that are not in {root}: {', '.join(missing)}")
        return (index, *(root / name for name in shards))
    single = root / SINGLE_WEIGHTS_NAME
    if not single.is_file():
        raise GenieBuildError(single, f"missing (and no {INDEX_NAME} either): the checkpoint has no safetensors "
                                      "weights")
    return (single,)


def _check_architecture(config: Mapping[str, Any], where: str | os.PathLike[str]) -> None:
    """The export supports ``config``'s model: a known model_type with its class in architectures, plain or llama3
    RoPE, full attention in every layer, an even head dim.

    Raises:
        GenieBuildError: one line naming what is supported.
    """
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise GenieBuildError(where, f"model_type {model_type!r} (architectures {architectures}) is not supported "
                                     f"by the export; supported: {_SUPPORTED_TEXT}")
    expected = SUPPORTED_ARCHITECTURES[model_type]
    if architectures and architectures != [expected]:
        raise GenieBuildError(where, f"architectures {architectures} with model_type {model_type!r}: the export "
                                     f"builds {expected} only; supported: {_SUPPORTED_TEXT}")
    scaling = read_rope(dict(config), where).scaling
    rope_type = rope_kind(scaling) if scaling else "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise GenieBuildError(where, f"rope type {rope_type!r} is not supported by the export "
                                     f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
    if config.get("use_sliding_window") or "sliding_attention" in (config.get("layer_types") or []):
        raise GenieBuildError(where, "sliding-window attention is not supported by the export (Genie's graphs "
                                     "attend to the whole context in every layer)")


def tensor_files(directory: str | os.PathLike[str]) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it: the index's ``weight_map``, else every tensor of the single
    ``model.safetensors`` (its header, read without the weights).

    Raises:
        GenieBuildError: as :func:`weight_files`, or a single file whose header is not safetensors'.
    """
    root = Path(directory)
    index = root / INDEX_NAME
    if index.is_file():
        weight_map = read_json(index)["weight_map"]
        weight_files(root)  # the index is valid and every shard it names is there
        return {name: root / shard for name, shard in weight_map.items()}
    single = weight_files(root)[0]
    return {name: single for name in _safetensors_names(single)}


def _safetensors_names(path: Path) -> list[str]:
    """The tensor names of a safetensors file, from its JSON header (8-byte length, then the header).

    Raises:
        GenieBuildError: the file is too short or its header is not a safetensors header.
    """
    try:
        with open(path, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if not 0 < length <= SAFETENSORS_HEADER_LIMIT:
                raise ValueError(f"header length {length}")
            header = json.loads(handle.read(length))
    except (OSError, ValueError) as exc:
        raise GenieBuildError(path, f"not a safetensors file ({exc})") from None
    if not isinstance(header, dict):
        raise GenieBuildError(path, "not a safetensors file (its header is not a JSON object)")
    return [name for name in header if name != "__metadata__"]


def _index_shards(index: Any, where: Path) -> list[str]:
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(name, str) and name and os.path.basename(name) == name for name in weight_map.values()):
        raise GenieBuildError(where, "not a safetensors index: it needs a non-empty weight_map of tensor name -> "
                                     "shard file name in the same directory")
    return sorted(set(weight_map.values()))
