"""Host run of a reference bundle: its tokens equal the unsplit model's quantized the same way; the KV cache
gives what recomputing without it gives; the prompt's chunking and padding do not change the result."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from bundle_helpers import TINY_DEMO, VARIANT, ReferenceBuild
from genie_build.chipsets import lookup
from genie_build.cli import main
from genie_build.errors import GenieBuildError
from genie_build.run import run_bundle as run_bundle_module
from genie_build.run.run_bundle import (GraphSession, Runner, generate, load_bundle, make_runner, run_bundle,
                                        unsplit_tokens)
from genie_build.toolchains.base import CompileOptions
from genie_build.toolchains.reference.container import load_container, read_graphs
from genie_build.toolchains.reference.toolchain import ReferenceToolchain

PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman"


@pytest.fixture(scope="module")
def unsplit_runner(build: ReferenceBuild) -> Runner:
    """The whole model, converted with the whole encodings and compiled like a part: one 'part'."""
    toolchain, converted = ReferenceToolchain(), {}
    for kind, ar in (("prompt", TINY_DEMO["ar"]), ("token", 1)):
        name = f"{kind}_ar{ar}_cl{TINY_DEMO['context']}"
        converted[name] = build.root / "unsplit" / f"{kind}.onnx"
        toolchain.convert(build.source / f"{kind}.onnx", build.source / f"{kind}.encodings.json", converted[name],
                          graph_name=name, float_bitwidth=VARIANT["float_bitwidth"])
    chip = lookup("SM8750")
    container = build.root / "unsplit" / "model.bin"
    toolchain.compile(converted, container, CompileOptions(**VARIANT, soc_model=chip.soc_model, dsp_arch=chip.dsp_arch))
    bundle = load_bundle(build.bundle)
    return make_runner([read_graphs(container)], head_dim=bundle.runner.head_dim,
                       rope_theta=bundle.runner.rope_theta)


def test_bundle_tokens_equal_the_unsplit_quantized_model(build: ReferenceBuild, unsplit_runner: Runner) -> None:
    bundle = load_bundle(build.bundle)
    prompt_ids = bundle.tokenizer.encode(PROMPT).ids
    assert len(prompt_ids) > 2 * TINY_DEMO["ar"]  # several prompt chunks, the last one padded
    assert len(prompt_ids) % TINY_DEMO["ar"] != 0
    split_tokens = generate(bundle.runner, prompt_ids, 12)
    assert len(bundle.runner.parts) == 3 and len(split_tokens) == 12
    assert split_tokens == generate(unsplit_runner, prompt_ids, 12)


def test_kv_cache_gives_what_recomputing_without_it_gives(build: ReferenceBuild) -> None:
    runner = load_bundle(build.bundle).runner
    prompt = [5, 77, 301]
    with_cache = generate(runner, prompt, TINY_DEMO["ar"] - len(prompt))
    # each token from a fresh prompt pass over the whole sequence so far (fits one chunk: no cache used)
    sequence = list(prompt)
    for _ in with_cache:
        sequence += generate(runner, sequence, 1)
    assert with_cache == sequence[len(prompt):]


def test_prompt_chunking_does_not_change_the_tokens(build: ReferenceBuild) -> None:
    runner = load_bundle(build.bundle).runner
    token_only = dataclasses.replace(runner, graphs=tuple({(1, runner.context_length): part[1]}
                                                          for part in runner.parts))
    prompt = list(range(40, 40 + 2 * TINY_DEMO["ar"] + 3))
    assert generate(runner, prompt, 8) == generate(token_only, prompt, 8)


def test_generation_stops_at_an_end_of_sequence_token(build: ReferenceBuild) -> None:
    runner = load_bundle(build.bundle).runner
    free = generate(runner, [5, 77, 301], 6)
    stopped = generate(runner, [5, 77, 301], 6, eos_ids=frozenset({free[2]}))
    assert stopped == free[:free.index(free[2]) + 1]


def test_prompt_and_new_tokens_must_fit_the_context(build: ReferenceBuild) -> None:
    runner = load_bundle(build.bundle).runner
    with pytest.raises(GenieBuildError, match="must fit the context size 64"):
        generate(runner, list(range(60)), 5)
    with pytest.raises(GenieBuildError, match="prompt: is empty"):
        generate(runner, [], 5)


def test_run_bundle_command_prints_text_and_speed(build: ReferenceBuild, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run-bundle", str(build.bundle), "--prompt", PROMPT, "--max-new-tokens", "6"]) == 0
    first, second = capsys.readouterr().out.splitlines()[-2:]
    assert first.startswith(PROMPT)
    assert "generated 6 tokens" in second and "tokens/s" in second
    result = run_bundle(build.bundle, PROMPT, 6)
    assert f"ids {list(result.new_ids)}" in second and np.isfinite(result.tokens_per_second)


def test_a_bundle_failing_its_checks_is_not_run(build: ReferenceBuild, tmp_path: Path) -> None:
    broken = tmp_path / "bundle"
    broken.mkdir()
    for item in build.bundle.iterdir():
        (broken / item.name).write_bytes(item.read_bytes())
    config = json.loads((broken / "genie_config.json").read_text())
    config["dialog"]["context"]["size"] = 128
    (broken / "genie_config.json").write_text(json.dumps(config))
    with pytest.raises(GenieBuildError, match=r"\[context-size\]"):
        load_bundle(broken)


def default_options_runner(containers: list[Path], like: Runner) -> Runner:
    """The runner as it was before it saved memory: each graph in a session with onnxruntime's default
    options (constant folding), weights inline."""
    parts = []
    for path in containers:
        by_graph = {}
        for name, model in load_container(path).items():
            session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            ar, cl = map(int, re.search(r"_ar(\d+)_cl(\d+)_", name).groups())
            by_graph[ar, cl] = GraphSession(session=session, weights={})
        parts.append(by_graph)
    return dataclasses.replace(like, graphs=tuple(parts))


def test_tokens_equal_those_of_default_session_options(build: ReferenceBuild) -> None:
    bundle = load_bundle(build.bundle)
    config = json.loads((build.bundle / "genie_config.json").read_text())
    containers = [build.bundle / name for name in config["dialog"]["engine"]["model"]["binary"]["ctx-bins"]]
    reference = default_options_runner(containers, bundle.runner)
    assert set(reference.parts[0]) == set(bundle.runner.parts[0]) == {1, TINY_DEMO["ar"]}
    prompt_ids = bundle.tokenizer.encode(PROMPT).ids
    assert generate(bundle.runner, prompt_ids, 12) == generate(reference, prompt_ids, 12)


def test_a_parts_graphs_are_fed_the_same_weight_arrays(build: ReferenceBuild) -> None:
    for part in load_bundle(build.bundle).runner.parts:
        prompt, token = part[TINY_DEMO["ar"]], part[1]
        common = set(prompt.weights) & set(token.weights)
        assert common and all(prompt.weights[name] is token.weights[name] for name in common)
        assert not any(node.name in prompt.weights for node in prompt.inputs())


def test_parts_are_loaded_one_at_a_time(build: ReferenceBuild) -> None:
    """Each part's models have given up their weights before the next part is read."""
    config = json.loads((build.bundle / "genie_config.json").read_text())
    containers = [build.bundle / name for name in config["dialog"]["engine"]["model"]["binary"]["ctx-bins"]]
    loaded: list[dict] = []

    def parts():
        for path in containers:
            assert all(not graph.model.graph.initializer for graphs in loaded for graph in graphs.values())
            loaded.append(read_graphs(path))
            yield loaded[-1]

    runner = make_runner(parts(), head_dim=8, rope_theta=10000.0)
    assert len(runner.parts) == len(containers) == 3


