"""export-length: a part's graphs at other context lengths, beside its own and reading its weights file.

A random Qwen2 checkpoint planned into 3 parts is exported at CL 32 (AR 8); each part then gets its graphs at CL 16
and CL 64. They are named as Genie names them, hold the same weight references as the part's own graphs (name ->
location, offset, length, checksum) with no new data file, leave the part's own files byte for byte and mtime as
they were, compute what transformers' modules compute at their length, and give the part's logits on a sequence
that fits every length (prompt step, then token steps: the shorter cache a prefix of the longer). What cannot be
added is refused in one line naming the file, writing nothing. Converted and compiled with the reference
toolchain, a part's graphs at two lengths store each weight once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from genie_build.conventions import (INPUT_IDS, LOGITS, MASK, MASK_MIN, POS_COS, POS_SIN, causal_mask, graph_ar,
                                     graph_name, kv_name, rope_tables)
from genie_build.encodings import Encodings, TensorEncoding, write_encodings
from genie_build.errors import GenieBuildError
from genie_build.hf_config import head_dim, read_rope
from genie_build.onnx_graph import ar_and_context_length
from genie_build.plan.shape_plan import plan_from_hf_config
from genie_build.split.verify_split import run_graph
from genie_build.toolchains import get_toolchain
from genie_build.toolchains.base import CompileOptions
from genie_build.toolchains.reference.container_format import read_header

pytestmark = pytest.mark.hf
torch = pytest.importorskip("torch", reason="the export needs torch: pip install --no-deps -r envs/requirements-hf.txt")
pytest.importorskip("transformers")
pytest.importorskip("onnxscript")

import hf_checkpoints  # noqa: E402  (needs torch)

from genie_build.export.export import export_part, part_files  # noqa: E402
from genie_build.export.export_length import export_length, length_files  # noqa: E402
from genie_build.export.verify_parts import TOLERANCE, PartGraph, verify_part  # noqa: E402

AR, CONTEXT, NUM_PARTS, MAX_POSITIONS = 8, 32, 3, 64
LENGTHS = (16, MAX_POSITIONS)   # one shorter than the part's own, one longer
OPTIONS = CompileOptions(weights_packing=True, optimization_type=3, weight_sharing_enabled=True, vtcm_mb=0,
                         soc_model=69, dsp_arch="v79", float_bitwidth=16)


def _file_states(folder: Path) -> dict[str, tuple[str, int]]:
    """Each file of a folder: its SHA-1 and its mtime (ns)."""
    return {path.name: (hashlib.sha1(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
            for path in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``(checkpoint, plan, parts folder, each part's files before export_length)``: every part exported at
    CONTEXT, then given its graphs at each of LENGTHS."""
    root = tmp_path_factory.mktemp("lengths")
    checkpoint = hf_checkpoints.make_checkpoint(root / "checkpoint", "qwen2", layers=3, context=MAX_POSITIONS)
    plan = plan_from_hf_config(checkpoint / "config.json", recipe="w4a16", ar=AR, context=CONTEXT,
                               num_parts=NUM_PARTS)
    parts = root / "parts"
    for part in plan.parts:
        export_part(checkpoint, part, parts / part.label, num_parts=NUM_PARTS, ar=AR, context=CONTEXT)
    before = {part.label: _file_states(parts / part.label) for part in plan.parts}
    for part in plan.parts:
        for context in LENGTHS:
            summary = export_length(checkpoint, part, parts / part.label, num_parts=NUM_PARTS, ar=AR,
                                    context=context)
            assert summary.files == tuple(length_files(parts / part.label, context).values())
    return checkpoint, plan, parts, before


def _references(path: Path) -> dict[str, dict[str, str]]:
    model = onnx.load(path, load_external_data=False)
    return {tensor.name: {entry.key: entry.value for entry in tensor.external_data}
            for tensor in model.graph.initializer}


