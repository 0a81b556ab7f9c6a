"""The qnn-htp toolchain at the level of its commands: convert (the QDQ graph), convert-dlc (its DLC), compile (one
binary per part under the bundle's graph names, weights stored once), compile-twin and the twin's run in the HTP
simulation, and the one-line refusals (a missing wheel, an unknown chipset, a graph the HTP backend does not take whole).

The parts and encodings are the tiny demo's (tests/bundle_helpers.py), split and sliced as the workflow does; the
reference toolchain's converted graphs of the same parts are the oracle.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from bundle_helpers import TINY_DEMO, VARIANT, ReferenceBuild
from genie_build.conventions import graph_name, part_label
from genie_build.encodings import read_encodings
from genie_build.errors import GenieBuildError
from workflow_helpers import without_qnn_wheel

try:
    from genie_build.qnn_wheel import locate_wheel
    locate_wheel()
    WHEEL_MISSING = None
except GenieBuildError as exc:
    WHEEL_MISSING = str(exc)
needs_wheel = pytest.mark.skipif(WHEEL_MISSING is not None, reason=WHEEL_MISSING or "")
pytestmark = needs_wheel

NUM_PARTS = 3
QNN_VARIANT = {**VARIANT, "toolchain": "qnn-htp", "weights_packing": False}


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "genie_build", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def part_files(build: ReferenceBuild, index: int, kind: str) -> tuple[Path, Path]:
    label = part_label(index, NUM_PARTS)
    return (build.root / "parts" / f"part_{label}" / f"{kind}.onnx",
            build.root / "encodings" / f"part_{label}" / f"{kind}.encodings.json")


def name_of(index: int, kind: str) -> str:
    return graph_name(kind, TINY_DEMO["ar"] if kind == "prompt" else 1, TINY_DEMO["context"], index, NUM_PARTS)


@pytest.fixture(scope="module")
def converted(build: ReferenceBuild, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, str], Path]:
    """Every part's graphs converted by qnn-htp (part 1, the 8-bit per-channel embedding alone, among them)."""
    out = tmp_path_factory.mktemp("qnn-htp-converted")
    result = {}
    for index in range(1, NUM_PARTS + 1):
        for kind in ("prompt", "token"):
            onnx_path, encodings = part_files(build, index, kind)
            target = out / f"part_{index}" / f"{kind}.onnx"
            done = cli("convert", "--toolchain", "qnn-htp", "--onnx", onnx_path, "--encodings", encodings,
                       "--graph-name", name_of(index, kind), "--float-bitwidth", 16, "--out", target)
            assert done.returncode == 0, done.stderr[-2000:]
            result[index, kind] = target
    return result


def compile_part(converted: dict, index: int, out: Path, **options: object) -> subprocess.CompletedProcess:
    graphs = [f"{name_of(index, kind)}={converted[index, kind]}" for kind in ("prompt", "token")]
    return cli("compile", "--toolchain", "qnn-htp", "--graph", *graphs, "--variant-json",
               json.dumps({**QNN_VARIANT, **options}), "--chipset", "SM8750", "--out", out)


def test_the_qdq_graph_holds_the_weights_the_encodings_give(build, converted, tmp_path):
    """Each encoded weight dequantizes to exactly the reference toolchain's quantized weight (AIMET's
    fake-quantized values), its 4-bit values stored as INT4 (signed, zero point 0: the encodings are symmetric)."""
    from genie_build.toolchains.reference.convert import convert_model

    reference = tmp_path / "reference.onnx"
    onnx_path, encodings = part_files(build, 2, "prompt")
    convert_model(onnx_path, encodings, reference, graph_name="reference", float_bitwidth=32)
    params = read_encodings(encodings).params
    qdq, ref = (_weights(path, sorted(params)) for path in (converted[2, "prompt"], reference))
    for name in params:
        np.testing.assert_array_equal(qdq[name], ref[name], err_msg=name)
    stored = {t.name: t for t in onnx.load(converted[2, "prompt"], load_external_data=False).graph.initializer}
    int4 = [name for name, enc in params.items() if enc.bitwidth == 4]
    assert int4 and {stored[f"{name}_quantized"].data_type for name in int4} == {onnx.TensorProto.INT4}
    assert {stored[f"{name}_zero_point"].data_type for name in int4} == {onnx.TensorProto.INT4}