def test_unsplit_tokens_read_the_bundle_config_without_loading_its_binaries(
        build: ReferenceBuild, unsplit_runner: Runner, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[Path] = []

    def recording_read(path):
        loaded.append(Path(path))
        return read_graphs(path)

    monkeypatch.setattr(run_bundle_module, "read_graphs", recording_read)
    prompt_ids = [5, 77, 301, 12]
    tokens = unsplit_tokens(build.bundle, build.root / "unsplit" / "model.bin", prompt_ids, 6)
    assert loaded == [build.root / "unsplit" / "model.bin"]
    assert tokens == generate(unsplit_runner, prompt_ids, 6)


def test_the_host_run_reads_llama3_scaling_back_from_genies_config_and_refuses_others():
    """What genie_config writes for a Llama 3 checkpoint is what the host run's RoPE tables get (HF's keys)."""
    from genie_build.genie_config import genie_rope_scaling
    from genie_build.run.run_bundle import host_rope

    hf = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
    encoding = {"type": "rope", "rope-dim": 8, "rope-theta": 500000, "rope-scaling": genie_rope_scaling(hf, "c")}
    engine = {"backend": {"QnnHtp": {}}, "model": {"positional-encoding": encoding}}
    assert host_rope(engine, Path("genie_config.json")) == {"head_dim": 16, "rope_theta": 500000.0,
                                                             "rope_scaling": hf}
    encoding["rope-scaling"]["rope-type"] = "yarnrope"
    with pytest.raises(GenieBuildError, match="plain and llama3 RoPE only"):
        host_rope(engine, Path("genie_config.json"))


def test_a_container_whose_records_claim_more_than_it_holds_is_one_line_in_bounded_memory(build: ReferenceBuild,
                                                                                         tmp_path: Path) -> None:
    """run-bundle reads the ctx-bins' graphs: a header whose graph record claims 2**40 bytes is refused before a
    byte is read for it (run in 4 GB of address space, as a user runs the command)."""
    import resource
    import shutil
    import subprocess
    import sys

    from genie_build.toolchains.reference.container_format import FORMAT_VERSION, MAGIC, PREAMBLE, padding

    bundle = tmp_path / "bundle"
    shutil.copytree(build.bundle, bundle)
    ctx_bin = bundle / "demo_part_2_of_3.bin"
    header = json.loads(ctx_bin.read_bytes()[PREAMBLE.size:PREAMBLE.size + PREAMBLE.unpack(
        ctx_bin.read_bytes()[:PREAMBLE.size])[3]])
    header.update(graph_section_bytes=0, weight_section={"alignment": 64, "bytes": 0}, weights=[])
    for graph in header["graphs"]:
        graph.update(structure_offset=0, structure_length=2**40)
    data = json.dumps(header).encode()
    ctx_bin.write_bytes(PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0, len(data)) + data
                        + b"\0" * padding(PREAMBLE.size + len(data), 64))
    (bundle / "manifest.json").unlink()  # the manifest would catch the change first; the record is what is tested

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 * 1024**3, 4 * 1024**3))

    result = subprocess.run([sys.executable, "-m", "genie_build", "run-bundle", str(bundle), "--prompt", "hi"],
                            capture_output=True, text=True, timeout=120, preexec_fn=limit_memory)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"genie-build: error: {ctx_bin}: a graph record at offset 0, length {2**40} lies outside its section of 0 "
        "bytes (corrupt reference container)")


