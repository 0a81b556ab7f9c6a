"""Genie's IO contract (genie_build.genie_contract and ``check-contract``): AR and CL read as Genie reads them,
the demo's graphs pass, the Hugging Face dynamo export fails with every violation listed, and each rule broken
on its own gives its own message."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from genie_build.cli import main
from genie_build.conventions import GenieDims, genie_dims, read_ar, read_cl
from genie_build.demo.demo import DemoShape, generate_demo, graph_inputs, graph_outputs
from genie_build.genie_contract import model_violations
from genie_build.onnx_graph import TensorSpec, graph_io, load_graph
from demo_shapes import ONE_LAYER

AR, CL = 4, 16
SMALL = dataclasses.replace(ONE_LAYER, vocab=32, context=CL, ar=AR)


def spec(name: str, shape: tuple, dtype: str = "float32") -> TensorSpec:
    return TensorSpec(name=name, shape=shape, dtype=dtype)


# --- how Genie reads a tensor's dims, AR and CL ---------------------------------------------------------------

@pytest.mark.parametrize("shape, dims", [
    ((1, 64), GenieDims(1, 1, 1, 64)),             # right-aligned, padded with 1s
    ((1, 8, 64), GenieDims(1, 1, 8, 64)),
    ((1, 1, 8, 64), GenieDims(1, 1, 8, 64)),       # a leading 1 changes nothing
    ((2, 1, 24, 16), GenieDims(1, 2, 24, 16)),     # "Hack to mix batch dimension": dim 0 folds into height
    ((3, 2, 24, 16), GenieDims(3, 2, 24, 16)),     # ... or becomes the batch
    ((1, 2, 3, 4, 5), GenieDims(1, 2, 3, 4)),      # rank 5: dims 1..3, not the last three
])
def test_genie_dims(shape, dims):
    assert genie_dims(shape) == dims


def test_symbolic_dims_are_unreadable():
    assert genie_dims((1, "sequence")) is None and genie_dims((1, None)) is None


@pytest.mark.parametrize("inputs, outputs, name, ar", [
    ([spec("input_ids", (1, 8), "int32"), spec("attention_mask", (1, 8, 64))], [], "", 8),
    ([spec("inputs_embeds", (1, 8, 96))], [], "", 8),
    ([spec("attention_mask", (1, 1, 8, 64))], [], "", 8),
    ([spec("attention_mask", (1, 64))], [], "prompt_ar8_cl64", 1),   # a 2-D mask reads as AR 1, name or not
    ([], [spec("past_value_0_out", (1, 2, 8, 16)), spec("past_key_0_out", (1, 2, 16, 8))], "", 8),
    ([], [spec("logits", (1, 8, 32))], "", 8),
    ([], [spec("hidden", (1, 8, 64))], "prompt_ar8_cl64_1_of_3", 8),
    ([], [spec("hidden", (1, 8, 64))], "embedding", None),
])
def test_ar_cascade(inputs, outputs, name, ar):
    assert read_ar(name, inputs, outputs).value == ar


@pytest.mark.parametrize("inputs, outputs, name, cl", [
    ([spec("attention_mask", (1, 64))], [], "prompt_ar8_cl96", 64),
    ([spec("past_key_0_in", (1, 2, 16, 56))], [spec("past_key_0_out", (1, 2, 16, 8))], "", 64),
    ([spec("past_key_0_in", (1, 2, 16, 56))], [], "prompt_ar8_cl64_2_of_3", 64),  # no _out: the name
    ([], [], "llama_ar1_1024_1_of_7", 1024),   # the largest number above 501
    ([], [], "prompt_ar128_3_of_7", None),     # 128 is below 501: might be the AR
])
def test_cl_cascade(inputs, outputs, name, cl):
    assert read_cl(name, inputs, outputs).value == cl


def test_a_reading_names_its_source():
    reading = read_ar("", [spec("attention_mask", (1, 64))], [])
    assert reading.source == "attention_mask [1, 64] (its elements / its largest dim)"


# --- the whole model ---------------------------------------------------------------------------------------

def io_of(path: Path) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    io = graph_io(load_graph(path))
    return io.inputs, io.outputs


def test_demo_graphs_follow_the_contract(tmp_path: Path):
    generate_demo(SMALL, tmp_path)
    dims, violations = model_violations({kind: io_of(tmp_path / f"{kind}.onnx") for kind in ("prompt", "token")},
                                        expected={"prompt": (AR, CL), "token": (1, CL)}, context_size=CL)
    assert violations == []
    assert dims == {"prompt": (AR, CL), "token": (1, CL)}


def test_a_graph_at_twice_its_ar_is_a_violation(tmp_path: Path):
    """CL = 2 x AR: the cache inputs hold AR entries like the outputs, and Genie takes the graph for one that updates
    its cache itself (measured: its tokens go wrong from that graph's first chunk on); the token graph at that CL
    is read as it is."""
    generate_demo(dataclasses.replace(SMALL, context=2 * AR), tmp_path)
    _, violations = model_violations({kind: io_of(tmp_path / f"{kind}.onnx") for kind in ("prompt", "token")})
    assert [str(violation) for violation in violations] == [
        f"prompt: graph has CL {2 * AR} = 2 x AR {AR}; Genie needs another CL or AR: its cache inputs (CL - AR = "
        f"{AR} entries) and outputs ({AR}) have one shape, which Genie takes for a graph that updates its cache "
        "itself, and it answers wrongly (docs/genie-run.md)"]


def test_check_contract_reads_no_weights(tmp_path: Path):
    """The check reads the graphs' structure only: it passes with the weight files gone (so the workflow need
    not list, nor Snakemake hash, the weights for it)."""
    generate_demo(SMALL, tmp_path)
    weights = sorted(tmp_path.glob("*.onnx.data"))
    assert [path.name for path in weights] == ["prompt.onnx.data", "token.onnx.data"]
    for data in weights:
        data.unlink()
    out = tmp_path / "contract.json"
    assert main(["check-contract", "--prompt", str(tmp_path / "prompt.onnx"), "--token", str(tmp_path / "token.onnx"),
                 "--expect-ar", str(AR), "--expect-context", str(CL), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["violations"] == []


@pytest.fixture(scope="module")
def hf_graphs(hf_qwen2: tuple[Path, Path]) -> tuple[Path, Path]:
    return hf_qwen2


HF_VIOLATIONS = {  # per graph: every tensor the dynamo export gets wrong, and a word of why
    "prompt": {"position_ids_cos": "is not an input", "position_ids_sin": "is not an input",
               "position_ids": "is an input Genie does not feed",
               "attention_mask": "is [1, 32] (Genie reads it as [1, 1, 32]); Genie needs [1, AR, CL] = [1, 8, 32]",
               "past_key_0_in": "the keys are not transposed", "past_key_1_in": "the keys are not transposed",
               "past_key_0_out": "the whole cache, 32 entries where Genie takes only the 8 new tokens",
               "past_key_1_out": "the whole cache, 32 entries where Genie takes only the 8 new tokens",
               "past_value_0_out": "[*, AR, kv_dim] = [*, 8, 16]", "past_value_1_out": "[*, AR, kv_dim] = [*, 8, 16]"},
    "token": {"position_ids_cos": "is not an input", "position_ids_sin": "is not an input",
              "position_ids": "is an input Genie does not feed",
              "past_key_0_in": "[*, kv_dim, past] = [*, 16, 31]", "past_key_1_in": "[*, kv_dim, past] = [*, 16, 31]",
              "past_key_0_out": "only the 1 new token", "past_key_1_out": "only the 1 new token",
              "past_value_0_out": "[*, AR, kv_dim] = [*, 1, 16]", "past_value_1_out": "[*, AR, kv_dim] = [*, 1, 16]"},
}


def test_hf_dynamo_export_lists_every_violation(hf_graphs: tuple[Path, Path]):
    prompt, token = hf_graphs
    dims, violations = model_violations({"prompt": io_of(prompt), "token": io_of(token)})
    assert dims == {"prompt": (8, 32), "token": (1, 32)}
    # the shapes, then the 0/1 int64 mask of both graphs (the token graph's [1, 32] mask is Genie's [1, AR, CL])
    shapes = [v for v in violations if not v.found.startswith("is int64")]
    assert {(v.graph, v.tensor) for v in shapes} == {(g, t) for g, tensors in HF_VIOLATIONS.items() for t in tensors}
    assert len(shapes) == sum(map(len, HF_VIOLATIONS.values()))
    for violation in shapes:
        assert HF_VIOLATIONS[violation.graph][violation.tensor] in str(violation), violation
    dtypes = [v for v in violations if v.found.startswith("is int64")]
    assert {(v.graph, v.tensor) for v in dtypes} == {("prompt", "attention_mask"), ("token", "attention_mask")}
    assert all("not a 0/1 integer mask" in v.found and v.needed == "float32 or float16" for v in dtypes)


def test_check_contract_command_fails_on_the_hf_export_in_one_line(hf_graphs: tuple[Path, Path], tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]):
    prompt, token = hf_graphs
    out = tmp_path / "contract.json"
    assert main(["check-contract", "--prompt", str(prompt), "--token", str(token), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"genie-build: error: {prompt}: 21 violation(s) of Genie's")
    assert error.rstrip().endswith("set bundle.enabled: false") and not out.exists()
    assert main(["check-contract", "--prompt", str(prompt), "--token", str(token), "--report-only",
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["bundle_enabled"] is False and len(report["violations"]) == 21


def test_check_contract_takes_its_checks_as_the_json_the_workflow_passes(hf_graphs: tuple[Path, Path],
                                                                         tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]):
    prompt, token = hf_graphs
    out = tmp_path / "contract.json"
    checks = {"expect_ar": None, "expect_context": None, "context_size": None}
    command = ["check-contract", "--prompt", str(prompt), "--token", str(token), "--out", str(out), "--checks-json"]
    assert main([*command, json.dumps({**checks, "report_only": False})]) == 2
    assert "21 violation(s)" in capsys.readouterr().err and not out.exists()
    assert main([*command, json.dumps({**checks, "report_only": True})]) == 0
    assert json.loads(out.read_text())["bundle_enabled"] is False
    assert main([*command, '{"report-only": true}']) == 2
    assert "--checks-json: unknown keys ['report-only']" in capsys.readouterr().err


# --- each rule broken on its own ----------------------------------------------------------------------------

def contract_graph(kind: str, shape: DemoShape = SMALL) -> dict[str, dict[str, tuple[tuple, str]]]:
    """The demo's IO of one graph, as ``{"inputs": {name: (shape, dtype)}, "outputs": {...}}`` to edit."""
    return {"inputs": {t.name: (t.dims, t.dtype) for t in graph_inputs(shape, kind)},
            "outputs": {t.name: (t.dims, t.dtype) for t in graph_outputs(shape, kind)}}


