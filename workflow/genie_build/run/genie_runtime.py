"""What Genie's runtime does with a bundle that the host run copies (docs/host-run.md), from Genie 2.51's dialog and
KV manager (``Dialog::query``, ``KVManager::prepareInferenceStrategy``) and measured with the wheel's ``libGenie.so``:

- a dialog's first query starts with ``context.bos-token`` (:func:`first_query_ids`);
- each query, and each generated token, runs on the graphs (AR, CL) Genie's KV manager picks (:func:`genie_steps`);
- an empty slot of a quantized KV cache holds the middle code whatever the encoding's offset (:func:`empty_kv`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper
from tokenizers import Tokenizer

from genie_build.conventions import KV_TENSOR
from genie_build.errors import GenieBuildError
from genie_build.toolchains.graph_edits import IO_ENCODINGS_KEY
from genie_build.toolchains.reference.onnx_io import metadata_json

__all__ = ["Step", "empty_kv", "first_query_ids", "genie_steps"]


def first_query_ids(tokenizer: Tokenizer, prompt: str, bos: int) -> list[int]:
    """The tokens Genie feeds for ``prompt`` as a dialog's first query: ``bos`` (when >= 0), then the prompt's
    tokens, the tokenizer's own special tokens left out (Genie adds the BOS itself)."""
    return [bos] * (bos >= 0) + tokenizer.encode(prompt, add_special_tokens=False).ids


@dataclass(frozen=True)
class Step:
    """``count`` tokens run through every part's graph (``ar``, ``cl``): one inference of Genie's strategy."""

    ar: int
    cl: int
    count: int


def genie_steps(offered: Collection[tuple[int, int]], valid: int, count: int) -> list[Step]:
    """The inferences Genie runs to take ``count`` new tokens after ``valid`` cached ones (one query, or one
    generated token).

    It starts at the smallest CL that holds the cache, with the narrowest AR that takes every token at once (or the
    widest there is), moving to a larger CL while the step would not fit (``valid + AR > CL``). Before each chunk it
    moves up one length when the cache after it might not fit the next step (``valid + AR > CL - AR``: for tokens,
    one slot is kept free). A later query or token starts again at the smallest CL that holds the cache, so Genie
    can move back down.

    Raises:
        GenieBuildError: the tokens exceed the largest CL, or the cache does not fit a chunk's past slots.
    """
    lengths = sorted({cl for _, cl in offered})
    ars = {cl: sorted(ar for ar, length in offered if length == cl) for cl in lengths}
    if valid + count > lengths[-1]:
        raise GenieBuildError("prompt", f"{count} tokens after {valid} exceed the largest context length {lengths[-1]}")
    cl = next(length for length in lengths if length >= valid)
    ar = _pick(count, ars[cl])
    while valid + ar > cl and cl != lengths[-1]:
        cl = lengths[lengths.index(cl) + 1]
        ar = _pick(count, ars[cl])
    steps, remaining = [], count
    while remaining:
        if valid + ar > cl - ar and cl != lengths[-1]:
            cl = lengths[lengths.index(cl) + 1]
            ar = _pick(remaining, ars[cl])
        if valid > cl - ar:
            raise GenieBuildError("prompt", f"the cache's {valid} entries do not fit the {cl - ar} past slots of "
                                            f"graph AR {ar} CL {cl}")
        steps.append(Step(ar, cl, min(remaining, ar)))
        valid, remaining = valid + steps[-1].count, remaining - steps[-1].count
    return steps


def _pick(count: int, ars: Sequence[int]) -> int:
    """Genie's choice of AR for ``count`` tokens: the narrowest that takes them at once, else the widest."""
    return min((ar for ar in ars if ar >= count), default=max(ars))


def empty_kv(model: onnx.ModelProto) -> dict[str, float]:
    """Per quantized KV input (``past_*_in``) of a graph, the value an empty cache slot reads as in Genie, which
    clears a quantized cache with the middle code (32768 at 16 bits) whatever the offset: ``(code + offset) * scale``
    of the input's encoding, as the converted graph records it (genie-build's converters) or as the
    ``QuantizeLinear`` that takes the input says it (a graph without that record). A float cache is cleared with 0,
    and is left out."""
    recorded = metadata_json(model, IO_ENCODINGS_KEY, None)
    if recorded is not None:
        return {name: (2 ** (encoding["bitwidth"] - 1) + encoding["offset"]) * encoding["scale"]
                for name, encoding in recorded.items() if _kv_input(name) and encoding.get("dtype") == "int"}
    constants = {tensor.name: tensor for tensor in model.graph.initializer
                 if tensor.data_location != onnx.TensorProto.EXTERNAL}
    empty = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and _kv_input(node.input[0]) and len(node.input) == 3 \
                and {node.input[1], node.input[2]} <= set(constants):
            scale, zero_point = (numpy_helper.to_array(constants[name]) for name in node.input[1:])
            if scale.size == 1 and zero_point.size == 1:  # per tensor, as every KV encoding is
                code = 2 ** (8 * zero_point.dtype.itemsize - 1)
                empty[node.input[0]] = float((code - np.int64(zero_point.item())) * np.float32(scale.item()))
    return empty


def _kv_input(name: str) -> bool:
    return name.endswith("_in") and KV_TENSOR.match(name) is not None
