"""The embedding as a CPU table (bundle.embedding: lut): the table file and its encoding, check-bundle's checks of it,
the config's rules, and the estimate's and memory plan's two layouts. The bytes against qairt-dev's own code:
tests/qairt_api/test_vendor_embedding_table.py; the workflow: tests/test_workflow_embedding.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from bundle_helpers import replace_tensor, synthetic_infos, with_inputs_embeds, write_bundle
from genie_build.bundle.check_bundle import check_bundle
from genie_build.bundle.embedding_table import (TableEncoding, dequantize_rows, dialog_embedding, quantize_table,
                                                write_embedding_table)
from genie_build.config import validate_config
from genie_build.errors import GenieBuildError
from genie_build.plan.precision import Precision
from genie_build.sizes.estimate import estimate_to_dir

REPO = Path(__file__).resolve().parents[1]
OUTPUT, TABLE = "/model/embed_tokens/Gather_output_0", "model.embed_tokens.weight"


def embedding_part(directory: Path, table: np.ndarray, entries: list[dict]) -> tuple[Path, Path]:
    graph = helper.make_graph([helper.make_node("Gather", [TABLE, "input_ids"], [OUTPUT])], "part_1",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT32, [1, 4])],
                              [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, [1, 4, table.shape[1]])],
                              [numpy_helper.from_array(table, TABLE)])
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), directory / "part.onnx")
    (directory / "part.encodings.json").write_text(json.dumps({"version": "1.0.0", "activation_encodings": entries,
                                                               "param_encodings": [], "quantizer_args": {}}))
    return directory / "part.onnx", directory / "part.encodings.json"


def encoding(name: str, bitwidth: int = 16, kind: str = "PER_TENSOR", scales: int = 1) -> dict:
    return {"name": name, "dtype": "INT", "enc_type": kind, "bw": bitwidth, "is_sym": False,
            "scale": [1e-4] * scales, "offset": [-(2 ** (bitwidth - 1))] * scales}


def test_codes_read_back_within_half_a_step_and_clip_beyond_the_range():
    enc = TableEncoding(16, 1e-4, -32768)
    values = np.array([[-5.0, -0.5, 0.0, 0.00015, 5.0]], dtype=np.float32)  # the range is +-3.28
    codes = quantize_table(values, enc)
    assert codes.dtype == np.uint16 and codes[0, 0] == 0 and codes[0, -1] == 65535
    back = dequantize_rows(codes, enc)
    assert np.allclose(back[0, 1:4], values[0, 1:4], atol=0.5e-4 + 1e-9)


def test_the_table_is_quantized_by_the_output_encoding_else_the_tables_and_float32_without_either(tmp_path):
    table = np.random.default_rng(0).normal(0, 0.01, size=(10, 6)).astype(np.float32)
    written = write_embedding_table(*embedding_part(tmp_path / "a", table, [encoding(OUTPUT, 8), encoding(TABLE)]),
                                    tmp_path / "a.bin")
    assert written.encoding.bitwidth == 8 and (tmp_path / "a.bin").stat().st_size == 60
    written = write_embedding_table(*embedding_part(tmp_path / "b", table, [encoding(TABLE)]), tmp_path / "b.bin")
    assert written.encoding.datatype == "ufixed16" and (tmp_path / "b.bin").stat().st_size == 120
    written = write_embedding_table(*embedding_part(tmp_path / "c", table, []), tmp_path / "c.bin")
    assert written.encoding.datatype == "float32"
    assert np.array_equal(np.fromfile(tmp_path / "c.bin", dtype=np.float32).reshape(10, 6), table)
    assert "quant-param" not in dialog_embedding(6, written.encoding)


@pytest.mark.parametrize("entry, problem", [(encoding(OUTPUT, kind="PER_CHANNEL", scales=6), "one scale"),
                                            (encoding(OUTPUT, bitwidth=4), "stored at 8 or 16")])
def test_an_encoding_the_table_cannot_carry_is_one_line(tmp_path, entry, problem):
    table = np.zeros((10, 6), dtype=np.float32)
    with pytest.raises(GenieBuildError, match=problem):
        write_embedding_table(*embedding_part(tmp_path / "p", table, [entry]), tmp_path / "t.bin")
    assert not (tmp_path / "t.bin").exists()


def test_a_part_that_is_not_the_embedding_lookup_is_refused(tmp_path):
    onnx_path, encodings = embedding_part(tmp_path / "p", np.zeros((4, 2), dtype=np.float32), [])
    model = onnx.load(onnx_path)
    model.graph.node[0].op_type = "Identity"
    del model.graph.node[0].input[1]
    onnx.save(model, onnx_path)
    with pytest.raises(GenieBuildError, match="no Gather of an embedding table by input_ids"):
        write_embedding_table(onnx_path, encodings, tmp_path / "t.bin")


def _part_with(directory: Path, table: np.ndarray, nodes: list, inputs: list, initializers: list,
               entries: list[dict]) -> tuple[Path, Path]:
    """Part 1 as ``embedding_part`` writes it, with ``nodes`` after the Gather (the last gives ``embedded``)."""
    onnx_path, encodings_path = embedding_part(directory, table, entries)
    model = onnx.load(onnx_path)
    model.graph.node.extend(nodes)
    model.graph.input.extend(inputs)
    model.graph.initializer.extend(initializers)
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("embedded", TensorProto.FLOAT, [1, 4, table.shape[1]]))
    onnx.save(model, onnx_path)
    return onnx_path, encodings_path


def _embedding_table_command(onnx_path: Path, encodings: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "genie_build", "embedding-table", "--onnx", str(onnx_path),
                           "--encodings", str(encodings), "--out", str(out)], capture_output=True, text=True,
                          check=False)


def test_the_table_holds_what_part_1_computes_after_its_gather(tmp_path):
    """Part 1 scales the Gather's rows by sqrt(hidden) (Gemma's embedding): the table holds the scaled rows,
    quantized with the scaled output's encoding, not the Gather's."""
    table = np.random.default_rng(1).normal(0, 0.01, size=(10, 6)).astype(np.float32)
    scale = np.float32(np.sqrt(6))
    mul = helper.make_node("Mul", [OUTPUT, "scale"], ["embedded"])
    wide = {**encoding("embedded"), "scale": [1e-4 * float(scale)]}
    onnx_path, encodings = _part_with(tmp_path / "p", table, [mul], [], [numpy_helper.from_array(scale, "scale")],
                                      [encoding(OUTPUT), wide])
    result = _embedding_table_command(onnx_path, encodings, tmp_path / "t.bin")
    assert result.returncode == 0, result.stderr
    stored = TableEncoding(16, 1e-4 * float(scale), -32768)
    assert (tmp_path / "t.bin").read_bytes() == quantize_table(table * scale, stored).tobytes()
    assert json.loads((tmp_path / "t.bin.json").read_text())["scale"] == stored.scale


def test_a_part_whose_rows_depend_on_more_than_the_token_is_refused_in_one_line(tmp_path):
    """Learned positions added to the rows (an input besides input_ids), or a sum along the sequence (a row that
    changes with the tokens beside it): no table holds them."""
    table = np.random.default_rng(2).normal(0, 0.01, size=(10, 6)).astype(np.float32)
    positions = [helper.make_node("Gather", ["wpe", "position_ids"], ["pos"]),
                 helper.make_node("Add", [OUTPUT, "pos"], ["embedded"])]
    onnx_path, encodings = _part_with(
        tmp_path / "positions", table, positions,
        [helper.make_tensor_value_info("position_ids", TensorProto.INT32, [1, 4])],
        [numpy_helper.from_array(np.ones((8, 6), np.float32), "wpe")], [])
    result = _embedding_table_command(onnx_path, encodings, tmp_path / "a.bin")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "takes 'position_ids' besides input_ids" in result.stderr and not (tmp_path / "a.bin").exists()
    cumulative = [helper.make_node("CumSum", [OUTPUT, "axis"], ["embedded"])]
    onnx_path, encodings = _part_with(tmp_path / "cumsum", table, cumulative, [],
                                      [numpy_helper.from_array(np.array(1, np.int64), "axis")], [])
    result = _embedding_table_command(onnx_path, encodings, tmp_path / "b.bin")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "is not a lookup: token 0's row changes with the tokens beside it" in result.stderr
    assert not (tmp_path / "b.bin").exists()


def lut_bundle(directory: Path, *, table_bytes: int | None = None, **block: object) -> Path:
    """A 2-part bundle's ctx-bins after its table (vocab 64, hidden 64), with a ufixed16 table."""
    infos = with_inputs_embeds(dict(list(synthetic_infos(num_parts=3).items())[1:]), 64)
    bundle = write_bundle(directory, infos)
    config = json.loads((bundle / "genie_config.json").read_text())
    config["dialog"]["embedding"] = {**dialog_embedding(64, TableEncoding(16, 1e-4, -32768)), **block}
    (bundle / "genie_config.json").write_text(json.dumps(config))
    (bundle / "embedding_table.bin").write_bytes(bytes(64 * 64 * 2 if table_bytes is None else table_bytes))
    return bundle


