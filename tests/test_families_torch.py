"""The family registry against transformers, and FP8 checkpoints read as transformers reads them.

Each record's tensors (names and shapes, tied and untied, with and without the config's bias switches) are the
state dict of its transformers class; the classes the export builds parts from exist; the defaults a record states
are its config class's. An FP8 checkpoint written as the Hub's ``*-FP8`` models are (``F8_E4M3`` weights,
``weight_scale_inv`` block scales, ``quantization_config.quant_method: fp8``) is exported with each weight equal, bit
for bit, to what transformers' own ``Fp8Dequantize`` makes of the same file, and not its raw codes.
"""

from __future__ import annotations

import importlib
import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from genie_build.families import FAMILIES
from genie_build.hf_checkpoint import check_checkpoint
from genie_build.hf_config import read_model_shape, stored_tensors
from genie_build.plan.shape_plan import plan_from_hf_config

pytestmark = pytest.mark.hf
torch = pytest.importorskip("torch", reason="the export needs torch: pip install --no-deps -r envs/requirements-hf.txt")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxscript")

import hf_checkpoints  # noqa: E402  (needs torch)
from test_families import DIMS, PUBLISHED  # noqa: E402

from genie_build.export.export import export_part, part_files  # noqa: E402

AR, CONTEXT = 8, 32
SWITCHES = {"attention_bias": True, "mlp_bias": True}


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
@pytest.mark.parametrize("tied, switches", [(False, False), (True, True)], ids=["untied", "tied-biases"])
def test_a_records_tensors_are_its_transformers_class_state_dict(model_type, tied, switches):
    family = FAMILIES[model_type]
    config = {"model_type": model_type, **DIMS, **PUBLISHED[model_type], "tie_word_embeddings": tied,
              **(SWITCHES if switches else {})}
    model_class = getattr(transformers, family.architecture)
    hf_config = model_class.config_class(**{k: v for k, v in config.items() if k not in ("model_type",)})
    with torch.device("meta"):
        model = model_class(hf_config)
    state = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if tied:
        state.pop("lm_head.weight")   # save_pretrained stores the table once
    ours = {t.name: t.shape for t in stored_tensors(read_model_shape(config, "config.json"))}
    assert ours == state
    modeling = importlib.import_module(family.modeling_module)
    assert all(hasattr(modeling, f"{family.class_prefix}{suffix}") for suffix in ("DecoderLayer", "RMSNorm"))


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_a_records_defaults_are_transformers(model_type):
    family = FAMILIES[model_type]
    config_class = getattr(transformers, family.architecture).config_class
    switch = {family.sliding_window_switch: True} if family.sliding_window_switch else {}
    made = config_class(hidden_size=64, num_attention_heads=4, **switch)
    for key, value in family.defaults.items():
        assert getattr(made, key) == value, (model_type, key)
    if "sliding_window" not in family.defaults:
        assert getattr(made, "sliding_window", None) is None
    if "head_dim" not in family.defaults:
        assert getattr(made, "head_dim", None) in (None, 16)


BLOCK = [16, 16]


def _to_fp8(checkpoint, block=BLOCK):
    """Rewrite ``checkpoint``'s layer Linear weights as FP8 codes and block scales, as the Hub's FP8 models store
    them (scale = the block's largest magnitude / 448, weight_scale_inv holding that scale); returns the codes and
    scales by weight name."""
    from safetensors.torch import load_file, save_file

    path = checkpoint / "model.safetensors"
    tensors = load_file(str(path))
    quantized = {}
    for name in [n for n in tensors if ".layers." in n and n.endswith("_proj.weight")]:
        weight = tensors[name].to(torch.float32)
        rows, cols = weight.shape
        blocks = weight.reshape(rows // block[0], block[0], cols // block[1], block[1])
        scale = blocks.abs().amax(dim=(1, 3)) / 448.0
        codes = (blocks / scale[:, None, :, None]).reshape(rows, cols).to(torch.float8_e4m3fn)
        tensors[name], tensors[name + "_scale_inv"] = codes, scale
        quantized[name] = (codes, scale)
    save_file(tensors, str(path), metadata={"format": "pt"})
    config = json.loads((checkpoint / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": block}
    (checkpoint / "config.json").write_text(json.dumps(config))
    return quantized


def test_an_fp8_checkpoint_is_exported_as_transformers_dequantizes_it(tmp_path):
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    checkpoint = hf_checkpoints.make_checkpoint(tmp_path / "checkpoint", "qwen3", tied=True, layers=2)
    quantized = _to_fp8(checkpoint)
    check_checkpoint(checkpoint, ar=AR, context=CONTEXT)
    plan = plan_from_hf_config(checkpoint / "config.json", recipe="w4a16", ar=AR, context=CONTEXT, num_parts=2)
    part = next(p for p in plan.parts if p.first_layer == 0)
    export_part(checkpoint, part, tmp_path / "part", num_parts=2, ar=AR, context=CONTEXT)
    graph = part_files(tmp_path / "part")[0]["prompt"]
    model = onnx.load(graph, load_external_data=False)
    exported = {t.name: numpy_helper.to_array(t, str(graph.parent)) for t in model.graph.initializer}
    theirs = Fp8Dequantize(None)
    compared = 0
    for name, (codes, scale) in quantized.items():
        if name not in exported:
            continue
        expected = theirs._dequantize_one(codes, scale, output_dtype=torch.float32).numpy()
        assert exported[name].dtype == np.float32 and np.array_equal(exported[name], expected), name
        assert not np.array_equal(exported[name], codes.to(torch.float32).numpy())
        compared += 1
    assert compared == 7 * len(range(part.first_layer, part.last_layer + 1))
    largest = max(float(np.abs(exported[name]).max()) for name in quantized if name in exported)
    assert largest < 1.0 < max(float(codes.to(torch.float32).abs().max()) for codes, _ in quantized.values())


def test_an_fp8_weight_without_its_scales_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    checkpoint = hf_checkpoints.make_checkpoint(tmp_path / "checkpoint", "qwen2", layers=1)
    _to_fp8(checkpoint)
    tensors = load_file(str(checkpoint / "model.safetensors"))
    del tensors["model.layers.0.mlp.up_proj.weight_scale_inv"]
    save_file(tensors, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(Exception, match="has no 'model.layers.0.mlp.up_proj.weight_scale_inv'"):
        check_checkpoint(checkpoint, ar=AR, context=CONTEXT)
