"""The demo tokenizer: exact vocabulary size, special tokens, round trips, deterministic bytes, the corpus."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from genie_build import cli
from genie_build.demo.train_tokenizer import (BOS_TOKEN_ID, EOS_TOKEN_ID, MIN_VOCAB, SPECIAL_TOKENS, reserved_token,
                                              train_tokenizer)
from genie_build.errors import GenieBuildError

CORPUS = Path(__file__).resolve().parents[1] / "resources" / "tokenizer_corpus.txt"
TEXTS = ("Return a new list containing all items from the iterable in ascending order.",
         "  leading spaces,\ttabs and\nnew lines  ", "naïve café — 数学 ≤ 1e-6 🙂", "")


@pytest.fixture(scope="module")
def demo_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer(CORPUS, 2048, path)
    return path


def test_corpus_is_shippable_text() -> None:
    data = CORPUS.read_bytes()
    assert 150_000 <= len(data) <= 300_000
    header = data.decode("utf-8").splitlines()[0]
    assert "standard-library" in header and "PSF License" in header


def test_vocab_has_exactly_the_requested_entries(demo_tokenizer: Path) -> None:
    tokenizer = Tokenizer.from_file(str(demo_tokenizer))
    assert tokenizer.get_vocab_size(with_added_tokens=True) == 2048
    assert sorted(tokenizer.get_vocab(with_added_tokens=True).values()) == list(range(2048))
    assert tokenizer.token_to_id(reserved_token(0)) is None   # the corpus is big enough: no padding


def test_special_tokens_and_config_ids(demo_tokenizer: Path) -> None:
    tokenizer = Tokenizer.from_file(str(demo_tokenizer))
    assert [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS] == [0, 1, 2]
    assert tokenizer.id_to_token(BOS_TOKEN_ID) == tokenizer.id_to_token(EOS_TOKEN_ID) == "<|endoftext|>"
    assert tokenizer.encode("<|im_start|>user<|im_end|>").ids[0] == 1   # specials are never split


@pytest.mark.parametrize("text", TEXTS)
def test_text_round_trips(demo_tokenizer: Path, text: str) -> None:
    tokenizer = Tokenizer.from_file(str(demo_tokenizer))
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids) == text


def test_merges_compress_english(demo_tokenizer: Path) -> None:
    tokenizer = Tokenizer.from_file(str(demo_tokenizer))
    assert len(tokenizer.encode(TEXTS[0]).ids) < len(TEXTS[0]) / 3


def test_output_is_deterministic(demo_tokenizer: Path, tmp_path: Path) -> None:
    train_tokenizer(CORPUS, 2048, tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == demo_tokenizer.read_bytes()


def test_small_corpus_is_padded_with_reserved_tokens(tmp_path: Path) -> None:
    corpus = tmp_path / "tiny.txt"
    corpus.write_text("the cat sat on the mat\n" * 20, encoding="utf-8")
    train_tokenizer(corpus, 400, tmp_path / "tokenizer.json")
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tokenizer.get_vocab_size(with_added_tokens=True) == 400
    first_reserved = tokenizer.token_to_id(reserved_token(0))
    assert MIN_VOCAB < first_reserved < 300
    assert tokenizer.id_to_token(399) == reserved_token(399 - first_reserved)
    assert tokenizer.decode(tokenizer.encode("the mat").ids) == "the mat"


def test_minimum_vocab_has_only_bytes_and_specials(tmp_path: Path) -> None:
    train_tokenizer(CORPUS, MIN_VOCAB, tmp_path / "tokenizer.json")
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == MIN_VOCAB
    assert len(tokenizer.encode("abc").ids) == 3


@pytest.mark.parametrize("vocab, corpus, where", [(MIN_VOCAB - 1, CORPUS, "demo.vocab"),
                                                  (2048, Path("no/such/corpus.txt"), "no/such/corpus.txt")])
def test_bad_input_is_a_one_line_error(tmp_path: Path, vocab: int, corpus: Path, where: str) -> None:
    with pytest.raises(GenieBuildError) as error:
        train_tokenizer(corpus, vocab, tmp_path / "tokenizer.json")
    assert error.value.where == where and "\n" not in str(error.value)
    assert not (tmp_path / "tokenizer.json").exists()


def test_cli(tmp_path: Path, demo_tokenizer: Path) -> None:
    out = tmp_path / "tokenizer.json"
    assert cli.main(["train-tokenizer", "--corpus", str(CORPUS), "--vocab", "2048", "--out", str(out)]) == 0
    assert out.read_bytes() == demo_tokenizer.read_bytes()
