"""The embedding lookup table against qairt-dev 0.13.0's own code: the table bytes its embedding-table preparation
writes (gen_ai_api/builders/embedding.py) and the ``dialog.embedding`` block its Genie config models write
(modules/genie_execution/genie_config.py) for the same float table and encoding equal ours."""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bundle_helpers import demo_hf_config, write_tokenizer
from genie_build.bundle.embedding_table import TableEncoding, dialog_embedding, write_embedding_table
from genie_build.genie_config import make_genie_config

OUTPUT = "/model/embed_tokens/Gather_output_0"
TABLE = "model.embed_tokens.weight"


@pytest.fixture
def vendor_embedding(real_qairt, monkeypatch):
    """qairt-dev's embedding module. The QAIRT environment has neither torch nor onnx_ir, nor the graph optimizer's
    dependencies: the functions used here (``convert_embedding_table``, ``parse_quant_params``) call none of them,
    the module only names them at import (type hints, isinstance checks), so bare stand-ins are seeded for those."""
    for name in ("qairt.gen_ai_api", "qairt.gen_ai_api.builders"):
        package = types.ModuleType(name)
        package.__path__ = [str(Path(real_qairt.__path__[0], *name.split(".")[1:]))]
        monkeypatch.setitem(sys.modules, name, package)
    stand_ins = {"torch": {"Tensor": type("Tensor", (), {})}, "onnx_ir": {"Model": type("Model", (), {})},
                 "qairt.optimizer.onnx.utils": {"get_embedding_node": None, "get_input_ids": None},
                 "qairt.optimizer.onnx.utils.encodings": {"deserialize_encodings": None}}
    for name, attributes in stand_ins.items():
        if name in sys.modules and name in ("torch", "onnx_ir"):
            continue  # the real package, where one is installed
        module = types.ModuleType(name)
        for attribute, value in attributes.items():
            setattr(module, attribute, value)
        monkeypatch.setitem(sys.modules, name, module)
    module = importlib.import_module("qairt.gen_ai_api.builders.embedding")
    yield module
    sys.modules.pop("qairt.gen_ai_api.builders.embedding", None)


def embedding_part(directory: Path, table: np.ndarray, encodings: dict) -> tuple[Path, Path]:
    """Part 1 as the split writes it: ``input_ids`` -> Gather of the table, and its encodings file."""
    graph = helper.make_graph(
        [helper.make_node("Gather", [TABLE, "input_ids"], [OUTPUT], name="/model/embed_tokens/Gather")], "part_1",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT32, [1, 4])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, [1, 4, table.shape[1]])],
        [numpy_helper.from_array(table, TABLE)])
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), directory / "part.onnx")
    (directory / "part.encodings.json").write_text(json.dumps(encodings))
    return directory / "part.onnx", directory / "part.encodings.json"


def per_tensor(name: str, bitwidth: int, scale: float, offset: int) -> dict:
    return {"name": name, "dtype": "INT", "enc_type": "PER_TENSOR", "bw": bitwidth, "is_sym": False,
            "scale": [scale], "offset": [offset]}


def a_table(rows: int = 96, columns: int = 40) -> np.ndarray:
    values = np.random.default_rng(7).normal(0.0, 0.02, size=(rows, columns)).astype(np.float32)
    values[0, :4] = [0.5, -0.5, 0.0, 1e-9]  # beyond the range both ways: the codes clip
    return values


@pytest.mark.parametrize("bitwidth, scale, offset", [(16, 2.1e-06, -34135), (8, 0.00045, -131)])
@pytest.mark.parametrize("encoded", ["output", "table"])
def test_our_table_and_config_block_are_what_qairt_dev_writes(vendor_embedding, genie_models, tmp_path, bitwidth,
                                                              scale, offset, encoded):
    table = a_table()
    name = OUTPUT if encoded == "output" else TABLE  # the Gather output's encoding, else the table's (AIMET's)
    onnx_path, encodings_path = embedding_part(
        tmp_path / "part", table, {"version": "1.0.0", "activation_encodings": [per_tensor(name, bitwidth, scale,
                                                                                           offset)],
                                   "param_encodings": [], "quantizer_args": {}})
    ours = write_embedding_table(onnx_path, encodings_path, tmp_path / "ours" / "embedding_table.bin")

    raw = tmp_path / "table_fp32.bin"
    table.tofile(raw)
    (tmp_path / "vendor").mkdir()
    vendor_path, params_path = vendor_embedding.convert_embedding_table(str(raw), bitwidth, scale, offset,
                                                                        str(tmp_path / "vendor"))
    assert ours.path.read_bytes() == Path(vendor_path).read_bytes()
    assert ours.path.stat().st_size == table.size * bitwidth // 8

    # the block as the vendor's builder makes it from its quant-params file (gen_ai_builder_htp.py
    # _build_embedding_config, genie_dialog_factory.py _get_dialog_embedding), dumped as use_case_exporter.py does
    params = vendor_embedding.parse_quant_params(json.loads(Path(params_path).read_text()))
    g = genie_models
    block = g.DialogEmbedding(type="lut", lut_path="embedding_table.bin", size=table.shape[1],
                              datatype=g.DialogEmbeddingDataType(f"ufixed{params['bw']}"),
                              quant_param=g.DialogEmbeddingQuantParam(scale=params["scale"], offset=params["offset"]))
    vendor_block = block.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert dialog_embedding(table.shape[1], ours.encoding) == vendor_block


def test_a_genie_config_with_the_table_is_a_valid_qairt_genie_config(genie_models, tmp_path):
    ours = make_genie_config(demo_hf_config(), write_tokenizer(tmp_path / "tokenizer.json"),
                             ["demo_part_2_of_2.bin"], 256,
                             embedding=dialog_embedding(64, TableEncoding(16, 2.1e-06, -34135)))
    parsed = genie_models.GenieConfig.model_validate(ours)
    assert parsed.dialog.embedding.datatype == genie_models.DialogEmbeddingDataType.UFIXED16
    assert ours == parsed.model_dump(by_alias=True, exclude_none=True, mode="json")