def _embedding_findings(bundle: Path) -> list[str]:
    return [f"{f.severity} {f.message}" for f in check_bundle(bundle) if f.rule == "embedding-table"]


def test_a_table_bundle_passes(tmp_path):
    assert check_bundle(lut_bundle(tmp_path / "b")) == []


@pytest.mark.parametrize("change, message", [
    ({"table_bytes": 64 * 64}, "is 4096 bytes, but n-vocab 64 x size 64 x 2 bytes (ufixed16) is 8192"),
    ({"datatype": "ufixed8"}, "is 8192 bytes, but n-vocab 64 x size 64 x 1 bytes (ufixed8) is 4096"),
    ({"datatype": "int16"}, "datatype 'int16' is not one of"),
    ({"quant-param": None}, "needs quant-param"),
    ({"size": 32}, "takes inputs_embeds [1, 32, 64], but the table's rows are dialog.embedding.size 32 wide"),
    ({"lut-path": "missing.bin"}, "'missing.bin' is not in the bundle"),
])
def test_a_table_that_does_not_match_its_config_is_one_line_each(tmp_path, change, message):
    block = {key: value for key, value in change.items() if key != "table_bytes"}
    if block.get("quant-param", 0) is None:
        block["quant-param"] = {}
    findings = _embedding_findings(lut_bundle(tmp_path / "b", table_bytes=change.get("table_bytes"), **block))
    assert len(findings) >= 1 and any(message in finding for finding in findings), findings
    assert all(finding.startswith("error") and "\n" not in finding for finding in findings)


