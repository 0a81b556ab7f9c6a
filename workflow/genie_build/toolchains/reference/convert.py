"""Convert: an ONNX part + its AIMET encodings -> a runnable ONNX holding the weights a device would hold.

Each initializer, read and written one at a time:

- with an integer encoding (its parameter encoding, else an activation encoding AIMET gives the initializer
  itself, as it does the embedding table), it becomes its quantized values ``{name}_quantized`` (uint8 up
  to 8 bits, uint16 up to 16; 32-bit values as int32 ``q - zero_point`` with a zero zero point),
  ``{name}_scale`` (float32) and ``{name}_zero_point``, and a DequantizeLinear whose output takes the
  original name, so no other node changes. The channel and block axes are the encoding's
  (:func:`genie_build.encodings.layout_of`: the consumer's rule, or the axis a 2.0.0 file states).
  DequantizeLinear takes 8/32-bit per-tensor and per-channel encodings from opset 13 and 16-bit and 2-D
  per-block ones from opset 21; otherwise the same formula ``(q - zero_point) * scale`` is written out as
  Cast, Sub and Mul (per block: on the values viewed with the block axis split into ``[blocks,
  block_size]``, reshaped back), which gives the same floats. LPBQ is always written out and stores what
  its encoding gives: the 4-bit values, the per-block integer scales ``{name}_block_int_scale`` (uint8)
  and the per-channel float scales ``{name}_scale`` (float64); the graph multiplies the two into the block
  scale.
  A non-float32 weight gets a Cast back to its own type;
- float32 without an integer encoding, it becomes ``{name}_float16`` + Cast to float32 when its float
  bitwidth (its float encoding's, else ``float_bitwidth``) is 16 -- unless a finite value would overflow
  float16, in which case it stays float32 with a warning;
- otherwise it is copied unchanged.

The model records in its ``metadata_props`` (JSON values): :data:`QUANTIZED_WEIGHTS_KEY` (values tensor ->
``weight``, ``bitwidth`` stored, ``encoding`` kind, channel ``axis``, ``block_size``, ``scale`` and
``zero_point`` tensor names), :data:`IO_ENCODINGS_KEY` (graph input/output -> its activation encoding) and
:data:`FLOAT_BITWIDTH_KEY`, and :data:`CONVERTED_FROM_KEY` (initializer -> a digest of what its conversion read:
its stored bytes' sha256, dtype and shape, its encoding, layout and float bitwidth; the tensors and nodes it became).
Tensors of 1 KiB and more go to ``<out>.data`` beside the output, 64-byte aligned; smaller ones stay inline.

Given a converted graph in the same folder to share weights with (a part's prompt graph, for its token graph and its
graphs at other context lengths), an initializer it converted from the same bytes (their sha256, read from this
graph's data file) with the same encoding is taken from it as it is (tensors, nodes, quantization record), not
quantized again; any other converted tensor it holds with the same name and bytes is not written again: the
initializer points at its data file.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from genie_build.encodings import SUPPORTED_FLOAT_BITWIDTHS, TensorEncoding, blocked_shape, layout_of
from genie_build.errors import GenieBuildError
from genie_build.fileio import atomic_open
from genie_build.onnx_graph import GraphTensors, WeightLayout, require_finite
from genie_build.toolchains.graph_edits import (CONVERTED_FROM_KEY, IO_ENCODINGS_KEY, ConvertedBefore, ConvertInput,
                                                converted_record, made_from, read_convert_input, replace_weights,
                                                write_converted)
from genie_build.toolchains.reference.onnx_io import (ExternalDataWriter, default_opset,
                                                     metadata_json, read_initializer)
from genie_build.toolchains.reference.quantize import (blocked_params, broadcast_params, lpbq_channel_scale,
                                                       quantize, stored_bitwidth, unsigned_dtype)
from genie_build.toolchains.reference.records import Quantization

__all__ = ["CONVERTED_FROM_KEY", "FLOAT_BITWIDTHS", "FLOAT_BITWIDTH_KEY", "QUANTIZED_WEIGHTS_KEY", "convert_model",
           "quantized_weights"]

QUANTIZED_WEIGHTS_KEY = "genie_build.quantized_weights"
FLOAT_BITWIDTH_KEY = "genie_build.float_bitwidth"
FLOAT_BITWIDTHS = SUPPORTED_FLOAT_BITWIDTHS  # what a float weight or fallback is stored as

_FLOAT16_MAX = float(np.finfo(np.float16).max)
_BLOCKED = ("per_block", "lpbq")
log = logging.getLogger(__name__)


def quantized_weights(model: onnx.ModelProto) -> dict[str, Quantization]:
    """A converted model's :data:`QUANTIZED_WEIGHTS_KEY` record: values tensor name -> its quantization."""
    return {name: Quantization.from_dict(record)
            for name, record in metadata_json(model, QUANTIZED_WEIGHTS_KEY, {}).items()}


