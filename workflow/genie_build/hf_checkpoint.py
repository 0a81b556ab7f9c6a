"""A Hugging Face checkpoint directory as genie-build reads it, without torch: which files it has, which shard holds
each tensor, and whether the checkpoint is one the export builds, checked before any job
(:func:`check_checkpoint`): its family (:mod:`genie_build.families`), architecture, RoPE, quantization, sliding
window and the settings against its ``config.json``, and every tensor's name, shape and type (from the safetensors
headers) against what ``config.json`` implies.

The layout is what ``save_pretrained`` writes: ``config.json``, the weights as one ``model.safetensors`` or as
shards listed by ``model.safetensors.index.json`` (``weight_map``: tensor name -> shard file), ``tokenizer.json``.
The folder is read as transformers 5 reads it: ``model.safetensors`` when it is there, even beside an index; the
shards' own headers say which tensors each holds (transformers loads every tensor of every listed shard), and a
tensor held by two files is refused; a tied head that the checkpoint also stores is read from the stored
``lm_head.weight`` (:func:`stored_name`). The files may be symlinks, as in the Hugging Face cache
(``snapshots/<revision>/`` linking to ``../../blobs/``), but each must resolve inside the model folder, or for a
cache snapshot inside its repository folder (:func:`folder_boundary`).
The workflow reads a checkpoint once at parse time (:func:`check_checkpoint`: its config, its files and every
shard's header, in one :class:`Checkpoint`), so a changed shard re-exports only the parts whose tensors it holds.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genie_build.conventions import EMBED_WEIGHT, LM_HEAD_WEIGHT
from genie_build.errors import GenieBuildError
from genie_build.families import REFUSED_FAMILIES, Family, family_of
from genie_build.fileio import is_json_int, read_json
from genie_build.genie_config import TOKENIZER_NAME
from genie_build.hf_config import (ModelShape, StoredTensor, head_dim, load_hf_config, read_model_shape, read_rope,
                                   rope_kind, stored_tensors, supported_text)
from genie_build.units import MIB

__all__ = ["CONFIG_NAME", "Checkpoint", "FP8_SCALE_SUFFIX", "INDEX_NAME", "StoredHeader", "check_checkpoint",
           "check_config", "check_settings", "folder_boundary", "read_checkpoint", "sliding_window", "stored_name",
           "tensor_files", "tensor_headers", "weight_files"]

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
SINGLE_WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
SAFETENSORS_HEADER_LIMIT = 100 * MIB   # safetensors' own limit on its JSON header
FLOAT_DTYPES = ("F32", "F16", "BF16")
# An FP8 checkpoint (quantization_config.quant_method fp8, as the Hub's *-FP8 models ship): a Linear weight in
# F8_E4M3 with its block scales beside it, which the export multiplies out as transformers does.
FP8_DTYPE = "F8_E4M3"
FP8_SCALE_SUFFIX = "_scale_inv"
# Why a RoPE kind the families do not list cannot be built.
_ROPE_REFUSALS = {
    "yarn": "Genie's yarnrope is not documented to compute transformers' yarn tables (attention factor, "
            "beta_fast/beta_slow ramps), so the bundle's tables cannot be shown to be the model's",
}
_LAYER_TENSOR = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint directory as read once: its config, its weight files (in name order), its tokenizer and, once
    checked (:func:`check_checkpoint`), every stored tensor's header; what the planner and the part-weight lookup
    share (:mod:`genie_build.plan.shape_plan`)."""

    directory: Path
    config: dict[str, Any]
    weight_files: tuple[Path, ...]
    tokenizer: Path
    headers: Mapping[str, StoredHeader] = field(default_factory=dict)   # tensor name -> its header

    @functools.cached_property
    def shape(self) -> ModelShape:
        return read_model_shape(self.config, self.directory / CONFIG_NAME)

    @property
    def tensor_files(self) -> dict[str, Path]:
        """Tensor name -> the safetensors file holding it."""
        return {name: header.file for name, header in self.headers.items()}

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

    @property
    def family(self) -> Family:
        return family_of(self.model_type)


@dataclass(frozen=True)
class StoredHeader:
    """A tensor as a safetensors header states it: its type, its shape and the file holding it."""

    dtype: str
    shape: tuple[int, ...]
    file: Path


