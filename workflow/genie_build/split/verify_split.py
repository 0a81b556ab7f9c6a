"""Chain == full: run the full graph and its parts chained in onnxruntime and require bit-exact outputs.

The split only moves nodes and bytes, so every output (logits and each KV output) must be identical in
dtype, shape and every bit. Both runs use the CPU provider with the same session options
(:func:`genie_build.ort_session.cpu_session_options`: no graph optimization, so the full graph and the parts run
the same unfused kernels on the same values); the feed is any fixed input (:func:`build_feed` makes a
deterministic one from the graph's input specs).
"""

from __future__ import annotations

import logging
import math
import os
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from genie_build.conventions import INPUT_IDS, find_parts
from genie_build.errors import GenieBuildError
from genie_build.fileio import write_json
from genie_build.onnx_graph import check_external_data, embedding_gather, graph_io, load_graph
from genie_build.ort_session import cpu_session_options

__all__ = ["OutputCheck", "VerifyReport", "build_feed", "compare_arrays", "compare_chain", "find_token_input",
           "run_graph", "verify_chain", "verify_split"]

logger = logging.getLogger(__name__)

CPU = ["CPUExecutionProvider"]
FLOAT_RANGE = (-1.0, 1.0)


@dataclass(frozen=True)
class OutputCheck:
    """One full-graph output against the same output of the chained parts."""

    name: str
    part: str                 # the part file that gives it
    dtype: str
    shape: tuple[int, ...]
    max_abs_diff: float       # inf when the shapes differ
    bit_exact: bool


@dataclass(frozen=True)
class VerifyReport:
    graph: str                # the full model's file
    parts: tuple[str, ...]    # the part files, in chain order
    outputs: tuple[OutputCheck, ...]

    @property
    def bit_exact(self) -> bool:
        return all(check.bit_exact for check in self.outputs)

    def to_dict(self) -> dict:
        return {"graph": self.graph, "parts": list(self.parts), "bit_exact": self.bit_exact,
                "outputs": [asdict(check) | {"shape": list(check.shape)} for check in self.outputs]}


def verify_chain(full_model_path: str | os.PathLike[str], part_paths: Sequence[str | os.PathLike[str]],
                 feed: Mapping[str, np.ndarray]) -> VerifyReport:
    """Compare the full graph with its chained parts and require every output to be bit-exact.

    Raises:
        GenieBuildError: an output differs (naming the graph and the first differing output), or the
            parts do not chain (an input nobody gives, an output no part gives).
    """
    report = compare_chain(full_model_path, part_paths, feed)
    for check in report.outputs:
        if not check.bit_exact:
            raise GenieBuildError(full_model_path, f"chained parts differ from the full graph at output "
                                                   f"{check.name!r} (from {check.part}): max abs diff "
                                                   f"{check.max_abs_diff:g}, dtype {check.dtype}")
    return report


def compare_chain(full_model_path: str | os.PathLike[str], part_paths: Sequence[str | os.PathLike[str]],
                  feed: Mapping[str, np.ndarray]) -> VerifyReport:
    """Run the full graph and the chained parts on ``feed`` and compare every full-graph output.

    Returns:
        A report with one :class:`OutputCheck` per full-graph output, in the full graph's order.

    Raises:
        GenieBuildError: the parts do not chain, or a full-graph output is given by no part.
    """
    full_path = Path(full_model_path)
    expected = run_graph(full_path, feed)
    chained, given_by = _run_chain([Path(p) for p in part_paths], feed)
    checks = []
    for name in expected:
        if name not in chained:
            raise GenieBuildError(full_path, f"output {name!r} is not given by any part")
        checks.append(compare_arrays(name, given_by[name], expected[name], chained[name]))
    return VerifyReport(str(full_path), tuple(str(p) for p in part_paths), tuple(checks))