@dataclass(frozen=True)
class _Converted:
    """What one initializer becomes: initializers to write, the nodes that rebuild the original tensor
    from them, and (for a quantized weight) its :class:`Quantization`."""

    tensors: tuple[tuple[str, np.ndarray], ...]
    nodes: tuple[onnx.NodeProto, ...] = ()
    quantization: Quantization | None = None


def convert_model(onnx_path: str | os.PathLike[str], encodings_path: str | os.PathLike[str],
                  out_path: str | os.PathLike[str], *, graph_name: str, float_bitwidth: int,
                  input_names: Mapping[str, str] | None = None,
                  share_weights_with: str | os.PathLike[str] | None = None) -> None:
    """Write the converted model to ``out_path`` and its weights to ``out_path + ".data"`` (atomically).

    ``share_weights_with`` names a converted graph in ``out_path``'s folder: each converted tensor it stores with the
    same name, dtype, shape and bytes is referred to in its data file rather than written again.

    ``input_names`` renames graph inputs (old -> new) in the converted model and its IO encodings: the first part of
    a bundle whose embedding is a CPU table takes the embedding output as ``inputs_embeds``, the name Genie feeds.

    Raises:
        GenieBuildError: a bad argument, an unreadable model or encodings file, encodings that do not fit
            the model, or a weight that cannot be quantized as its encoding says.
    """
    onnx_path, out_path = Path(onnx_path), Path(out_path)
    if float_bitwidth not in FLOAT_BITWIDTHS:
        raise GenieBuildError("float_bitwidth", f"{float_bitwidth} is not one of {FLOAT_BITWIDTHS}")
    if not graph_name:
        raise GenieBuildError("graph_name", "must not be empty")
    source = read_convert_input(onnx_path, encodings_path, out_path, share_weights_with)
    weights = _convert_weights(source, out_path, float_bitwidth, os.fspath(encodings_path))
    if share_weights_with is not None:
        log.info("%s: %d of %d weights taken as %s converted them (the same bytes and encoding), %d converted",
                 out_path.name, weights.taken, len(weights.rebuilds), share_weights_with,
                 len(weights.rebuilds) - weights.taken)
    model = source.model
    _check_new_names_are_free(weights.initializers, [node for _, nodes in weights.rebuilds for node in nodes],
                              source.names, onnx_path)
    replace_weights(model.graph, weights.initializers, weights.rebuilds)
    write_converted(model, source, out_path, graph_name=graph_name, input_names=input_names,
                    metadata={QUANTIZED_WEIGHTS_KEY: weights.quantized, IO_ENCODINGS_KEY: source.recorded_io,
                              FLOAT_BITWIDTH_KEY: float_bitwidth, CONVERTED_FROM_KEY: weights.converted_from})


@dataclass
class _ConvertedWeights:
    """A graph's initializers converted: the initializers to store, the nodes rebuilding each weight, the
    :data:`QUANTIZED_WEIGHTS_KEY` and :data:`CONVERTED_FROM_KEY` records."""

    initializers: list[onnx.TensorProto] = dataclasses.field(default_factory=list)
    rebuilds: list[tuple[str, tuple[onnx.NodeProto, ...]]] = dataclasses.field(default_factory=list)
    quantized: dict[str, dict] = dataclasses.field(default_factory=dict)
    converted_from: dict[str, dict] = dataclasses.field(default_factory=dict)
    taken: int = 0      # initializers taken as the shared graph converted them


