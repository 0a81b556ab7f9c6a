"""genie_build.onnx_graph: loading graphs without weights, external-data checks, shared-weight checks."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from genie_build import fileio
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import (
    check_external_data,
    check_shared_initializers,
    graph_io,
    initializer_specs,
    load_graph,
    part_tensor_names,
    read_graph_tensors,
    model_tensors,
    tensor_sha256,
    tensor_shapes,
)
from scoped_graph import EMBED_OUT, build_scoped_graph, layer_out, weight

EMBED = "model.embed_tokens.weight"


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "prompt.onnx"
    build_scoped_graph(path, ar=4)
    return path


def save_with_external_data(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location=f"{path.name}.data", size_threshold=0)
    return path


def one_line_error(excinfo: pytest.ExceptionInfo[GenieBuildError]) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------------------- load_graph

def test_load_graph_leaves_weights_on_disk(model_path: Path) -> None:
    model = load_graph(model_path)
    table = next(t for t in model.graph.initializer if t.name == EMBED)
    assert table.data_location == TensorProto.EXTERNAL
    assert not table.raw_data


def test_load_graph_missing_file(tmp_path: Path) -> None:
    with pytest.raises(GenieBuildError) as excinfo:
        load_graph(tmp_path / "nope.onnx")
    assert one_line_error(excinfo) == f"{tmp_path / 'nope.onnx'}: file not found"


def test_load_graph_truncated_file(model_path: Path) -> None:
    data = model_path.read_bytes()
    model_path.write_bytes(data[: len(data) // 2])
    with pytest.raises(GenieBuildError) as excinfo:
        load_graph(model_path)
    message = one_line_error(excinfo)
    assert message.startswith(f"{model_path}: ") and "truncated or corrupt" in message


def test_load_graph_corrupt_bytes(model_path: Path) -> None:
    data = bytearray(model_path.read_bytes())
    for index in range(16, len(data), 97):
        data[index] ^= 0x5A
    model_path.write_bytes(bytes(data))
    with pytest.raises(GenieBuildError, match="truncated or corrupt"):
        load_graph(model_path)


def test_load_graph_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(GenieBuildError, match="no nodes"):
        load_graph(path)


def test_load_graph_directory(tmp_path: Path) -> None:
    with pytest.raises(GenieBuildError, match="is a directory, not a regular file"):
        load_graph(tmp_path)


# ------------------------------------------------------------------------------------------- external data

def test_check_external_data_accepts_complete_model(model_path: Path) -> None:
    check_external_data(load_graph(model_path), model_path)


def test_check_external_data_missing_data_file(model_path: Path) -> None:
    data_file = model_path.with_name("prompt.onnx.data")
    data_file.unlink()
    with pytest.raises(GenieBuildError) as excinfo:
        check_external_data(load_graph(model_path), model_path)
    message = one_line_error(excinfo)
    assert str(data_file) in message and "not found" in message and "initializer 'eps'" in message


def test_check_external_data_truncated_data_file(model_path: Path) -> None:
    data_file = model_path.with_name("prompt.onnx.data")
    size = data_file.stat().st_size
    with open(data_file, "r+b") as handle:
        handle.truncate(size - 10)
    model = load_graph(model_path)
    last = max(model.graph.initializer,
               key=lambda t: int({e.key: e.value for e in t.external_data}.get("offset", 0)))
    info = {entry.key: entry.value for entry in last.external_data}
    with pytest.raises(GenieBuildError) as excinfo:
        check_external_data(model, model_path)
    message = one_line_error(excinfo)
    for fact in (last.name, f"offset {info['offset']}", f"length {info['length']}", f"{size - 10} bytes"):
        assert fact in message


def test_check_external_data_length_disagrees_with_shape(model_path: Path) -> None:
    model = load_graph(model_path)
    table = next(t for t in model.graph.initializer if t.name == EMBED)
    for entry in table.external_data:
        if entry.key == "length":
            entry.value = str(int(entry.value) - 4)
    with pytest.raises(GenieBuildError, match=f"{EMBED}.*needs {32 * 8 * 4} bytes"):
        check_external_data(model, model_path)


@pytest.mark.parametrize("location", ["../outside.data", "/abs/w.data"])
def test_check_external_data_rejects_locations_outside_the_folder(model_path: Path, location: str) -> None:
    model = load_graph(model_path)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    with pytest.raises(GenieBuildError, match="relative to the model's folder"):
        check_external_data(model, model_path)


# ------------------------------------------------------------------------------------------- inspecting

def test_initializer_specs_match_the_arrays(model_path: Path) -> None:
    specs = initializer_specs(load_graph(model_path))
    table = weight(EMBED, (32, 8))
    assert specs[EMBED].shape == table.shape and specs[EMBED].dtype == "float32"
    assert specs[EMBED].nbytes == table.nbytes
    assert specs["eps"].shape == (1,) and specs["eps"].nbytes == 4


def test_initializer_specs_of_other_dtypes() -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["shape"], ["out"])], "g", [],
        [helper.make_tensor_value_info("out", TensorProto.INT64, [3])],
        [numpy_helper.from_array(np.array([1, 2, 3], dtype=np.int64), "shape"),
         helper.make_tensor("packed", TensorProto.INT4, [5], [1, 2, 3, 4, 5]),
         numpy_helper.from_array(np.zeros((2, 3), dtype=np.float16), "half")])
    specs = initializer_specs(helper.make_model(graph))
    assert (specs["shape"].dtype, specs["shape"].nbytes) == ("int64", 24)
    assert (specs["packed"].dtype, specs["packed"].nbytes) == ("int4", 3)   # two per byte, rounded up
    assert (specs["half"].dtype, specs["half"].nbytes) == ("float16", 12)


def test_graph_io_leaves_out_initializers_listed_as_inputs() -> None:
    init = numpy_helper.from_array(np.ones((2,), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])], [init])
    io = graph_io(helper.make_model(graph))
    assert [(s.name, s.shape, s.dtype) for s in io.inputs] == [("x", ("batch", 2), "float32")]
    assert [(s.name, s.shape) for s in io.outputs] == [("y", (None, 2))]


def test_tensor_shapes_infers_missing_value_info() -> None:
    model = build_scoped_graph(hidden=8, ar=4)
    assert not model.graph.value_info
    shapes = tensor_shapes(model)
    assert shapes[EMBED_OUT] == (1, 4, 8)
    assert shapes[layer_out(1)] == (1, 4, 8)
    assert shapes[EMBED] == (32, 8)


# ------------------------------------------------------------------------------------------- sharing

@pytest.fixture
def prompt_and_token(tmp_path: Path) -> tuple[Path, Path]:
    prompt, token = tmp_path / "prompt.onnx", tmp_path / "token.onnx"
    build_scoped_graph(prompt, ar=4)
    build_scoped_graph(token, ar=1)
    return prompt, token


def replace_initializer(path: Path, name: str, array: np.ndarray) -> None:
    """Rewrite ``path`` with initializer ``name`` replaced (weights loaded, then saved externally again)."""
    model = onnx.load(path)
    index = next(i for i, t in enumerate(model.graph.initializer) if t.name == name)
    model.graph.initializer[index].CopyFrom(numpy_helper.from_array(array, name))
    path.with_name(f"{path.name}.data").unlink()
    save_with_external_data(model, path)


def test_shared_initializers_identical_across_ar(prompt_and_token: tuple[Path, Path]) -> None:
    check_shared_initializers(*prompt_and_token)


def test_shared_initializers_differ_in_shape(prompt_and_token: tuple[Path, Path]) -> None:
    prompt, token = prompt_and_token
    name = "model.layers.1.self_attn.q_proj.weight"
    replace_initializer(token, name, np.zeros((8, 4), dtype=np.float32))
    with pytest.raises(GenieBuildError) as excinfo:
        check_shared_initializers(prompt, token)
    message = one_line_error(excinfo)
    assert str(prompt) in message and str(token) in message
    assert name in message and "shape [8, 8] in the prompt graph but [8, 4] in the token graph" in message


def test_shared_initializers_differ_in_value(prompt_and_token: tuple[Path, Path]) -> None:
    prompt, token = prompt_and_token
    name = "model.layers.2.mlp.up_proj.weight"
    changed = weight(name, (8, 16))
    changed[3, 5] += 1e-3
    replace_initializer(token, name, changed)
    with pytest.raises(GenieBuildError) as excinfo:
        check_shared_initializers(prompt, token)
    message = one_line_error(excinfo)
    assert str(prompt) in message and str(token) in message
    assert f"{name!r} has the same shape [8, 16] and dtype but different values" in message


def test_shared_initializers_differ_in_dtype(prompt_and_token: tuple[Path, Path]) -> None:
    prompt, token = prompt_and_token
    replace_initializer(token, "eps", np.array([1e-6], dtype=np.float16))
    with pytest.raises(GenieBuildError, match="'eps' has dtype float32 in the prompt graph but float16"):
        check_shared_initializers(prompt, token)


def test_tensor_hash_is_independent_of_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """External (streamed in tiny chunks), raw inline and typed float_data give the same digest."""
    monkeypatch.setattr(fileio, "COPY_CHUNK_BYTES", 7)
    array = weight("w", (5, 3))
    expected = hashlib.sha256(array.tobytes()).hexdigest()
    external = save_with_external_data(
        helper.make_model(helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 3])],
                                            [numpy_helper.from_array(array, "w")])), tmp_path / "m.onnx")
    stored = load_graph(external).graph.initializer[0]
    typed = helper.make_tensor("w", TensorProto.FLOAT, [5, 3], array.ravel().tolist(), raw=False)
    assert tensor_sha256(stored, external) == expected
    assert tensor_sha256(numpy_helper.from_array(array, "w"), external) == expected
    assert tensor_sha256(typed, external) == expected


def test_external_data_files_lists_each_data_file_once(tmp_path):
    import numpy as np
    from onnx import helper, numpy_helper

    from genie_build.onnx_graph import external_data_files

    inits = [numpy_helper.from_array(np.ones((64, 64), np.float32), f"w{i}") for i in range(3)]
    node = helper.make_node("Add", ["w0", "w1"], ["y"])
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [64, 64])],
                              inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), path, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    assert external_data_files(load_graph(path), path) == [tmp_path / "m.onnx.data"]


# ------------------------------------------------------------------------------------------- walking

def test_part_tensor_names_recurses_into_subgraphs(tmp_path: Path) -> None:
    then_branch = helper.make_graph([helper.make_node("Add", ["x", "inner_c"], ["inner"])], "then", [],
                                    [helper.make_tensor_value_info("inner", TensorProto.FLOAT, [1, 4])],
                                    [helper.make_tensor("inner_c", TensorProto.FLOAT, [1, 4], [1.0] * 4)])
    else_branch = helper.make_graph([helper.make_node("Identity", ["x"], ["other"])], "else", [],
                                    [helper.make_tensor_value_info("other", TensorProto.FLOAT, [1, 4])])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph), tmp_path / "if.onnx")
    tensors, initializers = part_tensor_names(tmp_path / "if.onnx")
    assert tensors == {"cond", "x", "y", "inner", "inner_c", "other"}
    assert initializers == {"inner_c"}


def test_read_graph_tensors_rejects_non_onnx(tmp_path: Path) -> None:
    (tmp_path / "bad.onnx").write_bytes(b"\xff\xff not a protobuf")
    with pytest.raises(GenieBuildError, match="bad.onnx: "):
        read_graph_tensors(tmp_path / "bad.onnx")
    with pytest.raises(GenieBuildError, match="file not found"):
        read_graph_tensors(tmp_path / "absent.onnx")


def test_model_tensors_walks_initializers_attributes_subgraphs_and_functions_in_order() -> None:
    """The one tensor walker every check, copy and reader of stored bytes uses: nothing that can hold bytes is
    left out (sparse tensors, tensors of a model-local function), in a fixed order, each said where it sits."""
    def tensor(name: str) -> onnx.TensorProto:
        return helper.make_tensor(name, TensorProto.FLOAT, [1], [1.0])

    body = helper.make_graph([helper.make_node("Constant", [], ["k"], value=tensor("body_const"))], "body", [],
                             [helper.make_tensor_value_info("k", TensorProto.FLOAT, [1])], [tensor("body_init")])
    sparse = helper.make_sparse_tensor(tensor("sparse_values"), helper.make_tensor("sparse_indices",
                                                                                   TensorProto.INT64, [1], [0]), [4])
    nodes = [helper.make_node("Constant", [], ["c"], name="c", value=tensor("const")),
             helper.make_node("Constant", [], ["s"], name="s", sparse_value=sparse),
             helper.make_node("If", ["cond"], ["y"], name="if", then_branch=body, else_branch=body),
             helper.make_node("F", [], ["f"], domain="local")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [tensor("init")])
    function = helper.make_function("local", "F", [], ["f"],
                                    [helper.make_node("Constant", [], ["f"], value=tensor("function_const"))],
                                    [helper.make_opsetid("", 17)])
    model = helper.make_model(graph, functions=[function])
    walked = list(model_tensors(model))
    assert [stored.tensor.name for stored in walked] == [
        "init", "const", "sparse_values", "sparse_indices", "body_init", "body_const", "body_init", "body_const",
        "function_const"]
    assert [stored.initializer for stored in walked] == [True] + [False] * 8
    assert walked[1].what == "attribute 'value' of node 'c' (Constant)"
    assert walked[4].what == "initializer 'body_init' in the body 'else_branch' of node 'if' (If)"  # attributes sorted by name
    assert walked[-1].what == "attribute 'value' of node 'f' (Constant) in function 'F'"
    assert [stored.sparse for stored in walked[2:4]] == [True, True]


# ------------------------------------------------------------------------------------------- every stored tensor

def constant_model(path: Path, *, in_function: bool = False, in_subgraph: bool = False) -> Path:
    """A model whose weight is a Constant node's value (what ``onnx.save(..., convert_attribute=True)`` writes), in
    the main graph, an If body or a model-local function, saved with every tensor in ``<name>.data``."""
    value = numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8), "w")
    constant = helper.make_node("Constant", [], ["w"], name="const_w", value=value)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])
    functions = []
    if in_function:
        functions = [helper.make_function("local", "MakeW", [], ["w"], [constant], [helper.make_opsetid("", 17)])]
        nodes = [helper.make_node("MakeW", [], ["w"], domain="local"), helper.make_node("Identity", ["w"], ["y"])]
    elif in_subgraph:
        body = helper.make_graph([constant, helper.make_node("Identity", ["w"], ["b"])], "body", [],
                                 [helper.make_tensor_value_info("b", TensorProto.FLOAT, [8, 8])])
        nodes = [helper.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=body)]
    else:
        nodes = [constant, helper.make_node("Identity", ["w"], ["y"])]
    inputs = [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])] if in_subgraph else []
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, [y]), functions=functions,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    onnx.save(model, path, save_as_external_data=True, location=f"{path.name}.data", size_threshold=0,
              convert_attribute=True)
    return path


def set_external(model: onnx.ModelProto, key: str, value: str) -> None:
    """Set ``key`` of every external tensor of ``model`` (attributes, subgraphs, functions too)."""
    from genie_build.onnx_graph import model_tensors
    for stored in model_tensors(model):
        entries = {entry.key: entry for entry in stored.tensor.external_data}
        if key in entries:
            entries[key].value = value
        elif stored.tensor.external_data:
            stored.tensor.external_data.add(key=key, value=value)


@pytest.mark.parametrize("where", ["main", "subgraph", "function"])
def test_external_data_of_attribute_tensors_is_checked_and_listed(tmp_path: Path, where: str) -> None:
    from genie_build.onnx_graph import external_data_files
    path = constant_model(tmp_path / "m.onnx", in_function=where == "function", in_subgraph=where == "subgraph")
    assert external_data_files(load_graph(path), path) == [tmp_path / "m.onnx.data"]
    (tmp_path / "m.onnx.data").unlink()
    with pytest.raises(GenieBuildError) as excinfo:
        check_external_data(load_graph(path), path)
    message = one_line_error(excinfo)
    assert message.startswith(f"{path}: attribute 'value' of node 'const_w' (Constant)") and "not found" in message


@pytest.mark.parametrize(("key", "value", "problem"), [
    ("location", "/etc/passwd", "external data location '/etc/passwd' must be a file name relative to the model's "
                                "folder"),
    ("location", "../../x.data", "must be a file name relative to the model's folder"),
    ("offset", "abc", "external data offset 'abc' is not a non-negative integer"),
    ("offset", "-5", "external data offset '-5' is not a non-negative integer"),
    ("offset", "1e3", "external data offset '1e3' is not a non-negative integer"),
    ("length", " 256", "external data length ' 256' is not a non-negative integer"),
    ("offset", str(2**40), "runs past the end of"),
    ("length", "4", "external length 4 in"),
])
def test_bad_external_references_are_one_line_naming_file_and_tensor(tmp_path: Path, key: str, value: str,
                                                                     problem: str) -> None:
    path = constant_model(tmp_path / "m.onnx")
    model = load_graph(path)
    set_external(model, key, value)
    with pytest.raises(GenieBuildError) as excinfo:
        check_external_data(model, path)
    message = one_line_error(excinfo)
    assert message.startswith(f"{path}: attribute 'value' of node 'const_w' (Constant): ") and problem in message


def test_a_data_file_that_links_out_of_the_model_folder_is_refused(tmp_path: Path) -> None:
    """On another disk through a symlink: onnxruntime would refuse it at the end of the build; we refuse it
    before any job, and read nothing from there."""
    folder = tmp_path / "model"
    folder.mkdir()
    path = constant_model(folder / "m.onnx")
    elsewhere = tmp_path / "other-disk" / "m.onnx.data"
    elsewhere.parent.mkdir()
    (folder / "m.onnx.data").rename(elsewhere)
    (folder / "m.onnx.data").symlink_to(elsewhere)
    with pytest.raises(GenieBuildError) as excinfo:
        check_external_data(load_graph(path), path)
    assert f"resolves to {elsewhere}, outside {folder}" in one_line_error(excinfo)


@pytest.mark.parametrize("special", ["fifo", "dev-zero", "directory"])
def test_a_data_file_that_is_not_a_regular_file_is_refused(tmp_path: Path, special: str) -> None:
    path = constant_model(tmp_path / "m.onnx")
    data = tmp_path / "m.onnx.data"
    data.unlink()
    if special == "fifo":
        os.mkfifo(data)
    elif special == "directory":
        data.mkdir()
    else:
        # /dev/zero is outside the folder: refused for that before its kind matters
        data.symlink_to("/dev/zero")
    with pytest.raises(GenieBuildError, match="is not a regular file|outside"):
        check_external_data(load_graph(path), path)


def test_data_reached_through_a_linked_model_file_is_read_from_the_models_real_folder(tmp_path: Path) -> None:
    """A Hugging Face hub cache (or Snakemake's output cache) links the model and its data into a folder of
    blobs: the data lies in the folder the model file really is in, as onnxruntime accepts too."""
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshot"
    blobs.mkdir()
    snapshot.mkdir()
    constant_model(blobs / "m.onnx")
    (snapshot / "m.onnx").symlink_to(blobs / "m.onnx")
    (snapshot / "m.onnx.data").symlink_to(blobs / "m.onnx.data")
    path = snapshot / "m.onnx"
    check_external_data(load_graph(path), path)
    assert tensor_sha256(next(iter(_attribute_tensors(load_graph(path)))), path) == hashlib.sha256(
        np.arange(64, dtype=np.float32).tobytes()).hexdigest()


def _attribute_tensors(model: onnx.ModelProto):
    from genie_build.onnx_graph import model_tensors
    return [stored for stored in model_tensors(model) if not stored.initializer]


def test_sparse_initializers_duplicates_and_short_inline_tensors_are_refused(tmp_path: Path) -> None:
    weight_proto = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [], [y], [weight_proto, weight_proto])
    path = tmp_path / "dup.onnx"
    onnx.save(helper.make_model(graph), path)
    with pytest.raises(GenieBuildError, match=r"dup.onnx: initializer 'w' is defined 2 times"):
        check_external_data(load_graph(path), path)

    short = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    short.raw_data = short.raw_data[:-4]
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [], [y],
                                                  [short])), path)
    with pytest.raises(GenieBuildError, match=r"initializer 'w': holds 60 bytes but shape \[4, 4\] of FLOAT needs 64"):
        check_external_data(load_graph(path), path)

    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.ones(2, np.float32), "s"),
                                       numpy_helper.from_array(np.array([0, 5], np.int64), "s_indices"), [4, 4])
    graph = helper.make_graph([helper.make_node("Identity", ["s"], ["y"])], "g", [], [y], sparse_initializer=[sparse])
    onnx.save(helper.make_model(graph), path)
    with pytest.raises(GenieBuildError, match=r"sparse initializer 's' \(values\): sparse initializers are not "
                                              r"supported"):
        check_external_data(load_graph(path), path)


def test_a_non_finite_attribute_tensor_is_named_with_its_value_and_index(tmp_path: Path) -> None:
    from genie_build.onnx_graph import scan_tensor
    path = constant_model(tmp_path / "c.onnx")
    with open(tmp_path / "c.onnx.data", "r+b") as data:
        data.seek(4 * 9)
        data.write(np.float32(np.inf).tobytes())
    with pytest.raises(GenieBuildError) as excinfo:
        scan_tensor(_attribute_tensors(load_graph(path))[0], path, finite=True)
    assert one_line_error(excinfo) == (f"{path}: attribute 'value' of node 'const_w' (Constant) holds inf at "
                                       "index [1, 1] (shape [8, 8]): every float weight must be finite")


def test_training_graphs_are_walked_too(tmp_path: Path) -> None:
    """A training_info graph is never run, but its tensors can point anywhere: they are checked like the rest."""
    from genie_build.onnx_graph import model_tensors
    path = constant_model(tmp_path / "m.onnx")
    model = load_graph(path)
    initialization = helper.make_graph([], "init", [], [], [helper.make_tensor("step", TensorProto.FLOAT, [1], [0.0])])
    model.training_info.add().initialization.CopyFrom(initialization)
    external = model.training_info[0].initialization.initializer[0]
    external.data_location = TensorProto.EXTERNAL
    external.external_data.add(key="location", value="../../etc/hostname")
    assert [stored.what for stored in model_tensors(model)][-1] == "initializer 'step' in training_info[0].initialization"
    with pytest.raises(GenieBuildError, match="initializer 'step' in training_info.0..initialization: external data "
                                              "location '../../etc/hostname' must be"):
        check_external_data(model, path)
