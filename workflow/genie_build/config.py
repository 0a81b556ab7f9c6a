"""The workflow config: read it, check it against ``genie_build/schema/config.schema.yaml`` with the schema's
defaults filled in, then check what a schema cannot say (rules that tie one key to another).

Snakemake's ``common.smk`` and the tests call the same :func:`validate_config`, so a config is judged one
way everywhere. Every failure is one :class:`GenieBuildError` naming the dotted key, e.g.
``config split.num_parts: 'x' does not match '^auto$'``.
"""

from __future__ import annotations

import copy
import math
import os
import re
import reprlib
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError, best_match

from genie_build.bundle_layout import BundleLayout
from genie_build.chipsets import load_params, lookup
from genie_build.conventions import KV_BYTES, cache_length_problem
from genie_build.demo.demo import DemoShape, shape_config
from genie_build.errors import GenieBuildError
from genie_build.fileio import is_json_int, read_text
from genie_build.split_request import check_split_request
from genie_build.units import GIB, MIB

__all__ = ["DEFAULT_CALIBRATION_TOKENS", "DEFAULT_SCHEMA", "DemoCalibrator", "MAX_CONFIG_BYTES", "MAX_CONFIG_VALUES",
           "SourceKind", "StrictValidator", "bundle_config", "calibration_chain", "calibration_windows",
           "context_lengths", "load_config", "read_schema", "source_kind", "validate_config"]

# Package data, so that an installed package validates configs and recipes without the repository.
DEFAULT_SCHEMA = Path(__file__).resolve().parent / "schema" / "config.schema.yaml"
# libyaml when PyYAML has it: every Snakemake run reads the schema, in 19 ms instead of 84 ms with the pure-Python
# loader (a no-op run takes about 2 s).
_SCHEMA_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")
# A config or recipe file is a few kB; a larger one is not one (read as a regular file, never a FIFO or a device).
MAX_CONFIG_BYTES = 16 * MIB
# A config holds hundreds of values (a long split.boundaries list, a few thousand).
MAX_CONFIG_VALUES = 100_000


def load_config(path: str | os.PathLike[str], schema_path: str | os.PathLike[str] = DEFAULT_SCHEMA) -> dict:
    """Read a YAML config file and validate it (:func:`validate_config`); errors name the file.

    Raises:
        GenieBuildError: the file is missing, not YAML, or not a valid config.
    """
    text = read_text(path, max_bytes=MAX_CONFIG_BYTES)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise GenieBuildError(path, f"not valid YAML: {_yaml_problem(exc)}") from None
    return validate_config({} if data is None else data, where=os.fspath(path), schema_path=schema_path)


def validate_config(config: Any, where: str = "config",
                    schema_path: str | os.PathLike[str] = DEFAULT_SCHEMA) -> dict:
    """Check a whole config and return a copy with the schema's defaults filled in (``config`` is not changed).

    Checks, in order: plain data (string keys, finite numbers), the JSON schema (Draft 2020-12), then the
    rules across keys: exactly one of ``split.num_parts`` / ``split.max_part_mb``; ``bundle.variant`` and
    ``report.baseline_variant`` name variants; ``target.chipset`` is in the chipset table; the demo sizes fit
    together when the demo is built. ``model.name`` is held to a single path component by the schema pattern.

    Args:
        config: the config as YAML or Snakemake gives it.
        where: what to call the config in errors ("config", or its file).
        schema_path: the JSON schema (YAML); a copied workflow passes its own.

    Raises:
        GenieBuildError: one line, ``<where> <dotted.key>: <problem with the value>``.
    """
    if not isinstance(config, Mapping):
        raise GenieBuildError(where, f"must be a mapping of keys to values, got {reprlib.repr(config)}")
    _check_plain_data(config, where, ())
    filled = copy.deepcopy(dict(config))
    filler, checker = _validators(os.fspath(schema_path))
    # Fill first, judge after: a "required" checked before its sibling "properties" would miss the defaults.
    for _ in filler.iter_errors(filled):
        pass
    error = best_match(checker.iter_errors(filled))
    if error is not None:
        raise _schema_error(error, where)
    _check_cross_fields(filled, where)
    return filled


# ---------------------------------------------------------------------------------------------- the schema