def read_checkpoint(directory: str | os.PathLike[str]) -> Checkpoint:
    """Check a checkpoint directory and read its config (structure only, no weights): :func:`check_config`.

    Raises:
        GenieBuildError: a file is missing or unreadable, or config.json describes a model the export does not
            build.
    """
    root = Path(directory)
    if not root.is_dir():
        raise GenieBuildError(root, "not a directory (model.hf_checkpoint must be a Hugging Face checkpoint "
                                    "directory: config.json, *.safetensors, tokenizer.json)")
    config_path, tokenizer = root / CONFIG_NAME, root / TOKENIZER_NAME
    _check_inside(root, config_path, tokenizer)
    config = load_hf_config(config_path)
    check_config(config, config_path)
    if not tokenizer.is_file():
        raise GenieBuildError(tokenizer, "missing (the export needs the checkpoint's tokenizer.json)")
    return Checkpoint(root, config, weight_files(root), tokenizer)


def folder_boundary(directory: str | os.PathLike[str]) -> Path:
    """The folder no file of a checkpoint may resolve outside of: the model folder itself, or for a snapshot of the
    Hugging Face cache (``<repository>/snapshots/<revision>``) its repository folder, whose ``blobs/`` the
    snapshot's files link to."""
    root = Path(directory).resolve()
    return root.parent.parent if root.parent.name == "snapshots" else root


def _check_inside(directory: Path, *files: Path) -> None:
    """Each file (a symlink followed) lies inside :func:`folder_boundary` of ``directory``.

    Raises:
        GenieBuildError: naming the file and where it leads.
    """
    boundary = folder_boundary(directory)
    for path in files:
        target = path.resolve()
        if not target.is_relative_to(boundary):
            raise GenieBuildError(path, f"leads to {target}, outside the model folder {boundary}: nothing outside "
                                        "it is read")


def check_checkpoint(directory: str | os.PathLike[str], *, ar: int, context: int) -> Checkpoint:
    """Everything that can be known before any job: :func:`read_checkpoint`, :func:`check_settings` and every
    tensor of the safetensors headers against ``config.json`` (:func:`_check_tensors`). Reads headers only, each
    once, and returns them with the checkpoint.

    Raises:
        GenieBuildError: one line naming the file and the key or tensor.
    """
    checkpoint = read_checkpoint(directory)
    config_path = checkpoint.directory / CONFIG_NAME
    check_settings(checkpoint.config, config_path, ar=ar, context=context)
    index = checkpoint.directory / INDEX_NAME
    if index.is_file() and checkpoint.weight_files == (checkpoint.directory / SINGLE_WEIGHTS_NAME,):
        log.warning("%s: not read: %s is beside it, and transformers loads that file alone", index,
                    SINGLE_WEIGHTS_NAME)
    checkpoint = dataclasses.replace(checkpoint, headers=_read_headers(checkpoint.weight_files))
    _check_tensors(checkpoint)
    return checkpoint


def weight_files(directory: str | os.PathLike[str]) -> tuple[Path, ...]:
    """The safetensors files of a checkpoint, those transformers loads: its single ``model.safetensors`` when it is
    there (transformers looks for it before the index, and ignores an index beside it), else the shards its index
    lists (and the index itself).

    Raises:
        GenieBuildError: neither layout is there, the index is not valid, a listed shard is missing, or a file
            resolves outside the model folder.
    """
    root = Path(directory)
    single = root / SINGLE_WEIGHTS_NAME
    if single.is_file():
        _check_inside(root, single)
        return (single,)
    index = root / INDEX_NAME
    if not index.is_file():
        raise GenieBuildError(single, f"missing (and no {INDEX_NAME} either): the checkpoint has no safetensors "
                                      "weights")
    _check_inside(root, index)
    shards = _index_shards(read_json(index), index)
    missing = [name for name in shards if not (root / name).is_file()]
    if missing:
        raise GenieBuildError(index, f"lists shards that are not in {root}: {', '.join(missing)}")
    files = (index, *(root / name for name in shards))
    _check_inside(root, *files[1:])
    return files


