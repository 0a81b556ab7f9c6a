"""The qairt toolchain against a recording double of the ``qairt`` package (tests/doubles/python/qairt) and of
``qnn-context-binary-utility``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from genie_build.errors import GenieBuildError
from genie_build.naming import graph_name
from genie_build.toolchains import get_toolchain
from genie_build.toolchains.base import CompileOptions
from genie_build.toolchains.qairt import QairtToolchain
from doubles import compile_options, FAIL_VARIABLE, FAKE_PYTHON_PATH, LOG_VARIABLE, install_fake_sdk, read_log, write_tiny_part

AWKWARD = "dir with space 'single' \"double\" $HOME `tick`"
PROMPT = graph_name("prompt", 32, 256, 2, 2)
TOKEN = graph_name("token", 1, 256, 2, 2)


def options(**changes) -> CompileOptions:
    return compile_options(**{"vtcm_mb": 0, **changes})


@pytest.fixture
def fake_qairt(tmp_path, monkeypatch):
    """The qairt double importable, a fake SDK (for the utility) in $QAIRT_SDK_ROOT, calls logged."""
    monkeypatch.syspath_prepend(str(FAKE_PYTHON_PATH))
    monkeypatch.setenv("QAIRT_SDK_ROOT", str(install_fake_sdk(tmp_path / "sdk")))
    monkeypatch.setenv(LOG_VARIABLE, str(tmp_path / "calls.jsonl"))
    monkeypatch.delenv(FAIL_VARIABLE, raising=False)
    yield
    for module in [name for name in sys.modules if name.split(".")[0] in ("qairt", "genie_build_doubles")]:
        del sys.modules[module]


@pytest.fixture
def work(tmp_path) -> Path:
    return tmp_path / AWKWARD


@pytest.fixture
def converted(fake_qairt, work) -> dict[str, Path]:
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


def test_registry_maps_qairt_to_this_class():
    assert isinstance(get_toolchain("qairt"), QairtToolchain)


def test_convert_makes_the_field_report_call(converted, tmp_path, work):
    prompt, token = calls(tmp_path, "qairt.convert")
    assert Path(prompt["model"]).name == f"{PROMPT}.onnx" and Path(token["model"]).name == f"{TOKEN}.onnx"
    assert prompt["encodings"] == str(work / "parts" / "prompt" / "part_1_of_2.encodings.json")
    assert prompt["extra_args"] == {"float_bitwidth": 16}
    assert (prompt["backend"], prompt["calibration_config"]) == ("HTP", None)
    assert [Path(entry["path"]).name for entry in calls(tmp_path, "Model.save")] == [f"{PROMPT}.dlc", f"{TOKEN}.dlc"]


def test_converted_dlc_graph_is_named_after_the_graph(converted):
    import genie_build_doubles  # the double's placeholder reader, importable while the fixture is active

    for name, path in converted.items():
        dlc = genie_build_doubles.read_placeholder(path, genie_build_doubles.DLC_FORMAT)
        assert dlc["graph_name"] == name
        assert dlc["weight_bytes"] == 16 * 8 * 4  # qairt read the weights from the staged data file


def test_compile_loads_the_saved_dlcs_and_passes_the_documented_config(converted, tmp_path, work):
    out = work / "compiled" / "python-packed" / "part_2_of_2.bin"
    QairtToolchain().compile(converted, out, options())
    assert [entry["path"] for entry in calls(tmp_path, "qairt.load")] == [str(path) for path in converted.values()]
    call = compile_call(tmp_path)
    config = call["config"]
    assert call["graph_names"] == [PROMPT, TOKEN]
    assert config["backend"] == "HTP" and config["soc_details"] is None
    assert [(graph["name"], graph["optimization_type"], graph["weights_packing"], graph["vtcm_size_in_mb"])
            for graph in config["graph_custom_configs"]] == [(PROMPT, 3, True, 0), (TOKEN, 3, True, 0)]
    (context,) = config["context_custom_configs"]
    assert context["weight_sharing_enabled"] is True
    assert [Path(entry["path"]).name for entry in calls(tmp_path, "CompiledModel.save")] == ["part_2_of_2.bin"]
    assert out.is_file()


def test_options_are_set_explicitly_so_qairt_does_not_drop_them(converted, tmp_path, work):
    # qairt writes its backend extension with model_dump(exclude_unset=True): a field left at its default
    # would vanish from the JSON, and the backend would use its own default instead.
    QairtToolchain().compile(converted, work / "part_2_of_2.bin", options(packing=False, o_level=2))
    config = compile_call(tmp_path)["config"]
    for graph in config["graph_custom_configs"]:
        assert {"name", "optimization_type", "weights_packing", "vtcm_size_in_mb"} <= set(graph["explicitly_set"])
    assert "weight_sharing_enabled" in config["context_custom_configs"][0]["explicitly_set"]


@pytest.mark.parametrize(("packing", "o_level"), [(True, 3), (False, 2), (True, 1), (False, 3)])
def test_weights_packing_and_o_reach_every_graph_config(converted, tmp_path, work, packing, o_level):
    QairtToolchain().compile(converted, work / "part_2_of_2.bin", options(packing=packing, o_level=o_level))
    graphs = compile_call(tmp_path)["config"]["graph_custom_configs"]
    assert {graph["name"]: (graph["weights_packing"], graph["optimization_type"]) for graph in graphs} == {
        PROMPT: (packing, o_level), TOKEN: (packing, o_level)}


def test_device_config_comes_from_the_chipset(converted, tmp_path, work):
    QairtToolchain().compile(converted, work / "part_2_of_2.bin", options(chipset="SM8650"))
    (device,) = compile_call(tmp_path)["config"]["device_custom_configs"]
    assert (device["soc_model"], device["dsp_arch"]) == (57, "v75")


def test_graph_names_agree_from_conversion_to_binary(converted, tmp_path, work):
    toolchain = QairtToolchain()
    out = work / "part_2_of_2.bin"
    toolchain.compile(converted, out, options())
    configured = [graph["name"] for graph in compile_call(tmp_path)["config"]["graph_custom_configs"]]
    assert configured == list(converted) == [graph.name for graph in toolchain.inspect(out).graphs]


def test_compile_refuses_a_binary_whose_graph_names_differ(converted, work):
    renamed = {"prompt_renamed": converted[PROMPT], TOKEN: converted[TOKEN]}
    out = work / "part_2_of_2.bin"
    with pytest.raises(GenieBuildError, match="holds graphs"):
        QairtToolchain().compile(renamed, out, options())
    assert not out.exists()


def test_a_qairt_error_becomes_one_line_naming_the_file(fake_qairt, monkeypatch, work):
    monkeypatch.setenv(FAIL_VARIABLE, "qairt.convert")
    onnx_path, encodings_path = write_tiny_part(work, 32)
    out = work / "converted" / "part_2_of_2.dlc"
    with pytest.raises(GenieBuildError) as caught:
        QairtToolchain().convert(onnx_path, encodings_path, out, graph_name=PROMPT, float_bitwidth=16)
    assert str(caught.value) == f"{onnx_path}: qairt.convert failed: Model conversion failed: double asked to fail"
    assert list(out.parent.iterdir()) == []


def test_missing_qairt_module_gives_the_promised_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "qairt", None)  # makes `import qairt` fail even if one is installed
    with pytest.raises(GenieBuildError) as caught:
        QairtToolchain().check_available()
    assert str(caught.value) == (
        f"toolchain qairt: the qairt Python package is not importable by {sys.executable}: create the QAIRT "
        "environment from envs/qairt.yaml (Python 3.12, pip install qairt-dev), set QAIRT_SDK_ROOT, and point "
        "toolchains.qairt.python at it")


def test_qairt_without_the_config_modules_is_named(fake_qairt, monkeypatch):
    monkeypatch.setitem(sys.modules, "qairt.api.compiler.config", None)
    with pytest.raises(GenieBuildError, match="lacks what this adapter calls.*qairt.api.compiler.config"):
        QairtToolchain().check_available()


def test_missing_sdk_root_is_named(fake_qairt, monkeypatch):
    monkeypatch.delenv("QAIRT_SDK_ROOT")
    with pytest.raises(GenieBuildError, match="^toolchain qairt: QAIRT_SDK_ROOT is not set"):
        QairtToolchain().check_available()


def test_available_with_module_and_sdk(fake_qairt):
    QairtToolchain().check_available()


def test_relative_paths_work_as_snakemake_passes_them(fake_qairt, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    onnx_path, encodings_path = write_tiny_part(Path("parts"), 32)
    dlc = Path("converted") / "part_2_of_2.dlc"
    QairtToolchain().convert(onnx_path, encodings_path, dlc, graph_name=PROMPT, float_bitwidth=16)
    out = Path("compiled") / "part_2_of_2.bin"
    QairtToolchain().compile({PROMPT: dlc}, out, options())
    assert [graph.name for graph in QairtToolchain().inspect(out).graphs] == [PROMPT]