def _fill_defaults(validator_class: type) -> type:
    """A validator class that sets each missing property to a copy of its schema ``default`` before checking
    the object (the jsonschema FAQ recipe, as Snakemake's ``validate`` does), and reads a string given where
    the schema wants a number or a boolean as YAML: ``snakemake --config demo='{layers: 24}'`` passes ``'24'``."""
    check_properties = validator_class.VALIDATORS["properties"]

    def properties_with_defaults(validator, properties: dict, instance: Any, schema: dict) -> Iterator:
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if "default" in subschema and name not in instance:
                    instance[name] = copy.deepcopy(subschema["default"])
                elif isinstance(instance.get(name), str):
                    instance[name] = _scalar_from_text(instance[name], subschema)
                elif isinstance(instance.get(name), list) and "items" in subschema:  # demo='{context: [128, 256]}'
                    instance[name] = [_scalar_from_text(item, subschema["items"]) if isinstance(item, str) else item
                                      for item in instance[name]]
        yield from check_properties(validator, properties, instance, schema)

    return validators.extend(validator_class, {"properties": properties_with_defaults})


def _integers_are_ints(checker: Any, instance: Any) -> bool:
    """JSON Schema's "integer" without the floats it also admits (``256.0``): the workflow passes a config value on
    as it reads it, and ``256.0`` would name graphs ``cl256.0`` and meet ``int`` options as text."""
    return isinstance(instance, int) and not isinstance(instance, bool)


# Draft 2020-12 with "integer" meaning a whole number written as one: every integer key of the schema refuses 256.0.
StrictValidator = validators.extend(
    Draft202012Validator, type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _integers_are_ints))
_DefaultFillingValidator = _fill_defaults(StrictValidator)

_SCALAR_TYPES = {"integer": int, "number": (int, float), "boolean": bool}


def _scalar_from_text(text: str, schema: dict) -> Any:
    """``text`` as the number or boolean ``schema`` asks for, when it reads as one; otherwise unchanged."""
    wanted = schema.get("type", [])
    wanted = [wanted] if isinstance(wanted, str) else wanted
    # a key that also takes a string (split.num_parts: a count or "auto") still reads "4" as the count
    if not any(kind in _SCALAR_TYPES for kind in wanted):
        return text
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    matches = any(isinstance(value, _SCALAR_TYPES[kind]) and not (kind != "boolean" and isinstance(value, bool))
                  for kind in wanted if kind in _SCALAR_TYPES)
    return value if matches else text


@cache
def read_schema(schema_path: str | os.PathLike[str] = DEFAULT_SCHEMA) -> dict:
    """The config schema (YAML), read once per process.

    Raises:
        GenieBuildError: the file cannot be read or is not YAML.
    """
    try:
        return yaml.load(Path(schema_path).read_text(encoding="utf-8"), Loader=_SCHEMA_LOADER)
    except (OSError, yaml.YAMLError) as exc:
        raise GenieBuildError(schema_path, f"cannot read the config schema: {exc}") from None


@cache
def _validators(schema_path: str) -> tuple[Draft202012Validator, Draft202012Validator]:
    """The default-filling validator and the plain one for the schema at ``schema_path``."""
    schema = read_schema(schema_path)
    return _DefaultFillingValidator(schema), StrictValidator(schema)


def _schema_error(error: ValidationError, where: str) -> GenieBuildError:
    """One line for a schema violation: the dotted key, and the problem (unknown keys listed by name)."""
    path = tuple(error.absolute_path)
    known = list(error.schema.get("properties", {})) if isinstance(error.schema, dict) else []
    unknown = sorted(set(error.instance) - set(known)) if isinstance(error.instance, dict) else []
    if error.validator == "additionalProperties" and unknown:
        also = f"; also unknown: {', '.join(unknown[1:])}" if len(unknown) > 1 else ""
        return GenieBuildError(_key(where, (*path, unknown[0])),
                               f"unknown key (known: {', '.join(known)}){also}")
    problem = error.message
    if error.validator == "type" and isinstance(error.instance, float) and error.instance.is_integer():
        problem = f"{error.instance!r} is not an integer (write {int(error.instance)})"
    if error.validator == "pattern" and "description" in error.schema:
        problem += f" ({error.schema['description']})"
    return GenieBuildError(_key(where, path), problem)


# ---------------------------------------------------------------------------------------------- beyond the schema