def write_io_graph(path: Path, io: dict[str, dict[str, tuple[tuple, str]]]) -> Path:
    """A graph with exactly this IO: each output is a constant (the contract reads IO only)."""
    def info(name: str, dims: tuple, dtype: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(dims))

    nodes = [helper.make_node("Constant", [], [name], value=helper.make_tensor(
        f"{name}_value", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
        [d if isinstance(d, int) else 1 for d in dims], np.zeros(int(np.prod(
            [d if isinstance(d, int) else 1 for d in dims]))).astype(dtype).tolist()))
        for name, (dims, dtype) in io["outputs"].items()]
    graph = helper.make_graph(nodes, path.stem, [info(n, *v) for n, v in io["inputs"].items()],
                              [info(n, *v) for n, v in io["outputs"].items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _rename(side: str, old: str, new: str):
    def edit(io):
        io[side] = {new if name == old else name: value for name, value in io[side].items()}
    return edit


def _set(side: str, name: str, shape: tuple | None = None, dtype: str | None = None):
    def edit(io):
        old_shape, old_dtype = io[side][name]
        io[side][name] = (shape if shape is not None else old_shape, dtype or old_dtype)
    return edit


def _drop(side: str, name: str):
    def edit(io):
        del io[side][name]
    return edit


PAST = CL - AR
RULES = {  # rule: (graph edited, edit, fragments of the violations it must give, one per violation)
    "first-part input": ("prompt", _drop("inputs", "input_ids"), ["prompt: input_ids is not an input"]),
    "logits output": ("prompt", _rename("outputs", "logits", "scores"), ["prompt: logits is not an output"]),
    "mask present": ("prompt", _drop("inputs", "attention_mask"), ["attention_mask is not an input"]),
    "mask shape": ("prompt", _set("inputs", "attention_mask", (1, CL)),
                   ["attention_mask is [1, 16] (Genie reads it as [1, 1, 16]); Genie needs [1, AR, CL] = [1, 4, 16]"]),
    "mask dtype": ("prompt", _set("inputs", "attention_mask", dtype="int64"), ["attention_mask is int64"]),
    "rope present": ("token", _drop("inputs", "position_ids_sin"), ["token: position_ids_sin is not an input"]),
    "rope shape": ("prompt", _set("inputs", "position_ids_cos", (1, 1, 1, 4)),
                   ["position_ids_cos is [1, 1, 1, 4] (Genie reads it as [1, 1, 4]); Genie needs [1, AR, rope_dim]"
                    " = [1, 4, 4]"]),
    "rope dims agree": ("prompt", _set("inputs", "position_ids_sin", (1, AR, 2)),
                        ["position_ids_cos/position_ids_sin have last dims [2, 4]"]),
    "fed inputs": ("prompt", lambda io: io["inputs"].update(position_ids=((1, AR), "int64")),
                   ["position_ids is an input Genie does not feed"]),
    "kv names": ("prompt", _rename("outputs", "past_key_0_out", "present.0.key"),
                 ["present.0.key looks like a cache output but is not named past_key_{i}_out",
                  "past_key_0_out is missing"]),
    "kv side": ("prompt", lambda io: io["inputs"].update(past_key_0_out=io["outputs"].pop("past_key_0_out")),
                ["past_key_0_out is an input", "past_key_0_out is missing"]),
    "keys transposed": ("prompt", _set("inputs", "past_key_0_in", (1, 1, PAST, 8)),
                        ["past_key_0_in is [1, 1, 12, 8] (Genie reads it as [1, 12, 8]): the keys are not transposed"
                         " (Genie keeps keys as [kv_dim, length]); Genie needs [*, kv_dim, past] = [*, 8, 12]"]),
    "past length": ("prompt", _set("inputs", "past_value_0_in", (1, 1, PAST - 1, 8)),
                    ["past_value_0_in is [1, 1, 11, 8] (Genie reads it as [1, 11, 8]): it holds 11 past entries"
                     " where Genie takes 12"]),
    "new tokens only": ("prompt", _set("outputs", "past_value_0_out", (1, 1, CL, 8)),
                        ["past_value_0_out is [1, 1, 16, 8] (Genie reads it as [1, 16, 8]): it holds the whole cache,"
                         " 16 entries where Genie takes only the 4 new tokens"]),
    "logits shape": ("prompt", _set("outputs", "logits", (1, AR, 3, 32)),
                     ["logits is [1, 4, 3, 32] (Genie reads it as [4, 3, 32]); Genie needs vocab or AR x vocab"]),
    "static shapes": ("prompt", _set("outputs", "logits", (1, "sequence", 32)),
                      ["logits has shape [1, sequence, 32]; Genie needs fixed sizes"]),
    "readable AR": ("prompt", _set("inputs", "input_ids", (1, "sequence")),
                    ["prompt: graph gives Genie no AR (input_ids [1, sequence])", "input_ids has shape [1, sequence]"]),
    "rank": ("prompt", _set("inputs", "position_ids_cos", (1, 1, AR, 4, 1)),
             ["position_ids_cos has rank 5 ([1, 1, 4, 4, 1]); Genie needs rank 4 at most"]),
    "token ids dtype": ("token", _set("inputs", "input_ids", dtype="float32"),
                        ["token: input_ids is float32; Genie needs int32 or int64 or uint32"]),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_rule_broken_on_its_own(rule: str, tmp_path: Path):
    graph, edit, fragments = RULES[rule]
    graphs = {kind: contract_graph(kind) for kind in ("prompt", "token")}
    assert model_violations({kind: io_of(write_io_graph(tmp_path / f"ok_{kind}.onnx", io))
                             for kind, io in graphs.items()})[1] == []
    edit(graphs[graph])
    _, violations = model_violations({kind: io_of(write_io_graph(tmp_path / f"{kind}.onnx", io))
                                      for kind, io in graphs.items()})
    messages = [str(v) for v in violations]
    assert len(messages) == len(fragments), messages
    for fragment in fragments:
        assert any(fragment in message and message.startswith(f"{graph}: ") for message in messages), \
            (fragment, messages)


@pytest.mark.parametrize("token, expected, context_size, fragment", [
    (("prompt", {"ar": 2}), {}, None, "token: graph has AR 2; Genie needs AR 1"),
    (("token", {"context": 32}), {}, None,
     "token: graph has CL 32 but the prompt graph CL 16; Genie needs one CL for both graphs"),
    (("token", {}), {"prompt": (8, CL), "token": (1, CL)}, None, "prompt: graph has AR 4 but the config says 8"),
    (("token", {}), {}, 32, "config: bundle.context_size is 32; Genie needs at most the graphs' CL 16"),
])
def test_the_two_graphs_agree_with_each_other_and_the_config(token, expected, context_size, fragment,
                                                             tmp_path: Path):
    token_kind, changes = token  # the demo's prompt IO with AR 2 makes a token graph of AR 2
    io = {"prompt": io_of(write_io_graph(tmp_path / "prompt.onnx", contract_graph("prompt"))),
          "token": io_of(write_io_graph(tmp_path / "token.onnx",
                                        contract_graph(token_kind, dataclasses.replace(SMALL, **changes))))}
    messages = [str(v) for v in model_violations(io, expected=expected, context_size=context_size)[1]]
    assert len(messages) == 1 and fragment in messages[0], messages


# --- through the workflow ----------------------------------------------------------------------------------

def hf_user_model(workdir: Path, hf_graphs: tuple[Path, Path]) -> Path:
    """The HF export as a user brings it to the workflow: the graphs, 4-bit per-channel weight encodings (8-bit
    embedding and LM head, as AIHM's w4a16), a tokenizer and the HF config."""
    from bundle_helpers import write_tokenizer
    from genie_build.encodings import Encodings, write_encodings
    from genie_build.quantize.calibrate import read_initializer, symmetric_per_channel
    from rebuild_helpers import EXPORTS
    from workflow_helpers import copy_workflow

    workdir.mkdir(parents=True)
    copy_workflow(workdir)
    exports = workdir / EXPORTS
    exports.mkdir()
    for source in hf_graphs:
        for path in (source, source.with_name(source.name + ".data")):
            (exports / path.name).write_bytes(path.read_bytes())
    model = load_graph(exports / "prompt.onnx")
    params = {tensor.name: symmetric_per_channel(tensor.name, np.asarray(read_initializer(tensor, exports / "prompt.onnx")), 0,
                                                 8 if "embed" in tensor.name or "lm_head" in tensor.name else 4)
              for tensor in model.graph.initializer if len(tensor.dims) == 2 and tensor.name.endswith(".weight")}
    for graph in ("prompt", "token"):   # the graphs share every weight, so one set of parameter encodings
        write_encodings(exports / f"{graph}.encodings.json", Encodings(params=params))
    write_tokenizer(exports / "tokenizer.json", vocab_size=256)
    (exports / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "vocab_size": 256, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 128, "rope_theta": 10000.0,
        "rope_scaling": None, "bos_token_id": 1, "eos_token_id": 3, "max_position_embeddings": 32}))
    return workdir


@pytest.mark.workflow
def test_hf_export_fails_before_anything_is_built_and_builds_its_ab_table_without_a_bundle(
        hf_graphs: tuple[Path, Path], tmp_path: Path):
    from rebuild_helpers import USER_MODEL, user_model_config
    from workflow_helpers import REFERENCE_BUILD, run_snakemake

    workdir = hf_user_model(tmp_path / "wf", hf_graphs)
    out = workdir / "results" / USER_MODEL
    failed = run_snakemake(workdir, config_file=user_model_config(workdir), check=False)
    text = failed.stdout + failed.stderr
    assert failed.returncode != 0 and "Error in rule check_contract" in text
    assert "21 violation(s) of Genie's IO contract" in text and "set bundle.enabled: false" in text
    assert "prompt: attention_mask is [1, 32]" in text and "token: past_value_1_out is [1, 2, 32, 16]" in text
    built = {path.name for path in out.iterdir()}
    assert not built & {"plan.json", "parts", "converted", "compiled", "unsplit", "contract_check.json"}, built

    # the HTP backend does not take this export's graphs whole: its variant fails in one line naming the graph
    htp = run_snakemake(workdir, config_file=user_model_config(
        workdir, {"bundle": {"enabled": False, "embedding": "graph"}}, name="htp.yaml"), check=False)
    assert htp.returncode != 0 and "does not run on the HTP backend whole" in htp.stdout + htp.stderr
    # the reference toolchain builds the A/B table without a bundle
    config_file = user_model_config(workdir, {**REFERENCE_BUILD, "bundle": {**REFERENCE_BUILD["bundle"],
                                                                           "enabled": False}}, name="nb.yaml")
    run_snakemake(workdir, config_file=config_file)
    import pandas as pd

    table = pd.read_csv(out / "size_table.csv")   # every part: the embedding stays in the graph (part 1)
    assert set(table["variant"]) == set(REFERENCE_BUILD["variants"]) and sorted(table["part"]) == [1, 1, 2, 2, 3, 3]
    assert (out / "memory_plan.md").is_file() and (out / "compiled" / "packed").is_dir()
    assert not (out / "genie_bundle").exists() and not (out / "bundle_check.json").exists()
    report = json.loads((out / "contract_check.json").read_text())
    assert report["bundle_enabled"] is False and len(report["violations"]) == 21
    again = run_snakemake(workdir, "-n", config_file=config_file)
    assert "Nothing to be done" in again.stdout + again.stderr


@pytest.mark.workflow
def test_a_graph_genie_cannot_read_ar_from_stops_the_workflow_at_parse_time(tmp_path: Path):
    """Graph names carry AR and CL, so such a graph cannot be built even without a bundle: the workflow says
    why before any job, in the contract's words."""
    from rebuild_helpers import EXPORTS, user_model_config
    from workflow_helpers import copy_workflow, run_snakemake

    copy_workflow(tmp_path)
    exports = tmp_path / EXPORTS
    exports.mkdir()
    prompt = contract_graph("prompt")
    _set("inputs", "input_ids", (1, "sequence"))(prompt)
    write_io_graph(exports / "prompt.onnx", prompt)
    write_io_graph(exports / "token.onnx", contract_graph("token"))
    for name in ("prompt.encodings.json", "token.encodings.json", "tokenizer.json", "config.json"):
        (exports / name).write_text("{}")
    result = run_snakemake(tmp_path, "-n", config_file=user_model_config(tmp_path), check=False)
    text = result.stdout + result.stderr
    assert result.returncode != 0 and "config model.prompt_onnx: exports/prompt.onnx: Genie cannot read AR and CL" \
        in text
    assert "prompt: graph gives Genie no AR (input_ids [1, sequence])" in text
    assert "prompt: input_ids has shape [1, sequence]; Genie needs fixed sizes" in text
    assert not (tmp_path / "results").exists()
