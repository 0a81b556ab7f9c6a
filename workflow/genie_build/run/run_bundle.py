"""Run a reference bundle on the host the way Genie runs a bundle on the phone (docs/host-run.md).

The prompt is Genie's first query: ``bos-token`` first, then the prompt's tokens. It is processed in chunks, each
through every part in order; then one token at a time, greedily. Each chunk or token runs on the graph (AR, CL)
Genie's KV manager picks (:mod:`genie_build.run.genie_runtime`): the smallest CL that holds the cache, moving up a
length one step before the cache would fill it, and back down when a smaller one holds it again. The host keeps the
KV cache (docs/conventions.md): per layer, keys ``[1, n_kv, D, len]`` (transposed) and values ``[1, n_kv, len, D]``,
valid entries first, in one buffer of the largest CL whose empty slots hold what Genie's cleared cache reads as. A
graph with AR ``a`` and context ``CL`` sees the first ``CL - a`` cache columns and an additive mask hiding the empty
ones (``MASK_MIN``); it returns only the ``a`` new entries, of which the host appends the real ones (not the
padding).

The graphs come from :func:`genie_build.toolchains.reference.container.read_graphs` (the host run is a
reference-toolchain feature, so it reads the reference container directly); RoPE tables and the mask from
:mod:`genie_build.conventions`, computed from ``genie_config.json``'s RoPE (dim, theta, and a llama3
``rope-scaling``) as Genie computes them.

Memory: a part's graphs share their weights as the ctx-bin stores them (each decoded once, to integer codes, not
float), fed to onnxruntime as inputs so that no session copies or folds them, and the parts are loaded one at a
time. So the host run holds about one copy of the model's stored weights, plus one weight dequantized at a time.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from tokenizers import Tokenizer

from genie_build.bundle.check_bundle import MAX_DOCUMENT_BYTES, require_valid_bundle
from genie_build.bundle.embedding_part import (EmbeddingLookup, PartLookup, PartRows, embedding_lookup,
                                               graph_after_embedding, read_embedding_part)
from genie_build.conventions import (INPUT_IDS, INPUTS_EMBEDS, KV_PREFIX, LOGITS, MASK, PART_SUFFIX, POS_COS,
                                     POS_SIN, causal_mask, graph_ar_cl, rope_tables)
from genie_build.errors import GenieBuildError
from genie_build.families import FAMILIES
from genie_build.fileio import read_json
from genie_build.genie_config import GENIE_CONFIG_NAME, GENIE_ROPE_SCALING_KEYS, GENIE_ROPE_TYPES, load_tokenizer
from genie_build.onnx_graph import check_external_data, graph_io, load_graph
from genie_build.ort_session import cpu_session_options
from genie_build.run.genie_runtime import empty_kv, first_query_ids, genie_steps
from genie_build.run.near_ties import NEAR_TIE_SHARE, FollowBundle, NearTie
from genie_build.toolchains.base import GraphInfo, TensorInfo
from genie_build.toolchains.reference.container import ContainerGraph, read_graphs
from genie_build.toolchains.reference.onnx_io import read_initializer

__all__ = ["Generation", "GraphFile", "GraphRun", "GraphSession", "HOST_ROPE_TYPES", "HostRun", "KVCache",
           "LoadedBundle", "PARTS_REFERENCE", "Runner", "TABLE_REFERENCE", "generate", "reference_tokens",
           "graph_ar_cl_of", "host_rope", "host_run", "load_bundle", "make_runner", "read_graph_file", "run_bundle",
           "unsplit_tokens"]

KV_KEY_PREFIX, KV_VALUE_PREFIX = f"{KV_PREFIX}key_", f"{KV_PREFIX}value_"


@dataclass(frozen=True)
class GraphFile:
    """A graph ONNX Runtime runs from its file, weights and all: a qnn-htp twin's EPContext model in the HTP
    simulation (``htp``: the chipset's target), or a QDQ graph on the CPU (``htp`` None). ``model``: the graph
    without its external data, for its IO."""

    model: onnx.ModelProto
    path: Path
    htp: Any = None   # genie_build.toolchains.qnn_htp.backend.HtpTarget


@dataclass(frozen=True)
class GraphSession:
    """One graph ready to run: its session and the weights it is fed as inputs (the same arrays as the other
    graphs of its part where the ctx-bin shares them)."""

    session: ort.InferenceSession
    weights: Mapping[str, np.ndarray]
    empty: Mapping[str, float] = dataclasses.field(default_factory=dict)  # KV input -> what Genie's empty slot reads

    def inputs(self) -> list[ort.NodeArg]:
        """The graph's inputs other than its weights."""
        return [node for node in self.session.get_inputs() if node.name not in self.weights]

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every output by name, for ``feed`` (the inputs of :meth:`inputs`)."""
        names = [node.name for node in self.session.get_outputs()]
        return dict(zip(names, self.session.run(names, {**feed, **self.weights})))


# Genie rope-types the host run computes tables for (conventions.rope_tables): those the registered families carry.
HOST_ROPE_TYPES = ("default", *sorted({GENIE_ROPE_TYPES[kind] for family in FAMILIES.values()
                                       for kind in family.rope_kinds if kind != "default"}))


@dataclass(frozen=True)
class Runner:
    """The parts of a model, each a runnable session per graph (AR, CL), and the RoPE geometry to feed them.

    ``graphs[i][ar, cl]`` runs part ``i`` (0-based) for ``ar`` new tokens at context length ``cl``; every part
    offers the same (AR, CL).
    """

    graphs: tuple[Mapping[tuple[int, int], GraphSession], ...]
    head_dim: int
    rope_theta: float
    rope_scaling: Mapping[str, Any] | None = None  # HF llama3 parameters when Genie's config scales RoPE
    embedding: EmbeddingLookup | PartLookup | None = None  # the bundle's CPU table (or what it must hold)

    @property
    def offered(self) -> frozenset[tuple[int, int]]:
        """The (AR, CL) of every part's graphs."""
        return frozenset(self.graphs[0])

    @property
    def context_length(self) -> int:
        """The largest compiled CL: how many tokens the run may hold."""
        return max(cl for _, cl in self.offered)

    @property
    def parts(self) -> tuple[Mapping[int, GraphSession], ...]:
        """Each part's graphs at the largest CL, by AR (all the graphs of a bundle of one context length)."""
        top = self.context_length
        return tuple({ar: graph for (ar, cl), graph in part.items() if cl == top} for part in self.graphs)


@dataclass(frozen=True)
class GraphRun:
    """Consecutive steps of a generation on one graph (AR, CL) of every part."""

    ar: int
    cl: int
    steps: int


@dataclass(frozen=True)
class LoadedBundle:
    """A bundle ready to run: its graphs, tokenizer, stop tokens, ``context.size`` and ``bos-token``."""

    runner: Runner
    tokenizer: Tokenizer
    eos_ids: frozenset[int]
    context_size: int
    bos_id: int = -1  # Genie prepends it to a first query when it is >= 0

    def query_ids(self, prompt: str) -> list[int]:
        """The tokens Genie feeds for ``prompt`` as the dialog's first query (:func:`first_query_ids`)."""
        return first_query_ids(self.tokenizer, prompt, self.bos_id)


@dataclass(frozen=True)
class Generation:
    """Result of :func:`run_bundle`: the new tokens and their text, with timings."""

    prompt_ids: tuple[int, ...]
    new_ids: tuple[int, ...]
    text: str
    prompt_seconds: float
    decode_seconds: float
    graph_runs: tuple[GraphRun, ...] = ()  # in order: a new run at each switch of graph

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: tokens after the first (which the prompt pass yields) per second of token graphs."""
        return (len(self.new_ids) - 1) / self.decode_seconds if self.decode_seconds > 0 else float("nan")


def make_runner(parts: Iterable[Mapping[str, ContainerGraph | GraphFile]], *, head_dim: int, rope_theta: float,
                rope_scaling: Mapping[str, Any] | None = None,
                embedding: EmbeddingLookup | PartLookup | None = None) -> Runner:
    """Sessions for each part's graphs (as :func:`read_graphs` gives them), keyed by the (AR, CL) each graph takes.

    The graphs' models are consumed (their initializers become inputs fed from the graphs' weight arrays), so
    graphs of a part that share a weight in the ctx-bin are fed one array. ``parts`` may be a generator, so
    that a part is read only after the previous one's models are consumed.

    Raises:
        GenieBuildError: a graph whose AR or CL cannot be told (from its tensors or name), a part with two
            graphs for one (AR, CL), or parts that do not all offer the same (AR, CL).
    """
    sessions = []
    for index, graphs in enumerate(parts, start=1):
        by_graph: dict[tuple[int, int], GraphSession] = {}
        for name, graph in graphs.items():
            ar, cl = graph_ar_cl_of(name, graph.model)
            if ar is None or cl is None:
                raise GenieBuildError(name, f"part {index}: cannot tell the graph's AR and CL (got {ar}, {cl})")
            if (ar, cl) in by_graph:
                raise GenieBuildError(name, f"part {index} has two graphs with AR {ar} and CL {cl}")
            by_graph[ar, cl] = _graph_session(graph)
        sessions.append(by_graph)
    if not sessions:
        raise GenieBuildError("bundle", "has no parts")
    odd = next((index for index, by_graph in enumerate(sessions, start=1) if set(by_graph) != set(sessions[0])), None)
    if odd is not None:
        raise GenieBuildError("bundle", f"parts offer different graphs (AR, CL): part 1 {sorted(sessions[0])}, "
                                        f"part {odd} {sorted(sessions[odd - 1])}")
    return Runner(graphs=tuple(sessions), head_dim=head_dim, rope_theta=rope_theta, rope_scaling=rope_scaling,
                  embedding=embedding)


def load_bundle(bundle_dir: str | os.PathLike[str], twins: Sequence[str | os.PathLike[str]] = ()) -> LoadedBundle:
    """Check the bundle (as Genie would at load time), then load its ctx-bins as runnable graphs: reference
    containers as they are, QNN binaries through their twins (``twins``: one folder per ctx-bin, in order,
    :mod:`genie_build.toolchains.qnn_htp.twin`), which must hold the same graphs with the same IO.

    Raises:
        GenieBuildError: the bundle fails a check, its binaries are QNN's and no twin (or a twin that differs) is
            given, or it uses a RoPE variant the host run does not implement (scaled RoPE other than llama3).
    """
    bundle = Path(bundle_dir)
    require_valid_bundle(bundle)
    # checked above; read as the checker reads them all the same: regular files inside the bundle, bounded
    dialog = read_json(bundle / GENIE_CONFIG_NAME, inside=[bundle], max_bytes=MAX_DOCUMENT_BYTES)["dialog"]
    engine = dialog["engine"]
    rope = host_rope(engine, bundle / GENIE_CONFIG_NAME)
    binaries = [bundle / name for name in engine["model"]["binary"]["ctx-bins"]]
    if twins:
        parts = _twin_parts(bundle, binaries, twins)
    else:
        parts = (read_graphs(binary, inside=[bundle]) for binary in binaries)
    return LoadedBundle(runner=make_runner(parts, **rope, embedding=embedding_lookup(bundle, dialog)),
                        tokenizer=load_tokenizer(bundle / dialog["tokenizer"]["path"], inside=[bundle]),
                        eos_ids=_eos_ids(dialog), context_size=dialog["context"]["size"],
                        bos_id=dialog["context"]["bos-token"])


def _twin_parts(bundle: Path, binaries: Sequence[Path], twins: Sequence[str | os.PathLike[str]]
                ) -> list[dict[str, GraphFile]]:
    """Each ctx-bin's graphs from its twin, run in the HTP simulation for the bundle's device.

    Raises:
        GenieBuildError: not one twin per ctx-bin, or a twin whose graphs or IO differ from its ctx-bin's.
    """
    from genie_build.toolchains.qnn_htp.twin import require_same_io, twin_models, twin_target

    if len(twins) != len(binaries):
        raise GenieBuildError("--twin", f"{len(twins)} twins for the bundle's {len(binaries)} ctx-bins")
    parts = []
    for binary, twin in zip(binaries, twins):
        models, target = twin_models(twin, require_same_io(binary, twin)), twin_target(twin)
        parts.append({name: GraphFile(load_graph(path), path, target) for name, path in models.items()})
    return parts


def generate(runner: Runner, prompt_ids: Sequence[int], max_new_tokens: int, *,
             eos_ids: frozenset[int] = frozenset(), context_size: int | None = None) -> list[int]:
    """Greedy decoding: the prompt in chunks, then one token at a time, each on the graph Genie picks
    (:func:`genie_build.run.genie_runtime.genie_steps`).

    Args:
        runner: the model's parts.
        prompt_ids: the prompt's token ids (at least one).
        max_new_tokens: how many tokens to generate at most.
        eos_ids: generation stops after one of these.
        context_size: tokens the run may hold (default: the largest compiled context length).

    Returns:
        The new token ids (an end-of-sequence token included when one stopped the run).

    Raises:
        GenieBuildError: an empty prompt, or prompt + new tokens beyond the context size.
    """
    return list(_generate_timed(runner, prompt_ids, max_new_tokens, eos_ids, context_size)[0])


def run_bundle(bundle_dir: str | os.PathLike[str], prompt: str, max_new_tokens: int,
               twins: Sequence[str | os.PathLike[str]] = ()) -> Generation:
    """Tokenize ``prompt`` as Genie does for a first query (:meth:`LoadedBundle.query_ids`), generate greedily from
    the bundle (its QNN binaries through ``twins``) and decode the new tokens."""
    loaded = load_bundle(bundle_dir, twins)
    prompt_ids = loaded.query_ids(prompt)
    new_ids, prompt_seconds, decode_seconds, runs = _generate_timed(loaded.runner, prompt_ids, max_new_tokens,
                                                                    loaded.eos_ids, loaded.context_size)
    return Generation(prompt_ids=tuple(prompt_ids), new_ids=tuple(new_ids),
                      text=loaded.tokenizer.decode(list(new_ids)), prompt_seconds=prompt_seconds,
                      decode_seconds=decode_seconds, graph_runs=runs)


@dataclass(frozen=True)
class HostRun:
    """The host-run stage's result: the bundle's generation and, when compared, the reference's tokens and what
    the reference was."""

    prompt: str
    generation: Generation
    reference_ids: tuple[int, ...] | None = None  # None: not compared
    compared_with: str | None = None
    near_ties: tuple[NearTie, ...] = ()

    def to_dict(self) -> dict:
        """The report (``host_run.json``)."""
        generation = self.generation
        report = {"prompt": self.prompt, "prompt_ids": list(generation.prompt_ids),
                  "new_ids": list(generation.new_ids), "text": generation.text,
                  "tokens_per_second": round(generation.tokens_per_second, 1),
                  "graph_runs": [dataclasses.asdict(run) for run in generation.graph_runs]}
        if self.reference_ids is None:
            return report
        return {**report, "compared_with": self.compared_with, "reference_ids": list(self.reference_ids),
                "near_ties": [dataclasses.asdict(tie) for tie in self.near_ties]}


UNSPLIT_REFERENCE = "the unsplit model, converted with the whole encodings and compiled with the bundle's options"
PARTS_REFERENCE = ("the parts' converted graphs chained on the host, without the bundle's context binaries (a model "
                   "calibrated part by part has no whole encodings to convert an unsplit graph with)")
TABLE_REFERENCE = (", from part 1's output on, fed part 1's rows computed for each token and quantized as the table "
                   "stores them")


def host_run(bundle_dir: str | os.PathLike[str], prompt: str, max_new_tokens: int, *,
             compare_with: str | os.PathLike[str] | None = None,
             compare_with_parts: Sequence[str | os.PathLike[str]] = (),
             twins: Sequence[str | os.PathLike[str]] = (),
             embedding_part: tuple[str | os.PathLike[str], str | os.PathLike[str]] | None = None) -> HostRun:
    """Generate from the bundle (:func:`run_bundle`) and check that its greedy tokens are those of a reference run
    on the same prompt: the unsplit model's container (``compare_with``, :func:`unsplit_tokens`) or the parts'
    converted graphs (``compare_with_parts``, :func:`_converted_parts_tokens`). For a bundle whose embedding is a
    table, ``embedding_part`` (part 1's float graph and its encodings) gives the reference its embedding: part 1's
    rows computed for each token and quantized as the table stores them, never read from the bundle's table.

    The reference follows the bundle's tokens (:class:`genie_build.run.near_ties.FollowBundle`): with ``twins`` (a QNN
    bundle, run by the HTP simulation while the reference runs on the CPU) a step where the reference's logits nearly
    tie the bundle's token with its own is accepted and reported; a reference bundle must match exactly.

    Raises:
        GenieBuildError: the bundle is invalid, or its tokens differ from the reference's.
    """
    generation = run_bundle(bundle_dir, prompt, max_new_tokens, twins)
    embedding = None if embedding_part is None else PartLookup(PartRows(read_embedding_part(*embedding_part)))
    follow = FollowBundle(generation.new_ids, tolerance=NEAR_TIE_SHARE if twins else 0.0)
    if compare_with is not None:
        unsplit_tokens(bundle_dir, compare_with, generation.prompt_ids, max_new_tokens, embedding, follow)
        reference = UNSPLIT_REFERENCE
    elif compare_with_parts:
        _converted_parts_tokens(bundle_dir, compare_with_parts, generation.prompt_ids, max_new_tokens, embedding,
                                follow)
        reference = PARTS_REFERENCE
    else:
        return HostRun(prompt, generation)
    if embedding is not None:
        reference += TABLE_REFERENCE
    if not follow.agrees:
        raise GenieBuildError(bundle_dir, f"the bundle's tokens {list(generation.new_ids)} differ from those of "
                                          f"{reference}, run on the bundle's tokens: {follow.reference_ids}")
    return HostRun(prompt, generation, tuple(follow.reference_ids), reference, tuple(follow.near_ties))


def unsplit_tokens(bundle_dir: str | os.PathLike[str], unsplit_binary: str | os.PathLike[str],
                   prompt_ids: Sequence[int], max_new_tokens: int, embedding: PartLookup | None = None,
                   follow: FollowBundle | None = None) -> list[int]:
    """Greedy tokens (``follow``'s choices when given) of the whole model compiled as one container (converted
    with the whole encodings, compiled with the bundle variant's options): what the bundle's parts must reproduce.
    With ``embedding`` (a bundle whose part 1 is a table), the model from part 1's output on, fed that embedding.

    RoPE, stop tokens and context size come from the bundle's ``genie_config.json``; its ctx-bins are not
    loaded (run :func:`load_bundle` first to check the bundle)."""
    graphs = read_graphs(unsplit_binary)
    if embedding is not None:
        graphs = {name: graph_after_embedding(graph, embedding.rows.part.output, unsplit_binary)
                  for name, graph in graphs.items()}
    return reference_tokens(bundle_dir, [graphs], prompt_ids, max_new_tokens, embedding, follow)


def _converted_parts_tokens(bundle_dir: str | os.PathLike[str], graphs: Sequence[str | os.PathLike[str]],
                            prompt_ids: Sequence[int], max_new_tokens: int,
                            embedding: PartLookup | None = None, follow: FollowBundle | None = None) -> list[int]:
    """Greedy tokens (``follow``'s choices when given) of the parts' converted graphs (``graphs``: the reference
    converter's ONNX files, every graph of every part, grouped by the part their graph name gives), run as they
    are, without a context binary; fed ``embedding`` when they start at ``inputs_embeds``.

    Raises:
        GenieBuildError: a graph cannot be read or its name gives no part.
    """
    parts: dict[str, dict[str, ContainerGraph | GraphFile]] = {}
    for path in graphs:
        graph = _converted_graph(path)
        name = graph.model.graph.name
        match = PART_SUFFIX.search(name)
        if match is None:
            raise GenieBuildError(path, f"graph name {name!r} does not say which part it is")
        parts.setdefault(match.group(0), {})[name] = graph
    return reference_tokens(bundle_dir, [parts[label] for label in sorted(parts)], prompt_ids, max_new_tokens,
                            embedding, follow)


def _converted_graph(path: str | os.PathLike[str]) -> ContainerGraph | GraphFile:
    """A converted graph as the host runs it: the reference converter's as :func:`read_graph_file` reads it, a
    qnn-htp QDQ graph from its file on the CPU (ORT quantizes its activations as the encodings say)."""
    from genie_build.toolchains.qnn_htp.qdq import is_qdq_graph

    model = load_graph(path)
    if is_qdq_graph(model):
        check_external_data(model, path)
        return GraphFile(model, Path(path))
    return read_graph_file(path)


def read_graph_file(path: str | os.PathLike[str]) -> ContainerGraph:
    """An ONNX graph file (its external data checked) as :func:`read_graphs` gives a graph: its initializers' values
    (read inside its folder, as a Snakemake cache's symlinked outputs are too) apart from the model."""
    model = load_graph(path)
    check_external_data(model, path)
    weights = {tensor.name: read_initializer(tensor, path) for tensor in model.graph.initializer}
    for tensor in model.graph.initializer:
        for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data",
                      "string_data", "external_data"):
            tensor.ClearField(field)
        tensor.data_location = onnx.TensorProto.DEFAULT
    return ContainerGraph(model=model, weights=weights)


def reference_tokens(bundle_dir: str | os.PathLike[str], parts: Sequence[Mapping[str, ContainerGraph]],
                     prompt_ids: Sequence[int], max_new_tokens: int, embedding: PartLookup | None = None,
                     follow: FollowBundle | None = None) -> list[int]:
    """Greedy tokens (``follow``'s choices when given) of ``parts`` run with the bundle's RoPE, stop tokens and
    context size, fed ``embedding`` when they start at ``inputs_embeds`` (without it, that input is one nobody
    provides)."""
    config_path = Path(bundle_dir) / GENIE_CONFIG_NAME
    dialog = read_json(config_path, inside=[bundle_dir], max_bytes=MAX_DOCUMENT_BYTES)["dialog"]
    runner = make_runner(parts, **host_rope(dialog["engine"], config_path), embedding=embedding)
    return _generate_timed(runner, prompt_ids, max_new_tokens, _eos_ids(dialog), dialog["context"]["size"],
                           follow)[0]


def _generate_timed(runner: Runner, prompt_ids: Sequence[int], max_new_tokens: int, eos_ids: frozenset[int],
                    context_size: int | None, choose: Callable[[np.ndarray], int] | None = None
                    ) -> tuple[list[int], float, float, tuple[GraphRun, ...]]:
    limit = min(context_size or runner.context_length, runner.context_length)
    if not prompt_ids:
        raise GenieBuildError("prompt", "is empty after tokenization")
    if max_new_tokens < 1 or len(prompt_ids) + max_new_tokens > limit:
        raise GenieBuildError("max-new-tokens", f"the prompt's {len(prompt_ids)} tokens + {max_new_tokens} new "
                                                f"tokens must fit the context size {limit} (and at least 1 new)")
    # one buffer of the largest CL: each graph sees its first CL - AR slots, so a switch carries the cache over
    cache = KVCache(runner.context_length)
    # every position a graph can be fed (a padded chunk ends at most at the last slot)
    rope = rope_tables(runner.head_dim, runner.rope_theta, np.arange(runner.context_length), runner.rope_scaling)
    runs: list[GraphRun] = []

    def run(tokens: Sequence[int]) -> np.ndarray:
        """``tokens`` (the query, or one generated token) through Genie's steps; the logits of the last one."""
        first = cache.length
        for chosen in genie_steps(runner.offered, first, len(tokens)):
            if runs and (runs[-1].ar, runs[-1].cl) == (chosen.ar, chosen.cl):
                runs[-1] = dataclasses.replace(runs[-1], steps=runs[-1].steps + 1)
            else:
                runs.append(GraphRun(chosen.ar, chosen.cl, 1))
            done = cache.length - first
            logits = _step(runner, cache, rope, tokens[done:done + chosen.count], chosen.ar, chosen.cl)
        return logits

    started = time.perf_counter()
    choose = choose or (lambda logits: int(np.argmax(logits)))
    new_ids = [choose(run(prompt_ids))]
    prompt_done = time.perf_counter()
    while len(new_ids) < max_new_tokens and new_ids[-1] not in eos_ids:
        new_ids.append(choose(run(new_ids[-1:])))
    return new_ids, prompt_done - started, time.perf_counter() - prompt_done, tuple(runs)


def _step(runner: Runner, cache: KVCache, rope: tuple[np.ndarray, np.ndarray], tokens: Sequence[int],
          ar: int, cl: int) -> np.ndarray:
    """Run ``tokens`` (at most ``ar``, padded to ``ar``) through every part's graph (``ar``, ``cl``); append their
    KV; return the logits of the last real token. ``rope`` holds the cos/sin tables of every position."""
    count, past_len = len(tokens), cache.length
    positions = slice(past_len, past_len + ar)
    padded = list(tokens) + [0] * (ar - count)
    first = {INPUTS_EMBEDS: runner.embedding.vectors(padded)} if runner.embedding is not None \
        else {INPUT_IDS: np.array([padded], dtype=np.int32)}
    feed = {**first, MASK: causal_mask(ar, cl, past_len),
            POS_COS: rope[0][:, :, positions], POS_SIN: rope[1][:, :, positions]}
    for part in runner.graphs:
        graph = part[ar, cl]
        inputs = {node.name: feed[node.name] if node.name in feed
                  else cache.past(node.name, node.shape, graph.empty.get(node.name, 0.0)) for node in graph.inputs()}
        outputs = graph.run(inputs)
        cache.store(outputs, count)
        feed.update(outputs)
    cache.advance(count)
    return feed[LOGITS][0, count - 1]


class KVCache:
    """The host's cache: per ``past_{key,value}_{i}`` a buffer of ``context_length`` slots, ``length`` valid."""

    def __init__(self, context_length: int) -> None:
        self.context_length = context_length
        self.length = 0
        self.buffers: dict[str, np.ndarray] = {}

    def past(self, input_name: str, shape: Sequence[int], empty: float = 0.0) -> np.ndarray:
        """The feed of input ``past_*_in`` of ``shape``: its first slots (valid entries, then slots holding
        ``empty``, the value the buffer is created with)."""
        if not input_name.startswith((KV_KEY_PREFIX, KV_VALUE_PREFIX)) or not input_name.endswith("_in"):
            raise GenieBuildError(input_name, "is an input that neither the host nor an earlier part provides")
        axis = -1 if input_name.startswith(KV_KEY_PREFIX) else -2
        key = input_name.removesuffix("_in")
        if key not in self.buffers:
            buffer_shape = list(shape)
            buffer_shape[axis] = self.context_length
            self.buffers[key] = np.full(buffer_shape, empty, dtype=np.float32)
        return np.take(self.buffers[key], np.arange(shape[axis]), axis=axis)

    def store(self, outputs: Mapping[str, np.ndarray], count: int) -> None:
        """Write the first ``count`` new entries of every ``past_*_out`` at the slots after the valid ones."""
        for name, array in outputs.items():
            key = name.removesuffix("_out")
            if name.endswith("_out") and key in self.buffers:
                axis = -1 if name.startswith(KV_KEY_PREFIX) else -2
                target = np.moveaxis(self.buffers[key], axis, 0)
                target[self.length:self.length + count] = np.moveaxis(array, axis, 0)[:count]

    def advance(self, count: int) -> None:
        self.length += count


def host_rope(engine: dict, where: Path) -> dict[str, Any]:
    """:func:`make_runner`'s ``head_dim``, ``rope_theta`` and ``rope_scaling`` from a checked genie config: plain
    RoPE, or llama3 scaling (its Genie keys read back as HF's); another scaling is refused."""
    qnn_htp, model = engine["backend"]["QnnHtp"], engine["model"]
    encoding = model.get("positional-encoding")
    if encoding is None:
        if "rope-theta" not in qnn_htp or "kv-dim" not in qnn_htp:
            raise GenieBuildError(where, "the host run needs QnnHtp kv-dim and rope-theta")
        return {"head_dim": qnn_htp["kv-dim"], "rope_theta": float(qnn_htp["rope-theta"])}
    scaling = encoding.get("rope-scaling", {})
    rope_type = scaling.get("rope-type", "default")
    if encoding.get("type") != "rope" or rope_type not in HOST_ROPE_TYPES or "rope-theta" not in encoding:
        raise GenieBuildError(where, f"the host run implements plain and llama3 RoPE only, not "
                                     f"{encoding.get('type')!r} with rope-type {rope_type!r}")
    hf_keys = {genie: hf for hf, genie in GENIE_ROPE_SCALING_KEYS.items()}
    hf_scaling = ({"rope_type": rope_type, **{hf_keys[key]: value for key, value in scaling.items() if key in hf_keys}}
                  if rope_type != "default" else None)
    return {"head_dim": 2 * encoding["rope-dim"], "rope_theta": float(encoding["rope-theta"]),
            "rope_scaling": hf_scaling}


def graph_ar_cl_of(name: str, model: onnx.ModelProto) -> tuple[int | None, int | None]:
    """(AR, CL) of a graph as Genie tells them (:func:`genie_build.conventions.graph_ar_cl`)."""
    info = _graph_info(name, model)
    return graph_ar_cl(name, info.inputs, info.outputs)


def _graph_info(name: str, model: onnx.ModelProto) -> GraphInfo:
    io = graph_io(model)

    def tensor(spec) -> TensorInfo:
        return TensorInfo(spec.name, tuple(d if isinstance(d, int) else -1 for d in spec.shape), spec.dtype)

    return GraphInfo(name, tuple(map(tensor, io.inputs)), tuple(map(tensor, io.outputs)))


def _eos_ids(dialog: dict) -> frozenset[int]:
    """The stop tokens of a genie config's dialog (one id or a list)."""
    eos = dialog["context"]["eos-token"]
    return frozenset(eos if isinstance(eos, list) else [eos])


def _graph_session(graph: ContainerGraph | GraphFile) -> GraphSession:
    """A session on the graph's model whose initializers become inputs, fed from the graph's weights (which empties
    the model's initializers); or on a graph file, as ORT reads it."""
    if isinstance(graph, GraphFile):
        if graph.htp is None:
            return GraphSession(session=ort.InferenceSession(os.fspath(graph.path), cpu_session_options(),
                                                             providers=["CPUExecutionProvider"]), weights={},
                                empty=empty_kv(graph.model))
        from genie_build.toolchains.qnn_htp.backend import session_options
        return GraphSession(session=ort.InferenceSession(os.fspath(graph.path), session_options(graph.htp)),
                            weights={}, empty=empty_kv(graph.model))
    model = graph.model
    for tensor in model.graph.initializer:
        model.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
    model.graph.ClearField("initializer")
    return GraphSession(session=_session(model), weights=graph.weights, empty=empty_kv(model))


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    """A session on the in-memory graph (:func:`cpu_session_options`), quiet about unused initializers."""
    options = cpu_session_options()
    options.log_severity_level = 3  # onnxruntime's warnings about unused initializers are noise here
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
