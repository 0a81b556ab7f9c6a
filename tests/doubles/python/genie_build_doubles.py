"""Shared by the fake ``qairt`` package and the fake SDK executables (see ``tests/doubles/__init__.py``).

Placeholders are JSON, not DLCs or binaries:
- a "DLC" holds the graph name the SDK would give it -- the stem of the ONNX file converted, as
  ``qairt.convert`` names its DLC ``Path(model).stem + ".dlc"`` -- and the graph's IO read from the ONNX file
  (loaded *with* its external data, so a converter handed a link without its data file fails as the real one would);
- a "context binary" holds the DLCs' graphs and who produced it.

The fake utility writes the JSON shape ONNX Runtime's ``gen_qnn_ctx_onnx_model.py`` parses from the real
``qnn-context-binary-utility``; float IO is reported as ``UFIXED_POINT_16`` with scale 2**-10 and offset -32768
(as a w*a16 model's would be), int32 IO as ``INT_32`` without quantization.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

LOG_VARIABLE = "GENIE_BUILD_DOUBLE_LOG"
FAIL_VARIABLE = "GENIE_BUILD_DOUBLE_FAIL"
DLC_FORMAT = "genie-build-double-dlc"
BINARY_FORMAT = "genie-build-double-context-binary"
BUILD_ID = "v2.99.0.double"
FLOAT_IO_SCALE = 2.0 ** -10
FLOAT_IO_OFFSET = -32768


def record(event: dict) -> None:
    """Append ``event`` as one JSON line to ``$GENIE_BUILD_DOUBLE_LOG`` (when set)."""
    log = os.environ.get(LOG_VARIABLE)
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(event) + "\n")


def asked_to_fail(name: str) -> bool:
    return name in os.environ.get(FAIL_VARIABLE, "").split(",")


def write_json(path: str | os.PathLike, document: dict) -> None:
    Path(path).write_text(json.dumps(document, indent=1))


def read_placeholder(path: str | os.PathLike, expected_format: str) -> dict:
    document = json.loads(Path(path).read_text())
    if document.get("format") != expected_format:
        raise ValueError(f"{path} is not a {expected_format}")
    return document


def dlc_placeholder(network: str | os.PathLike, encodings: str | os.PathLike | None, options: dict) -> dict:
    """Convert an ONNX file (loading its external data) into a placeholder DLC."""
    import onnx  # here, not at the top: only converters need it, and it costs the other tools a second

    model = onnx.load(os.fspath(network))
    weight_bytes = sum(onnx.numpy_helper.to_array(tensor).nbytes for tensor in model.graph.initializer)
    if encodings is not None:
        json.loads(Path(encodings).read_text())  # the real converter reads it too; fail alike on a bad path
    return {"format": DLC_FORMAT, "graph_name": Path(network).stem, "source": os.fspath(network),
            "encodings": None if encodings is None else os.fspath(encodings), "options": options,
            "weight_bytes": weight_bytes,
            "inputs": [_value_info(onnx, value) for value in model.graph.input],
            "outputs": [_value_info(onnx, value) for value in model.graph.output]}


def binary_placeholder(dlcs: list[dict], producer: str, backend_extension: dict | None = None) -> dict:
    """A placeholder binary; each graph keeps the ``O`` and ``vtcm_mb`` its backend-extension entry gave it (the
    backend's defaults, 2 and 0, when none names it), which the fake utility reports as the real one does."""
    settings = {name: entry for entry in (backend_extension or {}).get("graphs", []) for name in entry["graph_names"]}
    return {"format": BINARY_FORMAT, "producer": producer,
            "graphs": [{**dlc, "applied": {"O": settings.get(dlc["graph_name"], {}).get("O", 2),
                                           "vtcm_mb": settings.get(dlc["graph_name"], {}).get("vtcm_mb", 0)}}
                       for dlc in dlcs]}


def utility_json(binary: dict) -> dict:
    """What ``qnn-context-binary-utility --json_file`` would say about a placeholder binary."""
    return {"info": {"buildId": BUILD_ID, "coreApiVersion": "2.99.0", "backendApiVersion": "5.99.0",
                     "graphs": [{"info": {"graphName": dlc["graph_name"],
                                          "graphInputs": _qnn_tensors(dlc["inputs"], "QNN_TENSOR_TYPE_APP_WRITE"),
                                          "graphOutputs": _qnn_tensors(dlc["outputs"], "QNN_TENSOR_TYPE_APP_READ"),
                                          "graphBlobInfo": {"info": {"optimizationLevel": dlc["applied"]["O"],
                                                                     "vtcmSize": dlc["applied"]["vtcm_mb"]}}}}
                                for dlc in binary["graphs"]]},
            "version": "1.0.0"}


def tool_main(tool: str, argv: list[str]) -> int:
    """Entry point of the fake executables."""
    if asked_to_fail(tool):
        record({"tool": tool, "argv": argv, "cwd": os.getcwd(), "failed": True})
        print(f"{tool}: loading the model\n{tool}: ERROR: double asked to fail", file=sys.stderr)
        return 1
    return {"qairt-converter": _converter, "qairt-quantizer": _quantizer,
            "qnn-context-binary-generator": _generator, "qnn-context-binary-utility": _utility}[tool](argv)


def _converter(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="qairt-converter")
    parser.add_argument("--input_network", required=True)
    parser.add_argument("--quantization_overrides")
    parser.add_argument("--input_layout", nargs=2, action="append", metavar=("NAME", "LAYOUT"))
    parser.add_argument("--float_bitwidth", type=int, choices=(16, 32), default=32)
    parser.add_argument("--output_path", required=True)
    args = parser.parse_args(argv)
    record({"tool": "qairt-converter", "argv": argv, "cwd": os.getcwd()})
    dlc = dlc_placeholder(args.input_network, args.quantization_overrides, {"float_bitwidth": args.float_bitwidth})
    write_json(args.output_path, dlc)
    return 0


def _quantizer(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="qairt-quantizer")
    parser.add_argument("--input_dlc", required=True)
    parser.add_argument("--output_dlc", required=True)
    parser.add_argument("--float_fallback", action="store_true")
    parser.add_argument("--act_bitwidth", type=int, choices=(8, 16), default=8)
    parser.add_argument("--bias_bitwidth", type=int, choices=(8, 32), default=8)
    args = parser.parse_args(argv)
    record({"tool": "qairt-quantizer", "argv": argv, "cwd": os.getcwd()})
    dlc = read_placeholder(args.input_dlc, DLC_FORMAT)
    dlc["quantizer"] = {"float_fallback": args.float_fallback, "act_bitwidth": args.act_bitwidth,
                        "bias_bitwidth": args.bias_bitwidth}
    write_json(args.output_dlc, dlc)
    return 0


def _generator(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="qnn-context-binary-generator")
    for option in ("--backend", "--model", "--dlc_path", "--config_file", "--binary_file", "--output_dir"):
        parser.add_argument(option, required=True)
    parser.add_argument("--input_output_tensor_mem_type", choices=("raw", "memhandle"), default="raw")
    args = parser.parse_args(argv)
    wrapper = json.loads(Path(args.config_file).read_text())
    extensions = wrapper["backend_extensions"]
    backend_extension = json.loads(Path(extensions["config_file_path"]).read_text())
    record({"tool": "qnn-context-binary-generator", "argv": argv, "cwd": os.getcwd(), "config_file": wrapper,
            "backend_extension": backend_extension})
    for library in (args.backend, args.model, extensions["shared_library_path"]):
        if not Path(library).is_file():
            print(f"qnn-context-binary-generator: cannot open {library}", file=sys.stderr)
            return 1
    dlcs = [read_placeholder(path, DLC_FORMAT) for path in args.dlc_path.split(",")]
    write_json(Path(args.output_dir) / f"{args.binary_file}.bin",
               binary_placeholder(dlcs, "qnn-context-binary-generator", backend_extension))
    return 0


def _utility(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="qnn-context-binary-utility")
    parser.add_argument("--context_binary", required=True)
    parser.add_argument("--json_file", required=True)
    args = parser.parse_args(argv)
    record({"tool": "qnn-context-binary-utility", "argv": argv, "cwd": os.getcwd()})
    write_json(args.json_file, utility_json(read_placeholder(args.context_binary, BINARY_FORMAT)))
    return 0


def _value_info(onnx, value) -> dict:
    tensor_type = value.type.tensor_type
    return {"name": value.name, "dims": [dim.dim_value for dim in tensor_type.shape.dim],
            "elem_type": onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name}


def _qnn_tensors(values: list[dict], tensor_type: str) -> list[dict]:
    return [{"info": {"id": index, "name": value["name"], "type": tensor_type,
                      "dataFormat": "QNN_TENSOR_DATA_FORMAT_FLAT_BUFFER", **_qnn_dtype(value["elem_type"]),
                      "rank": len(value["dims"]), "dimensions": value["dims"], "memType": "QNN_TENSORMEMTYPE_RAW"}}
            for index, value in enumerate(values)]


def _qnn_dtype(elem_type: str) -> dict:
    if elem_type.startswith("float"):
        return {"dataType": "QNN_DATATYPE_UFIXED_POINT_16",
                "quantizeParams": {"definition": "QNN_DEFINITION_DEFINED",
                                   "quantizationEncoding": "QNN_QUANTIZATION_ENCODING_SCALE_OFFSET",
                                   "scaleOffset": {"scale": FLOAT_IO_SCALE, "offset": FLOAT_IO_OFFSET}}}
    return {"dataType": f"QNN_DATATYPE_{elem_type.upper().replace('INT', 'INT_')}",
            "quantizeParams": {"definition": "QNN_DEFINITION_UNDEFINED",
                               "quantizationEncoding": "QNN_QUANTIZATION_ENCODING_UNDEFINED",
                               "scaleOffset": {"scale": 0.0, "offset": 0}}}
