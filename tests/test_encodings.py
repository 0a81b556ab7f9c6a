"""Tests for genie_build.encodings and the slice-graph-encodings and slice-encodings commands."""

from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import replace
from pathlib import Path

import hypothesis.strategies as st
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from onnx import TensorProto, helper

from genie_build.cli import main
from genie_build.conventions import part_encodings_path, part_graph_path
from genie_build.encodings import (
    Encodings,
    TensorEncoding,
    check_boundary_consistency,
    check_graphs_consistent,
    format_encodings,
    parse_encodings,
    read_encodings,
    share_encodings,
    slice_encodings,
    validate_against_model,
    write_encodings,
)
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import WeightLayout, part_tensor_names, read_graph_tensors


# ------------------------------------------------------------------------------------------- fixtures

def act(name: str, scale: float = 0.01, offset: int = -32768) -> TensorEncoding:
    return TensorEncoding(name=name, dtype="int", bitwidth=16, scale=(scale,), offset=(offset,))


def every_kind() -> Encodings:
    """One encoding of each kind; dict order deliberately not sorted by name."""
    return Encodings(
        activations={"x": act("x"), "a_float": TensorEncoding(name="a_float", dtype="float", bitwidth=16)},
        params={
            "w_channel": TensorEncoding(name="w_channel", dtype="int", bitwidth=4, kind="per_channel",
                                        is_symmetric=True, scale=(0.5, 0.25, 0.125), offset=(-8, -8, -8)),
            "w_block": TensorEncoding(name="w_block", dtype="int", bitwidth=4, kind="per_block", is_symmetric=True,
                                      scale=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6), offset=(-8,) * 6, block_size=2),
            "w_lpbq": TensorEncoding(name="w_lpbq", dtype="int", bitwidth=8, kind="lpbq", is_symmetric=True,
                                     scale=(0.01, 0.02, 0.03), offset=(-128,) * 3, block_size=2,
                                     compressed_bitwidth=4, per_block_int_scale=(1, 2, 3, 4, 5, 16)),
        },
        quantizer_args={"param_bitwidth": 4, "activation_bitwidth": 16},
    )


V061 = {
    "version": "0.6.1",
    "activation_encodings": {
        "t": [{"bitwidth": 16, "dtype": "int", "is_symmetric": "False", "max": 2.6, "min": -2.1,
               "offset": -114, "scale": 0.0185}],
        "f": [{"bitwidth": 16, "dtype": "float"}],
    },
    "param_encodings": {
        "w": [{"bitwidth": 4, "dtype": "int", "is_symmetric": "True", "max": 0.7, "min": -0.8,
               "offset": -8, "scale": 0.1},
              {"bitwidth": 4, "dtype": "int", "is_symmetric": "True", "max": 1.4, "min": -1.6,
               "offset": -8, "scale": 0.2}],
    },
    "quantizer_args": {"activation_bitwidth": 16, "is_symmetric": "True", "per_channel_quantization": "True"},
}

V100 = {
    "version": "1.0.0",
    "activation_encodings": [
        {"name": "t", "dtype": "INT", "enc_type": "PER_TENSOR", "bw": 16, "is_sym": False,
         "scale": [0.0185], "offset": [-114]},
    ],
    "param_encodings": [
        {"name": "w", "dtype": "INT", "enc_type": "PER_CHANNEL", "bw": 4, "is_sym": True,
         "scale": [0.1, 0.2], "offset": [-8, -8]},
        {"name": "w3", "dtype": "INT", "enc_type": "LPBQ", "bw": 8, "compressed_bw": 4, "is_sym": True,
         "block_size": 2, "scale": [0.1, 0.2], "offset": [-128, -128], "per_block_int_scale": [1, 2, 3, 4]},
    ],
    "quantizer_args": {},
}