def test_a_first_part_with_input_ids_under_a_table_is_an_error(tmp_path):
    bundle = lut_bundle(tmp_path / "b")
    infos = dict(list(synthetic_infos(num_parts=3).items())[1:])  # the first ctx-bin takes input_ids
    plain = write_bundle(tmp_path / "plain", infos)
    (bundle / "metadata.yaml").write_text((plain / "metadata.yaml").read_text())
    assert any("has no inputs_embeds input" in finding for finding in _embedding_findings(bundle))


@pytest.mark.parametrize("bitwidth", [16, 32])
def test_a_table_of_codes_for_a_float_inputs_embeds_is_an_error(tmp_path, bitwidth):
    """Genie converts a table's values into a quantized inputs_embeds, but not codes into a float one (measured on the
    AIMET-calibrated demo: one token over and over): a ufixed16 table needs a quantized input, a float32 one not."""
    bundle = lut_bundle(tmp_path / "b", table_bytes=64 * 64 * bitwidth // 8,
                        **dialog_embedding(64, TableEncoding(bitwidth, 1e-4, -32768)))
    if bitwidth == 32:
        config = json.loads((bundle / "genie_config.json").read_text())
        del config["dialog"]["embedding"]["quant-param"]
        (bundle / "genie_config.json").write_text(json.dumps(config))
    infos = with_inputs_embeds(dict(list(synthetic_infos(num_parts=3).items())[1:]), 64)
    first = next(iter(infos))
    for graph in infos[first].graphs:
        infos = replace_tensor(infos, first, graph.name, "inputs_embeds", dtype="float32", quant=None)
    (bundle / "metadata.yaml").write_text((write_bundle(tmp_path / "float", infos) / "metadata.yaml").read_text())
    findings = _embedding_findings(bundle)
    assert findings == ([] if bitwidth == 32 else [
        f"error graph {graph!r} takes inputs_embeds as float32, but the table holds ufixed16 codes: Genie does not "
        "dequantize them for a float input, and the model answers one token over and over (give the input the "
        "table's encoding)" for graph in ("prompt_ar32_cl256_2_of_3", "token_ar1_cl256_2_of_3")])


def _config(**bundle: object) -> dict:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    return {**config, "bundle": {**config["bundle"], **bundle}}


def test_the_layout_defaults_to_the_graph_the_default_config_asks_for_the_table_and_it_needs_part_1_alone():
    unset = _config()
    del unset["bundle"]["embedding"]
    assert validate_config(unset)["bundle"]["embedding"] == "graph"
    assert validate_config(_config())["bundle"]["embedding"] == "lut"   # the demo's qnn-htp bundle
    with pytest.raises(GenieBuildError, match="bundle.embedding: lut takes part 1 out of the bundle"):
        validate_config({**_config(embedding="lut"), "split": {"num_parts": 6, "embedding_alone": False}})
    with pytest.raises(GenieBuildError, match="bundle.embedding: .*reference and qnn-htp toolchains only"):
        validate_config({**_config(embedding="lut", variant="packed"), "variants": {"packed": {"toolchain": "qairt"}},
                         "report": {"baseline_variant": "packed"}})


def test_the_estimate_counts_the_table_on_the_cpu_and_one_context_fewer(tmp_path):
    hf = REPO / "config" / "hf" / "qwen2_5_7b_instruct.json"
    split = {"num_parts": 6, "max_part_mb": None, "embedding_alone": True, "boundaries": []}
    plans = {}
    for layout in ("graph", "lut"):
        estimate_to_dir(tmp_path / layout, Precision(), split, hf_config=hf, ar=128, context_length=4096,
                        embedding=layout)
        plans[layout] = json.loads((tmp_path / layout / "memory_plan.json").read_text())
    graph, lut = plans["graph"], plans["lut"]
    assert graph["num_contexts"] == 6 and lut["num_contexts"] == 5
    assert [part["part"] for part in lut["parts"]] == [2, 3, 4, 5, 6]
    assert graph["embedding"] == {"layout": "graph", "cpu_table_bytes": 0}
    assert lut["embedding"] == {"layout": "lut", "cpu_table_bytes": 152064 * 3584 * 2}  # ufixed16: a16
    assert "table on the CPU" in (tmp_path / "lut" / "memory_plan.md").read_text()