def _check_plain_data(value: Any, where: str, path: tuple, seen: frozenset[int] = frozenset(),
                      budget: list[int] | None = None) -> None:
    """Refuse what YAML can build but the schema cannot judge: non-string keys (``1:``, ``null:``, ``on:``),
    NaN or infinite numbers (``.nan``, ``.inf`` pass every bound), aliases that contain themselves, and more than
    :data:`MAX_CONFIG_VALUES` values once aliases are expanded (a few lines of nested aliases stand for billions,
    which every later check would walk)."""
    budget = [MAX_CONFIG_VALUES] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        raise GenieBuildError(where, f"holds more than {MAX_CONFIG_VALUES} values once its YAML aliases are expanded")
    if isinstance(value, float) and not math.isfinite(value):
        raise GenieBuildError(_key(where, path), f"{value} is not a finite number")
    if not isinstance(value, (Mapping, list, tuple)):
        return
    if id(value) in seen:
        raise GenieBuildError(_key(where, path), "refers to itself (a YAML alias inside its own anchor)")
    seen = seen | {id(value)}
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise GenieBuildError(_key(where, (*path, str(key))), f"key {key!r} is not a string; quote it")
            _check_plain_data(item, where, (*path, key), seen, budget)
    else:
        for index, item in enumerate(value):
            _check_plain_data(item, where, (*path, index), seen, budget)


# The model keys of a user's own export, which a Hugging Face checkpoint to export replaces.
USER_EXPORT_KEYS = ("prompt_onnx", "token_onnx", "encodings", "tokenizer", "hf_config")
SourceKind = Literal["demo", "files", "hf", "estimate"]
DemoCalibrator = Literal["builtin", "aimet"]  # demo.calibrator: genie_build.quantize.calibrate, or the chain


def source_kind(config: Mapping[str, Any]) -> SourceKind:
    """Where a config's model comes from, named once for the validator and the workflow (``workflow/rules/``).

    ``files``: the user's own graphs (``model.prompt_onnx`` and the paths it requires); ``hf``: a Hugging Face
    checkpoint the workflow exports part by part (``model.hf_checkpoint``); ``estimate``: an HF ``config.json``
    alone (``model.hf_config`` without graphs), which builds the shape-only estimate and nothing else; ``demo``:
    no model files, the generated demo.

    Args:
        config: a validated config (:func:`validate_config`), or any mapping with a ``model`` mapping.
    """
    model = config["model"]
    if "prompt_onnx" in model:
        return "files"
    if "hf_checkpoint" in model:
        return "hf"
    return "estimate" if "hf_config" in model else "demo"


def calibration_chain(config: Mapping[str, Any]) -> bool:
    """Whether the graphs' encodings are made by the calibration chain (aimet-onnx, one unit of one part at a
    time: ``workflow/rules/calibrate.smk``) because no source brings them: a checkpoint's, float graphs' without
    ``model.encodings``, the demo's with ``demo.calibrator: aimet``.

    Args:
        config: a validated config (:func:`validate_config`): ``demo.calibrator`` filled in.
    """
    kind = source_kind(config)
    calibrator: DemoCalibrator = config["demo"]["calibrator"]
    return (kind == "hf" or (kind == "files" and "encodings" not in config["model"])
            or (kind == "demo" and calibrator == "aimet"))


def context_lengths(section: Mapping[str, Any]) -> tuple[int, ...]:
    """The context lengths of a ``demo`` or ``export`` section, ascending: its ``context``, one or a list. The graphs
    at the largest are the ones calibrated, evaluated and split by the plan; those at the others share their weights
    and encodings (docs/context-lengths.md)."""
    context = section["context"]
    return tuple(sorted(context)) if isinstance(context, list) else (context,)


def bundle_config(config: Mapping[str, Any]) -> dict:
    """What of a validated config a Genie bundle is made from, as its manifest records it (and what reruns the bundle
    when it changes): the model and its encodings, the source's own section (``demo`` or ``export``, their context
    lengths ascending), the chipset, the split (and the load model it is planned by when ``auto``), the bundle's
    variant, the bundle section less the host run's and Genie's run's keys, and ``quantize`` less its memory budget
    in a build that calibrates. Not the other variants, the report, the evaluation, the converts' ``keep``, the estimate's
    ``precision``, nor a section the source does not read."""
    kind, variant = source_kind(config), config["bundle"]["variant"]
    used: dict[str, Any] = {
        "model": config["model"], "encodings": config["encodings"], "target": config["target"],
        "split": config["split"], "variants": {variant: config["variants"][variant]},
        "bundle": {key: value for key, value in config["bundle"].items()
                   if key not in ("host_run", "host_prompt", "genie_run")}}
    for section, source in (("demo", "demo"), ("export", "hf")):
        if kind == source:
            used[section] = {**config[section], "context": list(context_lengths(config[section]))}
    if config["split"].get("num_parts") == "auto":
        used["report"] = {"load": config["report"]["load"]}
    if calibration_chain(config):
        used["quantize"] = {key: value for key, value in config["quantize"].items() if key != "unit_memory_mb"}
    return used


