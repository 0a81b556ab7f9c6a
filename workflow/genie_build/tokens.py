"""A text as the model's token ids, tokenized once (the ``tokenize-text`` command) for every job that reads it.

The calibration chain's units and the evaluation read the ids file (a ``.npy`` of int32, :func:`read_tokens`),
mapped, taking only the windows they use, so their memory does not grow with the text. Tokenizing is the one step
that holds the whole text: it holds the text, its ids and one chunk's encoding (:func:`text_token_ids`), and it
checks what every reader would otherwise find too late: that the text fills the windows asked (no text is repeated
to fill them), and that every id lies within ``config.json``'s ``vocab_size`` (an embedding lookup past it is no
error message but a crash).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from genie_build.errors import GenieBuildError
from genie_build.fileio import atomic_open, is_json_int, read_text, regular_file_size, write_json
from genie_build.genie_config import load_tokenizer
from genie_build.hf_config import load_hf_config
from genie_build.units import MIB

__all__ = ["MAX_TEXT_BYTES", "TOKEN_DTYPE", "beyond_vocabulary", "check_host_prompt", "check_tokenizer", "chunk_starts",
           "host_prompt", "mapped_array", "read_tokens", "text_token_ids", "tokenize_text", "vocab_size"]

# A few windows of text are used: a larger file is a mistake
MAX_TEXT_BYTES = 64 * MIB
TOKEN_DTYPE = np.dtype("<i4")
CHUNK_CHARS = 1 << 20
SEAM_CHARS = 1 << 10   # far more than a pre-tokenizer looks around a character
SEAM_TRIES = 8


def vocab_size(hf_config_path: str | os.PathLike[str]) -> int:
    """``config.json``'s ``vocab_size``.

    Raises:
        GenieBuildError: the config is unreadable or its ``vocab_size`` is not a positive integer.
    """
    vocab = load_hf_config(hf_config_path).get("vocab_size")
    if not (is_json_int(vocab) and vocab > 0):
        raise GenieBuildError(hf_config_path, f"vocab_size must be a positive integer, got {vocab!r}")
    return vocab


def beyond_vocabulary(tokenizer_path: str | os.PathLike[str], width: int) -> str | None:
    """What is wrong when the tokenizer's highest id (added tokens too) is not below ``width``, else None: a token
    past the model's logits can be neither fed nor produced."""
    vocabulary = load_tokenizer(tokenizer_path).get_vocab(with_added_tokens=True)
    token, token_id = max(vocabulary.items(), key=lambda item: item[1], default=("", -1))
    if token_id < width:
        return None
    return f"token {token!r} has id {token_id}, beyond the model's {width} logits (ids 0..{width - 1})"


def check_tokenizer(tokenizer_path: str | os.PathLike[str], hf_config_path: str | os.PathLike[str],
                    vocab: int | None = None) -> None:
    """Every id of the tokenizer within ``config.json``'s ``vocab_size`` (``vocab``, when the config was read
    already): what a checkpoint's export makes the logits' width, so this runs before any export.

    Raises:
        GenieBuildError: naming the tokenizer and its highest token, or a file that cannot be read.
    """
    vocab = vocab_size(hf_config_path) if vocab is None else vocab
    problem = beyond_vocabulary(tokenizer_path, vocab)
    if problem is not None:
        raise GenieBuildError(tokenizer_path, f"{problem}, the vocab_size of {os.fspath(hf_config_path)}")


def text_token_ids(text_path: str | os.PathLike[str], tokenizer_path: str | os.PathLike[str]) -> np.ndarray:
    """The text as token ids (Hugging Face ``tokenizers``, no special tokens added: windows are cut anywhere in the
    text), int32, tokenized a chunk at a time (:func:`chunk_starts`), so that memory holds the text and its ids and
    one chunk's encoding (a whole text's encoding holds about 300 bytes a token).

    Raises:
        GenieBuildError: a file that is missing, unreadable, not UTF-8 or larger than :data:`MAX_TEXT_BYTES`.
    """
    tokenizer = load_tokenizer(tokenizer_path)
    text = read_text(text_path, max_bytes=MAX_TEXT_BYTES)
    starts = [*chunk_starts(text, tokenizer), len(text)]
    chunks = [_ids(tokenizer, text[start:end]) for start, end in zip(starts, starts[1:])]
    return np.concatenate(chunks) if chunks else np.zeros(0, TOKEN_DTYPE)


def chunk_starts(text: str, tokenizer: Tokenizer) -> list[int]:
    """Where the text's chunks of about :data:`CHUNK_CHARS` characters start: each cut just before a line break (or
    a space, in a text of long lines) where the tokenizer gives the text around it, :data:`SEAM_CHARS` on each side,
    the tokens of its two sides, so the chunks' tokens are the whole text's (a byte-level BPE and a ``Metaspace``
    one, which marks the start of its input, both have such cuts). Where none is found, the text is one chunk."""
    starts = [0]
    while len(text) - starts[-1] > CHUNK_CHARS:
        cut = _seam(text, tokenizer, starts[-1] + CHUNK_CHARS)
        if cut is None:
            return [0]
        starts.append(cut)
    return starts


def _seam(text: str, tokenizer: Tokenizer, after: int) -> int | None:
    candidates = [position for separator in ("\n", " ") for position in _positions(text, separator, after)]
    for cut in candidates:
        left, right = text[max(0, cut - SEAM_CHARS):cut], text[cut:cut + SEAM_CHARS]
        if right and np.array_equal(_ids(tokenizer, left + right),
                                    np.concatenate([_ids(tokenizer, left), _ids(tokenizer, right)])):
            return cut
    return None