def _convert_weights(source: ConvertInput, out_path: Path, float_bitwidth: int, where: str) -> _ConvertedWeights:
    """Every initializer of ``source``'s graph converted, its stored tensors written to ``out_path + ".data"``: one
    the shared graph converted from the same bytes with the same encoding taken as it made it, a stored tensor it
    holds the same referred to there, the rest written."""
    model, encodings, shared, onnx_path = source.model, source.encodings, source.shared, source.path
    opset = default_opset(model)
    done = _ConvertedWeights()
    done_before = ConvertedBefore(shared)
    quantized_before = metadata_json(done_before.model, QUANTIZED_WEIGHTS_KEY, {})
    data_name = out_path.name + ".data"
    with atomic_open(out_path.with_name(data_name)) as data:
        writer = ExternalDataWriter(data, data_name)
        for tensor in model.graph.initializer:
            enc, is_param, layout = (encodings.of_initializer(tensor.name), tensor.name in encodings.params,
                                     source.names.param_layouts.get(tensor.name))
            made = made_from(tensor, onnx_path, is_param=is_param, encoding=enc, layout=layout,
                             float_bitwidth=float_bitwidth, opset=opset)
            taken = done_before.take(tensor.name, made)
            if taken is not None:
                tensors, nodes = taken
                quantization = quantized_before.get(tensors[0].name)
                done.initializers += tensors
            else:
                array = read_initializer(tensor, onnx_path)
                require_finite(array, f"initializer {tensor.name!r}", onnx_path)
                converted = _convert_initializer(array, tensor.name, enc, is_param, layout, float_bitwidth, opset,
                                                 where)
                del array  # a quantized table's codes are written while its float values are freed
                for name, stored in converted.tensors:
                    reused = None if shared is None else shared.find(name, stored)
                    done.initializers.append(writer.add(name, stored) if reused is None else reused)
                nodes = converted.nodes
                quantization = None if converted.quantization is None else converted.quantization.to_dict()
                tensors = done.initializers[len(done.initializers) - len(converted.tensors):]
            done.rebuilds.append((tensor.name, nodes))
            if quantization is not None:
                done.quantized[tensors[0].name] = quantization
            if made is not None:
                done.converted_from[tensor.name] = converted_record(made, tensors, nodes)
    done.taken = done_before.taken
    return done


def _convert_initializer(array: np.ndarray, name: str, enc: TensorEncoding | None, is_param: bool,
                         consumer_layout: WeightLayout | None, float_bitwidth: int, opset: int,
                         where: str) -> _Converted:
    if enc is not None and enc.dtype == "int" and not np.issubdtype(array.dtype, np.floating):
        if is_param:
            raise GenieBuildError(where, f"param encoding {name!r}: an integer encoding on a {array.dtype} "
                                         "initializer (only float weights can be quantized)")
        return _Converted(tensors=((name, array),))  # an integer constant: nothing to quantize
    if enc is not None and enc.dtype == "int":
        section = "param" if is_param else "activation"
        try:
            layout = layout_of(enc, array.shape, consumer_layout)
            q, scale, zero_point = quantize(array, enc, layout)
        except GenieBuildError as exc:
            raise GenieBuildError(where, f"{section} encoding {name!r}: {exc.problem}") from None
        return _dequantized(name, array.dtype, q, scale, zero_point, enc, layout, opset, where)
    bitwidth = enc.bitwidth if enc is not None else float_bitwidth
    if array.dtype == np.float32 and bitwidth == 16:
        if not np.any(np.isfinite(array) & (np.abs(array) > _FLOAT16_MAX)):
            return _float16(name, array)
        log.warning("%s: kept in float32: a value exceeds the float16 range", name)
    return _Converted(tensors=((name, array),))


def _float16(name: str, array: np.ndarray) -> _Converted:
    stored = f"{name}_float16"
    return _Converted(tensors=((stored, array.astype(np.float16)),),
                      nodes=(helper.make_node("Cast", [stored], [name], name=f"{name}/Cast",
                                              to=onnx.TensorProto.FLOAT),))