def dump(tmp_path: Path, doc: object, name: str = "enc.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def make_onnx(path: Path, nodes: list, inputs: list[str], outputs: list[str],
              initializers: dict[str, tuple[int, ...]]) -> Path:
    """A float model; every value is [1, 4] except outputs, which ONNX needs no shape for here."""
    graph = helper.make_graph(
        nodes, path.stem,
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4]) for name in inputs],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        [helper.make_tensor(name, TensorProto.FLOAT, shape, [0.5] * _count(shape))
         for name, shape in initializers.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _count(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


# The tiny 3-part model: x -> [W1, +cos] -> b1 -> [W2, *cos] -> b2 -> [W3] -> logits.
# cos is a shared input of every part (like RoPE/mask); b1 and b2 are the cut tensors.
PART_NODES = [
    [helper.make_node("MatMul", ["x", "W1"], ["h1"]), helper.make_node("Add", ["h1", "cos"], ["b1"])],
    [helper.make_node("MatMul", ["b1", "W2"], ["h2"]), helper.make_node("Mul", ["h2", "cos"], ["b2"])],
    [helper.make_node("MatMul", ["b2", "W3"], ["logits"])],
]
PART_IO = [(["x", "cos"], ["b1"]), (["b1", "cos"], ["b2"]), (["b2"], ["logits"])]
PART_WEIGHTS = [{"W1": (4, 4)}, {"W2": (4, 4)}, {"W3": (4, 6)}]
LABELS = ["1_of_3", "2_of_3", "3_of_3"]


@pytest.fixture
def three_parts(tmp_path: Path) -> dict[str, Path]:
    """Full model, its encodings and a parts folder with part_{1,2,3}_of_3/{prompt,token}.onnx: the tiny model
    serves as both graphs; ``out`` is the (absent) encodings folder both graphs' slices go into."""
    full = make_onnx(tmp_path / "prompt.onnx", [node for nodes in PART_NODES for node in nodes],
                     ["x", "cos"], ["logits"], {k: v for weights in PART_WEIGHTS for k, v in weights.items()})
    parts = tmp_path / "parts"
    for label, nodes, (inputs, outputs), weights in zip(LABELS, PART_NODES, PART_IO, PART_WEIGHTS):
        for graph in ("prompt", "token"):
            path = part_graph_path(parts, label, graph)
            path.parent.mkdir(parents=True, exist_ok=True)
            make_onnx(path, nodes, inputs, outputs, weights)
    enc = Encodings(
        activations={name: act(name, scale=0.01 * (i + 1))
                     for i, name in enumerate(["x", "cos", "h1", "b1", "h2", "b2", "logits"])},
        params={"W1": TensorEncoding(name="W1", dtype="int", bitwidth=4, kind="per_channel", is_symmetric=True,
                                     scale=(0.1,) * 4, offset=(-8,) * 4),
                "W2": TensorEncoding(name="W2", dtype="int", bitwidth=8, scale=(0.1,), offset=(-128,)),
                "W3": TensorEncoding(name="W3", dtype="int", bitwidth=4, kind="per_block", is_symmetric=True,
                                     scale=(0.1,) * 12, offset=(-8,) * 12, block_size=2)},
    )
    encodings = tmp_path / "prompt.encodings.json"
    write_encodings(encodings, enc)
    return {"model": full, "parts": parts, "encodings": encodings, "out": tmp_path / "out"}


def slice_cli(paths: dict[str, Path], *extra: str, graph: str = "prompt") -> int:
    return main(["slice-graph-encodings", "--graph", graph, "--model", str(paths["model"]),
                 "--encodings", str(paths["encodings"]), "--parts-dir", str(paths["parts"]),
                 "--out-dir", str(paths["out"]), *extra])


def slice_files(out: Path) -> dict[str, bytes]:
    """Every file under ``out`` by its path there."""
    return {str(path.relative_to(out)): path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()}


def listing(root: Path) -> list[str]:
    """Every file and folder under ``root``, hidden ones (a temporary file or folder) included."""
    return sorted(str(path.relative_to(root)) for path in root.rglob("*")) if root.exists() else []


def slice_names(*graphs: str) -> list[str]:
    return sorted(f"part_{label}/{graph}.encodings.json" for label in LABELS for graph in graphs)


# ------------------------------------------------------------------------------------------- read/write

def test_061_reads_strings_and_lists_and_is_written_back_as_061(tmp_path: Path) -> None:
    enc = read_encodings(dump(tmp_path, V061))
    assert enc.version == "0.6.1"
    assert enc.activations["t"] == TensorEncoding(name="t", dtype="int", bitwidth=16, kind="per_tensor",
                                                  is_symmetric=False, scale=(0.0185,), offset=(-114,))
    assert enc.activations["f"] == TensorEncoding(name="f", dtype="float", bitwidth=16)
    assert enc.params["w"].kind == "per_channel" and enc.params["w"].is_symmetric is True
    assert enc.params["w"].scale == (0.1, 0.2)

    write_encodings(tmp_path / "out.json", enc)
    again = read_encodings(tmp_path / "out.json")
    assert again.version == "0.6.1"  # slices keep the version AIMET wrote, for the SDK converter
    assert again == enc
    assert json.loads((tmp_path / "out.json").read_text()) == V061


def test_100_round_trip_is_byte_identical_for_every_kind(tmp_path: Path) -> None:
    original = every_kind()
    write_encodings(tmp_path / "a.json", original)
    read_back = read_encodings(tmp_path / "a.json")
    assert read_back == original
    write_encodings(tmp_path / "b.json", read_back)
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_100_reader_accepts_the_spec_example(tmp_path: Path) -> None:
    enc = read_encodings(dump(tmp_path, V100))
    assert enc.params["w3"].kind == "lpbq"
    assert enc.params["w3"].compressed_bitwidth == 4
    assert enc.params["w3"].per_block_int_scale == (1, 2, 3, 4)


def test_written_entries_are_sorted_and_independent_of_dict_order() -> None:
    enc = every_kind()
    shuffled = Encodings(activations=dict(reversed(enc.activations.items())),
                         params=dict(reversed(enc.params.items())),
                         quantizer_args=dict(reversed(enc.quantizer_args.items())))
    text = format_encodings(enc)
    assert text == format_encodings(shuffled)
    names = [entry["name"] for entry in json.loads(text)["param_encodings"]]
    assert names == sorted(names) == ["w_block", "w_channel", "w_lpbq"]


def _v100_with(**changes: object) -> dict:
    """V100 with the entry for 'w' (the per-channel param) changed; None deletes a key."""
    doc = json.loads(json.dumps(V100))
    _change(doc["param_encodings"][0], changes)
    return doc


def _v061_with(**changes: object) -> dict:
    doc = json.loads(json.dumps(V061))
    _change(doc["param_encodings"]["w"][1], changes)
    return doc


def _change(entry: dict, changes: dict) -> None:
    for key, value in changes.items():
        if value is None:
            del entry[key]
        else:
            entry[key] = value


MALFORMED = {
    "top level list": ([1, 2], "top level is a list"),
    "missing version": ({"activation_encodings": {}, "param_encodings": {}}, "missing 'version'"),
    "unknown version": ({**V100, "version": "3.0.0"}, "version '3.0.0' is not supported"),
    "061 section as list": ({**V061, "activation_encodings": []}, "'activation_encodings' is a list"),
    "100 section as dict": ({**V100, "param_encodings": {}}, "'param_encodings' is an object"),
    "missing section": ({"version": "1.0.0", "activation_encodings": []}, "missing 'param_encodings'"),
    "missing scale": (_v100_with(scale=None), "param encoding 'w': missing 'scale'"),
    "missing bitwidth 061": (_v061_with(bitwidth=None), "param encoding 'w'[1]: missing 'bitwidth'"),
    "int bitwidth 3": (_v100_with(bw=3), "bw 3 is not supported for int"),
    "float bitwidth 8": (_v100_with(dtype="FLOAT", enc_type="PER_TENSOR", bw=8), "bw 8 is not supported for float"),
    "zero scale": (_v100_with(scale=[0.1, 0.0]), "scale[1] 0.0 is not a positive finite number"),
    "negative scale": (_v061_with(scale=-0.2), "scale -0.2 is not a positive finite number"),
    "string scale": (_v100_with(scale=["0.1", 0.2]), "scale[0] '0.1' is not a positive"),
    "count mismatch": (_v100_with(offset=[-8]), "2 scales but 1 offsets"),
    "positive offset": (_v100_with(offset=[-8, 1]), "offset[1] 1 is not an integer in [-15, 0]"),
    "offset below range": (_v061_with(offset=-16), "offset -16 is not an integer in [-15, 0]"),
    "fractional offset": (_v100_with(offset=[-8, -7.5]), "offset[1] -7.5 is not an integer"),
    "unknown enc_type": (_v100_with(enc_type="VECTOR"), "enc_type 'VECTOR' is not supported"),
    "bool bitwidth": (_v100_with(bw=True), "bw True is not supported"),
    "is_symmetric not a bool string": (_v061_with(is_symmetric="yes"), "is_symmetric 'yes'"),
    "is_sym as string in 100": (_v100_with(is_sym="True"), "is_sym 'True' is not true or false"),
    "per-channel entries disagree": (_v061_with(bitwidth=8, offset=-128), "entries disagree"),
    "per-tensor with two scales": (_v100_with(enc_type="PER_TENSOR"), "PER_TENSOR encoding has 2 scales"),
    "per-block without block_size": (_v100_with(enc_type="PER_BLOCK"), "missing 'block_size'"),
    "lpbq compressed wider": (_v100_with(enc_type="LPBQ", block_size=2, compressed_bw=8, bw=4,
                                         per_block_int_scale=[1, 1]), "compressed_bw 8 exceeds bw 4"),
    "lpbq ragged int scales": (_v100_with(enc_type="LPBQ", bw=8, offset=[-128, -128], block_size=2,
                                          compressed_bw=4, per_block_int_scale=[1, 2, 3]),
                               "3 per_block_int_scale values are not a whole number of blocks for 2 channels"),
    "duplicate names": ({**V100, "activation_encodings": V100["activation_encodings"] * 2},
                        "activation encoding 't': appears more than once"),
    "entry without name": ({**V100, "activation_encodings": [{"dtype": "INT"}]},
                           "activation_encodings[0]: missing or empty 'name'"),
    "061 empty list": ({**V061, "param_encodings": {"w": []}}, "param encoding 'w': expected a non-empty list"),
    "float per channel": (_v100_with(dtype="FLOAT", bw=16), "a FLOAT encoding must be PER_TENSOR"),
    "quantizer_args not object": ({**V100, "quantizer_args": [1]}, "'quantizer_args' is a list"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_files_raise_one_line_errors_naming_file_and_tensor(tmp_path: Path, case: str) -> None:
    doc, message = MALFORMED[case]
    path = dump(tmp_path, doc)
    with pytest.raises(GenieBuildError) as caught:
        read_encodings(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: ")
    assert message in text
    assert "\n" not in text


def _v100_lpbq_with(**changes: object) -> dict:
    doc = json.loads(json.dumps(V100))
    _change(doc["param_encodings"][1], changes)
    return doc


# Values that pass as float64 but are not what they say once stored and computed with: the scale in float32 (the
# precision AIMET quantizes in), an LPBQ block scale (channel scale x integer scale) in float32, a grid's ends in
# float32 (a dequantized weight), and an is_sym encoding whose offset is not symmetric.
AS_STORED = {
    "1e-300 is 0": (_v100_with(scale=[0.1, 1e-300]), "param encoding 'w': scale[1] 1e-300 is 0 in float32, the "
                                                      "precision it is computed in: a scale must be a normal float32, "
                                                      "between 1.1754944e-38 and 3.4028235e+38"),
    "1e300 is inf": (_v061_with(scale=1e300), "param encoding 'w': scale[1] 1e+300 is inf in float32"),
    "1e-40 is subnormal": (_v100_with(scale=[1e-40, 0.1]), "scale[0] 1e-40 is subnormal (9.99994610111476e-41) in "
                                                           "float32"),
    "2.0.0 tiny y_scale": ({"version": "2.0.0", "encodings": [{"name": "w", "output_dtype": "int8",
                                                               "y_scale": [0.5, 1e-45], "axis": 0}]},
                           "encoding 'w': scale[1] 1e-45 is subnormal"),
    "lpbq block scale overflows": (_v100_lpbq_with(scale=[3e38, 0.2]),
                                   "param encoding 'w3': scale[0] x per_block_int_scale[1] 6e+38 is inf in float32"),
    "lpbq channel scale 1e-320": (_v100_lpbq_with(scale=[1e-320, 0.2]), "scale[0] 1e-320 is subnormal"),
    "lpbq block scale wider than its bits": (_v100_lpbq_with(per_block_int_scale=[1, 2, 300, 4]),
                                             "per_block_int_scale[2] 300 is more than the 16 a 4-bit block scale "
                                             "holds"),
    "grid beyond float32": (_v100_with(bw=32, offset=[-2**31, -2**31], scale=[1e30, 0.1], is_sym=True),
                            "scale[0] 1.0000000150474662e+30 with offset -2147483648 reaches 2.14748e+39, beyond "
                            "float32"),
    "is_sym with an asymmetric offset": (_v100_with(offset=[-8, -3]), "param encoding 'w': is_sym is true but "
                                                                      "offset[1] is -3, an asymmetric offset"),
    "061 is_symmetric with an asymmetric offset": (_v061_with(offset=-15), "is_sym is true but offset[1] is -15"),
}


@pytest.mark.parametrize("case", sorted(AS_STORED))
def test_values_are_checked_as_they_will_be_stored(tmp_path: Path, case: str) -> None:
    doc, message = AS_STORED[case]
    path = dump(tmp_path, doc)
    with pytest.raises(GenieBuildError) as caught:
        read_encodings(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text, text


@pytest.mark.parametrize("offsets", [[-8, -8], [-7, -7], [0, 0], [-8, 0]])
def test_symmetric_offsets_aimet_writes_are_accepted(tmp_path: Path, offsets: list[int]) -> None:
    """Signed symmetric (-2**(bw-1)), strict symmetric (one more) and unsigned symmetric (0) per channel."""
    assert read_encodings(dump(tmp_path, _v100_with(offset=offsets))).params["w"].offset == tuple(offsets)


@pytest.mark.parametrize(("text", "message"), [("{nope", "not valid JSON"),
                                               ('{"version": "1.0.0", "activation_encodings": [{"name": "t", '
                                                '"dtype": "INT", "enc_type": "PER_TENSOR", "bw": 8, '
                                                '"is_sym": false, "scale": [1e400], "offset": [0]}], '
                                                '"param_encodings": []}', "scale[0] inf is not a positive finite")])
def test_unparsable_text_and_infinite_scale(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "enc.json"
    path.write_text(text)
    with pytest.raises(GenieBuildError, match=re.escape(message)):
        read_encodings(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(GenieBuildError, match="file not found"):
        read_encodings(tmp_path / "absent.json")


# ------------------------------------------------------------------------------------------- fuzz

# Well-formed documents with at most one field per object dropped or replaced by junk, so examples reach
# every check of the reader.
_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-300, 300), st.floats(), st.text(max_size=3))
_JUNK = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8)


def _mutated(fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """An object of valid field values, then one field kept, dropped or replaced by junk."""
    def apply(obj: dict, action: str, key: str, junk: object) -> dict:
        if action == "drop":
            obj.pop(key)
        elif action == "junk":
            obj[key] = junk
        return obj
    return st.builds(apply, st.fixed_dictionaries(fields), st.sampled_from(["keep", "keep", "drop", "junk"]),
                     st.sampled_from(sorted(fields)), _JUNK)


_ENTRY_V100 = _mutated({
    "name": st.sampled_from(["t", "w", "u"]), "dtype": st.sampled_from(["INT", "INT", "FLOAT"]),
    "enc_type": st.sampled_from(["PER_TENSOR", "PER_CHANNEL", "PER_BLOCK", "LPBQ"]),
    "bw": st.sampled_from([4, 8, 16]), "is_sym": st.booleans(),
    "scale": st.lists(st.floats(min_value=1e-6, max_value=10.0), min_size=1, max_size=3),
    "offset": st.lists(st.integers(-15, 0), min_size=1, max_size=3), "block_size": st.integers(1, 4),
    "compressed_bw": st.sampled_from([4, 8]),
    "per_block_int_scale": st.lists(st.integers(1, 16), min_size=1, max_size=6)})
_ENTRY_V061 = _mutated({
    "dtype": st.sampled_from(["int", "int", "float"]), "bitwidth": st.sampled_from([4, 8, 16]),
    "is_symmetric": st.sampled_from(["True", "False", True, False]),
    "scale": st.floats(min_value=1e-6, max_value=10.0), "offset": st.integers(-15, 0),
    "min": st.floats(), "max": st.floats()})
_SECTION_V100 = st.lists(_ENTRY_V100, max_size=2)
_SECTION_V061 = st.dictionaries(st.sampled_from(["t", "w"]), st.lists(_ENTRY_V061, min_size=1, max_size=2))
_DOCUMENT = st.one_of(
    _mutated({"version": st.just("1.0.0"), "activation_encodings": _SECTION_V100,
              "param_encodings": _SECTION_V100, "quantizer_args": st.dictionaries(st.text(max_size=3), _LEAF)}),
    _mutated({"version": st.just("0.6.1"), "activation_encodings": _SECTION_V061,
              "param_encodings": _SECTION_V061, "quantizer_args": st.dictionaries(st.text(max_size=3), _LEAF)}),
    _JUNK,
)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_DOCUMENT)
def test_fuzz_only_genie_build_errors_escape_and_accepted_files_round_trip(doc: object) -> None:
    doc = json.loads(json.dumps(doc))  # exactly what a reader of the file would see
    try:
        enc = parse_encodings(doc, "fuzz.json")
    except GenieBuildError as exc:
        assert "\n" not in str(exc)
        return
    assert _rewritten(enc) == format_encodings(enc)


def _rewritten(enc: Encodings) -> str:
    """Write, read back and write again; text, not Encodings, is compared so a NaN in quantizer_args is equal."""
    return format_encodings(parse_encodings(json.loads(format_encodings(enc)), "out.json"))


_JUNK_VALUES = [None, True, False, 0, -1, 3, 1.5, -0.5, float("nan"), "", "x", "True", [], [None], ["1"], {}, {"a": 1}]
_DROP = object()


def _node_paths(node: object, prefix: tuple = ()) -> list[tuple]:
    """The path (keys and indices) to every node under ``node``."""
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    return [path for key, child in children for path in [(*prefix, key), *_node_paths(child, (*prefix, key))]]


def _mutate(doc: object, path: tuple, replacement: object) -> object:
    copy = json.loads(json.dumps(doc))
    parent = copy
    for key in path[:-1]:
        parent = parent[key]
    if replacement is _DROP:
        del parent[path[-1]]
    else:
        parent[path[-1]] = replacement
    return copy


@pytest.mark.parametrize("base", ["0.6.1", "1.0.0", "every kind"])
def test_every_single_field_drop_or_junk_gives_a_genie_build_error_or_a_valid_read(base: str) -> None:
    doc = {"0.6.1": V061, "1.0.0": V100}.get(base) or json.loads(format_encodings(every_kind()))
    accepted = 0
    for node in _node_paths(doc):
        for replacement in [_DROP, *_JUNK_VALUES]:
            try:
                enc = parse_encodings(_mutate(doc, node, replacement), "enc.json")
            except GenieBuildError as exc:
                assert "\n" not in str(exc)
                continue
            accepted += 1
            assert _rewritten(enc) == format_encodings(enc)
    assert accepted > 0  # e.g. dropping quantizer_args or min/max is fine


# ------------------------------------------------------------------------------------------- validation

def test_validate_names_unknown_tensors_and_counts_them(tmp_path: Path) -> None:
    enc = Encodings(activations={name: act(name) for name in ["x", "ghost_1", "ghost_2"]},
                    params={"ghost_w": act("ghost_w")})
    with pytest.raises(GenieBuildError) as caught:
        validate_against_model(enc, tmp_path / "e.json", {"x"}, {"w": (4, 4)})
    assert str(caught.value) == (f"{tmp_path / 'e.json'}: 3 encodings name tensors the model does not have: "
                                 "activation 'ghost_1', activation 'ghost_2', param 'ghost_w'")


def test_validate_shows_only_a_few_of_many_unknown_names(tmp_path: Path) -> None:
    enc = Encodings(activations={f"ghost_{i:02d}": act(f"ghost_{i:02d}") for i in range(40)})
    with pytest.raises(GenieBuildError, match=r"40 encodings .* 'ghost_04', \.\.\.$"):
        validate_against_model(enc, "e.json", set(), {})


@pytest.mark.parametrize(("name", "shape", "ok"), [
    ("w_channel", (8, 3), True), ("w_channel", (8, 5), False),
    ("w_block", (4, 3), True), ("w_block", (6, 3), False), ("w_block", (5, 3), False), ("w_block", (2, 2, 3), False),
    ("w_lpbq", (4, 3), True), ("w_lpbq", (4, 6), False), ("w_lpbq", (6, 3), False),
])
def test_validate_checks_scale_counts_against_param_shapes(name: str, shape: tuple[int, ...], ok: bool) -> None:
    enc = every_kind()
    enc = replace(enc, activations={}, params={name: enc.params[name]})
    matmul = {name: WeightLayout(len(shape) - 1, len(shape) - 2)}  # an [in, out] MatMul weight
    if ok:
        validate_against_model(enc, "e.json", set(), {name: shape}, matmul)
    else:
        with pytest.raises(GenieBuildError, match=rf"^e\.json: param encoding '{name}': "):
            validate_against_model(enc, "e.json", set(), {name: shape}, matmul)


# ------------------------------------------------------------------------------------------- slicing

def test_part_tensor_names_reads_graph_io_nodes_and_initializers(three_parts: dict[str, Path]) -> None:
    tensors, initializers = part_tensor_names(part_graph_path(three_parts["parts"], "2_of_3", "prompt"))
    assert tensors == {"b1", "cos", "W2", "h2", "b2"}
    assert initializers == {"W2"}


def test_slices_keep_touched_activations_and_own_params_with_identical_boundaries(
        three_parts: dict[str, Path]) -> None:
    enc = read_encodings(three_parts["encodings"])
    slices = {label: slice_encodings(enc, *part_tensor_names(part_graph_path(three_parts["parts"], label, "prompt")))
              for label in LABELS}
    assert set(slices["1_of_3"].activations) == {"x", "cos", "h1", "b1"}
    assert set(slices["2_of_3"].activations) == {"cos", "b1", "h2", "b2"}
    assert set(slices["3_of_3"].activations) == {"b2", "logits"}
    assert [set(s.params) for s in slices.values()] == [{"W1"}, {"W2"}, {"W3"}]
    assert slices["1_of_3"].activations["b1"] == slices["2_of_3"].activations["b1"] == enc.activations["b1"]
    check_boundary_consistency(slices)


def test_boundary_mismatch_names_tensor_and_both_parts() -> None:
    slices = {"02_of_03": Encodings(activations={"b1": act("b1", scale=0.2)}),
              "01_of_03": Encodings(activations={"b1": act("b1", scale=0.1), "h1": act("h1")})}
    with pytest.raises(GenieBuildError) as caught:
        check_boundary_consistency(slices)
    assert str(caught.value) == ("b1: activation encoding differs between part 01_of_03 and part 02_of_03: "
                                 "scale[0] 0.1 vs 0.2")


def test_graphs_consistent_requires_identical_shared_tensors() -> None:
    prompt = every_kind()
    token = replace(prompt, activations={"x": act("x"), "only_token": act("only_token", scale=9.0)})
    check_graphs_consistent(prompt, token)
    token_bad = replace(prompt, params={**prompt.params,
                                        "w_channel": replace(prompt.params["w_channel"], bitwidth=8,
                                                             offset=(-128,) * 3)})
    with pytest.raises(GenieBuildError, match=r"^w_channel: param encoding differs between the prompt graph "
                                              r"and the token graph: bitwidth 4 vs 8; offset\[0\] -8 vs -128 "
                                              r"\(calibrate both graphs together, or set encodings.share_from: "
                                              r"prompt .*\)$"):
        check_graphs_consistent(prompt, token_bad)


# ------------------------------------------------------------------------------------------- the command

def test_command_writes_one_slice_per_part_and_reruns_byte_identical(three_parts: dict[str, Path]) -> None:
    assert slice_cli(three_parts) == 0
    out = three_parts["out"]
    assert listing(out) == sorted([f"part_{label}" for label in LABELS] + slice_names("prompt"))
    first = slice_files(out)
    assert set(read_encodings(part_encodings_path(out, "3_of_3", "prompt")).params) == {"W3"}

    assert slice_cli(three_parts) == 0
    assert slice_files(out) == first


def test_command_failure_leaves_nothing_behind(three_parts: dict[str, Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    enc = read_encodings(three_parts["encodings"])
    write_encodings(three_parts["encodings"], replace(enc, activations={**enc.activations, "ghost": act("ghost")}))
    assert slice_cli(three_parts) == 2
    assert "1 encodings name tensors the model does not have: activation 'ghost'" in capsys.readouterr().err
    assert listing(three_parts["out"]) == []


def test_command_checks_the_other_graphs_encodings(three_parts: dict[str, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    enc = read_encodings(three_parts["encodings"])
    token = tmp_path / "token.encodings.json"
    write_encodings(token, replace(enc, activations={**enc.activations, "cos": act("cos", scale=5.0)}))
    assert slice_cli(three_parts, "--consistent-with", str(token)) == 2
    assert "cos: activation encoding differs between the prompt graph and the token graph" in capsys.readouterr().err
    write_encodings(token, enc)
    assert slice_cli(three_parts, "--consistent-with", str(token)) == 0


def test_command_rejects_an_incomplete_set_of_parts(three_parts: dict[str, Path],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # the token graph's part 2 stays in that folder: only the prompt graph's own parts count
    part_graph_path(three_parts["parts"], "2_of_3", "prompt").unlink()
    assert slice_cli(three_parts) == 2
    assert "prompt parts 1_of_3, 3_of_3 are not exactly parts 1_of_3, 2_of_3, 3_of_3" in capsys.readouterr().err
    assert listing(three_parts["out"]) == []


def test_command_failing_midway_leaves_every_slice_whole(three_parts: dict[str, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Each slice is written atomically: when the disk fills up during the prompt graph's second slice, that slice,
    the ones not reached and the token graph's beside them are as they were, and no temporary file is left."""
    assert slice_cli(three_parts) == 0 and slice_cli(three_parts, graph="token") == 0
    out = three_parts["out"]
    before, names = slice_files(out), listing(out)
    enc = read_encodings(three_parts["encodings"])   # recalibrated, so every prompt slice changes
    write_encodings(three_parts["encodings"], replace(enc, activations={
        name: replace(entry, scale=tuple(2 * scale for scale in entry.scale))
        for name, entry in enc.activations.items()}))
    synced = []
    real_fsync = os.fsync

    def fsync_fails_on_the_second_file(fd: int) -> None:
        synced.append(fd)
        if len(synced) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_fails_on_the_second_file)
    assert slice_cli(three_parts) == 2
    assert f"{part_encodings_path(out, '2_of_3', 'prompt')}: cannot write" in capsys.readouterr().err
    monkeypatch.undo()
    assert slice_cli({**three_parts, "out": tmp_path / "fresh"}) == 0
    fresh, after = slice_files(tmp_path / "fresh"), slice_files(out)
    first = "part_1_of_3/prompt.encodings.json"
    assert fresh[first] != before[first]
    # the first slice, written before the failure, is whole: the old one or the new one
    assert after[first] in (before[first], fresh[first])
    assert {name: data for name, data in after.items() if name != first} == \
        {name: data for name, data in before.items() if name != first}
    assert listing(out) == names


def model_slice_cli(paths: dict[str, Path], token_encodings: Path, *extra: str) -> int:
    """slice-encodings on the tiny model as both graphs (the prompt graph's encodings are ``paths``')."""
    graphs = {"prompt": paths["encodings"], "token": token_encodings}
    return main(["slice-encodings", *(item for graph, encodings in graphs.items() for item in (
        f"--{graph}-model", str(paths["model"]), f"--{graph}-encodings", str(encodings))),
        "--parts-dir", str(paths["parts"]), "--out-dir", str(paths["out"]), *extra])


def test_model_command_writes_what_the_one_graph_command_writes_for_each_graph(three_parts: dict[str, Path],
                                                                               tmp_path: Path) -> None:
    token = tmp_path / "token.encodings.json"
    write_encodings(token, read_encodings(three_parts["encodings"]))
    assert model_slice_cli(three_parts, token) == 0
    both = slice_files(three_parts["out"])
    assert sorted(both) == slice_names("prompt", "token")
    one_by_one = tmp_path / "one_by_one"
    for graph, extra in (("prompt", ()), ("token", ("--consistent-with", str(three_parts["encodings"])))):
        assert main(["slice-graph-encodings", "--graph", graph, "--model", str(three_parts["model"]), "--encodings",
                     str(three_parts["encodings"] if graph == "prompt" else token), "--parts-dir",
                     str(three_parts["parts"]), "--out-dir", str(one_by_one), *extra]) == 0
    assert slice_files(one_by_one) == both


def test_model_command_checks_the_token_graph_against_the_prompt_graph_and_writes_neither_on_failure(
        three_parts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    enc = read_encodings(three_parts["encodings"])
    token = tmp_path / "token.encodings.json"
    write_encodings(token, replace(enc, activations={**enc.activations, "cos": act("cos", scale=5.0)}))
    assert model_slice_cli(three_parts, token) == 2
    assert "cos: activation encoding differs between the prompt graph and the token graph" in capsys.readouterr().err
    assert listing(three_parts["out"]) == []

    assert model_slice_cli(three_parts, token, "--token-shares-prompt") == 0
    part = read_encodings(part_encodings_path(three_parts["out"], "1_of_3", "token"))
    assert part.activations["cos"] == enc.activations["cos"]


def test_model_command_failure_keeps_the_previous_output_folder_whole(three_parts: dict[str, Path], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The output folder appears whole or not at all: a failure after the prompt graph's slices are written
    leaves the previous folder byte for byte and no staging folder beside it."""
    token = tmp_path / "token.encodings.json"
    write_encodings(token, read_encodings(three_parts["encodings"]))
    assert model_slice_cli(three_parts, token) == 0
    out = three_parts["out"]
    before, names, beside = slice_files(out), listing(out), sorted(path.name for path in out.parent.iterdir())
    calls = []

    def write_then_fail(path: Path, enc: Encodings) -> None:
        calls.append(path)
        write_encodings(path, replace(enc, activations={}))
        if len(calls) == len(LABELS) + 1:   # every prompt slice and the first token slice written
            raise GenieBuildError(path, "disk full")

    monkeypatch.setattr("genie_build.quantize.slice_encodings.write_encodings", write_then_fail)
    assert model_slice_cli(three_parts, token) == 2
    assert len(calls) == len(LABELS) + 1
    assert slice_files(out) == before and listing(out) == names
    assert sorted(path.name for path in out.parent.iterdir()) == beside


# ------------------------------------------------------------------------------------------- aimet-onnx formats

# Excerpts of what aimet-onnx 2.42 writes (docs/conventions.md, "Encodings"): 2.0.0 with a per-tensor uint8
# KV cache, the uint16 embedding table, int4 per channel, LPBQ laid out like an [out, in] weight, an int32 bias
# and a float16 tensor.
V200 = {
    "version": "2.0.0",
    "producer": {"package": "aimet-onnx", "version": "2.42.0"},
    "encodings": [
        {"name": "past_key_0", "output_dtype": "uint8", "y_scale": 0.0321, "y_zero_point": 135},
        {"name": "table", "output_dtype": "uint16", "y_scale": 2.683e-06, "y_zero_point": 31344},
        {"name": "w_pc", "output_dtype": "int4", "y_scale": [0.5, 0.25], "axis": 0},
        {"name": "w_lpbq", "output_dtype": "int4", "axis": 1, "block_size": 2,
         "per_channel_float_scale": [[0.1], [0.2]], "per_block_int_scale": [[16, 14], [13, 15]]},
        {"name": "w_pb", "output_dtype": "int4", "axis": 0, "block_size": 2, "y_scale": [[1.0, 2.0], [3.0, 4.0]]},
        {"name": "bias", "output_dtype": "int32", "y_scale": [1e-4, 2e-4], "axis": 0},
        {"name": "half", "output_dtype": "float16"},
    ],
}


def test_200_is_read_into_aimet_terms_with_the_stated_axes(tmp_path: Path) -> None:
    enc = read_encodings(dump(tmp_path, V200))
    assert enc.version == "2.0.0" and enc.header["producer"] == {"package": "aimet-onnx", "version": "2.42.0"}
    kv = enc.activations["past_key_0"]
    assert (kv.bitwidth, kv.is_symmetric, kv.scale, kv.offset) == (8, False, (0.0321,), (-135,))
    assert enc.of_initializer("table").offset == (-31344,) and enc.of_initializer("table").bitwidth == 16
    w_pc = enc.params["w_pc"]
    assert (w_pc.kind, w_pc.bitwidth, w_pc.is_symmetric, w_pc.offset, w_pc.axis) == ("per_channel", 4, True,
                                                                                       (-8, -8), 0)
    lpbq = enc.params["w_lpbq"]   # axis 1 is the block axis: channels along axis 0, listed channel-major
    assert (lpbq.kind, lpbq.bitwidth, lpbq.compressed_bitwidth, lpbq.axis) == ("lpbq", 8, 4, 0)
    assert lpbq.scale == (0.1, 0.2) and lpbq.per_block_int_scale == (16, 14, 13, 15)
    w_pb = enc.params["w_pb"]     # [in/bs, out] laid out like an [in, out] weight: channels along axis 1
    assert (w_pb.axis, w_pb.scale) == (1, (1.0, 3.0, 2.0, 4.0))
    bias = enc.params["bias"]
    assert (bias.bitwidth, bias.kind, bias.offset, bias.axis) == (32, "per_channel", (-2**31, -2**31), 0)
    assert enc.activations["half"] == TensorEncoding(name="half", dtype="float", bitwidth=16)


@pytest.mark.parametrize("entry, problem", [
    ({"name": "t", "output_dtype": "int5", "y_scale": 0.1}, "output_dtype 'int5' is not supported"),
    ({"name": "t", "output_dtype": "uint8", "y_scale": [0.1, 0.2]}, "2 y_scale values without an 'axis'"),
    ({"name": "t", "output_dtype": "uint8", "y_scale": 0.1, "y_zero_point": 300}, "offset"),
    ({"name": "t", "output_dtype": "int4", "y_scale": [[1.0, 2.0]], "axis": 0, "block_size": 2,
      "y_zero_point": [[0]]}, "does not match y_scale"),
    ({"name": "t", "output_dtype": "uint4", "axis": 1, "block_size": 2, "per_channel_float_scale": [[0.1]],
      "per_block_int_scale": [[1]]}, "LPBQ encodings must be symmetric"),
    ({"name": "t", "output_dtype": "int4", "axis": 1, "block_size": 2, "per_channel_float_scale": [[0.1], [0.2]],
      "per_block_int_scale": [[1, 2]]}, "2 per_channel_float_scale values for 1 channels"),
    ({"name": "t", "output_dtype": "float16", "y_scale": 0.5}, "a scaled float16 encoding is not supported"),
    ({"name": "t", "output_dtype": "int8", "y_scale": [0.1, "x"], "axis": 0}, "not a number"),
])
def test_200_errors_name_file_and_tensor(tmp_path: Path, entry: dict, problem: str) -> None:
    path = dump(tmp_path, {"version": "2.0.0", "encodings": [entry]})
    with pytest.raises(GenieBuildError, match=re.escape(problem)) as caught:
        read_encodings(path)
    assert str(caught.value).startswith(f"{path}: encoding 't': ") and "\n" not in str(caught.value)


def test_100_zero_point_shift_is_accepted_only_when_zero(tmp_path: Path) -> None:
    read_encodings(dump(tmp_path, _v100_with(zero_point_shift=[0.0, 0.0])))
    with pytest.raises(GenieBuildError, match="zero_point_shift \\[0.5, 0.5\\] is not supported"):
        read_encodings(dump(tmp_path, _v100_with(zero_point_shift=[0.5, 0.5])))


@pytest.mark.parametrize("doc", [V061, {**V100, "producer": {"package": "aimet-onnx", "version": "2.42.0"}}, V200],
                         ids=["0.6.1", "1.0.0", "2.0.0"])
def test_a_slice_keeps_the_version_top_level_keys_and_entries_as_read(tmp_path: Path, doc: dict) -> None:
    enc = read_encodings(dump(tmp_path, doc))
    some = set(list(enc.activations)[:1]) | set(list(enc.params)[:1])
    part = slice_encodings(enc, some, some)
    write_encodings(tmp_path / "part.json", part)
    written = json.loads((tmp_path / "part.json").read_text())
    assert {key: value for key, value in written.items() if "encodings" not in key} == \
        {key: value for key, value in doc.items() if "encodings" not in key}
    if doc["version"] == "0.6.1":
        kept = {**written["activation_encodings"], **written["param_encodings"]}
        assert kept == {name: {**doc["activation_encodings"], **doc["param_encodings"]}[name] for name in some}
    else:
        sections = ["encodings"] if doc["version"] == "2.0.0" else ["activation_encodings", "param_encodings"]
        kept = [entry for key in sections for entry in written[key]]
        assert sorted(kept, key=str) == sorted([entry for key in sections for entry in doc[key]
                                                if entry["name"] in some], key=str)
    assert read_encodings(tmp_path / "part.json") == part


def test_an_encoding_changed_in_memory_is_written_as_100(tmp_path: Path) -> None:
    enc = read_encodings(dump(tmp_path, V200))
    changed = replace(enc, activations={**enc.activations, "past_key_0": act("past_key_0")})
    assert json.loads(format_encodings(changed))["version"] == "1.0.0"
    again = read_encodings(dump(tmp_path, json.loads(format_encodings(changed)), "again.json"))
    # 1.0.0 states no axis: the consumer's rule gives it back, as for any 1.0.0 file
    assert again == replace(changed, params={name: replace(e, axis=None) for name, e in changed.params.items()})


def _consumer_graph() -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w_in_out"], ["a"]),
             helper.make_node("Transpose", ["w_out_in"], ["w_t"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "w_t"], ["b"]),
             helper.make_node("Gemm", ["x", "w_gemm_t", "bias"], ["c"], transB=1),
             helper.make_node("Gemm", ["x", "w_gemm"], ["d"]),
             helper.make_node("Conv", ["img", "w_conv"], ["e"]),
             helper.make_node("ConvTranspose", ["img", "w_deconv"], ["f"]),
             helper.make_node("Gather", ["table", "ids"], ["g"]),
             helper.make_node("Cast", ["w_half"], ["w_half_f"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["x", "w_half_f"], ["h"]),
             helper.make_node("Add", ["x", "w_added"], ["i"])]
    shapes = {"w_in_out": (4, 6), "w_out_in": (6, 4), "w_gemm_t": (6, 4), "w_gemm": (4, 6), "bias": (6,),
              "w_conv": (8, 4, 3, 3), "w_deconv": (4, 8, 3, 3), "table": (10, 4), "w_half": (4, 6),
              "w_added": (4, 4)}
    graph = helper.make_graph(nodes, "g", [], [], [helper.make_tensor(name, TensorProto.FLOAT, shape,
                                                                      [0.0] * _count(shape))
                                                   for name, shape in shapes.items()])
    return helper.make_model(graph)


def test_channel_and_block_axes_follow_aimets_rule_for_each_consumer(tmp_path: Path) -> None:
    onnx.save(_consumer_graph(), tmp_path / "g.onnx")
    layouts = read_graph_tensors(tmp_path / "g.onnx").param_layouts
    assert layouts == {"w_in_out": WeightLayout(1, 0), "w_out_in": WeightLayout(0, 1),
                       "w_gemm_t": WeightLayout(0, 1), "w_gemm": WeightLayout(1, 0), "bias": WeightLayout(0, None),
                       "w_conv": WeightLayout(0, 1), "w_deconv": WeightLayout(1, 0), "table": WeightLayout(0, 1),
                       "w_half": WeightLayout(1, 0)}   # w_added: an Add gives no axis


def test_a_square_weight_behind_a_transpose_takes_axis_0_and_a_count_that_does_not_fit_is_one_line(
        tmp_path: Path) -> None:
    onnx.save(_consumer_graph(), tmp_path / "g.onnx")
    model = read_graph_tensors(tmp_path / "g.onnx")

    def per_channel(name: str, count: int) -> Encodings:
        return Encodings(params={name: TensorEncoding(name=name, dtype="int", bitwidth=4, kind="per_channel",
                                                      is_symmetric=True, scale=(0.1,) * count, offset=(-8,) * count)})

    validate_against_model(per_channel("w_out_in", 6), "e.json", model.tensor_names, model.param_shapes,
                           model.param_layouts)
    with pytest.raises(GenieBuildError) as caught:   # 4 scales would fit axis 1; the graph says axis 0
        validate_against_model(per_channel("w_out_in", 4), "e.json", model.tensor_names, model.param_shapes,
                               model.param_layouts)
    assert str(caught.value) == ("e.json: param encoding 'w_out_in': 4 scale values do not fit shape [6, 4]: "
                                 "6 expected for channel axis 0")
    with pytest.raises(GenieBuildError, match="'w_added': a per_channel encoding on a weight of shape \\[4, 4\\] "
                                              "whose consumer gives no channel axis"):
        validate_against_model(per_channel("w_added", 4), "e.json", model.tensor_names, model.param_shapes,
                               model.param_layouts)


# ------------------------------------------------------------------------------------------- share_from

def test_share_encodings_gives_the_token_graph_the_prompts_for_every_tensor_it_has(tmp_path: Path) -> None:
    prompt = read_encodings(dump(tmp_path, V200, "prompt.json"))
    token_doc = json.loads(json.dumps(V200))
    token_doc["encodings"][0]["y_zero_point"] = 125          # calibrated on its own: past_key_0 differs
    token_doc["encodings"].append({"name": "only_token", "output_dtype": "uint16", "y_scale": 0.5})
    token = read_encodings(dump(tmp_path, token_doc, "token.json"))
    with pytest.raises(GenieBuildError, match="encodings.share_from: prompt"):
        check_graphs_consistent(prompt, token)
    shared = share_encodings(prompt, token, {"past_key_0", "table", "w_pc", "only_token"})
    check_graphs_consistent(prompt, shared)
    assert shared.activations["past_key_0"] == prompt.activations["past_key_0"]
    assert "only_token" in shared.activations
    write_encodings(tmp_path / "shared.json", shared)
    entries = {entry["name"]: entry for entry in json.loads((tmp_path / "shared.json").read_text())["encodings"]}
    assert entries["past_key_0"]["y_zero_point"] == 135


def test_share_encodings_refuses_files_of_two_versions(tmp_path: Path) -> None:
    with pytest.raises(GenieBuildError, match="versions 2.0.0 and 1.0.0"):
        share_encodings(read_encodings(dump(tmp_path, V200)), read_encodings(dump(tmp_path, V100, "b.json")), {"t"})


def test_command_share_from_lets_separately_calibrated_graphs_through(three_parts: dict[str, Path]) -> None:
    enc = read_encodings(three_parts["encodings"])
    other = three_parts["encodings"].with_name("token.encodings.json")
    write_encodings(other, replace(enc, activations={**enc.activations, "b1": act("b1", scale=0.5)}))
    token = ["slice-graph-encodings", "--graph", "token", "--model", str(three_parts["model"]), "--encodings",
             str(other), "--parts-dir", str(three_parts["parts"]), "--out-dir", str(three_parts["out"])]
    assert main([*token, "--consistent-with", str(three_parts["encodings"])]) == 2
    assert main([*token, "--share-from", str(three_parts["encodings"])]) == 0
    part = read_encodings(part_encodings_path(three_parts["out"], "2_of_3", "token"))
    assert part.activations["b1"] == enc.activations["b1"]


def test_a_blocked_encoding_without_an_axis_on_a_convtranspose_weight_is_refused(tmp_path: Path) -> None:
    onnx.save(_consumer_graph(), tmp_path / "g.onnx")
    model = read_graph_tensors(tmp_path / "g.onnx")
    blocked = TensorEncoding(name="w_deconv", dtype="int", bitwidth=4, kind="per_block", is_symmetric=True,
                             scale=(0.1,) * 8 * 2, offset=(-8,) * 8 * 2, block_size=2)
    with pytest.raises(GenieBuildError, match="'w_deconv': a per_block encoding without an axis .* export it as 2.0.0"):
        validate_against_model(Encodings(params={"w_deconv": blocked}), "e.json", model.tensor_names,
                               model.param_shapes, model.param_layouts)
    validate_against_model(Encodings(params={"w_deconv": replace(blocked, axis=1)}), "e.json", model.tensor_names,
                           model.param_shapes, model.param_layouts)
