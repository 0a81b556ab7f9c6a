"""The qairt toolchain against qairt-dev 0.13.0's real config classes and serializer (see conftest.py): what is
asserted is the backend-extension JSON the SDK would receive and the keywords ``qairt.convert`` validates."""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import pytest

from doubles import FAIL_VARIABLE, compile_options, install_fake_sdk, read_log, write_tiny_part
from genie_build.cli import main
from genie_build.conventions import graph_name
from genie_build.errors import GenieBuildError
from genie_build.toolchains.base import CompileOptions
from genie_build.toolchains.qairt import QairtToolchain, compile_config, import_qairt
from genie_build.toolchains.qnn_cli import QnnCliToolchain
from genie_build.toolchains.qnn_sdk import backend_extension_config

AWKWARD = "dir with space 'single' \"double\" $HOME `tick`"
PROMPT = graph_name("prompt", 32, 256, 2, 2)
TOKEN = graph_name("token", 1, 256, 2, 2)
OPTION_SETS = [dict(packing=True, o_level=3), dict(packing=False, o_level=2), dict(packing=True, o_level=1),
               dict(packing=False, o_level=3, vtcm_mb=8), dict(packing=True, o_level=3, chipset="SM8650")]


def options(**changes) -> CompileOptions:
    return compile_options(**{"vtcm_mb": 0, **changes})


@pytest.fixture
def work(tmp_path) -> Path:
    return tmp_path / AWKWARD


@pytest.fixture
def converted(real_qairt, work) -> dict[str, Path]:
    """Both graphs of part 2 converted, keyed by graph name (prompt first)."""
    result = {}
    for name, kind, ar in ((PROMPT, "prompt", 32), (TOKEN, "token", 1)):
        onnx_path, encodings_path = write_tiny_part(work / "parts" / kind, ar)
        out = work / "converted" / "qairt-fp16" / kind / "part_2_of_2.dlc"
        QairtToolchain().convert(onnx_path, encodings_path, out, graph_name=name, float_bitwidth=16)
        result[name] = out
    return result


def calls(tmp_path: Path, call: str) -> list[dict]:
    return [entry for entry in read_log(tmp_path / "calls.jsonl") if entry.get("call") == call]


def compile_call(tmp_path: Path) -> dict:
    (call,) = calls(tmp_path, "qairt.compile")
    return call


def serialized(config) -> dict:
    from qairt.api.common.backends.htp.config import HtpConfigHelper

    return HtpConfigHelper.to_backend_extension_dict(config.context_custom_configs, config.graph_custom_configs,
                                                     config.device_custom_configs, config.memory_custom_config,
                                                     config.group_context_config)


# --- the config: real classes, real serializer --------------------------------------------------------------

def test_the_sdk_receives_exactly_the_vendor_shaped_json(converted, tmp_path, work):
    QairtToolchain().compile(converted, work / "part_2_of_2.bin", options())
    call = compile_call(tmp_path)
    assert call["io_tensor_mem_type"] == "memhandle"
    assert call["backend_extension"] == {
        "context": [{"weight_sharing_enabled": True}],
        "graphs": [{"vtcm_mb": 0, "O": 3, "weights_packing": True, "graph_names": [PROMPT]},
                   {"vtcm_mb": 0, "O": 3, "weights_packing": True, "graph_names": [TOKEN]}],
        "devices": [{"soc_model": 69, "dsp_arch": "v79",
                     "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 100}]}],
        "memory": {"mem_type": "shared_buffer"},
    }


@pytest.mark.parametrize("changes", OPTION_SETS)
def test_qairt_serializes_the_shared_json_unchanged(real_qairt, changes):
    # The one function both toolchains use; the qairt objects built from it serialize back to it, key for key
    # and in the same order, so nothing is renamed, dropped or defaulted on the way.
    extension = backend_extension_config([PROMPT, TOKEN], options(**changes))
    written = serialized(compile_config(import_qairt(Path("/unused")), extension))
    assert json.dumps(written) == json.dumps(extension)


@pytest.mark.parametrize(("section", "key"), [("graphs", "vtcm_size_mb"), ("graphs", "optimization_level"),
                                              ("context", "weight_sharing"), ("devices", "soc")])
def test_a_key_qairt_does_not_know_is_refused(real_qairt, section, key):
    extension = backend_extension_config([PROMPT], options())
    extension[section][0][key] = 1
    with pytest.raises(GenieBuildError, match=f"has no field for backend-extension key.*{key}"):
        compile_config(import_qairt(Path("/unused")), extension)


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda ext: ext["graphs"][0].update(O=4), "optimization_type"),
    (lambda ext: ext["devices"][0].update(soc_model="SM8750"), "soc_model"),
    (lambda ext: ext["devices"][0]["cores"][0].update(perf_profile="fastest"), "perf_profile"),
    (lambda ext: ext["memory"].update(mem_type="ion"), "mem_type"),
])
def test_a_wrong_value_fails_qairts_own_validation(real_qairt, mutate, message):
    from pydantic import ValidationError

    extension = copy.deepcopy(backend_extension_config([PROMPT], options()))
    mutate(extension)
    with pytest.raises(ValidationError, match=message):
        compile_config(import_qairt(Path("/unused")), extension)