def test_the_prompt_is_genies_first_query_its_bos_token_first(build: ReferenceBuild) -> None:
    """Genie prepends context.bos-token to a dialog's first query; the tokenizer's own special tokens are not added
    (a tokenizer whose post-processor adds the BOS would otherwise give it twice)."""
    from tokenizers.processors import TemplateProcessing

    loaded = load_bundle(build.bundle)
    bos = json.loads((build.bundle / "genie_config.json").read_text())["dialog"]["context"]["bos-token"]
    text_ids = loaded.tokenizer.encode(PROMPT).ids
    result = run_bundle(build.bundle, PROMPT, 6)
    assert loaded.bos_id == bos >= 0 and list(result.prompt_ids) == [bos, *text_ids]
    assert list(result.new_ids) == generate(loaded.runner, [bos, *text_ids], 6)
    assert list(result.new_ids) != generate(loaded.runner, text_ids, 6)  # the BOS changes this model's tokens
    adding = loaded.tokenizer.from_str(loaded.tokenizer.to_str())
    special = loaded.tokenizer.id_to_token(bos)
    adding.post_processor = TemplateProcessing(single=f"{special} $A", special_tokens=[(special, bos)])
    assert adding.encode(PROMPT).ids == [bos, *text_ids]
    assert dataclasses.replace(loaded, tokenizer=adding).query_ids(PROMPT) == [bos, *text_ids]
    assert dataclasses.replace(loaded, bos_id=-1).query_ids(PROMPT) == text_ids  # Genie: no BOS below 0


