"""A real ``tokenizer.json`` for the demo model: byte-level BPE trained on a shipped English corpus.

The vocabulary has exactly ``vocab`` entries: the special tokens first (ids 0, 1, 2), then the 256
byte symbols, then BPE merges. When the corpus runs out of merges before ``vocab``, the remaining ids
are filled with reserved special tokens ``<|reserved_0|>``, ``<|reserved_1|>``, … (as real models pad
their vocabularies), so the embedding and LM head sizes always match the tokenizer.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from genie_build.errors import GenieBuildError
from genie_build.fileio import write_text

__all__ = ["BOS_TOKEN_ID", "EOS_TOKEN_ID", "MIN_VOCAB", "SPECIAL_TOKENS", "build_tokenizer", "reserved_token",
           "train_tokenizer"]

ENDOFTEXT = "<|endoftext|>"
SPECIAL_TOKENS = (ENDOFTEXT, "<|im_start|>", "<|im_end|>")
BOS_TOKEN_ID = SPECIAL_TOKENS.index(ENDOFTEXT)
EOS_TOKEN_ID = SPECIAL_TOKENS.index(ENDOFTEXT)
BYTE_SYMBOLS = 256
MIN_VOCAB = len(SPECIAL_TOKENS) + BYTE_SYMBOLS


def reserved_token(index: int) -> str:
    return f"<|reserved_{index}|>"


def _empty_tokenizer() -> Tokenizer:
    """Byte-level BPE with NFC normalization: every NFC string round-trips through encode/decode."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def build_tokenizer(corpus: str | Path, vocab: int) -> Tokenizer:
    """Train the tokenizer on ``corpus`` to exactly ``vocab`` entries (padding with reserved tokens).

    Raises:
        GenieBuildError: the corpus is missing or empty, or ``vocab`` is below :data:`MIN_VOCAB`.
    """
    if vocab < MIN_VOCAB:
        raise GenieBuildError("demo.vocab", f"{vocab} is below {MIN_VOCAB} (special tokens + 256 byte symbols)")
    corpus = Path(corpus)
    if not corpus.is_file() or corpus.stat().st_size == 0:
        raise GenieBuildError(corpus, "corpus file not found or empty")
    tokenizer = _empty_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train([str(corpus)], trainer)
    missing = vocab - tokenizer.get_vocab_size(with_added_tokens=True)
    tokenizer.add_special_tokens([AddedToken(reserved_token(k), special=True, normalized=False)
                                  for k in range(missing)])
    return tokenizer


def train_tokenizer(corpus: str | Path, vocab: int, out_path: str | Path) -> None:
    """Train on ``corpus`` and write ``tokenizer.json`` to ``out_path`` (same bytes on every run).

    Raises:
        GenieBuildError: see :func:`build_tokenizer`; or the file could not be written.
    """
    write_text(out_path, build_tokenizer(corpus, vocab).to_str(pretty=True))