def check_config(config: Mapping[str, Any], where: str | os.PathLike[str]) -> None:
    """``config`` describes a model the export builds: a registered family with its causal-LM class in
    ``architectures``, a RoPE kind the family's bundle carries over the whole head dim, float or FP8 weights.

    Raises:
        GenieBuildError: one line naming the key and what is supported (or why the family is refused).
    """
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    family = family_of(model_type)
    if family is None:
        reason = REFUSED_FAMILIES.get(model_type) if isinstance(model_type, str) else None
        raise GenieBuildError(where, f"model_type {model_type!r} (architectures {architectures}) is not supported "
                                     f"by the export{': ' + reason if reason else ''}; supported: {supported_text()}")
    if architectures and architectures != [family.architecture]:
        raise GenieBuildError(where, f"architectures {architectures} with model_type {model_type!r}: the export "
                                     f"builds the causal LM {family.architecture} only; supported: {supported_text()}")
    scaling = read_rope(dict(config), where).scaling
    kind = rope_kind(scaling) if scaling else "default"
    if kind not in family.rope_kinds:
        raise GenieBuildError(where, f"rope type {kind!r} is not supported for {model_type} (supported: "
                                     f"{', '.join(family.rope_kinds)})" + (f": {_ROPE_REFUSALS[kind]}"
                                                                          if kind in _ROPE_REFUSALS else ""))
    if kind == "longrope":
        _check_longrope(read_rope(dict(config), where).scaling, head_dim(config, where), where)
    partial = config.get("partial_rotary_factor", (config.get("rope_parameters") or {}).get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0):
        raise GenieBuildError(where, f"partial_rotary_factor {partial!r} is not supported (Genie rotates the whole "
                                     "head: rope-dim is half of kv-dim)")
    _check_quantization(config.get("quantization_config"), where)