def _dequantized(name: str, dtype: np.dtype, q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray,
                 enc: TensorEncoding, layout: WeightLayout | None, opset: int, where: str) -> _Converted:
    """The quantized values, scale and zero point, and the nodes that give back the float weight."""
    axis = None if layout is None else layout.channel_axis
    if q.dtype == np.uint32:  # DequantizeLinear has no uint32: store the signed values q - zero_point
        q, zero_point = _as_int32(q, zero_point, axis, name, where), np.zeros(zero_point.shape, np.int32)
    values, scale_name, zero_point_name = f"{name}_quantized", f"{name}_scale", f"{name}_zero_point"
    output = name if dtype == np.float32 else f"{name}_dequantized"
    blocked = enc.kind in _BLOCKED
    grid = blocked_shape(name, q.shape, enc.block_size, layout) if blocked else None
    whole_blocks = blocked and q.ndim == 2  # DequantizeLinear's blocked scales have every other axis whole
    lpbq: dict = {}
    if enc.kind == "lpbq":
        tensors, nodes, lpbq = _lpbq_tensors(name, output, q, enc, layout, grid)
    elif opset >= 21 or (opset >= 13 and q.dtype != np.uint16 and not blocked):
        attributes = {"axis": axis} if enc.kind == "per_channel" else {}
        if blocked and whole_blocks:
            attributes = {"axis": layout.block_axis, "block_size": enc.block_size}
        if blocked and not whole_blocks:
            tensors, nodes = _written_out_dequantize(name, output, q, scale, zero_point, enc, layout)
        else:
            nodes = [helper.make_node("DequantizeLinear", [values, scale_name, zero_point_name], [output],
                                      name=f"{name}/DequantizeLinear", **attributes)]
            tensors = [(values, q), (scale_name, scale), (zero_point_name, zero_point)]
    else:
        tensors, nodes = _written_out_dequantize(name, output, q, scale, zero_point, enc, layout)
    if output != name:
        nodes.append(helper.make_node("Cast", [output], [name], name=f"{name}/Cast",
                                      to=helper.np_dtype_to_tensor_dtype(dtype)))
    quantization = Quantization(weight=name, bitwidth=stored_bitwidth(enc), encoding=enc.kind, axis=axis,
                                block_axis=None if layout is None else layout.block_axis, block_size=enc.block_size,
                                scale=scale_name, zero_point=zero_point_name, **lpbq)
    return _Converted(tensors=tuple(tensors), nodes=tuple(nodes), quantization=quantization)


def _lpbq_tensors(name: str, output: str, q: np.ndarray, enc: TensorEncoding, layout: WeightLayout,
                  grid: tuple[int, ...]) -> tuple[list[tuple[str, np.ndarray]], list[onnx.NodeProto], dict]:
    """LPBQ as stored: values, per-channel float scale (float64, as given) and zero point, per-block integer
    scale; the graph computes ``block_scale = float32(double(block_int_scale) * scale)``, the scale
    quantize used."""
    int_scale_name, block_scale = f"{name}_block_int_scale", f"{name}_block_scale"
    int_bits = enc.bitwidth - enc.compressed_bitwidth
    int_scale = blocked_params(np.asarray(enc.per_block_int_scale), grid, layout).astype(unsigned_dtype(int_bits))
    channel_scale = lpbq_channel_scale(enc, grid, layout)
    zero_point = np.full(channel_scale.shape, 2 ** (enc.compressed_bitwidth - 1), dtype=q.dtype)
    # the block scale must broadcast over the values viewed as [.., blocks, block_size, ..]
    int_scale, channel_scale = (np.expand_dims(array, layout.block_axis + 1) for array in (int_scale, channel_scale))
    tensors, nodes = _written_out_dequantize(name, output, q, None, zero_point, enc, layout, scale_name=block_scale)
    tensors += [(f"{name}_scale", channel_scale), (int_scale_name, int_scale)]
    nodes[:0] = [helper.make_node("Cast", [int_scale_name], [f"{int_scale_name}_double"],
                                  name=f"{int_scale_name}/Cast", to=onnx.TensorProto.DOUBLE),
                 helper.make_node("Mul", [f"{int_scale_name}_double", f"{name}_scale"], [f"{block_scale}_double"],
                                  name=f"{block_scale}/Mul"),
                 helper.make_node("Cast", [f"{block_scale}_double"], [block_scale], name=f"{block_scale}/Cast",
                                  to=onnx.TensorProto.FLOAT)]
    return tensors, nodes, {"block_int_scale": int_scale_name, "block_int_scale_bitwidth": int_bits}