def _run_chain(part_paths: Sequence[Path], feed: Mapping[str, np.ndarray]
               ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Run the parts in order; each takes its inputs from ``feed`` or from an earlier part's outputs.

    Returns:
        Every tensor the parts gave, and the part (folder and file name) that gave each.

    Raises:
        GenieBuildError: a part needs an input nobody gives, or two parts give the same output.
    """
    values: dict[str, np.ndarray] = dict(feed)
    given_by: dict[str, str] = {}
    for path in part_paths:
        for name, value in run_graph(path, values).items():
            if name in given_by:
                raise GenieBuildError(path, f"output {name!r} is already given by {given_by[name]}")
            values[name] = value
            given_by[name] = f"{path.parent.name}/{path.name}"   # part_03_of_06/prompt.onnx
    return {name: values[name] for name in given_by}, given_by


def compare_arrays(name: str, part: str, expected: np.ndarray, actual: np.ndarray) -> OutputCheck:
    """Bit-exact when dtype, shape and every byte agree (so NaN payloads and signed zeros count too)."""
    same_shape = expected.shape == actual.shape
    bit_exact = same_shape and expected.dtype == actual.dtype and expected.tobytes() == actual.tobytes()
    if not same_shape:
        diff = math.inf
    elif expected.size == 0:
        diff = 0.0
    else:
        diff = float(np.max(np.abs(expected.astype(np.float64) - actual.astype(np.float64))))
    return OutputCheck(name, part, str(actual.dtype), tuple(actual.shape), diff, bit_exact)


def run_graph(path: Path, values: Mapping[str, np.ndarray], options: ort.SessionOptions | None = None
              ) -> dict[str, np.ndarray]:
    """Run one graph in onnxruntime (CPU, ``options`` or :func:`cpu_session_options`), taking its inputs by name from
    ``values``.

    The session is dropped on return, so only one graph's weights are in memory at a time.

    Returns:
        Every graph output by name, in graph order.

    Raises:
        GenieBuildError: an input is missing from ``values``, or onnxruntime cannot load or run the graph.
    """
    try:
        session = ort.InferenceSession(os.fspath(path), options or cpu_session_options(), providers=CPU)
    except Exception as exc:  # onnxruntime's error types derive from Exception only and are not exported
        raise GenieBuildError(path, f"onnxruntime cannot load it: {exc}") from None
    wanted = [arg.name for arg in session.get_inputs()]
    missing = [name for name in wanted if name not in values]
    if missing:
        raise GenieBuildError(path, f"input(s) {missing} are neither in the feed nor given by an earlier part")
    names = [output.name for output in session.get_outputs()]
    try:
        outputs = session.run(names, {name: values[name] for name in wanted})
    except Exception as exc:  # as above
        raise GenieBuildError(path, f"onnxruntime cannot run it: {exc}") from None
    return dict(zip(names, outputs))


def verify_split(model_path: str | os.PathLike[str], parts_dir: str | os.PathLike[str], graph: str,
                 out: str | os.PathLike[str], *, vocab: int | None = None, seed: int = 0) -> VerifyReport:
    """The verify stage: chain every part of ``graph`` in ``parts_dir`` (``part_*/{graph}.onnx``) on a generated
    feed, compare with the full graph bit for bit (:func:`verify_chain`) and write the report to ``out``.

    Raises:
        GenieBuildError: an incomplete set of parts, a graph onnxruntime cannot run, or any output that differs.
    """
    parts = list(find_parts(Path(parts_dir), graph).values())
    # onnxruntime reads the full graph's weights itself: check them our way first (inside its folder, ranges sane)
    check_external_data(load_graph(model_path), model_path)
    report = verify_chain(model_path, parts, build_feed(model_path, vocab=vocab, seed=seed))
    write_json(out, report.to_dict())
    logger.info("%s: %d outputs bit-exact over %d parts", model_path, len(report.outputs), len(parts))
    return report


def build_feed(model_path: str | os.PathLike[str], *, vocab: int | None = None, seed: int = 0
               ) -> dict[str, np.ndarray]:
    """A deterministic input for every graph input, from the graph's input specs (weights not loaded).

    Token ids (the integer input that feeds the embedding Gather, else ``input_ids``) are drawn from
    ``[0, vocab)``, with ``vocab`` from the embedding table's first dimension unless given. Other integer
    and bool inputs are ones (valid as positions, indices and 2-D masks); float inputs are uniform in
    :data:`FLOAT_RANGE`. Each input has its own generator, seeded by ``seed`` and its name.

    Raises:
        GenieBuildError: an input has a dynamic dimension, or the vocabulary size cannot be found.
    """
    path = Path(model_path)
    model = load_graph(path)
    token_input, table_rows = find_token_input(model)
    feed = {}
    for spec in graph_io(model).inputs:
        if not all(isinstance(dim, int) for dim in spec.shape):
            raise GenieBuildError(path, f"input {spec.name!r} has a dynamic shape {list(spec.shape)}; "
                                        "pass a feed instead")
        dtype = np.dtype(spec.dtype)
        rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
        if spec.name == token_input:
            rows = vocab or table_rows
            if not rows:
                raise GenieBuildError(path, f"cannot find the vocabulary size for {spec.name!r}; pass it")
            feed[spec.name] = rng.integers(0, rows, size=spec.shape).astype(dtype)
        elif np.issubdtype(dtype, np.floating):
            feed[spec.name] = rng.uniform(*FLOAT_RANGE, size=spec.shape).astype(dtype)
        else:
            feed[spec.name] = np.ones(spec.shape, dtype=dtype)
    return feed


def find_token_input(model: onnx.ModelProto) -> tuple[str, int | None]:
    """The graph input holding token ids and the row count of the table it indexes
    (:func:`genie_build.onnx_graph.embedding_gather`); without an embedding lookup, ``input_ids`` and no row count.
    """
    found = embedding_gather(model)
    return (INPUT_IDS, None) if found is None else (found.token_input, found.rows)
