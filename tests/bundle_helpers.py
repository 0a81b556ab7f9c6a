"""Tiny synthetic Genie bundles for the bundle, check-bundle and genie-config tests.

Graph IO follows docs/conventions.md: part 1 is the embedding alone, then one decoder layer per part, the
LM head in the last part; prompt graphs have AR 32, token graphs AR 1. Quantization of a tensor depends only
on its name (KV in/out of a layer share it), so a well-formed bundle passes the shared-quantization rule.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, models

from genie_build.bundle.bundle import ctx_bin_name
from genie_build.bundle.metadata import METADATA_NAME, dump_metadata
from genie_build.conventions import GRAPH_KINDS, graph_name
from genie_build.genie_config import make_genie_config, make_htp_backend_ext_config
from genie_build.toolchains.base import AppliedOptions, BinaryInfo, GraphInfo, QuantInfo, TensorInfo

SPECIAL_TOKENS = ("<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS, EOS = 1, 3


def write_tokenizer(path: Path, vocab_size: int = 64) -> Path:
    """A word-level tokenizer with ``vocab_size`` entries; ids 0..3 are the special tokens."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in SPECIAL_TOKENS])
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


def demo_hf_config(vocab: int = 64, hidden: int = 64, heads: int = 4, kv_heads: int = 2) -> dict:
    """A Qwen2-style HF config (plain RoPE) matching :func:`write_tokenizer`."""
    return {"model_type": "qwen2", "vocab_size": vocab, "hidden_size": hidden, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "num_hidden_layers": 2, "rope_theta": 1000000.0,
            "rope_scaling": None, "bos_token_id": BOS, "eos_token_id": EOS}


def quant(name: str, bitwidth: int = 16) -> QuantInfo:
    """A deterministic quantization for tensor ``name`` (KV in/out of one layer get the same one)."""
    key = name.removesuffix("_in").removesuffix("_out")
    return QuantInfo(dtype=f"uint{bitwidth}", scale=(zlib.crc32(key.encode()) % 1000 + 1) / 2**20,
                     offset=-(2 ** (bitwidth - 1)), bitwidth=bitwidth)


def _tensor(name: str, shape: tuple[int, ...], bitwidth: int = 16) -> TensorInfo:
    q = quant(name, bitwidth)
    return TensorInfo(name=name, shape=shape, dtype=q.dtype, quant=q)


