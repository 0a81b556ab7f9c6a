"""Where an encoding's scales run on its tensor (the channel and block axes, :func:`layout_of`) and whether an
encodings file fits a model: every tensor it names exists, every per-channel or per-block encoding has a scale per
channel or block (:func:`validate_against_model`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from collections.abc import Set as AbstractSet

from genie_build.encodings.model import Encodings, TensorEncoding
from genie_build.errors import GenieBuildError
from genie_build.onnx_graph import WeightLayout

__all__ = ["block_grid", "blocked_shape", "check_scale_count", "layout_of", "validate_against_model"]

_UNKNOWN_SHOWN = 5  # unknown tensor names quoted in an error


def layout_of(encoding: TensorEncoding, shape: tuple[int, ...],
              consumer_layout: WeightLayout | None) -> WeightLayout | None:
    """The axes ``encoding`` runs along on a tensor of ``shape``: the axis a 2.0.0 file states, else the
    consumer's (:func:`consumer_layouts`). None for a per-tensor encoding.

    Raises:
        GenieBuildError: (``where`` = the tensor) the encoding needs an axis and neither gives one, or the
            stated axis lies outside the shape.
    """
    if encoding.kind == "per_tensor" or encoding.dtype != "int":
        return None
    if encoding.axis is not None:
        if not -len(shape) <= encoding.axis < len(shape):
            raise GenieBuildError(encoding.name, f"axis {encoding.axis} is outside shape {list(shape)}")
        channel = encoding.axis % len(shape)
        if len(shape) == 1:
            return WeightLayout(0, None)
        if consumer_layout is not None and consumer_layout.channel_axis == channel:
            return consumer_layout
        return WeightLayout(channel, (channel + 1) % 2)
    if consumer_layout is None:
        raise GenieBuildError(encoding.name, f"a {encoding.kind} encoding on a weight of shape {list(shape)} "
                                             "whose consumer gives no channel axis (MatMul, Gemm, Conv, "
                                             "ConvTranspose, Gather do); a 2.0.0 file states the axis")
    if (encoding.kind in ("per_block", "lpbq") and len(shape) > 2
            and consumer_layout.channel_axis > consumer_layout.block_axis):
        # aimet-onnx lists such scales block-major in 1.0.0 (it transposes only 2-D ones to [out, in/block])
        raise GenieBuildError(encoding.name, f"a {encoding.kind} encoding without an axis on a weight of shape "
                                             f"{list(shape)} blocked along axis {consumer_layout.block_axis} "
                                             "(a ConvTranspose's) is not supported; export it as 2.0.0")
    return consumer_layout


def blocked_shape(name: str, shape: tuple[int, ...], block_size: int, layout: WeightLayout) -> tuple[int, ...]:
    """The shape of a blocked encoding's scales laid out like the weight: the channel axis whole, the block
    axis in blocks of ``block_size``, every other axis 1.

    Raises:
        GenieBuildError: the tensor has no block axis (1-D) or its block axis is not a whole number of blocks.
    """
    if layout.block_axis is None:
        raise GenieBuildError(name, f"a per-block encoding needs a weight of rank >= 2, got shape {list(shape)}")
    if shape[layout.block_axis] % block_size:
        raise GenieBuildError(name, f"axis {layout.block_axis} of shape {list(shape)} is not a whole number of "
                                    f"blocks of {block_size}")
    return tuple(size if axis == layout.channel_axis else size // block_size if axis == layout.block_axis else 1
                 for axis, size in enumerate(shape))


def block_grid(name: str, shape: tuple[int, ...], block_size: int, layout: WeightLayout) -> tuple[int, int]:
    """``(blocks, channels)`` of a per-block or LPBQ encoding (see :func:`blocked_shape`)."""
    grid = blocked_shape(name, shape, block_size, layout)
    return grid[layout.block_axis], grid[layout.channel_axis]


def validate_against_model(enc: Encodings, path: str | os.PathLike[str], activation_names: AbstractSet[str],
                           param_shapes: dict[str, tuple[int, ...]],
                           param_layouts: Mapping[str, WeightLayout] | None = None) -> None:
    """Check that ``enc`` (read from ``path``) fits the model: every tensor it names exists, and every
    per-channel or per-block encoding of an initializer has as many scales as its shape has along the
    axes its consumer gives (``param_layouts``, :attr:`GraphTensors.param_layouts`; 1-D tensors need none).

    Args:
        activation_names: every tensor name of the model (:attr:`GraphTensors.tensor_names`).
        param_shapes: the model's initializers and their shapes.

    Raises:
        GenieBuildError: naming ``path``, a few unknown tensors and how many there are; or the first
            initializer whose encoding does not fit (tensor, shape, axis and count).
    """
    unknown = [f"activation {name!r}" for name in sorted(set(enc.activations) - activation_names)]
    unknown += [f"param {name!r}" for name in sorted(set(enc.params) - param_shapes.keys())]
    if unknown:
        shown = ", ".join(unknown[:_UNKNOWN_SHOWN]) + (", ..." if len(unknown) > _UNKNOWN_SHOWN else "")
        raise GenieBuildError(path, f"{len(unknown)} encodings name tensors the model does not have: {shown}")
    layouts = param_layouts or {}
    for name in sorted(param_shapes.keys() & (set(enc.params) | set(enc.activations))):
        encoding = enc.of_initializer(name)
        section = "param" if name in enc.params else "activation"
        try:
            check_scale_count(encoding, param_shapes[name], layout_of(encoding, param_shapes[name],
                                                                      layouts.get(name)))
        except GenieBuildError as exc:
            raise GenieBuildError(path, f"{section} encoding {name!r}: {exc.problem}") from None


def check_scale_count(encoding: TensorEncoding, shape: tuple[int, ...], layout: WeightLayout | None) -> None:
    """Require ``encoding``'s scale counts to fit ``shape`` along ``layout`` (from :func:`layout_of`).

    Raises:
        GenieBuildError: (``where`` = the tensor) naming the shape, the axis and the counts.
    """
    if layout is None:
        if encoding.dtype == "int" and len(encoding.scale) != 1:
            raise GenieBuildError(encoding.name, f"{len(encoding.scale)} scales for a per-tensor encoding")
        return
    channels = shape[layout.channel_axis]
    if encoding.kind == "per_channel":
        counts = [("scale", len(encoding.scale), channels)]
    else:
        blocks, _ = block_grid(encoding.name, shape, encoding.block_size, layout)
        counts = [("scale", len(encoding.scale), blocks * channels)]
        if encoding.kind == "lpbq":  # per-channel float scales times per-block integer scales
            counts = [("scale", len(encoding.scale), channels),
                      ("per_block_int_scale", len(encoding.per_block_int_scale), blocks * channels)]
    for what, found, expected in counts:
        if found != expected:
            block = (f", blocks of {encoding.block_size} along axis {layout.block_axis}"
                     if encoding.block_size else "")
            raise GenieBuildError(encoding.name, f"{found} {what} values do not fit shape {list(shape)}: "
                                                 f"{expected} expected for channel axis {layout.channel_axis}"
                                                 f"{block}")