def test_each_part_gets_its_graphs_at_each_length_and_no_new_data_file(exported):
    _, plan, parts, before = exported
    for part in plan.parts:
        added = {path.name for context in LENGTHS for path in length_files(parts / part.label, context).values()}
        assert added == {f"{kind}_cl{context}.onnx" for kind in ("prompt", "token") for context in LENGTHS}
        assert sorted(path.name for path in (parts / part.label).iterdir()) == sorted({*before[part.label], *added})
        for context in LENGTHS:
            for kind, path in length_files(parts / part.label, context).items():
                model = onnx.load(path, load_external_data=False)
                assert model.graph.name == graph_name(kind, graph_ar(kind, AR), context, part.index, NUM_PARTS)
                if part.first_layer is not None:   # a part with decoder layers: Genie reads AR and CL from its IO
                    assert ar_and_context_length(model) == (graph_ar(kind, AR), context)


def test_the_graphs_at_each_length_refer_to_the_parts_own_weights(exported):
    _, plan, parts, _ = exported
    for part in plan.parts:
        graphs, data = part_files(parts / part.label)
        for context in LENGTHS:
            for kind, path in length_files(parts / part.label, context).items():
                references = _references(path)
                assert references == _references(graphs[kind]), (part.label, context, kind)
                assert {entry["location"] for entry in references.values()} == {data.name}
                model = onnx.load(path, load_external_data=False)
                assert all(t.data_location == onnx.TensorProto.EXTERNAL and not t.raw_data
                           for t in model.graph.initializer)


def test_the_parts_own_files_are_left_as_they_were(exported):
    _, plan, parts, before = exported
    for part in plan.parts:
        now = _file_states(parts / part.label)
        assert {name: now[name] for name in before[part.label]} == before[part.label]


def test_each_length_computes_what_transformers_modules_compute(exported, tmp_path):
    checkpoint, plan, parts, _ = exported
    for part in plan.parts:
        graphs = [PartGraph(f"{kind}_cl{context}", kind, context, path) for context in LENGTHS
                  for kind, path in length_files(parts / part.label, context).items()]
        checks = verify_part(checkpoint, part, graphs, ar=AR, out=tmp_path / f"{part.label}.json")
        assert {check.graph for check in checks} == {graph.key for graph in graphs}
        assert all(check.within_tolerance for check in checks)



# --- a graph wrong at another length ----------------------------------------------------------------------

def _rewire(model: onnx.ModelProto, names: tuple[str, ...], nodes: list[onnx.NodeProto],
            constants: dict[str, np.ndarray]) -> None:
    """Make every node that reads one of the graph inputs ``names`` read ``<name>_broken`` instead, which ``nodes``
    (put first, with ``constants`` as initializers) compute from the inputs."""
    for node in model.graph.node:
        node.input[:] = [f"{each}_broken" if each in names else each for each in node.input]
    model.graph.initializer.extend(onnx.numpy_helper.from_array(value, key) for key, value in constants.items())
    kept = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend([*nodes, *kept])


