"""Arguments the commands share (genie_build.cli_args), and the values the rules pass instead of flag strings."""

from __future__ import annotations

import argparse
import json

import pytest

from genie_build.cli import main
from genie_build.cli_args import add_split_options, boolean, positive_float, positive_int, split_options
from genie_build.errors import GenieBuildError

TINY = {"layers": 1, "hidden": 16, "heads": 1, "kv_heads": 1, "intermediate": 8, "vocab": 300, "context": 8, "ar": 2}


def _split(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    add_split_options(parser)
    return split_options(parser.parse_args(argv))


def test_the_config_split_section_gives_what_the_flags_give() -> None:
    assert _split("--split-json", json.dumps({"num_parts": 3, "max_part_mb": None, "embedding_alone": False,
                                              "boundaries": ["a", "b"]})) == \
        _split("--num-parts", "3", "--embedding-with-layers", "--boundaries", "a", "b")
    assert _split("--split-json", '{"max_part_mb": 2.5, "embedding_alone": true}') == _split("--max-part-mb", "2.5")


@pytest.mark.parametrize("argv, problem", [
    (("--split-json", '{"num_parts": 3, "max_part_mb": 2}'), "exactly one of num_parts and max_part_mb"),
    (("--split-json", '{"embedding_alone": true}'), "exactly one of num_parts and max_part_mb"),
    (("--split-json", "[3]"), "expected a JSON object"),
    (("--split-json", '{"num_parts": 3}', "--boundaries", "a"), "give them there"),
])
def test_a_bad_split_section_is_one_error(argv: tuple[str, ...], problem: str) -> None:
    with pytest.raises(GenieBuildError, match=problem):
        _split(*argv)


def test_argument_types() -> None:
    assert (positive_float("0.5"), positive_int("3"), boolean("True"), boolean("false")) == (0.5, 3, True, False)
    for convert, text in ((positive_float, "0"), (positive_float, "nan"), (positive_int, "0"), (boolean, "yes")):
        with pytest.raises(argparse.ArgumentTypeError):
            convert(text)


def test_generate_demo_takes_the_shape_as_json_with_the_bytes_of_the_options(tmp_path) -> None:
    options = [item for key, value in TINY.items() for item in (f"--{key.replace('_', '-')}", str(value))]
    assert main(["generate-demo", "--out-dir", str(tmp_path / "flags"), *options]) == 0
    assert main(["generate-demo", "--out-dir", str(tmp_path / "json"), "--shape-json",
                 json.dumps({**TINY, "rope_theta": 1000000})]) == 0
    for name in ("prompt.onnx", "prompt.onnx.data", "token.onnx", "config.json"):
        assert (tmp_path / "json" / name).read_bytes() == (tmp_path / "flags" / name).read_bytes(), name


def test_generate_demo_refuses_an_unknown_shape_field(tmp_path, capsys) -> None:
    assert main(["generate-demo", "--out-dir", str(tmp_path), "--shape-json", '{"layer": 2}']) == 2
    assert "--shape-json: unknown fields ['layer']" in capsys.readouterr().err