def _positions(text: str, separator: str, after: int) -> list[int]:
    """The first :data:`SEAM_TRIES` positions of ``separator`` at or after ``after``."""
    found: list[int] = []
    position = text.find(separator, after)
    while position >= 0 and len(found) < SEAM_TRIES:
        found.append(position)
        position = text.find(separator, position + 1)
    return found


def _ids(tokenizer: Tokenizer, text: str) -> np.ndarray:
    return np.array(tokenizer.encode(text, add_special_tokens=False).ids, dtype=TOKEN_DTYPE)


def tokenize_text(text_path: str | os.PathLike[str], tokenizer_path: str | os.PathLike[str],
                  hf_config_path: str | os.PathLike[str], out: str | os.PathLike[str], *, needed: int,
                  use: str) -> int:
    """The ``tokenize-text`` command: the text's ids into ``out`` (``.npy``, int32), checked to fill ``needed``
    tokens (``use``: what needs them, for the message) and to lie within ``config.json``'s ``vocab_size``.

    Returns:
        The number of tokens.

    Raises:
        GenieBuildError: the problems of :func:`text_token_ids`, a text of fewer than ``needed`` tokens (naming the
            text, its count and the count needed), or an id beyond the vocabulary (naming the tokenizer).
    """
    vocab = vocab_size(hf_config_path)
    ids = text_token_ids(text_path, tokenizer_path)
    if ids.size < needed:
        raise GenieBuildError(text_path, f"has {ids.size} tokens, {use} needs {needed}: give a longer text")
    if ids.size and int(ids.max()) >= vocab:
        raise GenieBuildError(tokenizer_path, f"gives {os.fspath(text_path)} token id {int(ids.max())}, beyond the "
                                              f"vocab_size {vocab} of {os.fspath(hf_config_path)}")
    with atomic_open(out) as handle:
        np.save(handle, ids, allow_pickle=False)
    return int(ids.size)


def host_prompt(config: Mapping[str, Any]) -> str:
    """The host run's prompt: ``bundle.host_prompt``, or when it is unset one the model can continue (the demo's
    model was trained on the King James Version, resources/training_corpus.txt).

    Args:
        config: a validated config (:func:`genie_build.config.validate_config`).
    """
    from genie_build.config import source_kind  # the config's schema and the demo's shapes: not the token jobs'

    if config["bundle"]["host_prompt"]:
        return config["bundle"]["host_prompt"]
    return "And Moses said unto the LORD" if source_kind(config) == "demo" else "What is 2+3? Explain briefly."


def check_host_prompt(tokenizer_path: str | os.PathLike[str], prompt: str, out: str | os.PathLike[str], *,
                      context_size: int, new_tokens: int) -> list[int]:
    """The ``check-host-prompt`` stage: the host run's prompt, tokenized as Genie tokenizes a first query (a BOS
    first, counted here whether the model has one or not), is not empty and leaves room for its ``new_tokens``
    within ``context_size``; its ids (without the BOS) go to ``out`` (JSON). A job that runs as soon as the tokenizer
    is there, so a prompt the host run cannot take stops the build before the jobs it would end.

    Raises:
        GenieBuildError: ``config bundle.host_prompt``: the prompt's token count, the new tokens and the context size.
    """
    ids = load_tokenizer(tokenizer_path).encode(prompt, add_special_tokens=False).ids
    if not ids or 1 + len(ids) + new_tokens > context_size:
        raise GenieBuildError("config bundle.host_prompt", f"{prompt!r} is {len(ids)} tokens and a BOS; with the "
                                                           f"host run's "
                                                           f"{new_tokens} new tokens it must fit the context size "
                                                           f"{context_size} (bundle.context_size, else the largest "
                                                           "context length): give a shorter prompt, or set "
                                                           "bundle.host_run: false")
    write_json(out, {"prompt": prompt, "prompt_ids": ids, "context_size": context_size, "new_tokens": new_tokens})
    return ids


def mapped_array(path: str | os.PathLike[str], kind: str, dtype: np.dtype, ndim: int, what: str) -> np.ndarray:
    """A ``.npy`` file of ``kind`` the workflow wrote, mapped (nothing read until used), of ``dtype`` and ``ndim``
    dimensions.

    Raises:
        GenieBuildError: not a regular ``.npy`` file, or one of another dtype or rank (``what`` says what it should
            hold).
    """
    regular_file_size(path)   # a regular file, not a link out of the results or a device
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise GenieBuildError(path, f"not a {kind} file: {exc}") from None
    if array.dtype != dtype or array.ndim != ndim:
        raise GenieBuildError(path, f"holds {array.dtype} of {array.ndim} dimensions, not {what}")
    return array


def read_tokens(path: str | os.PathLike[str], count: int | None = None) -> np.ndarray:
    """The first ``count`` ids (None: all) of a file :func:`tokenize_text` wrote, mapped: only the ids used are read.

    Raises:
        GenieBuildError: not such a file, or one of fewer than ``count`` ids (it was written for other settings).
    """
    ids = mapped_array(path, "token ids", TOKEN_DTYPE, 1, "int32 token ids")
    if count is not None and ids.size < count:
        raise GenieBuildError(path, f"holds {ids.size} token ids, {count} are needed: it was written for other "
                                    "settings (rebuild it)")
    return ids[:count]
