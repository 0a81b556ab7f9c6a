"""The model, its tokenizer and its ``config.json`` checked against each other, before anything is converted.

Genie takes the vocabulary width, the special ids and the RoPE and KV dims from the bundle's ``genie_config.json``,
which genie-build writes from ``config.json`` (:func:`genie_build.genie_config.make_genie_config`), while the
graphs carry their own widths and the tokenizer its own ids. When they disagree a bundle still builds and then
fails on the phone (``n-vocab`` wider than the logits, a token id past them), so every disagreement is an error
here; a warning is kept for what Genie tolerates. The graphs are given as IO specs, so a caller with graphs of its
own (the demo's, an export's) checks them the same way: :func:`check_consistency`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from genie_build.conventions import KV_TENSOR, LOGITS, POS_COS, POS_SIN, Tensor
from genie_build.errors import GenieBuildError
from genie_build.fileio import is_json_int
from genie_build.genie_config import make_genie_config
from genie_build.hf_config import head_dim, load_hf_config
from genie_build.tokens import beyond_vocabulary

__all__ = ["Graphs", "check_consistency"]

Graphs = Mapping[str, tuple[Sequence[Tensor], Sequence[Tensor]]]


@dataclass(frozen=True)
class _Disagreement:
    """One thing two of the inputs say differently: ``where`` is the file to fix."""

    where: str
    problem: str

    def __str__(self) -> str:
        return f"{self.where}: {self.problem}"


def check_consistency(graphs: Graphs, tokenizer_path: str | os.PathLike[str],
                      hf_config_path: str | os.PathLike[str]) -> list[str]:
    """Check the graphs (``{"prompt": (inputs, outputs), "token": ...}``), the tokenizer and ``config.json`` against
    each other (:func:`_disagreements`), and everything the bundle's ``genie_config.json`` will be made of.

    Returns:
        Warnings: what Genie tolerates but a user may not mean.

    Raises:
        GenieBuildError: one line naming the file of the first disagreement and listing every one.
    """
    found, warnings = _disagreements(graphs, tokenizer_path, hf_config_path)
    if found:
        where = found[0].where
        listed = "; ".join(item.problem if item.where == where else str(item) for item in found)
        raise GenieBuildError(where, f"{len(found)} disagreement(s) between the model, its tokenizer and its "
                                     f"config.json: {listed}")
    return warnings


def _disagreements(graphs: Graphs, tokenizer_path: str | os.PathLike[str],
                   hf_config_path: str | os.PathLike[str]) -> tuple[list[_Disagreement], list[str]]:
    """Every disagreement, and the warnings:

    - the logits' width is ``config.json``'s ``vocab_size`` (Genie's ``n-vocab``) in every graph;
    - every tokenizer id, added tokens included, lies within the logits (a token past them can be neither fed
      nor produced);
    - ``bos_token_id`` and ``eos_token_id`` are added tokens of the tokenizer and within the logits;
    - ``position_ids_cos``/``_sin`` are ``rope-dim`` (head_dim / 2) wide and the KV cache ``kv-dim`` (head_dim)
      deep, the values genie_config.json gives Genie;
    - and whatever :func:`~genie_build.genie_config.make_genie_config` refuses (RoPE styles, scaling Genie cannot
      express, ...), now rather than after every convert.

    Raises:
        GenieBuildError: the tokenizer or config.json cannot be read at all.
    """
    tokenizer_where, config_where = os.fspath(tokenizer_path), os.fspath(hf_config_path)
    hf_config = load_hf_config(hf_config_path)
    found: list[_Disagreement] = []
    vocab = hf_config.get("vocab_size")
    widths = {kind: width for kind, (_, outputs) in graphs.items() if (width := _logits_width(outputs)) is not None}
    found += [_Disagreement(config_where, f"vocab_size is {vocab!r} but the {kind} graph's logits have {width} "
                                         "entries (Genie's n-vocab must be the logits' width)")
              for kind, width in widths.items() if width != vocab]
    width = next(iter(widths.values()), vocab if is_json_int(vocab) else None)
    beyond = beyond_vocabulary(tokenizer_path, width) if width is not None else None
    if beyond is not None:
        found.append(_Disagreement(tokenizer_where, beyond))
    for key in ("bos_token_id", "eos_token_id"):
        ids = hf_config.get(key) if isinstance(hf_config.get(key), list) else [hf_config.get(key)]
        found += [_Disagreement(config_where, f"{key} {token_id} is beyond the model's {width} logits")
                  for token_id in ids if isinstance(token_id, int) and width is not None and token_id >= width]
    found += _rope_and_kv_dims(graphs, hf_config, config_where)
    try:  # everything else the bundle's genie_config.json is made of, now rather than after every convert
        make_genie_config(hf_config, tokenizer_path, ["model.bin"], 1, hf_config_path=hf_config_path)
    except GenieBuildError as exc:
        found.append(_Disagreement(exc.where, exc.problem))
    return found, _warnings(graphs, hf_config, config_where)


def _logits_width(outputs: Sequence[Tensor]) -> int | None:
    logits = next((tensor for tensor in outputs if tensor.name == LOGITS), None)
    width = logits.shape[-1] if logits is not None and logits.shape else None
    return width if isinstance(width, int) else None


def _rope_and_kv_dims(graphs: Graphs, hf_config: dict, where: str) -> list[_Disagreement]:
    """The first tensor of each kind whose dim is not what genie_config.json will tell Genie (one wrong setting
    shows in every layer)."""
    try:
        kv_dim = head_dim(hf_config, where)
    except GenieBuildError:
        return []  # make_genie_config reports it
    expected = {"rope": ("rope-dim", kv_dim // 2), "key": ("kv-dim", kv_dim), "value": ("kv-dim", kv_dim)}
    found, reported = [], set()
    for kind, (inputs, outputs) in graphs.items():
        for tensor in (*inputs, *outputs):
            role, axis = _dim_role(tensor.name)
            if role is None or role in reported or len(tensor.shape) < -axis:
                continue
            setting, value = expected[role]
            if tensor.shape[axis] != value:
                reported.add(role)
                found.append(_Disagreement(where, f"gives {setting} {value} (head_dim {kv_dim}) but {tensor.name} "
                                                 f"in the {kind} graph has shape {list(tensor.shape)}"))
    return found


def _dim_role(name: str) -> tuple[str | None, int]:
    """Which genie_config.json dim a tensor carries, and on which axis (keys are stored transposed)."""
    kv = KV_TENSOR.match(name)
    if kv:
        return kv.group(1), -2 if kv.group(1) == "key" else -1
    return ("rope", -1) if name in (POS_COS, POS_SIN) else (None, 0)


def _warnings(graphs: Graphs, hf_config: dict, where: str) -> list[str]:
    """What Genie runs anyway: a context longer than the model was trained for."""
    longest = hf_config.get("max_position_embeddings")
    lengths = [tensor.shape[-1] for inputs, _ in graphs.values() for tensor in inputs
               if tensor.name == "attention_mask" and tensor.shape and isinstance(tensor.shape[-1], int)]
    if isinstance(longest, int) and lengths and max(lengths) > longest:
        return [f"{where}: max_position_embeddings is {longest} but the graphs' context length is {max(lengths)}: "
                "positions past it were never trained"]
    return []
