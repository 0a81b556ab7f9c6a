"""Convert for the ``qnn-htp`` toolchain: an ONNX part + its AIMET encodings -> a QDQ ONNX graph that says exactly
what the encodings say, the form ONNX Runtime's QNN execution provider hands to the HTP backend.

- **Weights** with an integer encoding become a ``DequantizeLinear`` of their integer values: symmetric encodings as
  signed INT4/INT8/INT16 with zero point 0 (how QNN stores them), asymmetric ones as UINT with their zero point;
  per tensor, per channel (``axis`` = the encoding's channel axis), per block (``block_size``), and LPBQ as the
  pattern the EP fuses into QNN's block encoding: the per-block integer scales (uint8) dequantized by the
  per-channel float scales give the block scales of the 4-bit values. INT4 is stored packed, two values a byte, in
  ``raw_data`` (as int32_data a 7B part would overflow protobuf's 2 GB).
- **Activations** with an integer encoding (graph inputs, node outputs, the KV cache at its own bits) get a
  ``QuantizeLinear``/``DequantizeLinear`` pair with the encoding's scale and zero point ``-offset``, unsigned: the
  QNN graph's IO is then UFIXED_POINT_16 (or 8) with the AIMET scale and offset, and a tensor crossing a part
  boundary carries the same encoding on both sides because both parts read it from the same file.
- **Float constants the encodings leave out** (norm weights, biases, eps, the attention scale): quantized per
  tensor at 16 bits, asymmetric over their own range with 0 on the grid, as QNN's quantizer treats a static
  tensor without an override at the activation width (:data:`CONSTANT_BITWIDTH`); integer constants (shapes,
  indices), and weights with a float encoding (AIMET's float fallback), stay as they are. The rule is recorded in the model's metadata (:data:`CONSTANTS_KEY`).
- **A 32-bit encoding on a tensor an elementwise op reads** (aimet-onnx's int32 bias of a MatMul followed by an Add,
  scaled per channel by the input's and the weight's scales): QNN's elementwise ops take no 32-bit and no per-channel
  input (the HTP backend leaves such a DequantizeLinear on the CPU; measured on an LPBQ export), so the bias takes the
  values its encoding gives and is stored as the float constants above are, at :data:`CONSTANT_BITWIDTH` bits over
  its own range (finer than the 16-bit grid of the Add's output it joins) and recorded with them.
- **Activations the encodings leave out** (aimet-onnx encodes a supergroup's output, not each tensor inside it):
  the output of a data-movement op (:data:`_MOVES`: Reshape, Transpose, Split, ...) takes its input's encoding, as
  QNN propagates it; a MatMul or Gemm output feeding only the Add of a constant bias takes that Add's range at 16
  bits (QNN fuses the two and quantizes once; here the product is rounded once more, at 16 bits, also where the Add
  is 8-bit, as a value projection feeding an 8-bit KV cache is: the HTP's block-quantized MatMul takes 16-bit
  outputs only); every other tensor stays
  float, which the HTP runs in float16 as QNN's converter does with ``float_fallback``. What each rule gave is
  recorded in the model's metadata (:data:`FILLED_KEY`).
- **A weight read only through a Transpose** (torch.onnx writes ``nn.Linear`` as ``weight [out, in]`` -> Transpose ->
  MatMul) is stored transposed, its DequantizeLinear giving the Transpose's output and the Transpose removed: the
  same values, where QNN's execution provider fuses a DequantizeLinear feeding a MatMul but leaves one feeding a
  Transpose on the CPU once the weight is large (the 152,064 x 3,584 LM head of a 7B model; measured), and a part
  with a node on the CPU does not compile. Its encoding's channel and block axes are the stored tensor's
  (:data:`FOLDED_KEY` lists what was folded).

Initializers are read and written one at a time (memory holds one weight, never the part); tensors of 1 KiB and more
go to ``<out>.data`` beside the output. The graph is moved to opset 21 first (int4 and blocked DequantizeLinear).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter

from genie_build.encodings import Encodings, TensorEncoding, blocked_shape, layout_of
from genie_build.errors import GenieBuildError
from genie_build.fileio import atomic_open
from genie_build.onnx_graph import WeightLayout, require_finite
from genie_build.toolchains.graph_edits import (CONVERTED_FROM_KEY, IO_ENCODINGS_KEY, ConvertedBefore, converted_record,
                                                made_from, read_convert_input, replace_weights, write_converted)
from genie_build.toolchains.reference.onnx_io import (ExternalDataWriter, SharedWeights, default_opset, metadata_json,
                                                     read_initializer)
from genie_build.toolchains.reference.quantize import blocked_params, dequantize, lpbq_channel_scale, quantize

__all__ = ["CONSTANTS_KEY", "CONSTANT_BITWIDTH", "FILLED_KEY", "FOLDED_KEY", "QDQ_OPSET", "elementwise_operands",
           "is_qdq_graph", "weight_transposes", "write_qdq_model"]

QDQ_OPSET = 21                      # int4 and blocked DequantizeLinear
CONSTANT_BITWIDTH = 16
ACTIVATION_BITWIDTH = 16            # what the HTP's matrix units take when the encodings leave a product out
CONSTANTS_KEY = "genie_build.unencoded_constants"
FILLED_KEY = "genie_build.filled_encodings"
FOLDED_KEY = "genie_build.folded_transposes"
# Ops that move or cut their input's values without computing new ones: their output is on the input's grid.
_MOVES = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Split", "Slice", "Expand",
                    "Identity", "Gather", "Tile"})
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div"})
_SIGNED = {4: onnx.TensorProto.INT4, 8: onnx.TensorProto.INT8, 16: onnx.TensorProto.INT16, 32: onnx.TensorProto.INT32}
_UNSIGNED = {4: onnx.TensorProto.UINT4, 8: onnx.TensorProto.UINT8, 16: onnx.TensorProto.UINT16}
_ACTIVATION_BITWIDTHS = (8, 16)
_NUMPY_SIGNED = {4: np.int8, 8: np.int8, 16: np.int16, 32: np.int32}
_NUMPY_UNSIGNED = {4: np.uint8, 8: np.uint8, 16: np.uint16}
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Stored:
    """A tensor to store: its values as written (4-bit ones packed), ONNX type and shape."""

    name: str
    values: np.ndarray
    data_type: int
    dims: tuple[int, ...]


@dataclass(frozen=True)
class _Rewrite:
    """What one initializer becomes: the tensors to store and the nodes that give back the original float tensor
    under its own name; ``constant``: a float constant without an encoding (:func:`_constant`)."""

    tensors: tuple[_Stored, ...]
    nodes: tuple[onnx.NodeProto, ...] = ()
    constant: bool = False


def write_qdq_model(onnx_path: str | os.PathLike[str], encodings_path: str | os.PathLike[str],
                    out_path: str | os.PathLike[str], *, graph_name: str,
                    input_names: Mapping[str, str] | None = None,
                    share_weights_with: str | os.PathLike[str] | None = None) -> None:
    """Write the QDQ graph of one part to ``out_path`` and its weights to ``out_path + ".data"`` (atomically).

    Args:
        onnx_path: the part's graph, its external data beside it.
        encodings_path: the part's AIMET encodings (every format :func:`read_encodings` reads).
        out_path: the QDQ graph to write.
        graph_name: the graph's name (the context binary's graph name).
        input_names: graph inputs to rename (old -> new): ``inputs_embeds`` for the part after an embedding table.
        share_weights_with: a QDQ graph in ``out_path``'s folder (the part's prompt graph): each stored tensor it
            holds with the same name, type, shape and bytes is referred to in its data file, not written again (a
            part's graphs at every length hold the same weights); a weight it converted from the same bytes, with
            the same encoding and layout, is taken as it made it (:class:`ConvertedBefore`), not quantized again.

    Raises:
        GenieBuildError: an unreadable model or encodings file, encodings that do not fit the model, a weight
            that cannot be quantized as its encoding says, or an encoding QNN has no form for.
    """
    onnx_path, out_path = Path(onnx_path), Path(out_path)
    source = read_convert_input(onnx_path, encodings_path, out_path, share_weights_with)
    encodings, layouts, shared = source.encodings, source.names.param_layouts, source.shared
    model = _at_qdq_opset(source.model, onnx_path)
    initializers, rebuilds, constants, converted_from = [], [], {}, {}
    folds, elementwise = weight_transposes(model.graph), elementwise_operands(model.graph)
    done_before = ConvertedBefore(shared)
    constants_before = metadata_json(done_before.model, CONSTANTS_KEY, {})
    data_name = out_path.name + ".data"
    with atomic_open(out_path.with_name(data_name)) as data:
        writer = ExternalDataWriter(data, data_name)
        for tensor in model.graph.initializer:
            transposed_as = folds[tensor.name].output[0] if tensor.name in folds else None
            made = made_from(tensor, onnx_path, encoding=encodings.of_initializer(tensor.name),
                             layout=layouts.get(tensor.name), transposed_as=transposed_as,
                             elementwise=tensor.name in elementwise, constant_bitwidth=CONSTANT_BITWIDTH,
                             opset=QDQ_OPSET)
            taken = done_before.take(tensor.name, made)
            if taken is not None:
                tensors, nodes = taken
                constant = tensor.name in constants_before
            else:
                array = read_initializer(tensor, onnx_path)
                if array.dtype.kind == "f":
                    require_finite(array, f"initializer {tensor.name!r}", onnx_path)
                rewrite = _rewrite_initializer(array, tensor.name, encodings, layouts.get(tensor.name),
                                               os.fspath(encodings_path), transposed_as,
                                               elementwise=tensor.name in elementwise)
                del array
                tensors = [_stored_tensor(writer, shared, stored) for stored in rewrite.tensors]
                nodes, constant = rewrite.nodes, rewrite.constant
            initializers += tensors
            rebuilds.append((tensor.name, list(nodes)))
            if constant:
                constants[tensor.name] = CONSTANT_BITWIDTH
            if made is not None:
                converted_from[tensor.name] = converted_record(made, tensors, nodes)
    if shared is not None:
        log.info("%s: %d of %d weights taken as %s converted them (the same bytes and encoding)", out_path.name,
                 done_before.taken, len(rebuilds), share_weights_with)
    replace_weights(model.graph, initializers, rebuilds)
    _remove_transposes(model.graph, folds.values())
    weights = {name for name, _ in rebuilds} | {node.output[0] for node in folds.values()}
    activations, filled = _filled_activations(model.graph, encodings.activations, weights)
    _quantize_activations(model.graph, activations, skip=weights)
    write_converted(model, source, out_path, graph_name=graph_name, input_names=input_names,
                    metadata={IO_ENCODINGS_KEY: source.recorded_io, CONSTANTS_KEY: constants, FILLED_KEY: filled,
                              FOLDED_KEY: {name: node.output[0] for name, node in folds.items()},
                              CONVERTED_FROM_KEY: converted_from})


def _stored_tensor(writer: ExternalDataWriter, shared: SharedWeights | None, stored: _Stored) -> onnx.TensorProto:
    """The initializer of a tensor to store: the shared graph's, where it holds the same, else written."""
    reused = None if shared is None else shared.find(stored.name, stored.values, data_type=stored.data_type,
                                                     dims=stored.dims)
    return reused or writer.add(stored.name, stored.values, data_type=stored.data_type, dims=stored.dims)


def is_qdq_graph(model: onnx.ModelProto) -> bool:
    """Whether ``model`` is a graph :func:`write_qdq_model` wrote (it records its rule for unencoded constants)."""
    return any(entry.key == CONSTANTS_KEY for entry in model.metadata_props)


def _at_qdq_opset(model: onnx.ModelProto, onnx_path: Path) -> onnx.ModelProto:
    """The model at opset :data:`QDQ_OPSET` (onnx's version converter: e.g. ReduceMean's axes become an input).

    Raises:
        GenieBuildError: an opset the converter cannot move (named with onnx's reason).
    """
    if default_opset(model) >= QDQ_OPSET:
        return model
    try:
        return version_converter.convert_version(model, QDQ_OPSET)
    except Exception as exc:  # onnx raises RuntimeError/ValidationError/... from C++, with its reason
        raise GenieBuildError(onnx_path, f"cannot move the graph from opset {default_opset(model)} to "
                                         f"{QDQ_OPSET} for QNN's QDQ form: {str(exc).splitlines()[0]}") from None


def weight_transposes(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """Float 2-D initializers that only a Transpose reads (swapping the two axes) -> that Transpose: the weights
    :func:`write_qdq_model` stores transposed."""
    float_matrices = {tensor.name for tensor in graph.initializer
                      if len(tensor.dims) == 2 and helper.tensor_dtype_to_np_dtype(tensor.data_type).kind == "f"}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in set(node.input) & float_matrices:
            readers.setdefault(name, []).append(node)
    outputs = {value.name for value in graph.output}
    return {name: nodes[0] for name, nodes in readers.items()
            if len(nodes) == 1 and name not in outputs and _swaps_axes(nodes[0]) and nodes[0].input[0] == name}


def elementwise_operands(graph: onnx.GraphProto) -> set[str]:
    """Initializers that only elementwise ops (:data:`_ELEMENTWISE`) read."""
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    return {tensor.name for tensor in graph.initializer if readers.get(tensor.name, {""}) <= _ELEMENTWISE}


def _swaps_axes(node: onnx.NodeProto) -> bool:
    perm = next((list(attribute.ints) for attribute in node.attribute if attribute.name == "perm"), [1, 0])
    return node.op_type == "Transpose" and perm == [1, 0]


def _remove_transposes(graph: onnx.GraphProto, transposes: Iterable[onnx.NodeProto]) -> None:
    """Remove the folded ``transposes`` from ``graph``, each known by its output (which a DequantizeLinear gives
    now)."""
    outputs = {node.output[0] for node in transposes}
    kept = [node for node in graph.node if not (node.op_type == "Transpose" and node.output[0] in outputs)]
    del graph.node[:]
    graph.node.extend(kept)


def _rewrite_initializer(array: np.ndarray, name: str, encodings: Encodings, consumer_layout: WeightLayout | None,
                         where: str, transposed_as: str | None = None, *, elementwise: bool = False) -> _Rewrite:
    """What one initializer becomes; ``transposed_as``: the output of the Transpose that alone reads it, which the
    rewrite gives instead of ``name`` (the values stored transposed); ``elementwise``: only elementwise ops read
    it (a 32-bit encoding then gives its values to a constant)."""
    enc = encodings.of_initializer(name)
    if array.dtype.kind != "f":
        return _Rewrite((_Stored(name, array, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape),))
    if enc is None:
        return _constant(name, array, transposed_as)
    if enc.dtype != "int":  # a float encoding: the weight stays float, its op runs in float16 on the HTP
        return _Rewrite((_Stored(name, array, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape),))
    section = "param" if name in encodings.params else "activation"
    try:
        layout = layout_of(enc, array.shape, consumer_layout)
        if elementwise and enc.bitwidth == 32:
            q, scale, zero_point = quantize(array, enc, layout)
            return _constant(name, dequantize(q, scale, zero_point, None if layout is None else layout.channel_axis),
                             transposed_as)
        return _weight(name, array, enc, layout, transposed_as)
    except GenieBuildError as exc:
        raise GenieBuildError(where, f"{section} encoding {name!r}: {exc.problem}") from None


def _weight(name: str, array: np.ndarray, enc: TensorEncoding, layout: WeightLayout | None,
            transposed_as: str | None = None) -> _Rewrite:
    """An encoded weight as its integer values and one DequantizeLinear (two for LPBQ); quantized as it is, then,
    with ``transposed_as``, its codes and block scales transposed (the float weight is never copied)."""
    q, scale, zero_point = quantize(array, enc, layout)
    if transposed_as is not None:
        q = np.ascontiguousarray(q.T)
        if layout is not None:
            layout = WeightLayout(1 - layout.channel_axis, None if layout.block_axis is None else 1 - layout.block_axis)
        if enc.kind == "per_block":
            scale, zero_point = np.ascontiguousarray(scale.T), np.ascontiguousarray(zero_point.T)
    bits = enc.compressed_bitwidth if enc.kind == "lpbq" else enc.bitwidth
    values, scale_name, zero_name = f"{name}_quantized", f"{name}_scale", f"{name}_zero_point"
    target = transposed_as or name
    output = target if array.dtype == np.float32 else f"{name}_dequantized"
    signed = enc.is_symmetric and bool(np.all(zero_point.astype(np.int64) == 2 ** (bits - 1)))
    if signed:
        codes = _centered(q, bits)
        zero_point, code_type = np.zeros(zero_point.shape, codes.dtype), _SIGNED[bits]
    elif bits in _UNSIGNED:
        codes, code_type = q.astype(_NUMPY_UNSIGNED[bits], copy=False), _UNSIGNED[bits]
        zero_point = zero_point.astype(codes.dtype)
    else:
        raise GenieBuildError(name, f"an asymmetric {bits}-bit encoding has no QNN form (QNN stores 32-bit "
                                    "values signed, zero point 0)")
    attributes: dict = {}
    tensors = [_Stored(values, _packed(codes, bits), code_type, codes.shape)]
    nodes = []
    if enc.kind == "per_channel":
        attributes["axis"] = layout.channel_axis
    if enc.kind in ("per_block", "lpbq"):
        if array.ndim != 2:
            raise GenieBuildError(name, f"a {enc.kind} encoding on a weight of rank {array.ndim}: QNN's block "
                                        "encodings take 2-D weights (MatMul, Gemm)")
        attributes.update(axis=layout.block_axis, block_size=enc.block_size)
    if enc.kind == "lpbq":
        grid = blocked_shape(name, q.shape, enc.block_size, layout)
        int_scale = blocked_params(np.asarray(enc.per_block_int_scale), grid, layout).astype(np.uint8)
        channel_scale = lpbq_channel_scale(enc, grid, layout).astype(np.float32).reshape(-1)
        block_scale = f"{name}_block_scale"
        tensors += [_Stored(f"{name}_block_int_scale", int_scale, onnx.TensorProto.UINT8, int_scale.shape),
                    _Stored(scale_name, channel_scale, onnx.TensorProto.FLOAT, channel_scale.shape),
                    _Stored(f"{name}_block_int_zero_point", np.zeros(channel_scale.shape, np.uint8),
                            onnx.TensorProto.UINT8, channel_scale.shape)]
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_block_int_scale", scale_name,
                                                           f"{name}_block_int_zero_point"], [block_scale],
                                      name=f"{block_scale}/DequantizeLinear", axis=layout.channel_axis))
        zero_point, scale_name = np.zeros(grid, codes.dtype), block_scale
    else:
        tensors.append(_Stored(scale_name, scale.astype(np.float32), onnx.TensorProto.FLOAT, scale.shape))
    tensors.append(_Stored(zero_name, _packed(zero_point, bits), code_type, zero_point.shape))
    nodes.append(helper.make_node("DequantizeLinear", [values, scale_name, zero_name], [output],
                                  name=f"{name}/DequantizeLinear", **attributes))
    if output != target:
        nodes.append(helper.make_node("Cast", [output], [target], name=f"{name}/Cast",
                                      to=helper.np_dtype_to_tensor_dtype(array.dtype)))
    return _Rewrite(tuple(tensors), tuple(nodes))


