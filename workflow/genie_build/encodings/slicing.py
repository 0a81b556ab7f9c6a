"""Encodings across parts and graphs: a part's slice (:func:`slice_encodings`), the token graph given the prompt
graph's encodings (:func:`share_encodings`), and the rules Genie enforces when it loads them: a tensor shared by
parts or graphs quantized alike everywhere, a layer's KV cache output quantized as its input."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import fields, replace

from genie_build.conventions import KV_TENSOR
from genie_build.encodings.model import Encodings, TensorEncoding, short_repr
from genie_build.errors import GenieBuildError

__all__ = ["check_boundary_consistency", "check_graphs_consistent", "check_kv_cache_tied", "share_encodings",
           "slice_encodings"]


def slice_encodings(enc: Encodings, tensor_names: set[str], initializer_names: set[str]) -> Encodings:
    """The part of ``enc`` one part needs: activation encodings of the tensors it touches, parameter
    encodings of its own initializers."""
    activations = {name: e for name, e in enc.activations.items() if name in tensor_names}
    params = {name: e for name, e in enc.params.items() if name in initializer_names}
    kept = activations.keys() | params.keys()
    return replace(enc, activations=activations, params=params, quantizer_args=dict(enc.quantizer_args),
                   entries={key: entry for key, entry in enc.entries.items() if key[1] in kept})


def share_encodings(source: Encodings, target: Encodings, target_names: AbstractSet[str]) -> Encodings:
    """``target`` with ``source``'s encoding for every tensor of ``source`` that the target graph has
    (``target_names``, :attr:`GraphTensors.tensor_names`), as AI Hub gives the token graph the prompt
    graph's encodings.

    Raises:
        GenieBuildError: the two files are of different versions (their entries cannot be mixed).
    """
    if source.version != target.version:
        raise GenieBuildError("encodings.share_from", f"the graphs' encodings are of versions {source.version} "
                                                      f"and {target.version}; sharing needs one version")
    shared = {name: section for name, section in _sections_by_name(source).items() if name in target_names}
    activations, params = dict(target.activations), dict(target.params)
    entries = dict(target.entries)
    for name, section in shared.items():
        for encodings in (activations, params):
            encodings.pop(name, None)
        (params if section == "param" else activations)[name] = source.params.get(name) or source.activations[name]
        for key in [key for key in entries if key[1] == name]:
            del entries[key]
        entries.update((key, entry) for key, entry in source.entries.items() if key[1] == name)
    return replace(target, activations=activations, params=params, entries=entries)


def _sections_by_name(enc: Encodings) -> dict[str, str]:
    return {**{name: "activation" for name in enc.activations}, **{name: "param" for name in enc.params}}


def check_boundary_consistency(slices: dict[str, Encodings]) -> None:
    """Require a tensor that several parts' slices hold (a boundary, the shared RoPE/mask inputs) to have
    identical encodings in all of them.

    Args:
        slices: part label -> that part's encodings.

    Raises:
        GenieBuildError: naming the tensor, both parts and what differs.
    """
    _require_identical({f"part {label}": slices[label] for label in sorted(slices)})


def check_graphs_consistent(prompt_enc: Encodings, token_enc: Encodings) -> None:
    """Require a tensor in both graphs' encodings to have identical encodings: Genie rejects
    "Non-identical quantization parameters found for the same tensor".

    Raises:
        GenieBuildError: naming the tensor and what differs, and the option that shares them instead.
    """
    try:
        _require_identical({"the prompt graph": prompt_enc, "the token graph": token_enc})
    except GenieBuildError as exc:
        raise GenieBuildError(exc.where, f"{exc.problem} (calibrate both graphs together, or set "
                                         "encodings.share_from: prompt to give the token graph the prompt "
                                         "graph's encodings)") from None


def check_kv_cache_tied(enc: Encodings, tensor_names: AbstractSet[str]) -> None:
    """Require each ``past_{key,value}_{i}_out`` of the graph (``tensor_names``) to have the encoding of its
    ``_in``: Genie writes the new cache entries back into the input cache, so it refuses any difference at load
    time. AIMET leaves outputs of data-movement ops (the new entries) without an encoding unless its LLM recipe
    ties the cache quantizers, so a plain export stops here, before anything is converted or compiled.

    Raises:
        GenieBuildError: naming the first untied output, both encodings and the fix.
    """
    for name in sorted(tensor_names):
        match = KV_TENSOR.match(name)
        source_name = f"past_{match.group(1)}_{match.group(2)}_in" if match and match.group(3) == "out" else None
        if source_name not in tensor_names:
            continue
        source, output = enc.activations.get(source_name), enc.activations.get(name)
        expected = replace(source, name=name) if source is not None else None
        if expected == output:
            continue
        describe = (f"it has none, {source_name} has one" if output is None else
                    f"it has one, {source_name} has none" if expected is None else _difference(expected, output))
        raise GenieBuildError(name, f"activation encoding is not {source_name}'s ({describe}); Genie needs the "
                                    "KV cache's output quantized as its input: tie the cache quantizers in AIMET, "
                                    f"or give {name} the entry of {source_name}")


def _require_identical(sources: dict[str, Encodings]) -> None:
    first_seen: dict[tuple[str, str], tuple[str, TensorEncoding]] = {}
    for source, enc in sources.items():
        for section, encodings in (("activation", enc.activations), ("param", enc.params)):
            for name, encoding in encodings.items():
                seen_in, seen = first_seen.setdefault((section, name), (source, encoding))
                if seen != encoding:
                    raise GenieBuildError(name, f"{section} encoding differs between {seen_in} and {source}: "
                                                f"{_difference(seen, encoding)}")


def _difference(first: TensorEncoding, second: TensorEncoding) -> str:
    differences = []
    for spec in fields(TensorEncoding):
        a, b = getattr(first, spec.name), getattr(second, spec.name)
        if a == b:
            continue
        if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
            index = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            differences.append(f"{spec.name}[{index}] {a[index]!r} vs {b[index]!r}")
        else:
            differences.append(f"{spec.name} {short_repr(a)} vs {short_repr(b)}")
    return "; ".join(differences)
