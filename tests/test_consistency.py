"""genie_build.consistency: the graphs, the tokenizer and config.json checked against each other before any convert,
each disagreement one clause of one line naming the file to fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer

from bundle_helpers import demo_hf_config, write_tokenizer
from demo_shapes import SMALL
from genie_build.consistency import check_consistency
from genie_build.errors import GenieBuildError
from genie_build.toolchains.base import TensorInfo

VOCAB, HEAD_DIM, KV_HEADS, CL = 64, 16, 2, 32


def graph(ar: int, *, vocab: int = VOCAB, rope_dim: int = HEAD_DIM // 2, kv_dim: int = HEAD_DIM
          ) -> tuple[tuple[TensorInfo, ...], tuple[TensorInfo, ...]]:
    """A one-layer model's IO as Genie's contract lays it out."""
    inputs = (TensorInfo("input_ids", (1, ar), "int32"), TensorInfo("attention_mask", (1, ar, CL), "float32"),
              TensorInfo("position_ids_cos", (1, 1, ar, rope_dim), "float32"),
              TensorInfo("position_ids_sin", (1, 1, ar, rope_dim), "float32"),
              TensorInfo("past_key_0_in", (1, KV_HEADS, kv_dim, CL - ar), "float32"),
              TensorInfo("past_value_0_in", (1, KV_HEADS, CL - ar, kv_dim), "float32"))
    outputs = (TensorInfo("logits", (1, ar, vocab), "float32"),
               TensorInfo("past_key_0_out", (1, KV_HEADS, kv_dim, ar), "float32"),
               TensorInfo("past_value_0_out", (1, KV_HEADS, ar, kv_dim), "float32"))
    return inputs, outputs


def model(**dims: int) -> dict:
    return {"prompt": graph(8, **dims), "token": graph(1, **dims)}


@pytest.fixture()
def files(tmp_path: Path) -> tuple[Path, Path]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**demo_hf_config(vocab=VOCAB), "max_position_embeddings": CL}))
    return write_tokenizer(tmp_path / "tokenizer.json", VOCAB), config


def edit_config(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def disagreement(graphs: dict, tokenizer: Path, config: Path) -> str:
    with pytest.raises(GenieBuildError) as caught:
        check_consistency(graphs, tokenizer, config)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_model_that_agrees_passes_without_warnings(files: tuple[Path, Path]) -> None:
    assert check_consistency(model(), *files) == []


def test_a_config_vocab_that_is_not_the_logits_width_is_an_error(files: tuple[Path, Path]) -> None:
    tokenizer, config = files
    edit_config(config, vocab_size=2 * VOCAB)
    assert disagreement(model(), tokenizer, config) == (
        f"{config}: 2 disagreement(s) between the model, its tokenizer and its config.json: vocab_size is 128 but the "
        "prompt graph's logits have 64 entries (Genie's n-vocab must be the logits' width); vocab_size is 128 but "
        "the token graph's logits have 64 entries (Genie's n-vocab must be the logits' width)")


def test_a_tokenizer_id_past_the_logits_is_an_error_added_tokens_included(files: tuple[Path, Path],
                                                                         tmp_path: Path) -> None:
    tokenizer, config = files
    wide = write_tokenizer(tmp_path / "wide.json", VOCAB + 10)
    assert disagreement(model(), wide, config) == (
        f"{wide}: 1 disagreement(s) between the model, its tokenizer and its config.json: token 'w73' has id 73, "
        "beyond the model's 64 logits (ids 0..63)")
    added = Tokenizer.from_file(str(tokenizer))
    added.add_special_tokens([AddedToken("<|extra|>", special=True)])
    added.save(str(tmp_path / "added.json"))
    assert "token '<|extra|>' has id 64, beyond the model's 64 logits" in disagreement(
        model(), tmp_path / "added.json", config)


def test_special_ids_must_be_added_tokens_within_the_logits(files: tuple[Path, Path]) -> None:
    tokenizer, config = files
    edit_config(config, eos_token_id=[3, 70])
    message = disagreement(model(), tokenizer, config)
    assert message.startswith(f"{config}: 2 disagreement(s)")
    assert "eos_token_id 70 is beyond the model's 64 logits" in message
    assert f"; {tokenizer}: eos_token_id 70 (from {config}) is not an added token of this tokenizer" in message


@pytest.mark.parametrize(("dims", "clause"), [
    ({"rope_dim": 16}, "gives rope-dim 8 (head_dim 16) but position_ids_cos in the prompt graph has shape "
                       "[1, 1, 8, 16]"),
    ({"kv_dim": 32}, "gives kv-dim 16 (head_dim 16) but past_key_0_in in the prompt graph has shape [1, 2, 32, 24]"),
])
def test_rope_and_kv_dims_must_be_what_genie_config_will_say(files: tuple[Path, Path], dims: dict,
                                                              clause: str) -> None:
    assert clause in disagreement(model(**dims), *files)


def test_what_the_bundles_genie_config_refuses_is_refused_before_any_convert(files: tuple[Path, Path]) -> None:
    tokenizer, config = files
    edit_config(config, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert "rope type 'dynamic' is not supported by Genie" in disagreement(model(), tokenizer, config)


def test_a_context_longer_than_the_model_was_trained_for_is_a_warning(files: tuple[Path, Path]) -> None:
    tokenizer, config = files
    edit_config(config, max_position_embeddings=16)
    assert check_consistency(model(), tokenizer, config) == [
        f"{config}: max_position_embeddings is 16 but the graphs' context length is {CL}: positions past it were "
        "never trained"]


def test_check_contract_refuses_a_disagreement_before_any_split_and_records_it_when_no_bundle_is_built(
        small_demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The workflow's check-contract job runs it: the plan, and so every split and convert, waits for it."""
    from genie_build.cli import main
    wide = write_tokenizer(tmp_path / "tokenizer.json", SMALL.vocab + 1)
    out = tmp_path / "contract_check.json"
    args = ["check-contract", "--prompt", str(small_demo / "prompt.onnx"), "--token", str(small_demo / "token.onnx"),
            "--tokenizer", str(wide), "--hf-config", str(small_demo / "config.json"), "--out", str(out)]
    assert main(args) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"genie-build: error: {wide}: 1 disagreement(s)") and f"has id {SMALL.vocab}, beyond" in last
    assert not out.exists()
    assert main([*args, "--report-only"]) == 0
    assert f"has id {SMALL.vocab}, beyond" in json.loads(out.read_text())["disagreement"]