def _written_out_dequantize(name: str, output: str, q: np.ndarray, scale: np.ndarray | None, zero_point: np.ndarray,
                            enc: TensorEncoding, layout: WeightLayout | None, scale_name: str | None = None
                            ) -> tuple[list[tuple[str, np.ndarray]], list[onnx.NodeProto]]:
    """``(q - zero_point) * scale`` as Cast/Sub/Mul, parameters stored in a shape that broadcasts.

    ``scale_name`` names a scale another node computes (LPBQ's block scale); ``scale`` is then None."""
    values, zero_point_name = f"{name}_quantized", f"{name}_zero_point"
    scale_name = scale_name or f"{name}_scale"
    weight_shape = q.shape
    if enc.kind in _BLOCKED:  # split the block axis into [blocks, block_size] so [blocks, 1] broadcasts
        split = layout.block_axis
        q = q.reshape(q.shape[:split] + (q.shape[split] // enc.block_size, enc.block_size) + q.shape[split + 1:])
        zero_point = np.expand_dims(zero_point, split + 1)
        scale = None if scale is None else np.expand_dims(scale, split + 1)
    elif enc.kind == "per_channel":
        along_axis = [-1 if dim == layout.channel_axis else 1 for dim in range(q.ndim)]
        scale, zero_point = scale.reshape(along_axis), zero_point.reshape(along_axis)
    product = f"{name}_blocks" if enc.kind in _BLOCKED else output
    float_type = onnx.TensorProto.FLOAT
    nodes = [helper.make_node("Cast", [values], [f"{values}_float"], name=f"{values}/Cast", to=float_type),
             helper.make_node("Cast", [zero_point_name], [f"{zero_point_name}_float"], name=f"{zero_point_name}/Cast",
                              to=float_type),
             helper.make_node("Sub", [f"{values}_float", f"{zero_point_name}_float"], [f"{name}_centered"],
                              name=f"{name}/Sub"),
             helper.make_node("Mul", [f"{name}_centered", scale_name], [product], name=f"{name}/Mul")]
    tensors = [(values, q), (zero_point_name, zero_point)]
    if scale is not None:
        tensors.insert(1, (scale_name, scale))
    if enc.kind in _BLOCKED:
        nodes.append(helper.make_node("Reshape", [product, f"{name}_shape"], [output], name=f"{name}/Reshape"))
        tensors.append((f"{name}_shape", np.array(weight_shape, dtype=np.int64)))
    return tensors, nodes


def _as_int32(q: np.ndarray, zero_point: np.ndarray, axis: int | None, name: str, where: str) -> np.ndarray:
    signed = q.astype(np.int64) - broadcast_params(zero_point, q.shape, axis).astype(np.int64)
    limits = np.iinfo(np.int32)
    if signed.size and (signed.min() < limits.min or signed.max() > limits.max):
        raise GenieBuildError(where, f"param encoding {name!r}: 32-bit values q + offset span "
                                     f"[{signed.min()}, {signed.max()}], outside int32")
    return signed.astype(np.int32)


def _check_new_names_are_free(initializers: list[onnx.TensorProto], nodes: list[onnx.NodeProto],
                              names: GraphTensors, onnx_path: Path) -> None:
    """Refuse to convert when a name the converter adds (``{name}_quantized``, ...) is already taken."""
    added = {tensor.name for tensor in initializers} | {output for node in nodes for output in node.output}
    clashes = sorted((added - names.param_shapes.keys()) & names.tensor_names)
    if clashes:
        raise GenieBuildError(onnx_path, f"tensor names the converter adds are already used: {clashes[:3]}")

