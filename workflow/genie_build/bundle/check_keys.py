"""check-bundle's checks of ``genie_config.json`` by genie-build's own key table
(:data:`genie_build.genie_config.GENIE_CONFIG_SECTIONS`, the keys Genie 2.51 takes in a basic dialog of QnnHtp
ctx-bins): mandatory and known keys, their types and versions, the values genie-build's other checks need, one RoPE
style, and a sampler Genie would not make greedy. Where the onnxruntime-qnn wheel is installed Genie itself checks
the file as well (:mod:`genie_build.bundle.check_vendor`).
"""

from __future__ import annotations

from genie_build.bundle.bundle_files import Finding, config_value
from genie_build.genie_config import (BINARY_SOURCES, EXPECTED_VALUES, GENIE_CONFIG_SECTIONS, ROPE_SCALING_TYPES,
                                      GenieSection, sampler_problem)

__all__ = ["check_keys"]


def check_keys(config: dict) -> list[Finding]:
    """The key table's findings on a ``genie_config.json`` that is a JSON object (rules ``required-keys``,
    ``unknown-key``, ``rope-style``, ``sampler``, and ``ctx-bins-exist`` for a binary.fcb)."""
    sampler = sampler_problem(config_value(config, "dialog.sampler", dict) or {})
    findings = _check_keys(config) + _check_rope_style(config)
    return findings + ([Finding("sampler", "warning", sampler)] if sampler else [])


def _check_keys(config: dict) -> list[Finding]:
    """Mandatory keys, known keys, key types, versions and the values genie-build's checks need."""
    if not isinstance(config.get("dialog"), dict):
        return [Finding("required-keys", "error", "genie_config.json has no 'dialog' object")]
    findings = [Finding("unknown-key", "error", f"genie_config.json has top-level key {key!r}; Genie knows 'dialog' "
                                                "only") for key in config if key != "dialog"]
    for where, section in GENIE_CONFIG_SECTIONS.items():
        body = config_value(config, where, dict)
        if body is not None:  # an absent section is reported by its parent's mandatory keys
            findings += _check_section(section, where, body)
    if "engine" in config["dialog"] and not isinstance(config["dialog"]["engine"], dict):
        findings.append(Finding("required-keys", "error", "dialog.engine must be one object for a basic dialog"))
    binary = config_value(config, "dialog.engine.model.binary", dict)
    if binary is not None and sum(key in binary for key in BINARY_SOURCES) != 1:
        findings.append(Finding("required-keys", "error", "dialog.engine.model.binary needs exactly one of "
                                                          f"{' and '.join(map(repr, BINARY_SOURCES))}"))
    if binary is not None and "fcb" in binary:
        findings.append(Finding("ctx-bins-exist", "warning", "binary.fcb (a multi-SoC DLC bundle): the ctx-bin "
                                                             "and graph checks apply to ctx-bins only"))
    rope_type = config_value(config, "dialog.engine.model.positional-encoding.rope-scaling.rope-type")
    if rope_type is not None and rope_type not in ROPE_SCALING_TYPES:
        findings.append(Finding("required-keys", "error", f"rope-scaling.rope-type {rope_type!r} is not one of "
                                                          f"{', '.join(ROPE_SCALING_TYPES)}"))
    return findings


def _check_section(section: GenieSection, where: str, body: dict) -> list[Finding]:
    findings = [Finding("required-keys", "error", f"{where} lacks mandatory key {key!r}")
                for key in sorted(section.mandatory - set(body))]
    findings += [Finding("unknown-key", "error", f"{where} has key {key!r} that Genie does not take here "
                                                 f"(known: {', '.join(sorted(section.known))})")
                 for key in body if key not in section.known]
    findings += [Finding("required-keys", "error", f"{where}.{key} must be {kind.name}, got {body[key]!r}")
                 for key, kind in section.types.items() if key in body and not kind.accepts(body[key])]
    if "version" in body and body["version"] != 1:
        findings.append(Finding("required-keys", "error", f"{where}.version must be 1, got {body['version']!r}"))
    findings += [Finding("required-keys", "error", f"{where}.{key} is {body[key]!r}; genie-build checks bundles "
                                                   f"with {key} {expected!r}")
                 for key, expected in EXPECTED_VALUES.get(where, {}).items()
                 if key in body and body[key] != expected]
    return findings


def _check_rope_style(config: dict) -> list[Finding]:
    qnn_htp = config_value(config, "dialog.engine.backend.QnnHtp", dict) or {}
    plain = [key for key in ("pos-id-dim", "rope-theta") if key in qnn_htp]
    if plain and isinstance(config_value(config, "dialog.engine.model"), dict) \
            and "positional-encoding" in config["dialog"]["engine"]["model"]:
        return [Finding("rope-style", "error", f"QnnHtp gives {' and '.join(plain)} and model gives "
                                               "positional-encoding; Genie accepts one rope style, not both")]
    return []
