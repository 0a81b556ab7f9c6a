"""Fuzzing the three readers of user-supplied documents: on any input they answer with a result, findings,
or a one-line GenieBuildError naming the file or key -- never another exception.

Each fuzzer mutates a valid document (drop a node, replace it with junk, add an unknown key, corrupt the bytes),
so examples get past the first checks and reach the deep ones; bounded to a few seconds each.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundle_helpers import build_reference_bundle
from genie_build.bundle.check_bundle import Finding, check_bundle
from genie_build.config import load_config, validate_config
from genie_build.encodings import Encodings, format_encodings, read_encodings
from genie_build.errors import GenieBuildError

REPO = Path(__file__).resolve().parents[1]
FUZZ = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# ------------------------------------------------------------------------------------------- mutations

_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                  st.sampled_from(["../x", "/abs", "a/b", "SM8750", "packed", "INT", "PER_CHANNEL", "0.6.1",
                                   "1.0.0", "True", "", "-1", "1e400", "nan"]))
JUNK = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
_DROP, _ADD_KEY, _WRAP, _DUPLICATE = "drop", "add-key", "wrap", "duplicate"
OPERATIONS = st.sampled_from(["replace", "replace", _DROP, _ADD_KEY, _WRAP, _DUPLICATE])


def node_paths(node: object, prefix: tuple = ()) -> list[tuple]:
    """The path (keys and list indices) of every node under ``node``, ``()`` for the root."""
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    return [prefix] + [path for key, child in children for path in node_paths(child, (*prefix, key))]


def mutate(document: object, path: tuple, operation: str, junk: object) -> object:
    """A copy of ``document`` with the node at ``path`` changed by ``operation``."""
    root = {"": copy.deepcopy(document)}  # a parent for the document itself, so the root can be replaced too
    parent, key = root, ""
    for step in path:
        parent, key = parent[key], step
    node = parent[key]
    if operation == _DROP and path:
        del parent[key]
    elif operation == _ADD_KEY and isinstance(node, dict):
        node[f"unknown_{len(node)}"] = junk
    elif operation == _WRAP:
        parent[key] = [node]
    elif operation == _DUPLICATE and isinstance(node, list) and node:
        node.append(copy.deepcopy(node[-1]))
    else:
        parent[key] = junk
    return root[""]


@st.composite
def mutated(draw: st.DrawFn, document: object, max_mutations: int = 2) -> object:
    """``document`` after 1..``max_mutations`` random mutations."""
    for _ in range(draw(st.integers(1, max_mutations))):
        path = draw(st.sampled_from(node_paths(document)))
        document = mutate(document, path, draw(OPERATIONS), draw(JUNK))
    return document


@st.composite
def corrupted_bytes(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` truncated, with a byte overwritten, or with random bytes spliced in."""
    cut = draw(st.integers(0, len(data)))
    kind = draw(st.sampled_from(["truncate", "overwrite", "splice"]))
    if kind == "truncate":
        return data[:cut]
    if kind == "overwrite" and cut < len(data):
        return data[:cut] + bytes([draw(st.integers(0, 255))]) + data[cut + 1:]
    return data[:cut] + draw(st.binary(max_size=8)) + data[cut:]


def assert_one_line_naming(error: GenieBuildError, where: str) -> None:
    message = str(error)
    assert "\n" not in message and message.startswith(where), message


# ------------------------------------------------------------------------------------------- encodings

V100 = {
    "version": "1.0.0",
    "activation_encodings": [
        {"name": "input_ids", "dtype": "INT", "enc_type": "PER_TENSOR", "bw": 16, "is_sym": False,
         "scale": [0.001], "offset": [-32768]},
        {"name": "attention_mask", "dtype": "FLOAT", "enc_type": "PER_TENSOR", "bw": 16},
    ],
    "param_encodings": [
        {"name": "model.layers.0.mlp.up_proj.weight", "dtype": "INT", "enc_type": "PER_CHANNEL", "bw": 4,
         "is_sym": True, "scale": [0.1, 0.2], "offset": [-8, -8]},
        {"name": "model.layers.0.mlp.down_proj.weight", "dtype": "INT", "enc_type": "PER_BLOCK", "bw": 4,
         "is_sym": True, "scale": [0.1, 0.2, 0.3, 0.4], "offset": [-8, -8, -8, -8], "block_size": 2},
        {"name": "lm_head.weight", "dtype": "INT", "enc_type": "LPBQ", "bw": 8, "compressed_bw": 4,
         "is_sym": True, "scale": [0.5, 0.25], "offset": [-128, -128], "block_size": 2,
         "per_block_int_scale": [1, 2, 3, 4]},
    ],
    "quantizer_args": {"activation_bitwidth": 16, "param_bitwidth": 4},
}
V061 = {
    "version": "0.6.1",
    "activation_encodings": {"input_ids": [{"dtype": "int", "bitwidth": 16, "is_symmetric": "False",
                                            "scale": 0.001, "offset": -32768, "min": -32.768, "max": 32.767}],
                             "attention_mask": [{"dtype": "float", "bitwidth": 16}]},
    "param_encodings": {"model.embed_tokens.weight": [
        {"dtype": "int", "bitwidth": 8, "is_symmetric": "True", "scale": 0.01, "offset": -128},
        {"dtype": "int", "bitwidth": 8, "is_symmetric": "True", "scale": 0.02, "offset": -128}]},
    "quantizer_args": {},
}