def _weights(path: Path, names: list[str]) -> dict[str, np.ndarray]:
    """The weights ``names`` as a converted graph's nodes rebuild them from its initializers, on the CPU."""
    model = onnx.load(path)
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in names)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    zeros = {value.name: np.zeros([d if isinstance(d, int) else 1 for d in value.shape], np.float32)
             for value in session.get_inputs()}
    return dict(zip(names, session.run(names, zeros)))


def test_every_encoded_activation_is_quantized_with_its_encoding(build, converted):
    onnx_path, encodings = part_files(build, 2, "prompt")
    activations = read_encodings(encodings).activations
    model = onnx.load(converted[2, "prompt"], load_external_data=False)
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith(
        ("/scale", "/zero_point"))}
    quantized = {node.input[0].removesuffix("/float") if node.input[0].endswith("/float") else node.input[0]: node
                 for node in model.graph.node if node.op_type == "QuantizeLinear"}
    for name, enc in activations.items():
        node = quantized[name]
        assert initializers[node.input[1]] == np.float32(enc.scale[0]), name
        assert int(initializers[node.input[2]]) == -enc.offset[0], name
        assert initializers[node.input[2]].dtype == (np.uint16 if enc.bitwidth == 16 else np.uint8), name


def test_the_qdq_part_on_the_cpu_computes_the_reference_parts_outputs(build, converted):
    """The QDQ graph quantizes its activations at their encodings' grids, the reference does not: on the sample the
    grids were calibrated on (no value clipped), they agree within what the grids cost -- the tiny demo's KV cache is
    8-bit, so attention reads 8-bit keys and values (2.4% on the residual stream measured; a wrong scale or offset
    anywhere gives tens of percent)."""
    from genie_build.toolchains.reference.convert import convert_model

    onnx_path, encodings = part_files(build, 2, "prompt")
    reference = converted[2, "prompt"].parent / "reference32.onnx"
    convert_model(onnx_path, encodings, reference, graph_name="reference", float_bitwidth=32)
    qdq = ort.InferenceSession(str(converted[2, "prompt"]), providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(str(reference), providers=["CPUExecutionProvider"])
    feed = calibration_feed(build, ref)
    for (name, got), expected in zip(zip([o.name for o in qdq.get_outputs()], qdq.run(None, feed)),
                                     ref.run([o.name for o in qdq.get_outputs()], feed)):
        assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 0.04, name


def calibration_feed(build: ReferenceBuild, session: ort.InferenceSession) -> dict[str, np.ndarray]:
    """Part 2's inputs on the sample the tiny demo's encodings were calibrated on (tests/bundle_helpers.py calibrates
    on one): the embedding rows of its tokens (part 1 is the embedding alone), its mask, RoPE tables and cache."""
    from genie_build.quantize.calibrate import calibration_feeds
    from demo_shapes import demo_shape
    from genie_build.toolchains.reference.onnx_io import read_initializer

    sample = next(calibration_feeds(demo_shape(TINY_DEMO), "prompt", 1))
    source = onnx.load(build.source / "prompt.onnx", load_external_data=False)
    table = read_initializer(next(t for t in source.graph.initializer if t.name == "model.embed_tokens.weight"),
                             build.source / "prompt.onnx")
    hidden = table[sample["input_ids"].astype(np.int64)]
    return {value.name: sample[value.name] if value.name in sample else hidden for value in session.get_inputs()}


def test_convert_dlc_writes_the_graph_as_a_dlc_the_vendors_reader_opens(converted, tmp_path):
    from genie_build.qnn_wheel.system import read_dlc

    out = tmp_path / "token.dlc"
    done = cli("convert-dlc", "--graph", converted[2, "token"], "--graph-name", name_of(2, "token"), "--out", out)
    assert done.returncode == 0, done.stderr[-2000:]
    dlc = read_dlc(out)
    assert [graph.name for graph in dlc.graphs] == [name_of(2, "token")]
    assert {t.name for t in dlc.graphs[0].info.inputs} >= {"attention_mask", "position_ids_cos"}


def test_one_binary_per_part_holds_its_graphs_under_the_bundles_names_with_the_encodings_io(build, converted,
                                                                                           tmp_path):
    from genie_build.qnn_wheel.system import read_context_binary

    out = tmp_path / "part_2.bin"
    done = compile_part(converted, 2, out)
    assert done.returncode == 0, done.stderr[-2000:]
    binary = read_context_binary(out)
    assert (binary.soc_model, binary.dsp_arch, binary.build_id[:7]) == (69, "v79", "v2.51.0")
    assert sorted(graph.info.name for graph in binary.graphs) == sorted(name_of(2, kind) for kind in ("prompt", "token"))
    for graph in binary.graphs:
        kind = graph.info.name.split("_")[0]
        activations = read_encodings(part_files(build, 2, kind)[1]).activations
        for tensor in (*graph.info.inputs, *graph.info.outputs):
            enc = activations[tensor.name]
            assert (tensor.quant.bitwidth, tensor.quant.offset) == (enc.bitwidth, enc.offset[0]), tensor.name
            assert tensor.quant.scale == pytest.approx(enc.scale[0], rel=1e-6), tensor.name


def test_the_weight_shared_binary_is_smaller_than_the_separate_graphs_and_packing_changes_no_size(converted,
                                                                                                 tmp_path):
    sizes = {}
    for label, options in (("shared", {}), ("separate", {"weight_sharing_enabled": False}),
                           ("packed", {"weights_packing": True})):
        out = tmp_path / f"{label}.bin"
        assert compile_part(converted, 2, out, **options).returncode == 0
        sizes[label] = out.stat().st_size
    assert sizes["shared"] < sizes["separate"]
    assert sizes["packed"] == sizes["shared"]   # QNN 2.51 stores int4 at 4 bits with or without the option
    assert (tmp_path / "packed.bin").read_bytes() != (tmp_path / "shared.bin").read_bytes()  # the option applied


def test_the_twin_runs_in_the_htp_simulation_as_the_qdq_graph_on_the_cpu(build, converted, tmp_path):
    from genie_build.run.run_bundle import GraphFile, _graph_session
    from genie_build.toolchains.qnn_htp.twin import require_same_io, twin_models, twin_target

    shipped, twin = tmp_path / "part_2.bin", tmp_path / "twin"
    assert compile_part(converted, 2, shipped).returncode == 0
    graphs = [f"{name_of(2, kind)}={converted[2, kind]}" for kind in ("prompt", "token")]
    done = cli("compile-twin", "--graph", *graphs, "--variant-json", json.dumps(QNN_VARIANT), "--chipset", "SM8750",
               "--out-dir", twin)
    assert done.returncode == 0, done.stderr[-2000:]
    names = require_same_io(shipped, twin)
    model = twin_models(twin, names)[name_of(2, "prompt")]
    simulated = _graph_session(GraphFile(onnx.load(model), model, twin_target(twin)))
    on_cpu = ort.InferenceSession(str(converted[2, "prompt"]), providers=["CPUExecutionProvider"])
    feed = calibration_feed(build, on_cpu)
    got = simulated.run(feed)
    for name, expected in zip([o.name for o in on_cpu.get_outputs()], on_cpu.run(None, feed)):
        assert np.linalg.norm(got[name] - expected) / np.linalg.norm(expected) < 0.03, name


def test_a_twin_of_other_graphs_is_refused_naming_the_difference(converted, tmp_path):
    from genie_build.toolchains.qnn_htp.twin import require_same_io

    shipped, other = tmp_path / "part_2.bin", tmp_path / "other"
    assert compile_part(converted, 2, shipped).returncode == 0
    graphs = [f"{name_of(3, kind)}={converted[3, kind]}" for kind in ("prompt", "token")]
    assert cli("compile-twin", "--graph", *graphs, "--variant-json", json.dumps(QNN_VARIANT), "--chipset", "SM8750",
               "--out-dir", other).returncode == 0
    with pytest.raises(GenieBuildError, match="holds graphs"):
        require_same_io(shipped, other)


def test_a_graph_the_htp_does_not_take_whole_is_one_line_naming_the_op(converted, tmp_path):
    """Part 1 is the tiny demo's 8-bit per-channel embedding table: its Gather's table stays on the CPU."""
    done = compile_part(converted, 1, tmp_path / "part_1.bin")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("genie-build: error: ") and "does not run on the HTP backend whole" in last
    assert "DequantizeLinear" in last and "bundle.embedding: lut" in last
    assert not (tmp_path / "part_1.bin").exists() and list(tmp_path.glob(".*")) == []


def test_an_unknown_chipset_is_one_line(converted, tmp_path):
    done = cli("compile", "--toolchain", "qnn-htp", "--graph", f"{name_of(2, 'prompt')}={converted[2, 'prompt']}",
               "--variant-json", json.dumps(QNN_VARIANT), "--chipset", "SM9999", "--out", tmp_path / "x.bin")
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("genie-build: error: ")
    assert "SM9999" in done.stderr


@pytest.mark.parametrize("command", ["convert", "compile"])
def test_a_missing_wheel_is_one_line_naming_the_extra(build, tmp_path, command):
    """The wheel hidden from a fresh interpreter."""
    onnx_path, encodings = part_files(build, 2, "prompt")
    args = (["convert", "--toolchain", "qnn-htp", "--onnx", onnx_path, "--encodings", encodings, "--graph-name", "g",
             "--float-bitwidth", 16, "--out", tmp_path / "g.onnx"] if command == "convert" else
            ["compile", "--toolchain", "qnn-htp", "--graph", f"g={onnx_path}", "--variant-json",
             json.dumps(QNN_VARIANT), "--chipset", "SM8750", "--out", tmp_path / "g.bin"])
    done = subprocess.run([sys.executable, "-m", "genie_build", *map(str, args)], capture_output=True, text=True,
                          env=without_qnn_wheel(tmp_path / "hide"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"genie-build: error: toolchain qnn-htp: the onnxruntime-qnn wheel is not installed for {sys.executable}: "
        "pip install -r envs/requirements-qnn.txt")


def test_a_weight_with_a_float_encoding_stays_float_and_runs_on_the_htp(build, tmp_path):
    """AIMET's float fallback: a norm weight given a float16 encoding is not quantized; its op runs in float16."""
    onnx_path, encodings = part_files(build, 2, "prompt")
    document = json.loads(encodings.read_text())
    norm = next(t.name for t in onnx.load(onnx_path, load_external_data=False).graph.initializer
                if t.name.endswith("input_layernorm.weight"))
    document["param_encodings"] = [entry for entry in document["param_encodings"] if entry["name"] != norm]
    document["param_encodings"].append({"name": norm, "dtype": "FLOAT", "bw": 16, "enc_type": "PER_TENSOR"})
    edited, out = tmp_path / "edited.encodings.json", tmp_path / "converted" / "prompt.onnx"
    edited.write_text(json.dumps(document))
    done = cli("convert", "--toolchain", "qnn-htp", "--onnx", onnx_path, "--encodings", edited, "--graph-name",
               name_of(2, "prompt"), "--float-bitwidth", 16, "--out", out)
    assert done.returncode == 0, done.stderr[-2000:]
    model = onnx.load(out, load_external_data=False)
    assert norm in {t.name for t in model.graph.initializer}
    assert not any(node.output[0] == norm for node in model.graph.node)
    assert cli("compile", "--toolchain", "qnn-htp", "--graph", f"{name_of(2, 'prompt')}={out}", "--variant-json",
               json.dumps(QNN_VARIANT), "--chipset", "SM8750", "--out", tmp_path / "p.bin").returncode == 0


def test_check_bundle_refuses_a_binary_compiled_for_another_soc_than_the_extension_config_names(converted, tmp_path):
    from genie_build.bundle.check_bundle import _check_binary_socs

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    assert compile_part(converted, 2, bundle / "demo_part_2_of_3.bin").returncode == 0
    sm8750, sm8650 = {"devices": [{"soc_model": 69, "dsp_arch": "v79"}]}, {"devices": [{"soc_model": 57}]}
    assert _check_binary_socs(bundle, ["demo_part_2_of_3.bin"], "ext.json", sm8750) == []
    (finding,) = _check_binary_socs(bundle, ["demo_part_2_of_3.bin"], "ext.json", sm8650)
    assert (finding.rule, finding.severity) == ("chipset", "error")
    assert finding.message == "demo_part_2_of_3.bin was compiled for soc_model 69, but ext.json names 57"


def test_a_weight_read_through_a_transpose_is_stored_transposed_and_computes_the_same(build, converted, tmp_path):
    """torch.onnx writes ``nn.Linear`` as ``weight [out, in]`` -> Transpose -> MatMul; QNN's execution provider
    leaves a DequantizeLinear feeding a Transpose on the CPU at a 7B LM head's size, so the convert stores such a
    weight transposed and drops the Transpose. Here every MatMul weight of the demo's part 2 is rewritten that way
    (the encodings unchanged: their scales are listed by channel whatever the storage): the converted graph holds
    no Transpose of a weight, dequantizes each to the same values, computes what the untouched graph's conversion computes, and compiles
    whole."""
    from genie_build.toolchains.qnn_htp.qdq import FOLDED_KEY

    onnx_path, encodings = part_files(build, 2, "prompt")
    model = onnx.load(onnx_path)
    weights = {t.name: t for t in model.graph.initializer if len(t.dims) == 2}
    transposed = {}
    for node in [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights]:
        name = node.input[1]
        if name in transposed:
            continue
        tensor = weights[name]
        tensor.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(tensor).T), name))
        transposed[name] = f"{name}/transposed"
        model.graph.node.append(onnx.helper.make_node("Transpose", [name], [transposed[name]], perm=[1, 0],
                                                      name=f"{name}/Transpose"))
    for node in model.graph.node:
        if node.op_type == "MatMul":
            node.input[:] = [transposed.get(name, name) for name in node.input]
    assert transposed
    nodes = list(model.graph.node)  # topological again: each Transpose before its reader
    order = sorted(range(len(nodes)), key=lambda i: (not nodes[i].op_type == "Transpose", i))
    del model.graph.node[:]
    model.graph.node.extend(nodes[i] for i in order)
    edited = tmp_path / "edited" / "prompt.onnx"
    edited.parent.mkdir()
    onnx.save(model, edited, save_as_external_data=True, location="prompt.onnx.data")
    out = tmp_path / "converted" / "prompt.onnx"
    done = cli("convert", "--toolchain", "qnn-htp", "--onnx", edited, "--encodings", encodings, "--graph-name",
               name_of(2, "prompt"), "--float-bitwidth", 16, "--out", out)
    assert done.returncode == 0, done.stderr[-2000:]

    folded = onnx.load(out, load_external_data=False)
    producers = {output: node.op_type for node in folded.graph.node for output in node.output}
    assert {producers[output] for output in transposed.values()} == {"DequantizeLinear"}
    stored = {t.name for t in folded.graph.initializer}
    dequantized_weights = {n.output[0] for n in folded.graph.node if n.op_type == "DequantizeLinear"
                           and n.input[0] in stored}
    assert not [n for n in folded.graph.node if n.op_type == "Transpose" and n.input[0] in dequantized_weights]
    assert json.loads(next(p.value for p in folded.metadata_props if p.key == FOLDED_KEY)) == transposed
    names = sorted(transposed)
    got = _weights(out, [transposed[name] for name in names])
    untouched = _weights(converted[2, "prompt"], names)
    for name in names:
        np.testing.assert_array_equal(got[transposed[name]], untouched[name], err_msg=name)
    ours = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    theirs = ort.InferenceSession(str(converted[2, "prompt"]), providers=["CPUExecutionProvider"])
    feed = calibration_feed(build, theirs)
    outputs = [o.name for o in theirs.get_outputs()]
    for name, a, b in zip(outputs, ours.run(outputs, feed), theirs.run(outputs, feed)):
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert cli("compile", "--toolchain", "qnn-htp", "--graph", f"{name_of(2, 'prompt')}={out}", "--variant-json",
               json.dumps(QNN_VARIANT), "--chipset", "SM8750", "--out", tmp_path / "p.bin").returncode == 0