def _centered(q: np.ndarray, bits: int) -> np.ndarray:
    """The unsigned codes ``q`` of a symmetric encoding (zero point ``2**(bits-1)``) as the signed values QNN stores,
    ``q - 2**(bits-1)``, computed in ``q``'s own memory: a 7B LM head's codes through int64 took 4.4 GB."""
    codes = q.view(_NUMPY_SIGNED[bits])
    if bits == 8 * q.itemsize:      # the sign bit flipped is the subtraction modulo 2**bits
        np.bitwise_xor(q, q.dtype.type(1 << (bits - 1)), out=q)
    else:                           # 4 bits in a byte: 0..15 -> -8..7, no wrap
        np.subtract(codes, codes.dtype.type(1 << (bits - 1)), out=codes)
    return codes


def _constant(name: str, array: np.ndarray, transposed_as: str | None = None) -> _Rewrite:
    """A float constant without an encoding, at :data:`CONSTANT_BITWIDTH` bits per tensor over its own range;
    stored transposed as ``transposed_as`` gives (:func:`_rewrite_initializer`)."""
    values = array.astype(np.float32) if transposed_as is None else np.ascontiguousarray(array.T, np.float32)
    low, high = min(float(values.min(initial=0.0)), 0.0), max(float(values.max(initial=0.0)), 0.0)
    levels = 2 ** CONSTANT_BITWIDTH - 1
    scale = (high - low) / levels if high > low else 1.0
    zero_point = int(np.clip(np.rint(-low / scale), 0, levels))
    codes = np.clip(np.rint(values / np.float32(scale)) + zero_point, 0, levels).astype(np.uint16)
    target = transposed_as or name
    output = target if array.dtype == np.float32 else f"{name}_dequantized"
    nodes = [helper.make_node("DequantizeLinear", [f"{name}_quantized", f"{name}_scale", f"{name}_zero_point"],
                              [output], name=f"{name}/DequantizeLinear")]
    if output != target:
        nodes.append(helper.make_node("Cast", [output], [target], name=f"{name}/Cast",
                                      to=helper.np_dtype_to_tensor_dtype(array.dtype)))
    return _Rewrite((_Stored(f"{name}_quantized", codes, onnx.TensorProto.UINT16, codes.shape),
                     _Stored(f"{name}_scale", np.array(scale, np.float32), onnx.TensorProto.FLOAT, ()),
                     _Stored(f"{name}_zero_point", np.array(zero_point, np.uint16), onnx.TensorProto.UINT16, ())),
                    tuple(nodes), constant=True)