def part_graph(name: str, index: int, num_parts: int, ar: int, cl: int, *, hidden: int = 64, head_dim: int = 16,
               kv_heads: int = 2, vocab: int = 64) -> GraphInfo:
    """IO of part ``index`` (1-based): the embedding alone, or decoder layer ``index - 2`` (+ head if last)."""
    if index == 1:
        return GraphInfo(name, (TensorInfo("input_ids", (1, ar), "int32"),),
                         (_tensor("/model/embed_tokens/Gather_output_0", (1, ar, hidden)),))
    layer, past = index - 2, cl - ar
    boundary_in = "/model/embed_tokens/Gather_output_0" if layer == 0 else f"/model/layers.{layer - 1}/Add_1_output_0"
    inputs = (_tensor(boundary_in, (1, ar, hidden)), _tensor("attention_mask", (1, ar, cl)),
              _tensor("position_ids_cos", (1, 1, ar, head_dim // 2)),
              _tensor("position_ids_sin", (1, 1, ar, head_dim // 2)),
              _tensor(f"past_key_{layer}_in", (1, kv_heads, head_dim, past), 8),
              _tensor(f"past_value_{layer}_in", (1, kv_heads, past, head_dim), 8))
    last = (TensorInfo("logits", (1, ar, vocab), "uint16", QuantInfo("uint16", 0.001 * ar, -30000, 16)),) \
        if index == num_parts else (_tensor(f"/model/layers.{layer}/Add_1_output_0", (1, ar, hidden)),)
    outputs = last + (_tensor(f"past_key_{layer}_out", (1, kv_heads, head_dim, ar), 8),
                      _tensor(f"past_value_{layer}_out", (1, kv_heads, ar, head_dim), 8))
    return GraphInfo(name, inputs, outputs)


def synthetic_infos(model: str = "demo", num_parts: int = 3, *, cl: int = 256, prompt_ar: int = 32,
                    padded: bool = True, cls: tuple[int, ...] | None = None, **dims: int) -> dict[str, BinaryInfo]:
    """BinaryInfo per bundle ctx-bin name, for a model split into ``num_parts`` parts; each part holds the prompt
    and token graphs at ``cl``, or at each of the context lengths ``cls``."""
    infos = {}
    for index in range(1, num_parts + 1):
        graphs = []
        for kind, ar, cl in [(kind, ar, length) for length in (cls or (cl,))
                             for kind, ar in (("prompt", prompt_ar), ("token", 1))]:
            name = graph_name(kind, ar, cl, index, num_parts) if padded \
                else f"{kind}_ar{ar}_cl{cl}_{index}_of_{num_parts}"
            graphs.append(part_graph(name, index, num_parts, ar, cl, **dims))
        infos[ctx_bin_name(model, index, num_parts)] = BinaryInfo(
            path=f"part_{index}.bin", file_bytes=16, weight_bytes=8, graphs=tuple(graphs), toolchain="reference",
            tool_version="test", applied_options=AppliedOptions(weights_packing=True))
    return infos


def replace_tensor(infos: dict[str, BinaryInfo], bin_name: str, graph: str, tensor: str,
                   **changes: object) -> dict[str, BinaryInfo]:
    """A copy of ``infos`` with one tensor of one graph changed (``dataclasses.replace`` fields)."""
    def edit(tensors: tuple[TensorInfo, ...]) -> tuple[TensorInfo, ...]:
        return tuple(dataclasses.replace(t, **changes) if t.name == tensor else t for t in tensors)

    info = infos[bin_name]
    graphs = tuple(dataclasses.replace(g, inputs=edit(g.inputs), outputs=edit(g.outputs)) if g.name == graph else g
                   for g in info.graphs)
    return {**infos, bin_name: dataclasses.replace(info, graphs=graphs)}


def with_inputs_embeds(infos: dict[str, BinaryInfo], width: int) -> dict[str, BinaryInfo]:
    """``infos`` with the first ctx-bin's graphs taking ``inputs_embeds`` as a bundle whose embedding is a CPU table
    (dialog.embedding) has them: for ``input_ids`` (``[..., width]``), or for the embedding's output when the first
    ctx-bin is part 2."""
    first = next(iter(infos))
    for graph in infos[first].graphs:
        inputs = {tensor.name: tensor for tensor in graph.inputs}
        if "input_ids" in inputs:
            embeds = _tensor("inputs_embeds", (*inputs["input_ids"].shape, width))
            infos = replace_tensor(infos, first, graph.name, "input_ids", name="inputs_embeds", shape=embeds.shape,
                                   dtype=embeds.dtype, quant=embeds.quant)
        else:
            infos = replace_tensor(infos, first, graph.name, "/model/embed_tokens/Gather_output_0",
                                   name="inputs_embeds")
    return infos


def write_bundle(directory: Path, infos: dict[str, BinaryInfo] | None = None, *, context_size: int = 256,
                 chipset: str = "SM8750", hf_config: dict | None = None) -> Path:
    """A bundle as :func:`genie_build.bundle.bundle.assemble_bundle` lays it out, with placeholder ctx-bins."""
    infos = infos if infos is not None else synthetic_infos()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = write_tokenizer(directory / "tokenizer.json")
    config = make_genie_config(hf_config or demo_hf_config(), tokenizer, list(infos), context_size)
    (directory / "genie_config.json").write_text(json.dumps(config, indent=2))
    (directory / "htp_backend_ext_config.json").write_text(json.dumps(make_htp_backend_ext_config(chipset)))
    (directory / METADATA_NAME).write_text(dump_metadata(infos))
    for name in infos:
        (directory / name).write_bytes(b"placeholder ctx-bin")
    return directory


def edit_json(path: Path, edit) -> None:
    """Rewrite the JSON file at ``path`` with ``edit(document)`` applied in place."""
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document, indent=2))


# --- a real reference bundle, built through the CLI as the workflow's rules build it ------------------------

REPO = Path(__file__).resolve().parents[1]
TINY_DEMO = {"layers": 2, "hidden": 64, "heads": 2, "kv_heads": 1, "intermediate": 128, "vocab": 512,
             "context": 64, "ar": 8}
VARIANT = {"weights_packing": True, "optimization_type": 3, "weight_sharing_enabled": True, "vtcm_mb": 0,
           "float_bitwidth": 16}


@dataclasses.dataclass(frozen=True)
class ReferenceBuild:
    """Paths of a tiny demo built end to end: source model, per-part ctx-bins, and the bundle."""

    root: Path
    source: Path
    binaries: tuple[Path, ...]
    bundle: Path


def _cli(*args: object) -> None:
    from genie_build.cli import main

    if main([str(arg) for arg in args]) != 0:
        raise AssertionError(f"genie-build {args[0]} failed")


def build_reference_bundle(root: Path, num_parts: int = 3) -> ReferenceBuild:
    """Demo model -> tokenizer -> calibrated encodings -> plan -> split -> slices -> convert -> compile ->
    bundle, each step through ``python -m genie_build`` commands (about 2 s for the tiny demo)."""
    from genie_build.conventions import graph_name, part_label

    source = root / "source"
    _cli("generate-demo", "--out-dir", source, *[item for key, value in TINY_DEMO.items()
                                                for item in (f"--{key.replace('_', '-')}", value)])
    _cli("train-tokenizer", "--corpus", REPO / "resources" / "tokenizer_corpus.txt", "--vocab", TINY_DEMO["vocab"],
         "--out", source / "tokenizer.json")
    _cli("calibrate", "--model-dir", source, "--out-prompt", source / "prompt.encodings.json",
         "--out-token", source / "token.encodings.json", "--num-samples", 1)
    _cli("plan", "--prompt", source / "prompt.onnx", "--token", source / "token.onnx",
         "--encodings-prompt", source / "prompt.encodings.json", "--num-parts", num_parts, "--out", root / "plan.json")
    _cli("split", "--plan", root / "plan.json", "--parts-dir", root / "parts",
         "--graph", *(f"{kind}={source / f'{kind}.onnx'}" for kind in GRAPH_KINDS))
    for kind in GRAPH_KINDS:
        _cli("slice-graph-encodings", "--graph", kind, "--model", source / f"{kind}.onnx",
             "--encodings", source / f"{kind}.encodings.json", "--parts-dir", root / "parts",
             "--out-dir", root / "encodings")
    binaries = []
    for index in range(1, num_parts + 1):
        label, graphs = part_label(index, num_parts), []
        for kind, ar in (("prompt", TINY_DEMO["ar"]), ("token", 1)):
            name = graph_name(kind, ar, TINY_DEMO["context"], index, num_parts)
            converted = root / "converted" / kind / f"part_{label}.onnx"
            _cli("convert", "--toolchain", "reference", "--onnx", root / "parts" / f"part_{label}" / f"{kind}.onnx",
                 "--encodings", root / "encodings" / f"part_{label}" / f"{kind}.encodings.json", "--graph-name", name,
                 "--float-bitwidth", 16, "--out", converted)
            graphs += ["--graph", f"{name}={converted}"]
        binaries.append(root / "compiled" / f"part_{label}.bin")
        _cli("compile", "--toolchain", "reference", *graphs, "--variant-json", json.dumps(VARIANT),
             "--chipset", "SM8750", "--out", binaries[-1])
    bundle = root / "genie_bundle"
    _cli("bundle", "--binaries", *binaries, "--toolchain", "reference", "--model-name", "demo",
         "--hf-config", source / "config.json", "--tokenizer", source / "tokenizer.json", "--chipset", "SM8750",
         "--out-dir", bundle)
    return ReferenceBuild(root=root, source=source, binaries=tuple(binaries), bundle=bundle)