def test_an_empty_cache_slot_holds_what_genies_cleared_cache_reads_as(build: ReferenceBuild,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Genie clears a 16-bit KV cache with code 32768 whatever the encoding's offset: the host's empty slots hold
    (32768 + offset) * scale of the input's encoding as the ctx-bin records it, not 0."""
    from genie_build.toolchains.reference.container_format import inspect_container

    config = json.loads((build.bundle / "genie_config.json").read_text())
    first_bin = build.bundle / config["dialog"]["engine"]["model"]["binary"]["ctx-bins"][1]
    graph = next(graph for graph in inspect_container(first_bin).graphs if graph.name.startswith("prompt"))
    kv = next(tensor for tensor in graph.inputs if tensor.name.startswith("past_key_") and tensor.name.endswith("_in"))
    cleared = (2 ** (kv.quant.bitwidth - 1) + kv.quant.offset) * kv.quant.scale
    assert kv.quant.bitwidth == 16 and cleared != 0
    runner = load_bundle(build.bundle).runner
    assert runner.graphs[1][TINY_DEMO["ar"], TINY_DEMO["context"]].empty[kv.name] == pytest.approx(cleared)
    fed: list[np.ndarray] = []
    original = GraphSession.run

    def recording(session, feed):
        if kv.name in feed:
            fed.append(feed[kv.name].copy())
        return original(session, feed)

    monkeypatch.setattr(GraphSession, "run", recording)
    generate(runner, [5, 77, 301], 2)
    first_prompt, first_token = fed[0], fed[1]
    assert np.all(first_prompt == np.float32(cleared))  # nothing cached yet
    empty = first_token == np.float32(cleared)
    assert np.all(empty[..., 3:]) and not np.all(empty[..., :3])  # three cached, the rest empty


def test_a_graph_without_the_converters_record_gives_the_empty_slot_from_its_quantize_node():
    """A graph genie-build's converters did not write (a qnn-htp twin) says its KV encoding only in the QuantizeLinear
    that takes the input: (32768 - zero_point) * scale for a uint16 zero point, (128 - zero_point) * scale for uint8;
    a float KV input has none."""
    from onnx import TensorProto, helper

    from genie_build.run.genie_runtime import empty_kv

    def quantized(name: str, scale: float, zero_point: int, dtype: int) -> list:
        return [helper.make_tensor(f"{name}_scale", TensorProto.FLOAT, [], [scale]),
                helper.make_tensor(f"{name}_zero", dtype, [], [zero_point])]

    nodes = [helper.make_node("QuantizeLinear", [name, f"{name}_scale", f"{name}_zero"], [f"{name}_q"])
             for name in ("past_key_0_in", "past_value_0_in", "hidden_in")]
    initializers = (quantized("past_key_0_in", 0.5, 33288, TensorProto.UINT16)
                    + quantized("past_value_0_in", 0.25, 100, TensorProto.UINT8)
                    + quantized("hidden_in", 1.0, 0, TensorProto.UINT16))
    graph = helper.make_graph(nodes, "twin", [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1])
                                              for name in ("past_key_0_in", "past_value_0_in", "hidden_in",
                                                           "past_key_1_in")],
                              [helper.make_tensor_value_info(f"{node.input[0]}_q", TensorProto.UINT16, [1])
                               for node in nodes], initializers)
    assert empty_kv(helper.make_model(graph)) == {"past_key_0_in": (32768 - 33288) * 0.5,
                                                  "past_value_0_in": (128 - 100) * 0.25}