def test_both_toolchains_hand_the_sdk_the_same_json(converted, tmp_path, work):
    # The A/B between qairt and qnn-cli must compare the tools, not two JSON shapes.
    QairtToolchain().compile(converted, work / "qairt.bin", options(packing=False, o_level=2))
    cli_dlcs = {}
    for name, path in converted.items():
        cli_dlcs[name] = work / "cli" / name / path.name
        cli_dlcs[name].parent.mkdir(parents=True)
        shutil.copyfile(path, cli_dlcs[name])
    QnnCliToolchain().compile(cli_dlcs, work / "cli.bin", options(packing=False, o_level=2))
    (generator,) = [entry for entry in read_log(tmp_path / "calls.jsonl")
                    if entry.get("tool") == "qnn-context-binary-generator"]
    assert generator["backend_extension"] == compile_call(tmp_path)["backend_extension"]
    argv = generator["argv"]
    assert argv[argv.index("--input_output_tensor_mem_type") + 1] == compile_call(tmp_path)["io_tensor_mem_type"]


@pytest.mark.parametrize(("packing", "o_level"), [(True, 3), (False, 2), (True, 1), (False, 3)])
def test_weights_packing_and_o_reach_every_graph(converted, tmp_path, work, packing, o_level):
    QairtToolchain().compile(converted, work / "part_2_of_2.bin", options(packing=packing, o_level=o_level))
    graphs = compile_call(tmp_path)["backend_extension"]["graphs"]
    assert {name: (graph["weights_packing"], graph["O"]) for graph in graphs for name in graph["graph_names"]} \
        == {PROMPT: (packing, o_level), TOKEN: (packing, o_level)}


def test_device_comes_from_the_chipset(converted, tmp_path, work):
    QairtToolchain().compile(converted, work / "part_2_of_2.bin", options(chipset="SM8650"))
    (device,) = compile_call(tmp_path)["backend_extension"]["devices"]
    assert (device["soc_model"], device["dsp_arch"]) == (57, "v75")


# --- convert ------------------------------------------------------------------------------------------------

def test_convert_passes_the_vendor_llm_settings(converted, tmp_path, work):
    prompt, token = calls(tmp_path, "qairt.convert")
    assert Path(prompt["model"]).name == f"{PROMPT}.onnx" and Path(token["model"]).name == f"{TOKEN}.onnx"
    assert prompt["encodings"] == str(work / "parts" / "prompt" / "part_1_of_2.encodings.json")
    assert prompt["backend"] == "HTP"
    assert prompt["calibration_config"] == {"act_precision": 16, "bias_precision": 32}
    assert prompt["extra_args"] == {
        "graph_name": PROMPT, "float_bitwidth": 16,
        "input_tensor_config": [{"name": "input_ids", "layout": "NONTRIVIAL", "datatype": "int32"}]}
    assert token["extra_args"]["graph_name"] == TOKEN
    assert [Path(entry["path"]).name for entry in calls(tmp_path, "Model.save")] == [f"{PROMPT}.dlc", f"{TOKEN}.dlc"]


@pytest.mark.parametrize("extras", [
    {"input_tensor_config": {"name": "input_ids", "layout": "NONTRIVIAL"}},  # one dict, not a list of them
    {"float_precision": 8},
    {"graph_name": ["prompt"]},
])
def test_converter_config_refuses_what_qairt_refuses(real_qairt, tmp_path, extras):
    # The double validates the extras with qairt's ConverterConfig, as qairt.convert does first; this checks
    # that the validation is real. (It checks types only: any layout string passes, so NONTRIVIAL is taken
    # verbatim from the vendor's gen_ai_utils.get_input_layout.)
    from pydantic import ValidationError
    import qairt

    onnx_path, encodings_path = write_tiny_part(tmp_path / "part", 32)
    with pytest.raises(ValidationError):
        qairt.convert(str(onnx_path), encodings=str(encodings_path), **extras)


def test_converted_dlc_graph_is_named_after_the_graph(converted):
    import genie_build_doubles

    for name, path in converted.items():
        dlc = genie_build_doubles.read_placeholder(path, genie_build_doubles.DLC_FORMAT)
        assert dlc["graph_name"] == name
        assert dlc["weight_bytes"] == 16 * 8 * 4  # qairt read the weights from the staged data file


