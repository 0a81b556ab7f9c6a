"""The texts tokenized once (``tokenize-text``, genie_build.tokens): the ids equal the whole text's encoding though
it is tokenized a chunk at a time, a text too short for its windows or holding an id past the vocabulary is one
line naming the file, and the readers map the ids and read only what they use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from bundle_helpers import demo_hf_config, write_tokenizer
from genie_build import tokens
from genie_build.demo.train_tokenizer import build_tokenizer
from genie_build.errors import GenieBuildError
from genie_build.tokens import check_tokenizer, chunk_starts, read_tokens, text_token_ids, tokenize_text

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "resources" / "tokenizer_corpus.txt"


def _metaspace_tokenizer() -> Tokenizer:
    """A SentencePiece-style BPE (Llama 2, Mistral): ``Metaspace`` marks the start of its input with a space."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer.decoder = decoders.Metaspace(prepend_scheme="first")
    tokenizer.train([str(CORPUS)], trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>"]))
    return tokenizer


@pytest.mark.parametrize("kind", ["byte-level", "metaspace"])
def test_the_ids_are_the_whole_texts_though_tokenized_a_chunk_at_a_time(kind, tmp_path, monkeypatch):
    tokenizer = build_tokenizer(CORPUS, 320) if kind == "byte-level" else _metaspace_tokenizer()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    text = CORPUS.read_text(encoding="utf-8")[:80_000] + "  two spaces\n\n\ttab <unk> end"
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    monkeypatch.setattr(tokens, "CHUNK_CHARS", 3000)
    monkeypatch.setattr(tokens, "SEAM_CHARS", 300)
    assert len(chunk_starts(text, tokenizer)) > 20
    whole = tokenizer.encode(text, add_special_tokens=False).ids
    ids = text_token_ids(tmp_path / "text.txt", tmp_path / "tokenizer.json")
    assert ids.dtype == np.int32 and ids.tolist() == whole


def test_a_text_too_short_for_its_windows_or_past_the_vocabulary_is_one_line_naming_the_file(tmp_path):
    tokenizer = tmp_path / "tokenizer.json"
    build_tokenizer(CORPUS, 320).save(str(tokenizer))
    (tmp_path / "config.json").write_text(json.dumps(demo_hf_config(vocab=320)))
    (tmp_path / "text.txt").write_text("And it came to pass.")
    count = len(Tokenizer.from_file(str(tokenizer)).encode("And it came to pass.").ids)
    out = tmp_path / "tokens.npy"
    with pytest.raises(GenieBuildError, match=rf"text.txt: has {count} tokens, calibration \(8 windows of 4\) needs "
                                              "32: give a longer text"):
        tokenize_text(tmp_path / "text.txt", tokenizer, tmp_path / "config.json", out, needed=32,
                      use="calibration (8 windows of 4)")
    assert not out.exists()   # never repeated to fill the windows
    assert tokenize_text(tmp_path / "text.txt", tokenizer, tmp_path / "config.json", out, needed=count,
                         use="x") == count
    assert read_tokens(out).tolist() == Tokenizer.from_file(str(tokenizer)).encode("And it came to pass.").ids

    highest = int(read_tokens(out).max())
    (tmp_path / "config.json").write_text(json.dumps(demo_hf_config(vocab=highest)))
    result = subprocess.run([sys.executable, "-m", "genie_build", "tokenize-text", "--text", str(tmp_path / "text.txt"),
                             "--tokenizer", str(tokenizer), "--hf-config", str(tmp_path / "config.json"),
                             "--needed", "1", "--use", "evaluation", "--out", str(tmp_path / "past.npy")],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"genie-build: error: {tokenizer}: gives {tmp_path / 'text.txt'} token id {highest}, beyond the vocab_size "
        f"{highest} of {tmp_path / 'config.json'}"]
    assert not (tmp_path / "past.npy").exists()


def test_the_tokenizer_is_checked_against_vocab_size_naming_its_highest_token(tmp_path):
    tokenizer = write_tokenizer(tmp_path / "tokenizer.json", 64)
    (tmp_path / "config.json").write_text(json.dumps(demo_hf_config(vocab=64)))
    check_tokenizer(tokenizer, tmp_path / "config.json")
    loaded = Tokenizer.from_file(str(tokenizer))
    loaded.add_special_tokens([AddedToken("<|extra|>", special=True)])
    loaded.save(str(tokenizer))
    with pytest.raises(GenieBuildError, match=r"tokenizer.json: token '<\|extra\|>' has id 64, beyond the model's 64 "
                                              r"logits \(ids 0..63\), the vocab_size of .*config.json$"):
        check_tokenizer(tokenizer, tmp_path / "config.json")


def test_the_readers_map_the_ids_and_refuse_a_file_of_other_settings(tmp_path):
    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(1000, dtype=np.int32))
    window = read_tokens(path, 16)
    assert isinstance(window, np.memmap) and window.tolist() == list(range(16))
    with pytest.raises(GenieBuildError, match=r"tokens.npy: holds 1000 token ids, 1001 are needed: it was written "
                                              r"for other settings"):
        read_tokens(path, 1001)
    np.save(path, np.arange(4, dtype=np.int64))
    with pytest.raises(GenieBuildError, match="tokens.npy: holds int64 of 1 dimensions, not int32 token ids"):
        read_tokens(path)
    path.write_bytes(b"not an array")
    with pytest.raises(GenieBuildError, match="tokens.npy: not a token ids file"):
        read_tokens(path)