def _check_longrope(scaling: Mapping[str, Any], dim: int, where: str | os.PathLike[str]) -> None:
    """LongRoPE parameters Genie computes as transformers does (Genie's ROPE_LONGROPE: one factor per rotated pair,
    and an attention factor it always derives from ``factor``, which transformers takes when none is given)."""
    for key in ("short_factor", "long_factor"):
        factors = scaling.get(key)
        if not (isinstance(factors, list) and len(factors) == dim // 2):
            raise GenieBuildError(where, f"longrope {key} must list {dim // 2} factors (half the head dim {dim})")
    factor = scaling["factor"]
    if not factor >= 1:
        raise GenieBuildError(where, f"longrope factor {factor} is below 1: Genie's attention factor then differs "
                                     "from transformers' (1)")
    if scaling.get("attention_factor") is not None:
        raise GenieBuildError(where, "longrope attention_factor: Genie derives the attention factor from factor "
                                     "and original_max_position_embeddings and reads no other")


def _check_quantization(quantization: Any, where: str | os.PathLike[str]) -> None:
    """No ``quantization_config``, or FP8 with block scales (what the export dequantizes as transformers does)."""
    if quantization is None:
        return
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    if method != "fp8":
        raise GenieBuildError(where, f"quantization_config.quant_method {method!r} is not supported: the export "
                                     "reads float weights, or FP8 ones with block scales (quant_method fp8); give "
                                     "the float checkpoint")
    block = quantization.get("weight_block_size")
    problems = [f"{key} {quantization.get(key)!r}" for key, allowed in (("fmt", (None, "e4m3")),
                                                                          ("activation_scheme", (None, "dynamic")))
                if quantization.get(key) not in allowed]
    if not (isinstance(block, list) and len(block) == 2 and all(is_json_int(n) and n > 0 for n in block)):
        problems.append(f"weight_block_size {block!r}")
    if problems:
        raise GenieBuildError(where, f"quantization_config: FP8 is read as e4m3 weights with dynamic activations "
                                     f"and a [rows, cols] weight_block_size; got {', '.join(problems)}")


def sliding_window(config: Mapping[str, Any]) -> int | None:
    """The sliding window transformers gives the model's attention (its family's default when config.json leaves
    it out; None when off)."""
    family = family_of(config.get("model_type"))
    if family is None or (family.sliding_window_switch and not config.get(family.sliding_window_switch, False)):
        return None
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and "sliding_attention" not in layer_types:
        return None
    window = config.get("sliding_window", family.defaults.get("sliding_window"))
    return window if is_json_int(window) else None


def check_settings(config: Mapping[str, Any], where: str | os.PathLike[str], *, ar: int, context: int) -> None:
    """The export's AR and context fit the model: 2 <= AR < CL, CL at most max_position_embeddings, and no
    sliding window that takes effect within CL (Genie's graphs attend to the whole context in every layer).

    Raises:
        GenieBuildError: naming the config key (``config export.ar``, ``config export.context``) or ``where``.
    """
    if not 2 <= ar < context:
        raise GenieBuildError("config export.ar", f"{ar} must be at least 2 (the token graph has AR 1) and below "
                                                  f"export.context = {context}")
    limit = config.get("max_position_embeddings")
    if is_json_int(limit) and context > limit:
        raise GenieBuildError("config export.context", f"{context} exceeds the model's max_position_embeddings "
                                                       f"{limit} ({os.fspath(where)})")
    scaling = read_rope(dict(config), where).scaling
    if scaling and rope_kind(scaling) == "longrope" and context > scaling["original_max_position_embeddings"]:
        raise GenieBuildError(where, f"longrope with export.context {context} above original_max_position_embeddings "
                                     f"{scaling['original_max_position_embeddings']}: Genie then takes long_factor "
                                     "for every position, transformers only once the sequence is that long; set "
                                     "export.context to at most original_max_position_embeddings")
    window = sliding_window(config)
    if window is not None and window < context:
        raise GenieBuildError(where, f"sliding_window {window} is shorter than export.context {context}: Genie's "
                                     "graphs attend to the whole context in every layer; set export.context to at "
                                     f"most {window}")


def _check_tensors(checkpoint: Checkpoint) -> None:
    """The stored tensors are those ``config.json`` implies: as many layers, each tensor there with its shape, a
    float type (or FP8 with its block scales when the config says so). Other tensors are logged as transformers
    warns of them ("unexpected keys", which it does not load); a layer beyond ``num_hidden_layers`` is refused
    (a model of more layers than the config's).

    Raises:
        GenieBuildError: naming config.json and the layer count, or the file and the tensor, expected and found.
    """
    config_path, shape, headers = checkpoint.directory / CONFIG_NAME, checkpoint.shape, checkpoint.headers
    layers = {int(match[1]) for name in headers if (match := _LAYER_TENSOR.match(name))}
    if layers != set(range(shape.layers)):
        held = f"layers {min(layers)}-{max(layers)}" if layers else "no layer"
        raise GenieBuildError(config_path, f"num_hidden_layers is {shape.layers}, but the checkpoint's tensors hold "
                                           f"{held} ({len(layers)} in all)")
    fp8 = checkpoint.config.get("quantization_config") is not None
    where = checkpoint.weight_files[0]
    expected = list(stored_tensors(shape))
    if shape.tied and LM_HEAD_WEIGHT in headers:
        log.warning("%s: tie_word_embeddings is true, but the checkpoint stores %s: it is read as the LM head, as "
                    "transformers 5 does (it ties the two only where they are equal)", config_path, LM_HEAD_WEIGHT)
        embedding = expected[0]
        expected.append(StoredTensor(LM_HEAD_WEIGHT, embedding.shape, shape.layers + 1, "lm_head"))
    known = {tensor.name for tensor in expected} | {tensor.name + FP8_SCALE_SUFFIX for tensor in expected if fp8}
    unexpected = sorted(set(headers) - known)
    if unexpected:
        log.warning("%s: %d tensor(s) the model does not have are not read (transformers warns of them as unexpected "
                    "and drops them too): %s", where, len(unexpected), ", ".join(unexpected[:5]))
    for tensor in expected:
        header = headers.get(tensor.name)
        if header is None:
            raise GenieBuildError(where, f"has no tensor {tensor.name!r}, which config.json implies "
                                         f"(shape {list(tensor.shape)})")
        if header.shape != tensor.shape:
            raise GenieBuildError(header.file, f"tensor {tensor.name!r} has shape {list(header.shape)}; config.json "
                                               f"implies {list(tensor.shape)}")
        if header.dtype in FLOAT_DTYPES:
            continue
        if not (fp8 and header.dtype == FP8_DTYPE and tensor.kind == "linear"):
            raise GenieBuildError(header.file, f"tensor {tensor.name!r} is {header.dtype}, a quantized weight without "
                                               "a quantization_config the export reads (float weights, or FP8 with "
                                               "block scales)")
        _check_fp8_scale(tensor.name, header, headers.get(tensor.name + FP8_SCALE_SUFFIX))


def _check_fp8_scale(name: str, weight: StoredHeader, scale: StoredHeader | None) -> None:
    """An FP8 weight's scales tile it as transformers requires (the block is the weight's shape over the grid's)."""
    if scale is None:
        raise GenieBuildError(weight.file, f"FP8 tensor {name!r} has no {name + FP8_SCALE_SUFFIX!r} "
                                           "(quantization_config fp8 stores block scales beside each weight)")
    if scale.dtype not in FLOAT_DTYPES or len(scale.shape) != 2 or any(
            n == 0 or size % n for size, n in zip(weight.shape, scale.shape)):
        raise GenieBuildError(scale.file, f"tensor {name + FP8_SCALE_SUFFIX!r} ({scale.dtype} "
                                          f"{list(scale.shape)}) is not a grid of block scales of "
                                          f"{list(weight.shape)}")


def tensor_headers(directory: str | os.PathLike[str]) -> dict[str, StoredHeader]:
    """Every stored tensor's type, shape and file, from the headers of the files transformers loads
    (:func:`weight_files`; no weights read): what each shard holds, as transformers loads every tensor of every
    shard whatever the index's ``weight_map`` says.

    Raises:
        GenieBuildError: as :func:`weight_files`, a file whose header is not safetensors', or a tensor held by two
            shards (naming it and both).
    """
    return _read_headers(weight_files(directory))


def _read_headers(files: tuple[Path, ...]) -> dict[str, StoredHeader]:
    """:func:`tensor_headers` of the checkpoint's :func:`weight_files`."""
    headers: dict[str, StoredHeader] = {}
    for path in files:
        if path.name == INDEX_NAME:
            continue
        for name, entry in _safetensors_header(path).items():
            if not (isinstance(entry, dict) and isinstance(entry.get("dtype"), str)
                    and isinstance(entry.get("shape"), list)):
                raise GenieBuildError(path, f"not a safetensors file (tensor {name!r} has no dtype and shape)")
            if name in headers:
                raise GenieBuildError(path, f"holds tensor {name!r}, which {headers[name].file.name} holds too: "
                                            "which copy a reader takes is not defined; keep one")
            headers[name] = StoredHeader(entry["dtype"], tuple(entry["shape"]), path)
    return headers


def tensor_files(directory: str | os.PathLike[str]) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (:func:`tensor_headers`).

    Raises:
        GenieBuildError: as :func:`tensor_headers`.
    """
    return {name: header.file for name, header in tensor_headers(directory).items()}


def stored_name(name: str, tied: bool, stored: Collection[str]) -> str:
    """The stored tensor transformers 5 loads into the model's tensor ``name``: a tied LM head is the embedding
    table, unless the checkpoint also stores ``lm_head.weight`` (transformers 5 then keeps the stored head where it
    differs from the table, and where it does not, the two are one)."""
    return EMBED_WEIGHT if tied and name == LM_HEAD_WEIGHT and LM_HEAD_WEIGHT not in stored else name


def _safetensors_header(path: Path) -> dict[str, Any]:
    """A safetensors file's JSON header (8-byte length, then the header) less its ``__metadata__``: tensor name ->
    its dtype, shape and offsets.

    Raises:
        GenieBuildError: the file is too short or its header is not a safetensors header.
    """
    try:
        with open(path, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if not 0 < length <= SAFETENSORS_HEADER_LIMIT:
                raise ValueError(f"header length {length}")
            header = json.loads(handle.read(length))
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad JSON or UTF-8; RecursionError: deep JSON
        raise GenieBuildError(path, f"not a safetensors file (its header cannot be read: "
                                    f"{type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(header, dict):
        raise GenieBuildError(path, "not a safetensors file (its header is not a JSON object)")
    return {name: entry for name, entry in header.items() if name != "__metadata__"}


def _index_shards(index: Any, where: Path) -> list[str]:
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(name, str) and name and os.path.basename(name) == name for name in weight_map.values()):
        raise GenieBuildError(where, "not a safetensors index: it needs a non-empty weight_map of tensor name -> "
                                     "shard file name in the same directory")
    return sorted(set(weight_map.values()))