# --- the job around it --------------------------------------------------------------------------------------

def test_graph_names_agree_from_conversion_to_binary(converted, tmp_path, work):
    toolchain = QairtToolchain()
    out = work / "part_2_of_2.bin"
    toolchain.compile(converted, out, options())
    configured = [name for graph in compile_call(tmp_path)["backend_extension"]["graphs"]
                  for name in graph["graph_names"]]
    assert configured == list(converted) == [graph.name for graph in toolchain.inspect(out).graphs]
    assert [entry["path"] for entry in calls(tmp_path, "qairt.load")] == [str(path) for path in converted.values()]


def test_compile_refuses_a_binary_whose_graph_names_differ(converted, work):
    renamed = {"prompt_renamed": converted[PROMPT], TOKEN: converted[TOKEN]}
    out = work / "part_2_of_2.bin"
    with pytest.raises(GenieBuildError, match="holds graphs"):
        QairtToolchain().compile(renamed, out, options())
    assert not out.exists()


def test_a_qairt_error_becomes_one_line_naming_the_file(real_qairt, monkeypatch, work):
    monkeypatch.setenv(FAIL_VARIABLE, "qairt.convert")
    onnx_path, encodings_path = write_tiny_part(work, 32)
    out = work / "converted" / "part_2_of_2.dlc"
    with pytest.raises(GenieBuildError) as caught:
        QairtToolchain().convert(onnx_path, encodings_path, out, graph_name=PROMPT, float_bitwidth=16)
    assert str(caught.value) == f"{onnx_path}: qairt.convert failed: Model conversion failed: double asked to fail"
    assert list(out.parent.iterdir()) == []


def test_an_sdk_older_than_qairt_dev_accepts_is_refused(real_qairt, tmp_path, monkeypatch):
    root = install_fake_sdk(tmp_path / "old-sdk")
    (root / "sdk.yaml").write_text("version: 2.45.0.250101\n")
    monkeypatch.setenv("QAIRT_SDK_ROOT", str(root))
    with pytest.raises(GenieBuildError) as caught:
        QairtToolchain().check_available()
    assert str(caught.value) == (f"{root}/sdk.yaml: QAIRT SDK 2.45.0.250101, but qairt-dev 0.13.0 needs 2.46.0 or "
                                 "newer: point QAIRT_SDK_ROOT at a newer SDK")


def test_the_cli_jobs_run_in_the_qairt_environment(real_qairt, tmp_path, monkeypatch):
    # convert, compile and account as the workflow runs them with toolchains.qairt.python: the package's code
    # under qairt-dev's numpy 1.26 / pydantic 2.8.
    monkeypatch.chdir(tmp_path)
    dlcs = []
    for name, kind, ar in ((PROMPT, "prompt", 32), (TOKEN, "token", 1)):
        onnx_path, encodings_path = write_tiny_part(Path("parts") / kind, ar)
        dlcs.append(Path("converted") / kind / "part_2_of_2.dlc")
        assert main(["convert", "--toolchain", "qairt", "--onnx", str(onnx_path), "--encodings",
                     str(encodings_path), "--graph-name", name, "--float-bitwidth", "16", "--out",
                     str(dlcs[-1])]) == 0
    variant = {"toolchain": "qairt", "weights_packing": True, "optimization_type": 3,
               "weight_sharing_enabled": True, "vtcm_mb": 0, "float_bitwidth": 16}
    binary = Path("compiled") / "part_2_of_2.bin"
    assert main(["compile", "--toolchain", "qairt", "--graph", f"{PROMPT}={dlcs[0]}", "--graph",
                 f"{TOKEN}={dlcs[1]}", "--variant-json", json.dumps(variant), "--chipset", "SM8750",
                 "--out", str(binary)]) == 0
    record_path = Path("sizes") / "part_2_of_2.json"
    assert main(["account", "--toolchain", "qairt", "--binary", str(binary), "--part-label", "2_of_2",
                 "--variant", "python-packed", "--variant-json", json.dumps(variant), "--out",
                 str(record_path)]) == 0
    record = json.loads(record_path.read_text())
    assert [graph["name"] for graph in record["graphs"]] == [PROMPT, TOKEN]
    assert record["bytes"] == binary.stat().st_size
    # read back from the binary, as the utility reports what the compile applied per graph
    assert record["applied"] == {"optimization_type": {PROMPT: 3, TOKEN: 3}, "vtcm_size": {PROMPT: 0, TOKEN: 0}}


def test_a_qairt_without_the_config_modules_is_named(real_qairt, monkeypatch):
    monkeypatch.setitem(sys.modules, "qairt.api.compiler.config", None)
    with pytest.raises(GenieBuildError, match="lacks what this adapter calls.*qairt.api.compiler.config"):
        QairtToolchain().check_available()
