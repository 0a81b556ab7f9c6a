"""Check a Genie bundle against what Genie enforces when it loads one (``Dialog.cpp``, ``nsp-model.cpp``;
docs/conventions.md).

Usable on bundles made elsewhere: graph names and IO come from ``metadata.yaml`` when the bundle has one,
else from the ctx-bins themselves when they are reference containers. Every finding carries a stable rule
id (:data:`RULES`); :func:`check_bundle` never raises on a malformed bundle, it reports it.

A bundle may come from anyone, so the checker reads only regular files inside the bundle's folder (symlinks
resolved: a link out of it is a finding, never followed), each within a size bound, through
:func:`genie_build.fileio.open_regular`; it hashes only the files the manifest lists under the bundle's folder, and
never touches a path a config or manifest names outside it. Time and memory stay bounded by those sizes.

``metadata.yaml`` is read with :func:`genie_build.bundle.metadata.parse_metadata` (:mod:`genie_build.bundle.metadata`).
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from genie_build.bundle.bundle_files import (MAX_CTX_BIN_BYTES, MAX_DOCUMENT_BYTES, MAX_HASHED_BYTES, Finding, Severity,
                                             bundle_file_problem, bundle_path, config_value, is_inside,
                                             load_bundle_json)
from genie_build.bundle.check_embedding import RULE as EMBEDDING_RULE, check_embedding
from genie_build.bundle.check_keys import check_keys
from genie_build.bundle.check_vendor import RULES as VENDOR_RULES, check_vendor
from genie_build.bundle.manifest import MANIFEST_NAME
from genie_build.bundle.metadata import METADATA_NAME, UNNAMED_GRAPH, parse_metadata
from genie_build.chipsets import CHIPSETS, Chipset, check_device, lookup
from genie_build.conventions import (AR_IN_NAME, CL_IN_NAME, FIRST_PART_INPUTS, KV_TENSOR, LOGITS, MASK,
                                     PART_SUFFIX, POS_COS, POS_SIN, Reading, genie_dims, graph_ar_cl, read_ar,
                                     read_cl)
from genie_build.errors import GenieBuildError
from genie_build.fileio import is_json_int, read_text, regular_file_size, resolve_inside, sha256_file
from genie_build.genie_config import GENIE_CONFIG_NAME, HTP_EXT_CONFIG_NAME, MAX_TOKENIZER_BYTES, load_tokenizer
from genie_build.genie_contract import graph_violations
from genie_build.hf_config import load_hf_config
from genie_build.htp_extensions import extension_problems
from genie_build.toolchains.base import GraphInfo, TensorInfo
from genie_build.toolchains.reference.container_format import MAGIC as CONTAINER_MAGIC, inspect_container

__all__ = ["Finding", "MAX_DOCUMENT_BYTES", "RULES", "Severity", "check_bundle", "require_valid_bundle"]

RULES = {
    "files": "genie_config.json, the tokenizer and the backend extension config are regular files inside the bundle "
             "(within size bounds, no link out of it) and parse",
    "required-keys": "every key Genie's Dialog.cpp requires is present, with its type, and version 1",
    "unknown-key": "no key Genie does not know (Genie rejects the config: 'Unknown QnnHtp config key')",
    "rope-style": "pos-id-dim/rope-theta and model.positional-encoding are never both given",
    "ctx-bins-exist": "every listed ctx-bin exists in the bundle, once",
    "ctx-bins-listed": "every .bin in the bundle is listed in ctx-bins",
    "graph-info": "graph names and IO are known (metadata.yaml, or reference containers)",
    "graph-names": "AR and CL are readable from every graph name and agree with what Genie reads from its tensors",
    "tensor-shapes": "attention_mask, position_ids_cos/_sin, the KV cache and logits have the shapes Genie's "
                     "validateModel requires for the graph's AR and CL (genie_build.genie_contract)",
    "graph-order": "within each (AR, CL) the graph names sort lexicographically into part order",
    "io-ends": "input_ids is an input of the first part's graphs, logits an output of the last part's",
    "shared-quant": "a tensor shared across graphs carries identical quantization (logits excluded)",
    "context-size": "context.size is at most the compiled context length",
    "tensor-dims": "kv-dim and pos-id-dim/rope-dim match the KV cache and RoPE tensors",
    "chipset": "soc_model and dsp_arch agree with the chipset table",
    "htp-extensions": "the extension config's context, groupContext, memory and devices[].cores[] keys, types and "
                      "perf_profile are the HTP backend's, and "
                      "groupContext.share_resources comes with allow-async-init (without it Genie ignores it) and "
                      "without enable-graph-switching (the HTP backend does not switch graphs of shared contexts)",
    "n-vocab": "n-vocab is at most the logits' width and the model's vocab_size (a smaller one is a warning), and "
               "every tokenizer id lies within the logits",
    "manifest": "manifest.json names files inside the bundle only, and their hashes match",
    "sampler": "a sampler that asks for greedy decoding gets it from Genie (top-k 1 or temp 0: Genie 2.51 ignores "
               "greedy)",
    **VENDOR_RULES,
    EMBEDDING_RULE: "dialog.embedding's table (type lut) is n-vocab x size x the datatype's bytes, its datatype comes "
                    "with the quant-param it needs, and the first part's graphs take inputs_embeds of that size, "
                    "quantized for a table of codes (genie_build.bundle.check_embedding)",
}

UNSHARED_TENSORS = (LOGITS,)  # Genie's shared-quantization rule excludes them


def check_bundle(bundle_dir: str | os.PathLike[str], hf_config: str | os.PathLike[str] | None = None,
                 chipset: str | None = None, *, manifest: bool = True) -> list[Finding]:
    """Every violation of Genie's load-time rules found in ``bundle_dir``.

    Args:
        bundle_dir: the bundle directory.
        hf_config: the model's HF ``config.json``, when known (enables the n-vocab check against it).
        chipset: the intended chipset; without it soc_model and dsp_arch are only checked for consistency.
        manifest: check the manifest's hashes (the bundler, which has just hashed the files it wrote, skips it).

    Returns:
        Findings, errors first; an empty list for a bundle Genie would accept.
    """
    bundle = Path(bundle_dir)
    if not bundle.is_dir():
        return [Finding("files", "error", f"{bundle}: not a directory")]
    config, findings = load_bundle_json(bundle, GENIE_CONFIG_NAME)
    if not isinstance(config, dict):
        return findings or [Finding("files", "error", f"{GENIE_CONFIG_NAME} is not a JSON object")]
    findings += check_keys(config)
    referenced, referenced_findings = _referenced_files(bundle, config)
    findings += referenced_findings
    ctx_bins = [name for name in config_value(config, "dialog.engine.model.binary.ctx-bins", list) or []
                if isinstance(name, str)]
    findings += _check_ctx_bins(bundle, ctx_bins, _other_bundle_files(config))
    extensions = referenced.get("backend extensions")
    if extensions is None and config_value(config, "dialog.engine.backend.extensions") is None \
            and bundle_file_problem(bundle, HTP_EXT_CONFIG_NAME, MAX_DOCUMENT_BYTES) is None:
        extensions = HTP_EXT_CONFIG_NAME  # not named, but beside the config as AIHM lays bundles out
    if extensions is not None:
        findings += _check_chipset(bundle, extensions, chipset)
        htp_config = load_bundle_json(bundle, extensions)[0]
        findings += _check_binary_socs(bundle, ctx_bins, extensions, htp_config)
        qnn_htp = "dialog.engine.backend.QnnHtp"
        switches = (config_value(config, f"{qnn_htp}.allow-async-init"),
                    config_value(config, f"{qnn_htp}.enable-graph-switching"))
        findings += [Finding("htp-extensions", severity, f"{extensions}: {message}") for severity, message in
                     (extension_problems(htp_config, *switches) if isinstance(htp_config, dict) else ())]
    findings += check_vendor(bundle, extensions)
    findings += _check_manifest(bundle) if manifest else []
    graphs, graph_findings = _load_graphs(bundle, ctx_bins)
    findings += graph_findings
    if graphs is not None:
        findings += _check_graphs(config, ctx_bins, graphs)
    findings += _check_vocab(config, graphs, hf_config, bundle, referenced.get("tokenizer"))
    findings += check_embedding(bundle, config, graphs[ctx_bins[0]] if graphs and ctx_bins else None)
    return sorted(findings, key=lambda f: f.severity != "error")


def require_valid_bundle(bundle_dir: str | os.PathLike[str], hf_config: str | os.PathLike[str] | None = None,
                         chipset: str | None = None, *, manifest: bool = True) -> list[Finding]:
    """:func:`check_bundle`, raising on any error.

    Returns:
        The warnings.

    Raises:
        GenieBuildError: one line naming the bundle and every error with its rule id.
    """
    findings = check_bundle(bundle_dir, hf_config, chipset, manifest=manifest)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise GenieBuildError(bundle_dir, f"{len(errors)} error(s): "
                                          + "; ".join(f"[{f.rule}] {f.message}" for f in errors))
    return findings


# --- genie_config.json --------------------------------------------------------------------------------------

def _referenced_files(bundle: Path, config: dict) -> tuple[dict[str, str], list[Finding]]:
    """The tokenizer and backend extension config the config names (label -> its relative path), each a regular
    file inside the bundle; the findings for those that are not."""
    found, findings = {}, []
    for label, key in (("tokenizer", "dialog.tokenizer.path"),
                       ("backend extensions", "dialog.engine.backend.extensions")):
        name = config_value(config, key, str)
        if name is None:
            continue
        problem = bundle_file_problem(bundle, name, MAX_DOCUMENT_BYTES if label == "backend extensions"
                                       else MAX_TOKENIZER_BYTES)
        if problem is None:
            found[label] = name
        else:
            findings.append(Finding("files", "error", f"{label} file {name!r} ({key}) {problem}"))
    return found, findings


def _check_ctx_bins(bundle: Path, ctx_bins: list[str], other_files: set[str]) -> list[Finding]:
    """Listed once, inside the bundle (Genie resolves ctx-bin paths from its working directory, the bundle root:
    the vendor lists ``artifacts/split_model_1.bin``), present; and no unlisted ``.bin`` where ctx-bins live
    (the bundle root and every directory holding one) unless the config names it otherwise (an embedding LUT)."""
    findings = [Finding("ctx-bins-exist", "error", f"ctx-bin {name!r} is listed {count} times")
                for name, count in Counter(ctx_bins).items() if count > 1]
    findings += [Finding("ctx-bins-exist", "error", f"ctx-bin {name!r} must be a relative path inside the bundle "
                                                    "(Genie resolves it from the working directory, the bundle root)")
                 for name in dict.fromkeys(ctx_bins) if bundle_path(name) is None]
    findings += [Finding("ctx-bins-exist", "error", f"ctx-bin {name!r} is listed but not in the bundle"
                                                    if problem == "is not in the bundle" else
                                                    f"ctx-bin {name!r} {problem}")
                 for name in dict.fromkeys(ctx_bins) if bundle_path(name) is not None
                 and (problem := bundle_file_problem(bundle, name, MAX_CTX_BIN_BYTES)) is not None]
    listed = {str(bundle_path(name)) for name in ctx_bins if bundle_path(name) is not None} | other_files
    directories = {PurePosixPath(".")} | {PurePosixPath(name).parent for name in listed}
    findings += [Finding("ctx-bins-listed", "error", f"{name} is in the bundle but not listed in ctx-bins")
                 for directory in sorted(directories) if is_inside(bundle, bundle / directory)
                 for path in sorted((bundle / directory).glob("*.bin"))
                 if (name := str(directory / path.name)) not in listed]
    return findings


def _other_bundle_files(config: dict) -> set[str]:
    """Bundle files the config names besides ctx-bins (the vendor's embedding LUT is a ``.bin`` too)."""
    lut = config_value(config, "dialog.embedding.lut-path", str)
    return {str(bundle_path(lut))} if lut is not None and bundle_path(lut) is not None else set()


def _check_manifest(bundle: Path) -> list[Finding]:
    """The manifest's hashes against the files it lists: only names inside the bundle, regular files there, each
    within :data:`MAX_CTX_BIN_BYTES` and all together within :data:`MAX_HASHED_BYTES` (so a manifest cannot make
    the checker confirm a guess about a file elsewhere, nor read without end)."""
    if not os.path.lexists(bundle / MANIFEST_NAME):
        return []
    manifest, findings = load_bundle_json(bundle, MANIFEST_NAME)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return findings or [Finding("manifest", "error", f"{MANIFEST_NAME} has no 'files' mapping")]
    hashed = 0
    for name, entry in files.items():
        name = str(name)
        expected = entry.get("sha256") if isinstance(entry, dict) else None
        problem = bundle_file_problem(bundle, name, MAX_CTX_BIN_BYTES)
        if problem == "is not in the bundle":
            findings.append(Finding("manifest", "error", f"{name} is in {MANIFEST_NAME} but not in the bundle"))
            continue
        if problem is not None:
            findings.append(Finding("manifest", "error", f"{MANIFEST_NAME} lists {name!r}, which {problem}"))
            continue
        path = bundle / bundle_path(name)
        hashed += regular_file_size(path, inside=[bundle])
        if hashed > MAX_HASHED_BYTES:
            findings.append(Finding("manifest", "error", f"{MANIFEST_NAME} lists more than {MAX_HASHED_BYTES} bytes "
                                                         "of files to hash; the rest are not checked"))
            break
        if sha256_file(path, inside=[bundle], max_bytes=MAX_CTX_BIN_BYTES) != expected:
            findings.append(Finding("manifest", "error", f"{name} does not match its sha256 in {MANIFEST_NAME}"))
    findings += [Finding("manifest", "warning", f"{path.name} is not in {MANIFEST_NAME}")
                 for path in sorted(bundle.iterdir())
                 if path.is_file() and path.name != MANIFEST_NAME and path.name not in files]
    return findings


# --- htp_backend_ext_config.json ----------------------------------------------------------------------------

def _check_chipset(bundle: Path, htp_config_name: str, chipset: str | None) -> list[Finding]:
    """soc_model/dsp_arch of every device against the table (or against ``chipset`` when given)."""
    htp_config, findings = load_bundle_json(bundle, htp_config_name)
    devices = htp_config.get("devices") if isinstance(htp_config, dict) else None
    if not (isinstance(devices, list) and devices and all(isinstance(d, dict) for d in devices)):
        return findings or [Finding("chipset", "error", f"{htp_config_name} has no devices[] objects")]
    try:
        expected = lookup(chipset) if chipset else None
    except GenieBuildError as exc:
        return [Finding("chipset", "error", str(exc))]
    for device in devices:
        findings += _check_device(device.get("soc_model"), device.get("dsp_arch"), expected)
    return findings


def _check_binary_socs(bundle: Path, ctx_bins: list[str], extensions: str, htp_config: object) -> list[Finding]:
    """Every QNN ctx-bin was compiled for the SoC the extension config names (read back by libQnnSystem where the
    wheel is installed; a reference container, an unreadable file or a missing wheel is left to the other checks):
    a binary for another SoC loads on the phone and may compute garbage."""
    devices = htp_config.get("devices") if isinstance(htp_config, dict) else None
    named = devices[0].get("soc_model") if isinstance(devices, list) and devices and isinstance(devices[0], dict) \
        else None
    if not is_json_int(named):
        return []
    findings = []
    for name in dict.fromkeys(ctx_bins):
        if bundle_file_problem(bundle, name, MAX_CTX_BIN_BYTES) is not None:
            continue   # a name outside the bundle or not a regular file (a FIFO would block the read) is judged elsewhere
        try:
            path = resolve_inside(bundle / bundle_path(name), [bundle])
            with open(path, "rb") as handle:
                if handle.read(len(CONTAINER_MAGIC)) == CONTAINER_MAGIC:
                    continue
            from genie_build.qnn_wheel.system import read_context_binary
            compiled_for = read_context_binary(path).soc_model
        except (GenieBuildError, OSError):
            continue
        if compiled_for is not None and compiled_for != named:
            findings.append(Finding("chipset", "error", f"{name} was compiled for soc_model {compiled_for}, but "
                                                        f"{extensions} names {named}"))
    return findings


def _check_device(soc_model: object, dsp_arch: object, expected: Chipset | None) -> list[Finding]:
    """Against ``expected`` when the chipset is known; otherwise soc_model and dsp_arch must belong together."""
    if expected is not None:
        return [Finding("chipset", "error", problem) for problem in check_device(soc_model, dsp_arch, expected)]
    if not (is_json_int(soc_model) and isinstance(dsp_arch, str)):
        return [Finding("chipset", "error", f"device needs an integer soc_model and a dsp_arch string, "
                                            f"got soc_model={soc_model!r}, dsp_arch={dsp_arch!r}")]
    owner = next((chip for chip in CHIPSETS.values() if chip.soc_model == soc_model), None)
    if owner is None:
        return [Finding("chipset", "warning", f"soc_model {soc_model} is not in the chipset table")]
    if owner.dsp_arch != dsp_arch.lower():
        arch_owners = [chip.name for chip in CHIPSETS.values() if chip.dsp_arch == dsp_arch.lower()]
        return [Finding("chipset", "error", f"soc_model {soc_model} is {owner.name}'s ({owner.dsp_arch}) but "
                                            f"dsp_arch is {dsp_arch}"
                                            + (f", that of {', '.join(arch_owners)}" if arch_owners else ""))]
    return []


# --- graphs -------------------------------------------------------------------------------------------------

def _load_graphs(bundle: Path, ctx_bins: list[str]) -> tuple[dict[str, tuple[GraphInfo, ...]] | None, list[Finding]]:
    """Graphs per listed ctx-bin, from ``metadata.yaml`` or else from the ctx-bins themselves (a reference container
    read by this package, a QNN binary by the vendor's libQnnSystem); or None (with the reason) when they are not
    known for every ctx-bin."""
    present = [name for name in dict.fromkeys(ctx_bins)
               if bundle_file_problem(bundle, name, MAX_CTX_BIN_BYTES) is None]
    if not ctx_bins or len(present) != len(set(ctx_bins)):
        return None, []  # the ctx-bin findings say why
    if os.path.lexists(bundle / METADATA_NAME):
        try:
            graphs = parse_metadata(read_text(bundle / METADATA_NAME, inside=[bundle], max_bytes=MAX_DOCUMENT_BYTES),
                                    METADATA_NAME)
        except GenieBuildError as exc:
            return None, [Finding("graph-info", "error", f"{METADATA_NAME}: {exc.problem}")]
        missing = [name for name in present if name not in graphs]
        if missing:
            return None, [Finding("graph-info", "error", f"{METADATA_NAME} has no entry for {', '.join(missing)}")]
        return {name: graphs[name] for name in present}, []
    result, findings = {}, []
    for name in present:
        try:
            result[name] = _binary_graphs(bundle, name)
        except GenieBuildError as exc:
            findings.append(Finding("graph-info", "error", f"{name}: {exc.problem}; without {METADATA_NAME} the "
                                                           "graph checks need the binaries themselves"))
    return (None if findings else result), findings


def _binary_graphs(bundle: Path, name: str) -> tuple[GraphInfo, ...]:
    """A ctx-bin's graphs as the binary holds them.

    Raises:
        GenieBuildError: neither a reference container nor a QNN context binary libQnnSystem reads (or the
            onnxruntime-qnn wheel that holds libQnnSystem is not installed).
    """
    path = resolve_inside(bundle / bundle_path(name), [bundle])
    with open(path, "rb") as handle:
        is_container = handle.read(len(CONTAINER_MAGIC)) == CONTAINER_MAGIC
    if is_container:
        return inspect_container(path, inside=[bundle]).graphs
    from genie_build.qnn_wheel.system import read_context_binary
    return tuple(graph.info for graph in read_context_binary(path).graphs)


def _check_graphs(config: dict, ctx_bins: list[str], graphs: dict[str, tuple[GraphInfo, ...]]) -> list[Finding]:
    order = list(dict.fromkeys(ctx_bins))
    placed = [(graph, order.index(name)) for name in order for graph in graphs[name]]
    all_graphs = [graph for graph, _ in placed]
    findings = _check_io_ends(graphs[order[0]], graphs[order[-1]])
    findings += _check_shared_quant(all_graphs)
    findings += _check_tensor_dims(config, all_graphs)
    if any(graph.name == UNNAMED_GRAPH for graph in all_graphs):
        findings.append(Finding("graph-info", "warning", f"{METADATA_NAME} gives IO per ctx-bin, not per graph: "
                                                         "the graph-names and graph-order checks need the graph "
                                                         "names (qnn-context-binary-utility lists them)"))
        tensor_cls = [graph_ar_cl("", graph.inputs, graph.outputs)[1] for graph in all_graphs]
        return findings + _check_context_size(config, [cl for cl in tensor_cls if cl is not None])
    shapes = {}
    for graph in all_graphs:
        shapes[graph.name], graph_findings = _graph_ar_cl(graph)
        findings += graph_findings + _check_tensor_shapes(graph, *shapes[graph.name])
    findings += _check_order(placed, shapes, len(order))
    return findings + _check_context_size(config, [cl for _, cl in shapes.values() if cl is not None])


def _graph_ar_cl(graph: GraphInfo) -> tuple[tuple[int | None, int | None], list[Finding]]:
    """Genie's (AR, CL) of a graph, and where its name disagrees with them or lacks them (Genie falls back on
    the name when the tensors do not tell, as in an embedding-only part: so the name must carry both)."""
    named_ar, named_cl = _name_number(AR_IN_NAME, graph.name), _name_number(CL_IN_NAME, graph.name)
    tensor_ar, tensor_cl = _tensor_readings(graph)
    findings = [Finding("graph-names", "error", f"graph {graph.name!r}: no {what} in its name (Genie reads "
                                                f"{regex.pattern!r} there when the tensors do not tell; an "
                                                "embedding-only part has no other source)")
                for what, regex, value in (("AR", AR_IN_NAME, named_ar), ("CL", CL_IN_NAME, named_cl))
                if value is None]
    findings += [Finding("graph-names", "error", f"graph {graph.name!r}: Genie reads {what} {reading.value} from "
                                                 f"{reading.source}, but the name says {what} {named}"
                                                 + _mask_hint(graph, what, named_ar, named_cl))
                 for what, named, reading in (("AR", named_ar, tensor_ar), ("CL", named_cl, tensor_cl))
                 if named is not None and reading.value is not None and named != reading.value]
    ar = tensor_ar.value if tensor_ar.value is not None else named_ar
    cl = tensor_cl.value if tensor_cl.value is not None else named_cl
    return (ar, cl), findings


def _tensor_readings(graph: GraphInfo) -> tuple[Reading, Reading]:
    """AR and CL as Genie reads them from the graph's tensors alone."""
    return read_ar("", graph.inputs, graph.outputs), read_cl("", graph.inputs, graph.outputs)


def _mask_hint(graph: GraphInfo, what: str, named_ar: int | None, named_cl: int | None) -> str:
    """What Genie needs of the mask when the AR misread comes from it (e.g. a 2-D ``[1, CL]`` mask)."""
    mask = next((t for t in graph.inputs if t.name == MASK), None)
    dims = genie_dims(mask.shape) if mask is not None else None
    if what != "AR" or dims is None or None in (named_ar, named_cl) or dims.hwc == (1, named_ar, named_cl):
        return ""
    return f"; Genie needs attention_mask [1, AR, CL] = [1, {named_ar}, {named_cl}]"


def _check_tensor_shapes(graph: GraphInfo, ar: int | None, cl: int | None) -> list[Finding]:
    """The shapes Genie's validateModel checks, for the AR and CL Genie reads (quantized dtypes not checked)."""
    return [Finding("tensor-shapes", "error", f"graph {violation}")
            for violation in graph_violations(repr(graph.name), graph.inputs, graph.outputs, ar=ar, cl=cl,
                                              whole=False, check_dtypes=False)]


def _check_order(placed: list[tuple[GraphInfo, int]], shapes: dict[str, tuple[int | None, int | None]],
                 num_bins: int) -> list[Finding]:
    """Genie puts the graphs of one (AR, CL) into splits by sorting their names; that must be part order."""
    groups: dict[tuple[int, int], list[tuple[str, int]]] = defaultdict(list)
    for graph, bin_index in placed:
        ar, cl = shapes[graph.name]
        if ar is not None and cl is not None:
            groups[(ar, cl)].append((graph.name, bin_index))
    findings = []
    for (ar, cl), members in sorted(groups.items()):
        per_bin = Counter(bin_index for _, bin_index in members)
        if any(count > 1 for count in per_bin.values()):
            together = sorted(name for name, bin_index in members if per_bin[bin_index] > 1)
            findings.append(Finding("graph-order", "error", f"AR {ar}, CL {cl}: a ctx-bin holds more than one "
                                                            f"graph Genie reads as AR {ar}, CL {cl} "
                                                            f"({', '.join(together)}); Genie stops with "
                                                            "'duplicate graph found'"))
        elif len(per_bin) != num_bins:
            findings.append(Finding("graph-order", "error", f"AR {ar}, CL {cl}: graphs in {len(per_bin)} of "
                                                            f"{num_bins} ctx-bins; every part needs one"))
        else:
            findings += _check_sorted_into_parts(ar, cl, members)
    return findings


def _check_sorted_into_parts(ar: int, cl: int, members: list[tuple[str, int]]) -> list[Finding]:
    for split_index, (name, bin_index) in enumerate(sorted(members)):
        if split_index != bin_index:
            return [Finding("graph-order", "error", f"AR {ar}, CL {cl}: graph {name!r} sorts to split "
                                                    f"{split_index + 1} but sits in part {bin_index + 1}"
                                                    + _padding_hint(name for name, _ in members))]
    return []


def _padding_hint(names: Iterable[str]) -> str:
    for name in names:
        match = PART_SUFFIX.search(name)
        if match and len(match.group(1)) < len(match.group(2)):
            return (f"; part indices are not zero-padded ({name!r}): with 10 or more parts, '10' sorts before "
                    f"'2', so pad them to the width of N (e.g. '_{int(match.group(1)):0{len(match.group(2))}d}"
                    f"_of_{match.group(2)}')")
    return ""


def _check_io_ends(first: tuple[GraphInfo, ...], last: tuple[GraphInfo, ...]) -> list[Finding]:
    findings = [Finding("io-ends", "error", f"graph {graph.name!r} of the first part has no input_ids (or "
                                            "inputs_embeds) input")
                for graph in first if not any(t.name in FIRST_PART_INPUTS for t in graph.inputs)]
    findings += [Finding("io-ends", "error", f"graph {graph.name!r} of the last part has no logits output")
                 for graph in last if not any(t.name == LOGITS for t in graph.outputs)]
    return findings


def _check_shared_quant(graphs: list[GraphInfo]) -> list[Finding]:
    """Genie: "Non-identical quantization parameters found for the same tensor" (past_*_in and past_*_out
    of one layer count as the same tensor: the cache)."""
    first_seen: dict[str, tuple[str, str, tuple]] = {}
    reported, findings = set(), []
    for graph in graphs:
        for tensor in graph.inputs + graph.outputs:
            if tensor.name in UNSHARED_TENSORS:
                continue
            key = KV_TENSOR.sub(r"past_\1_\2", tensor.name)
            seen = first_seen.setdefault(key, (graph.name, tensor.name, _quant_signature(tensor)))
            if seen[2] != _quant_signature(tensor) and key not in reported:
                reported.add(key)
                findings.append(Finding("shared-quant", "error", f"tensor {tensor.name!r} in graph {graph.name!r} "
                                                                 f"has {_describe(_quant_signature(tensor))} but "
                                                                 f"{seen[1]!r} in graph {seen[0]!r} has "
                                                                 f"{_describe(seen[2])}"))
    return findings


def _quant_signature(tensor: TensorInfo) -> tuple:
    quant = tensor.quant
    return (tensor.dtype, None, None, None) if quant is None else (quant.dtype, quant.scale, quant.offset,
                                                                    quant.bitwidth)


def _describe(signature: tuple) -> str:
    dtype, scale, offset, bitwidth = signature
    return f"{dtype}" if scale is None else f"{dtype} scale {scale!r} offset {offset} ({bitwidth} bit)"


def _check_context_size(config: dict, compiled_cls: list[int]) -> list[Finding]:
    size = config_value(config, "dialog.context.size", int)
    if size is None or not compiled_cls or size <= max(compiled_cls):
        return []
    return [Finding("context-size", "error", f"context.size {size} exceeds the compiled context length "
                                             f"{max(compiled_cls)} (Genie: 'Config specifies context->size={size}, "
                                             f"but loaded max-CL={max(compiled_cls)}')")]


def _check_tensor_dims(config: dict, graphs: list[GraphInfo]) -> list[Finding]:
    """``kv-dim`` is the head dim of ``past_key_*`` (dim -2, keys transposed) and ``past_value_*`` (dim -1);
    ``pos-id-dim`` (or ``rope-dim``) is the last dim of ``position_ids_cos``/``_sin``. Reports the first
    mismatch only: one wrong setting shows in every layer."""
    dims = {"kv-dim": config_value(config, "dialog.engine.backend.QnnHtp.kv-dim", int),
            "pos-id-dim": config_value(config, "dialog.engine.backend.QnnHtp.pos-id-dim", int)
            or config_value(config, "dialog.engine.model.positional-encoding.rope-dim", int)}
    for graph in graphs:
        for tensor in graph.inputs + graph.outputs:
            key, axis = _dim_of(tensor.name)
            if key and dims[key] is not None and len(tensor.shape) >= -axis and tensor.shape[axis] != dims[key]:
                return [Finding("tensor-dims", "error", f"{key} is {dims[key]} but {tensor.name!r} in graph "
                                                        f"{graph.name!r} has shape {list(tensor.shape)}")]
    return []


def _dim_of(tensor_name: str) -> tuple[str | None, int]:
    """Which config dimension a tensor carries, and on which axis."""
    kv = KV_TENSOR.match(tensor_name)
    if kv:
        return "kv-dim", -2 if kv.group(1) == "key" else -1
    if tensor_name in (POS_COS, POS_SIN):
        return "pos-id-dim", -1
    return None, 0


def _check_vocab(config: dict, graphs: dict[str, tuple[GraphInfo, ...]] | None,
                 hf_config: str | os.PathLike[str] | None, bundle: Path, tokenizer: str | None) -> list[Finding]:
    """n-vocab against the logits' width and the model's vocab_size: wider is an error (Genie reads logits that
    are not there: the bundle fails when run), narrower a warning (Genie samples the first n-vocab only); and every
    tokenizer id within the logits (one past them can be neither fed nor produced)."""
    n_vocab = config_value(config, "dialog.context.n-vocab", int)
    findings = []
    widths = {}
    if hf_config is not None:
        try:
            vocab = load_hf_config(hf_config).get("vocab_size")
        except GenieBuildError as exc:
            return [Finding("files", "error", str(exc))]
        if is_json_int(vocab):
            widths[f"the model's vocab_size ({os.fspath(hf_config)})"] = vocab
    widths.update((f"the logits of graph {graph.name!r}", tensor.shape[-1])
                  for graph_list in (graphs or {}).values() for graph in graph_list for tensor in graph.outputs
                  if tensor.name == LOGITS and tensor.shape and tensor.shape[-1] > 0)
    if n_vocab is not None:
        for what, width in widths.items():
            if n_vocab != width:
                severity = "error" if n_vocab > width else "warning"
                effect = ("Genie would read past them" if n_vocab > width
                          else "Genie samples only the first n-vocab")
                findings.append(Finding("n-vocab", severity, f"context.n-vocab is {n_vocab} but {what} is "
                                                             f"{width} wide: {effect}"))
                break  # one wrong n-vocab, said once
    logits = [width for what, width in widths.items() if what.startswith("the logits")]
    if tokenizer is not None and logits:
        findings += _check_tokenizer_ids(bundle, tokenizer, min(logits))
    return findings


def _check_tokenizer_ids(bundle: Path, tokenizer: str, width: int) -> list[Finding]:
    """The bundle's tokenizer parses (a bounded regular file inside the bundle) and its largest id, added tokens
    included, lies within the logits' ``width``."""
    try:
        vocabulary = load_tokenizer(bundle / bundle_path(tokenizer), inside=[bundle]).get_vocab(with_added_tokens=True)
    except GenieBuildError as exc:
        return [Finding("files", "error", f"tokenizer file {tokenizer!r}: {exc.problem}")]
    token, token_id = max(vocabulary.items(), key=lambda item: item[1], default=("", -1))
    if token_id >= width:
        return [Finding("n-vocab", "error", f"tokenizer token {token!r} has id {token_id}, beyond the logits' "
                                            f"{width} entries")]
    return []


# --- helpers ------------------------------------------------------------------------------------------------

def _name_number(pattern: re.Pattern[str], name: str) -> int | None:
    match = pattern.search(name)
    return int(match.group(2)) if match else None