@pytest.mark.parametrize("kind", ["per_channel", "per_block", "lpbq"])
def test_a_folded_weight_dequantizes_to_the_unfolded_weight_transposed(kind):
    """Every encoding kind a MatMul weight takes: stored transposed, its DequantizeLinear (two for LPBQ) gives
    exactly the transpose of what the weight as written dequantizes to."""
    from genie_build.encodings import TensorEncoding
    from genie_build.onnx_graph import WeightLayout
    from genie_build.toolchains.qnn_htp.qdq import _weight

    rng = np.random.default_rng(7)
    out_features, in_features, block = 16, 32, 8
    weight = rng.normal(0, 0.05, (out_features, in_features)).astype(np.float32)   # [out, in], read transposed
    blocks = out_features * in_features // block
    enc = {"per_channel": TensorEncoding("w", "int", 4, "per_channel", True,
                                         tuple(rng.uniform(0.01, 0.02, out_features).tolist()), (-8,) * out_features),
           "per_block": TensorEncoding("w", "int", 4, "per_block", True, tuple(rng.uniform(0.01, 0.02, blocks).tolist()),
                                       (-8,) * blocks, block_size=block),
           "lpbq": TensorEncoding("w", "int", 8, "lpbq", True, tuple(rng.uniform(0.001, 0.002, out_features).tolist()),
                                  (-128,) * out_features, block_size=block, compressed_bitwidth=4,
                                  per_block_int_scale=tuple(rng.integers(1, 17, blocks).tolist()))}[kind]
    layout = WeightLayout(0, 1)          # what a Transpose before a MatMul gives an [out, in] weight

    def dequantized(rewrite, output: str) -> np.ndarray:
        graph = onnx.helper.make_graph(
            list(rewrite.nodes), "w", [], [onnx.helper.make_tensor_value_info(output, onnx.TensorProto.FLOAT, None)],
            [onnx.helper.make_tensor(t.name, t.data_type, t.dims, t.values.tobytes(), raw=True)
             for t in rewrite.tensors])
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)])
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})[0]

    as_written = dequantized(_weight("w", weight, enc, layout), "w")
    folded = dequantized(_weight("w", weight, enc, layout, transposed_as="w_t"), "w_t")
    assert folded.shape == (in_features, out_features)
    np.testing.assert_array_equal(folded, as_written.T)
    assert np.abs(as_written - weight).max() < 0.1