@pytest.mark.parametrize("valid", [V100, V061], ids=["1.0.0", "0.6.1"])
def test_the_valid_encodings_the_fuzzers_start_from_are_read(tmp_path: Path, valid: dict) -> None:
    path = tmp_path / "e.json"
    path.write_text(json.dumps(valid))
    assert len(read_encodings(path).params) in (1, 3)  # otherwise the mutations below start from an error


def _check_encodings_file(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "fuzz.encodings.json"
        path.write_bytes(data)
        try:
            encodings = read_encodings(path)
        except GenieBuildError as error:
            assert_one_line_naming(error, str(path))
            return
    assert isinstance(encodings, Encodings)
    format_encodings(encodings)  # whatever was accepted can be written as a slice


@FUZZ
@given(document=st.one_of(mutated(V100), mutated(V061)))
def test_encodings_reader_on_mutated_valid_files(document: object) -> None:
    _check_encodings_file(json.dumps(document).encode())


@FUZZ
@given(data=st.one_of(JUNK.map(lambda doc: json.dumps(doc).encode()),
                      corrupted_bytes(json.dumps(V100).encode()), corrupted_bytes(json.dumps(V061).encode()),
                      st.binary(max_size=64)))
def test_encodings_reader_on_random_and_corrupted_bytes(data: bytes) -> None:
    _check_encodings_file(data)


# ------------------------------------------------------------------------------------------- config

DEFAULT_CONFIG = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


@FUZZ
@given(config=mutated(DEFAULT_CONFIG))
def test_config_validator_on_mutated_default_configs(config: object) -> None:
    try:
        result = validate_config(config)
    except GenieBuildError as error:
        assert_one_line_naming(error, "config")
        return
    assert validate_config(result) == result  # accepted configs are complete: validating again changes nothing
    results = Path("/results").resolve()
    assert (results / result["model"]["name"]).resolve().parent == results, "model.name must stay in results/"
    numbers = [v for v in _leaves(result) if isinstance(v, float)]
    assert all(math.isfinite(v) for v in numbers)


def _leaves(node: object) -> list:
    if isinstance(node, dict):
        return [leaf for child in node.values() for leaf in _leaves(child)]
    if isinstance(node, list):
        return [leaf for child in node for leaf in _leaves(child)]
    return [node]


@FUZZ
@given(data=st.one_of(corrupted_bytes((REPO / "config" / "config.yaml").read_bytes()),
                      st.text(alphabet=st.sampled_from("ab:{}[]-&*!|>'\"\n #?,.0%@`"), max_size=40)
                      .map(str.encode)))
def test_config_loader_on_corrupted_yaml_files(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "config.yaml"
        path.write_bytes(data)
        try:
            load_config(path)
        except GenieBuildError as error:
            assert_one_line_naming(error, str(path))


# ------------------------------------------------------------------------------------------- bundle checker

BUNDLE_FILES = ("genie_config.json", "htp_backend_ext_config.json", "metadata.yaml")


@pytest.fixture(scope="module")
def reference_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real reference bundle (ctx-bins, metadata, manifest) and the HF config it was made from."""
    build = build_reference_bundle(tmp_path_factory.mktemp("fuzz-bundle"))
    return build.bundle, build.source / "config.json"


def test_the_bundle_the_fuzzer_starts_from_passes(reference_bundle: tuple[Path, Path]) -> None:
    bundle, hf_config = reference_bundle
    assert [f for f in check_bundle(bundle, hf_config, "SM8750") if f.severity == "error"] == []


def _load(name: str, data: bytes) -> object:
    return yaml.safe_load(data) if name.endswith(".yaml") else json.loads(data)


def _dump(name: str, document: object) -> bytes:
    return (yaml.safe_dump(document) if name.endswith(".yaml") else json.dumps(document)).encode()


@st.composite
def bundle_edit(draw: st.DrawFn, bundle: Path) -> tuple[str, bytes | None]:
    """One file of ``bundle`` and its new bytes (None: deleted), structurally mutated or corrupted."""
    name = draw(st.sampled_from(BUNDLE_FILES))
    data = (bundle / name).read_bytes()
    kind = draw(st.sampled_from(["mutate", "mutate", "corrupt", "delete"]))
    if kind == "delete":
        return name, None
    if kind == "corrupt":
        return name, draw(corrupted_bytes(data))
    return name, _dump(name, draw(mutated(_load(name, data))))


@FUZZ
@given(data=st.data())
def test_bundle_checker_on_mutated_bundles(reference_bundle: tuple[Path, Path], data: st.DataObject) -> None:
    bundle, hf_config = reference_bundle
    name, new_bytes = data.draw(bundle_edit(bundle))
    with tempfile.TemporaryDirectory() as scratch:
        copy_dir = shutil.copytree(bundle, Path(scratch) / "bundle")
        if new_bytes is None:
            (copy_dir / name).unlink()
        else:
            (copy_dir / name).write_bytes(new_bytes)
        try:
            findings = check_bundle(copy_dir, hf_config, "SM8750")
        except GenieBuildError as error:
            assert "\n" not in str(error)
            return
    assert all(isinstance(finding, Finding) for finding in findings)
    if new_bytes != (bundle / name).read_bytes():
        assert any(f.severity == "error" for f in findings), f"a changed {name} passed the manifest check"