def _packed(values: np.ndarray, bits: int) -> np.ndarray:
    """The bytes ONNX stores ``values`` in: 4-bit values packed two a byte, the first in the low nibble."""
    if bits != 4:
        return values
    flat = values.reshape(-1).astype(np.uint8) & 0x0F
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return flat[0::2] | (flat[1::2] << 4)


def _filled_activations(graph: onnx.GraphProto, activations: Mapping[str, TensorEncoding],
                        constants: AbstractSet[str]) -> tuple[dict[str, TensorEncoding], dict[str, str]]:
    """The activation encodings with those of tensors the encodings leave out filled by the module's rules, and
    for each filled tensor the tensor whose encoding it took (in node order, so a chain of moves propagates)."""
    filled_from: dict[str, str] = {}
    result = dict(activations)
    outputs = {value.name for value in graph.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in graph.node:
        for output in node.output:
            if not output or output in result or output in outputs:
                continue
            source = _encoding_source(node, output, result, consumers, constants)
            if source is not None:
                enc = result[source]
                if node.op_type in ("MatMul", "Gemm"):
                    enc = _at_bitwidth(enc, ACTIVATION_BITWIDTH)
                result[output] = dataclasses.replace(enc, name=output)
                filled_from[output] = source
    return result, filled_from


def _encoding_source(node: onnx.NodeProto, output: str, known: Mapping[str, TensorEncoding],
                     consumers: Mapping[str, list[onnx.NodeProto]], constants: AbstractSet[str]) -> str | None:
    """The tensor whose encoding an unencoded ``output`` of ``node`` takes, if a rule gives one."""
    if node.op_type in _MOVES and node.input and _quantizable(known.get(node.input[0])):
        return node.input[0]
    users = consumers.get(output, [])
    if node.op_type in ("MatMul", "Gemm") and len(users) == 1 and users[0].op_type == "Add":
        add = users[0]
        other = next((name for name in add.input if name != output), None)
        if other in constants and _quantizable(known.get(add.output[0])):
            return add.output[0]
    return None


def _at_bitwidth(enc: TensorEncoding, bitwidth: int) -> TensorEncoding:
    """A per-tensor encoding over the same range at ``bitwidth`` bits (the range's ends kept, 0 on the grid)."""
    if enc.bitwidth == bitwidth:
        return enc
    low = enc.offset[0] * enc.scale[0]
    high = (2 ** enc.bitwidth - 1 + enc.offset[0]) * enc.scale[0]
    scale = (high - low) / (2 ** bitwidth - 1)
    return dataclasses.replace(enc, bitwidth=bitwidth, scale=(scale,), offset=(int(round(low / scale)),),
                               is_symmetric=False)


def _quantizable(enc: TensorEncoding | None) -> bool:
    return enc is not None and enc.dtype == "int" and enc.kind == "per_tensor"


def _quantize_activations(graph: onnx.GraphProto, activations: Mapping[str, TensorEncoding],
                          skip: AbstractSet[str]) -> None:
    """A QuantizeLinear/DequantizeLinear pair on every graph input and node output with an integer encoding:
    consumers of an input read its dequantized copy; a node output is renamed, quantized and dequantized back
    under its own name (so a graph output keeps its name and float type, and ORT moves its Q/DQ to the CPU).
    ``skip``: the weights, already dequantized from their encoding (AIMET gives the embedding table an activation
    encoding of its own).

    Raises:
        GenieBuildError: an activation encoding QNN has no form for (per channel, or not 8 or 16 bits).
    """
    nodes, renames = [], {}
    for value in graph.input:
        enc = activations.get(value.name)
        if _quantized(enc):
            renames[value.name] = f"{value.name}/dequantized"
            nodes += _pair(graph, value.name, renames[value.name], enc)
    for node in list(graph.node):
        node.input[:] = [renames.get(name, name) for name in node.input]
        nodes.append(node)
        for index, output in enumerate(node.output):
            enc = activations.get(output)
            if output and output not in skip and _quantized(enc):
                node.output[index] = f"{output}/float"
                nodes += _pair(graph, node.output[index], output, enc)
    del graph.node[:]
    graph.node.extend(nodes)


def _quantized(enc: TensorEncoding | None) -> bool:
    if enc is None or enc.dtype != "int":
        return False
    if enc.kind != "per_tensor" or enc.bitwidth not in _ACTIVATION_BITWIDTHS:
        raise GenieBuildError(enc.name, f"a {enc.kind} {enc.bitwidth}-bit activation encoding: QNN quantizes "
                                        f"activations per tensor at {' or '.join(map(str, _ACTIVATION_BITWIDTHS))} "
                                        "bits")
    return True


def _pair(graph: onnx.GraphProto, source: str, target: str, enc: TensorEncoding) -> list[onnx.NodeProto]:
    """Quantize ``source`` and dequantize it as ``target``; the scale and zero point become initializers of
    ``graph`` (QNN takes them only as constants)."""
    scale_name, zero_name, quantized = f"{target}/scale", f"{target}/zero_point", f"{target}/quantized"
    graph.initializer.extend([
        numpy_helper.from_array(np.array(enc.scale[0], np.float32), scale_name),
        numpy_helper.from_array(np.array(-enc.offset[0], _NUMPY_UNSIGNED[enc.bitwidth]), zero_name)])
    return [helper.make_node("QuantizeLinear", [source, scale_name, zero_name], [quantized],
                             name=f"{target}/QuantizeLinear"),
            helper.make_node("DequantizeLinear", [quantized, scale_name, zero_name], [target],
                             name=f"{target}/DequantizeLinear")]