def test_a_weight_the_prompt_graph_converted_from_the_same_bytes_and_encoding_is_taken_not_quantized_again(
        build, converted, tmp_path, monkeypatch):
    """The token graph (and every other length's graphs) converted beside the prompt graph: each weight the prompt
    graph converted from the same bytes with the same encoding is taken as it is -- nothing quantized again, nothing
    written, the same outputs as the token graph converted alone; a weight whose encoding differs is quantized again
    into the token graph's own data file."""
    from genie_build.encodings import write_encodings
    from genie_build.toolchains.qnn_htp import qdq

    quantized, real = [], qdq.quantize
    monkeypatch.setattr(qdq, "quantize", lambda array, enc, layout: quantized.append(enc.name) or real(array, enc,
                                                                                                        layout))
    part = tmp_path / "part"
    prompt, token = (part_files(build, 2, kind) for kind in ("prompt", "token"))
    qdq.write_qdq_model(prompt[0], prompt[1], part / "prompt.onnx", graph_name=name_of(2, "prompt"))
    in_prompt = len(quantized)
    qdq.write_qdq_model(token[0], token[1], part / "token.onnx", graph_name=name_of(2, "token"),
                        share_weights_with=part / "prompt.onnx")
    assert in_prompt > 0 and quantized[in_prompt:] == []
    assert (part / "token.onnx.data").stat().st_size == 0
    ours = ort.InferenceSession(str(part / "token.onnx"), providers=["CPUExecutionProvider"])
    alone = ort.InferenceSession(str(converted[2, "token"]), providers=["CPUExecutionProvider"])
    feed = {value.name: np.random.default_rng(1).uniform(0, 1, value.shape).astype(np.float32)
            for value in alone.get_inputs()}
    for a, b in zip(ours.run(None, feed), alone.run(None, feed), strict=True):
        np.testing.assert_array_equal(a, b)

    encodings = read_encodings(token[1])
    changed = next(name for name, enc in encodings.params.items() if enc.kind == "per_channel")
    enc = encodings.params[changed]
    edited = dataclasses.replace(encodings, params={**encodings.params, changed: dataclasses.replace(
        enc, scale=tuple(2 * x for x in enc.scale))})
    write_encodings(tmp_path / "token.encodings.json", edited)
    del quantized[:]
    qdq.write_qdq_model(token[0], tmp_path / "token.encodings.json", part / "token_changed.onnx",
                        graph_name=name_of(2, "token"), share_weights_with=part / "prompt.onnx")
    assert quantized == [changed]
    model = onnx.load(part / "token_changed.onnx", load_external_data=False)
    location = next(entry.value for t in model.graph.initializer if t.name == f"{changed}_quantized"
                    for entry in t.external_data if entry.key == "location")
    assert location == "token_changed.onnx.data"