def _far_cache_hidden(model, config, ar, context):
    """The mask hides the second half of the cache, as a graph traced with a shorter cache's mask would."""
    hidden = np.zeros((1, 1, context), np.float32)
    hidden[..., (context - ar) // 2:context - ar] = MASK_MIN
    _rewire(model, (MASK,), [onnx.helper.make_node("Add", [MASK, "far_half"], [f"{MASK}_broken"])],
            {"far_half": hidden})


def _mask_shifted(model, config, ar, context):
    """The mask read one column off (each column takes the next one's value)."""
    make = onnx.helper.make_node
    _rewire(model, (MASK,), [make("Slice", [MASK, "one", "end", "last_axis"], ["mask_tail"]),
                             make("Slice", [MASK, "zero", "one", "last_axis"], ["mask_head"]),
                             make("Concat", ["mask_tail", "mask_head"], [f"{MASK}_broken"], axis=2)],
            {name: np.array([value], np.int64) for name, value in
             (("zero", 0), ("one", 1), ("end", context), ("last_axis", 2))})


def _rope_offset(model, config, ar, context):
    """Every position one ahead of the RoPE tables given: cos(a + b) and sin(a + b), b one position's angles."""
    rope, make = read_rope(config, "config.json"), onnx.helper.make_node
    cos_one, sin_one = rope_tables(head_dim(config, "config.json"), rope.theta, [1], rope.scaling)
    _rewire(model, (POS_COS, POS_SIN),
            [make("Mul", [POS_COS, "cos_one"], ["cos_cos"]), make("Mul", [POS_SIN, "sin_one"], ["sin_sin"]),
             make("Mul", [POS_SIN, "cos_one"], ["sin_cos"]), make("Mul", [POS_COS, "sin_one"], ["cos_sin"]),
             make("Sub", ["cos_cos", "sin_sin"], [f"{POS_COS}_broken"]),
             make("Add", ["sin_cos", "cos_sin"], [f"{POS_SIN}_broken"])],
            {"cos_one": cos_one, "sin_one": sin_one})


BREAKS = {"far-cache-hidden": _far_cache_hidden, "mask-shifted": _mask_shifted, "rope-offset": _rope_offset}


@pytest.mark.parametrize("graph_key", ["prompt_cl64", "token_cl16"])
@pytest.mark.parametrize("case", sorted(BREAKS))
def test_a_graph_wrong_at_another_length_fails_the_verification(exported, tmp_path, case, graph_key):
    """Each length's graphs are checked on their kind's step laid out in their own cache: a graph at another
    length than the part's own that hides part of its cache, reads its mask a column off or shifts its positions
    fails, among every graph of the part, naming that graph."""
    checkpoint, plan, parts, _ = exported
    config = json.loads((checkpoint / "config.json").read_text())
    part = next(part for part in plan.parts if part.first_layer is not None)
    folder = tmp_path / part.label
    shutil.copytree(parts / part.label, folder)
    kind, context = graph_key.split("_cl")[0], int(graph_key.split("_cl")[1])
    broken = folder / f"{graph_key}.onnx"
    model = onnx.load(broken, load_external_data=False)
    BREAKS[case](model, config, graph_ar(kind, AR), context)
    onnx.save(model, broken)
    graphs = [PartGraph(kind, kind, CONTEXT, path) for kind, path in part_files(folder)[0].items()] + [
        PartGraph(f"{kind}_cl{length}", kind, length, path) for length in LENGTHS
        for kind, path in length_files(folder, length).items()]
    with pytest.raises(GenieBuildError, match="differs from transformers' modules") as error:
        verify_part(checkpoint, part, graphs, ar=AR, out=tmp_path / "report.json")
    assert Path(error.value.where) == broken
    assert not (tmp_path / "report.json").exists()


def _chained_logits(checkpoint: Path, plan, graphs_of, context: int, prompt_ids: np.ndarray,
                    next_ids: list[int]) -> list[np.ndarray]:
    """The logits of a prompt step from an empty cache then one token step per id of ``next_ids``, the parts'
    graphs (``graphs_of(part)``: kind -> path) chained in onnxruntime at context ``context``, each step's new KV
    entries appended to the cache as Genie does."""
    config = json.loads((checkpoint / "config.json").read_text())
    rope, d, kv = read_rope(config, "config.json"), head_dim(config, "config.json"), config["num_key_value_heads"]
    layers = range(config["num_hidden_layers"])
    cache = {layer: (np.zeros((1, kv, d, 0), np.float32), np.zeros((1, kv, 0, d), np.float32)) for layer in layers}
    steps = [("prompt", prompt_ids)] + [("token", np.array([[token]])) for token in next_ids]
    logits, past_len = [], 0
    for kind, ids in steps:
        ar = ids.shape[1]
        past = context - ar
        cos, sin = rope_tables(d, rope.theta, np.arange(past_len, past_len + ar), rope.scaling)
        values = {INPUT_IDS: ids.astype(np.int32), MASK: causal_mask(ar, context, past_len), POS_COS: cos,
                  POS_SIN: sin}
        for layer in layers:
            keys, vals = np.zeros((1, kv, d, past), np.float32), np.zeros((1, kv, past, d), np.float32)
            keys[..., :past_len], vals[:, :, :past_len] = cache[layer]
            values[kv_name("key", layer, "in")], values[kv_name("value", layer, "in")] = keys, vals
        for part in plan.parts:
            values.update(run_graph(graphs_of(part)[kind], values))
        for layer in layers:
            cache[layer] = (np.concatenate([cache[layer][0], values[kv_name("key", layer, "out")]], axis=3),
                            np.concatenate([cache[layer][1], values[kv_name("value", layer, "out")]], axis=2))
        logits.append(values[LOGITS])
        past_len += ar
    return logits


def test_the_logits_agree_across_lengths_on_a_sequence_that_fits_every_length(exported):
    checkpoint, plan, parts, _ = exported
    config = json.loads((checkpoint / "config.json").read_text())
    rng = np.random.default_rng(3)
    prompt_ids = rng.integers(0, config["vocab_size"], (1, AR))
    next_ids = [int(token) for token in rng.integers(0, config["vocab_size"], min(LENGTHS) - AR)]  # fills CL 16
    base = _chained_logits(checkpoint, plan, lambda part: part_files(parts / part.label)[0], CONTEXT, prompt_ids,
                           next_ids)
    assert min(float(np.abs(step).max()) for step in base) > 0.1
    assert not np.allclose(base[1], base[2])   # each step's logits are its own
    for context in LENGTHS:
        ours = _chained_logits(checkpoint, plan, lambda part: length_files(parts / part.label, context), context,
                               prompt_ids, next_ids)
        for step, (theirs, mine) in enumerate(zip(base, ours, strict=True)):
            largest = max(float(np.abs(theirs).max()), 1.0)
            assert float(np.abs(mine - theirs).max()) <= TOLERANCE * largest, (context, step)


# --- refusals ---------------------------------------------------------------------------------------------

def _edit_initializer(folder: Path, edit) -> None:
    """Apply ``edit(folder, model, tensor)`` to the first 2-D weight of the folder's ``prompt.onnx`` whose dims
    differ, and save the graph (its weights stay where they are)."""
    model = onnx.load(folder / "prompt.onnx", load_external_data=False)
    tensor = next(t for t in model.graph.initializer if len(t.dims) == 2 and t.dims[0] != t.dims[1])
    edit(folder, model, tensor)
    onnx.save(model, folder / "prompt.onnx")


def _drop(folder, model, tensor):
    model.graph.initializer.remove(tensor)


def _transpose_dims(folder, model, tensor):
    tensor.dims[:] = list(reversed(tensor.dims))


def _as_int32(folder, model, tensor):
    tensor.data_type = onnx.TensorProto.INT32


def _inline(folder, model, tensor):
    entries = {entry.key: entry.value for entry in tensor.external_data}
    with open(folder / entries["location"], "rb") as handle:
        handle.seek(int(entries["offset"]))
        tensor.raw_data = handle.read(int(entries["length"]))
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT


REFUSALS = {  # case -> (how the part's folder is broken, context, the file named, words of the problem)
    "no-part": (lambda folder: [path.unlink() for path in folder.iterdir()], 16, "prompt.onnx", "export-part"),
    "no-data-file": (lambda folder: (folder / "weights.onnx.data").unlink(), 16, "weights.onnx.data", "not found"),
    "its-own-length": (None, CONTEXT, "prompt.onnx", "already"),
    "missing-weight": (lambda folder: _edit_initializer(folder, _drop), 16, "prompt.onnx", "has no weight"),
    "other-shape": (lambda folder: _edit_initializer(folder, _transpose_dims), 16, "prompt.onnx",
                    "reads it as float"),
    "other-dtype": (lambda folder: _edit_initializer(folder, _as_int32), 16, "prompt.onnx", "is int32"),
    "inline-weight": (lambda folder: _edit_initializer(folder, _inline), 16, "prompt.onnx",
                      "not all in weights.onnx.data"),
    # the settings, as export-part refuses them (naming the config's key)
    "beyond-max-positions": (None, 2 * MAX_POSITIONS, "config export.context", "max_position_embeddings"),
    "context-not-above-ar": (None, AR, "config export.ar", "below"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_what_cannot_be_added_is_refused_in_one_line_naming_the_file(exported, tmp_path, case):
    checkpoint, plan, parts, _ = exported
    part = plan.parts[1]
    folder = tmp_path / part.label
    shutil.copytree(parts / part.label, folder)
    for context in LENGTHS:
        for path in length_files(folder, context).values():
            path.unlink()
    breaking, context, named, words = REFUSALS[case]
    if breaking:
        breaking(folder)
    states = _file_states(folder)
    with pytest.raises(GenieBuildError) as error:
        export_length(checkpoint, part, folder, num_parts=NUM_PARTS, ar=AR, context=context)
    assert Path(error.value.where).name == named, str(error.value)
    assert words in error.value.problem, str(error.value)
    assert "\n" not in str(error.value)
    assert _file_states(folder) == states   # nothing written, nothing rewritten


def test_the_command_writes_both_graphs_or_exits_2_with_one_line(exported, tmp_path):
    checkpoint, plan, parts, _ = exported
    part = plan.parts[-1]
    folder = tmp_path / part.label
    shutil.copytree(parts / part.label, folder)
    part_json = json.dumps(dataclasses.asdict(part))
    command = [sys.executable, "-m", "genie_build", "export-length", "--checkpoint", str(checkpoint), "--part-json",
               part_json, "--num-parts", str(NUM_PARTS), "--ar", str(AR), "--out-dir", str(folder), "--context"]
    for path in length_files(folder, 16).values():
        path.unlink()
    done = subprocess.run([*command, "16"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert all(path.is_file() for path in length_files(folder, 16).values())
    refused = subprocess.run([*command, str(CONTEXT)], capture_output=True, text=True)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert lines[0].startswith(f"genie-build: error: {folder / 'prompt.onnx'}: ") and "already" in lines[0]


# --- one binary, several lengths --------------------------------------------------------------------------

def _weight_encodings(path: Path) -> Encodings:
    """8-bit symmetric per-tensor encodings of every matrix of a part's graph (the rest stays float)."""
    model = onnx.load(path)   # tiny: its weights loaded
    params = {}
    for tensor in model.graph.initializer:
        values = onnx.numpy_helper.to_array(tensor)
        if values.ndim == 2:
            params[tensor.name] = TensorEncoding(tensor.name, "int", 8, "per_tensor", True,
                                                 (max(float(np.abs(values).max()), 1e-8) / 127,), (-128,))
    return Encodings(params=params)


def test_a_binary_with_the_part_at_two_lengths_stores_each_weight_once(exported, tmp_path):
    _, plan, parts, _ = exported
    part = plan.parts[-1]
    reference = get_toolchain("reference")
    graphs, _ = part_files(parts / part.label)
    write_encodings(tmp_path / "part.encodings.json", _weight_encodings(graphs["prompt"]))
    converted = {}
    for context, files in ((CONTEXT, graphs), (LENGTHS[0], length_files(parts / part.label, LENGTHS[0]))):
        for kind, path in files.items():
            name = graph_name(kind, graph_ar(kind, AR), context, part.index, NUM_PARTS)
            converted[name] = tmp_path / "converted" / f"{name}.onnx"
            reference.convert(path, tmp_path / "part.encodings.json", converted[name], graph_name=name,
                              float_bitwidth=16)
    own = {name: path for name, path in converted.items() if f"_cl{CONTEXT}_" in name}
    reference.compile(own, tmp_path / "one_length.bin", OPTIONS)
    reference.compile(converted, tmp_path / "two_lengths.bin", OPTIONS)
    one, two = (read_header(tmp_path / f"{name}.bin") for name in ("one_length", "two_lengths"))
    kinds = {entry["name"]: {graph.split("_")[0] for graph in entry["graphs"]} for entry in one["weights"]}
    assert sorted(entry["name"] for entry in two["weights"]) == sorted(kinds)   # each weight stored once
    for entry in two["weights"]:   # ... for the graphs of the kinds holding it, at both lengths
        assert sorted(entry["graphs"]) == sorted(name for name in converted
                                                  if name.split("_")[0] in kinds[entry["name"]])
    assert reference.inspect(tmp_path / "two_lengths.bin").weight_bytes == reference.inspect(
        tmp_path / "one_length.bin").weight_bytes