DEFAULT_NUM_PARTS = 6
# quantize.num_samples unset: the windows that hold this many tokens of the prompt graph's AR (docs/quantize.md, "The
# default, chosen by measurement": fewer let a trained model's held-out activations pass their grids)
DEFAULT_CALIBRATION_TOKENS = 2048


def calibration_windows(quantize: Mapping[str, Any], ar: int) -> int:
    """The calibration windows of a validated ``quantize`` section for a prompt graph of AR ``ar``: its
    ``num_samples``, else as many as hold :data:`DEFAULT_CALIBRATION_TOKENS` tokens."""
    return quantize["num_samples"] or -(-DEFAULT_CALIBRATION_TOKENS // ar)


def _check_cross_fields(config: dict, where: str) -> None:
    split = config["split"]
    if "num_parts" not in split and split.get("max_part_mb") is None:
        # a checkpoint (or an estimate of one) splits by the load model; the demo and ONNX graphs as they always have
        split["num_parts"] = "auto" if source_kind(config) in ("hf", "estimate") else DEFAULT_NUM_PARTS
    check_split_request(split.get("num_parts"), split.get("max_part_mb"), _key(where, ("split",)))
    variants = config["variants"]
    for section, key in (("bundle", "variant"), ("report", "baseline_variant")):
        name = config[section][key]
        if name not in variants:
            raise GenieBuildError(_key(where, (section, key)),
                                  f"{name!r} is not one of the variants: {', '.join(variants)}")
    try:
        lookup(config["target"]["chipset"])
    except GenieBuildError as exc:
        raise GenieBuildError(_key(where, ("target", "chipset")), exc.problem) from None
    _fill_variant_recipes(config, where)
    if "precision" in config and calibration_chain(config):
        raise GenieBuildError(_key(where, ("precision",)),
                              "this build calibrates its encodings, so the estimate weighs the weights by "
                              f"quantize.recipe ({config['quantize']['recipe']}): unset precision, or choose another "
                              "recipe")
    given_with_checkpoint = sorted(set(USER_EXPORT_KEYS) & set(config["model"]))
    if "hf_checkpoint" in config["model"] and given_with_checkpoint:
        raise GenieBuildError(_key(where, ("model", "hf_checkpoint")),
                              f"a checkpoint to export is a source of its own: unset {', '.join(given_with_checkpoint)}"
                              " (its graphs, tokenizer and config.json come from the checkpoint)")
    if config["demo"]["calibrator"] == "aimet" and config["demo"]["weight_dtype"] != "float32":
        raise GenieBuildError(_key(where, ("demo", "weight_dtype")),
                              f"{config['demo']['weight_dtype']!r} with calibrator aimet: aimet-onnx quantizes "
                              "float32 weights only (a weight reaching its op through a Cast stays unquantized)")
    if BundleLayout(config["bundle"]["embedding"]).table:
        _check_embedding_table(config, where)
    if config["bundle"].get("graph_switching") is True and config["bundle"]["share_resources"]:
        # the HTP manual: graph switching "can not be used together with QNN_HTP_CONTEXT_CONFIG_OPTION_SHARE_RESOURCES"
        raise GenieBuildError(_key(where, ("bundle", "graph_switching")),
                              "true cannot go with bundle.share_resources: true (the HTP backend does not switch "
                              "graphs of contexts that share resources): unset one")
    _check_cache_lengths(config, where)
    if source_kind(config) == "demo":  # the demo is built: its sizes must make a model at every length
        for length in context_lengths(config["demo"]):
            try:
                DemoShape(**{**shape_config(config["demo"]), "context": length})
            except GenieBuildError as exc:  # where is "demo.<field>"
                raise GenieBuildError(f"{where} {exc.where}", exc.problem) from None
        _check_demo_kv_cache(config, where)
    _check_user_lengths(config["model"], where)


def _check_cache_lengths(config: dict, where: str) -> None:
    """The source's lengths (``demo`` or ``export``: the graphs genie-build makes) with a cache Genie reads: none twice
    the AR (:func:`genie_build.conventions.cache_length_problem`)."""
    section = {"demo": "demo", "hf": "export"}.get(source_kind(config))
    if section is None:
        return
    ar = config[section]["ar"]
    for length in context_lengths(config[section]):
        if (problem := cache_length_problem(ar, length)) is not None:
            raise GenieBuildError(_key(where, (section, "context")),
                                  f"{length} is twice {section}.ar {ar}: at that length {problem}; choose another "
                                  "length")


def _check_demo_kv_cache(config: dict, where: str) -> None:
    """One layer's KV cache at the demo's largest context length -- the least a context of its bundle holds, mapped
    on the HTP with the context -- fits one HTP session of the chipset's load model (``report.load`` applied): a
    length past that maps in no split, and the jobs would first hold the cache on the host (``demo.context:
    100000000`` is tens of GB a graph)."""
    demo = config["demo"]
    context, kv_width = max(context_lengths(demo)), demo["kv_heads"] * (demo["hidden"] // demo["heads"])
    layer_bytes = 2 * kv_width * (context - 1) * KV_BYTES
    load = load_params(config["target"]["chipset"], config["report"]["load"])
    if layer_bytes > load.usable_bytes:
        raise GenieBuildError(_key(where, ("demo", "context")),
                              f"{context}: one layer's KV cache at this length is {layer_bytes / GIB:,.1f} GiB "
                              f"(keys and values, {kv_width} wide, {KV_BYTES} byte a value), more than the "
                              f"{load.usable_bytes / MIB:,.0f} MiB of an HTP session under the load model of "
                              f"{config['target']['chipset']}: no part holding a layer would map; give a shorter "
                              "context")


def _check_user_lengths(model: Mapping[str, Any], where: str) -> None:
    """One prompt graph per token graph: a list of either pairs with a list of the other, one per length."""
    graphs = {key: model[key] for key in ("prompt_onnx", "token_onnx") if key in model}
    counts = {key: len(value) if isinstance(value, list) else 1 for key, value in graphs.items()}
    if len(set(counts.values())) > 1:
        raise GenieBuildError(_key(where, ("model", "token_onnx")),
                              "give as many token graphs as prompt graphs, one of each per context length (got "
                              + ", ".join(f"{key}: {n} path{'' if n == 1 else 's'}" for key, n in counts.items())
                              + ")")


def _check_embedding_table(config: dict, where: str) -> None:
    """``bundle.embedding: lut`` takes part 1 out of the bundle, so part 1 must be the embedding alone; and the
    first remaining part's input is renamed ``inputs_embeds`` by the converter (the reference and qnn-htp ones; the
    SDK converters do not rename graph inputs)."""
    if not config["split"].get("embedding_alone", True):
        raise GenieBuildError(_key(where, ("bundle", "embedding")),
                              "lut takes part 1 out of the bundle as a table, so part 1 must hold the embedding "
                              "alone: set split.embedding_alone: true")
    variant = config["bundle"]["variant"]
    if config["variants"][variant]["toolchain"] not in ("reference", "qnn-htp"):
        raise GenieBuildError(_key(where, ("bundle", "embedding")),
                              f"lut is built with the reference and qnn-htp toolchains only; variant {variant!r} uses "
                              f"{config['variants'][variant]['toolchain']!r} (use bundle.embedding: graph)")


def _fill_variant_recipes(config: dict, where: str) -> None:
    """Each variant's ``recipe``: ``quantize.recipe`` unless it names one, in a build that calibrates; None in a build
    whose encodings come with the source, which refuses one. Some variant must be of ``quantize.recipe``, the recipe
    the split is weighed and checked by."""
    variants, recipe = config["variants"], config["quantize"]["recipe"]
    if not calibration_chain(config):
        for name, variant in variants.items():
            if variant.get("recipe") is not None:
                raise GenieBuildError(_key(where, ("variants", name, "recipe")),
                                      "this build's encodings come with its source (model.encodings, or the demo's "
                                      "reference calibrator), so no recipe makes them: a variant names a recipe only "
                                      "when the build calibrates (a checkpoint, float graphs without model.encodings, "
                                      "demo.calibrator: aimet)")
            variant["recipe"] = None
        return
    for variant in variants.values():
        if variant.get("recipe") is None:
            variant["recipe"] = recipe
    if all(variant["recipe"] != recipe for variant in variants.values()):
        raise GenieBuildError(_key(where, ("quantize", "recipe")),
                              f"{recipe!r}, the recipe the split is weighed and checked by, is no variant's (theirs: "
                              f"{', '.join(sorted({variant['recipe'] for variant in variants.values()}))}): set it "
                              "to one of them")


# ---------------------------------------------------------------------------------------------- messages

def _key(where: str, path: tuple) -> str:
    """``config split.num_parts``; list items as ``split.boundaries[2]``; a key that is empty or holds other
    characters than letters, digits, '_' and '-' quoted (``variants.'a b'``); the whole config as ``config``."""
    dotted = ""
    for part in path:
        if is_json_int(part):
            dotted += f"[{part}]"
        else:
            dotted += f".{part}" if _PLAIN_KEY.fullmatch(str(part)) else f".{str(part)!r}"
    return f"{where} {dotted.removeprefix('.')}" if dotted else where


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem
