"""The config loader: schema defaults filled, every bad value one line naming its dotted key, and the same
validator in Snakemake (common.smk) as here."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from genie_build.config import (DEFAULT_CALIBRATION_TOKENS, DEFAULT_SCHEMA, MAX_CONFIG_VALUES, calibration_chain,
                                calibration_windows, load_config, read_schema, source_kind, validate_config)
from genie_build.errors import GenieBuildError

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
DEFAULT_VARIANTS = "reference, qnn-htp, qnn-htp-separate, qnn-htp-packing"
TOP_LEVEL_KEYS = ", ".join(yaml.safe_load(DEFAULT_SCHEMA.read_text())["properties"])


def changed(**edits: object) -> dict:
    """The default config with ``section__key=value`` edits (``key=value`` for a top-level key)."""
    config = copy.deepcopy(DEFAULT_CONFIG)
    for name, value in edits.items():
        section, _, key = name.partition("__")
        if key:
            config[section][key] = value
        else:
            config[section] = value
    return config


def error_of(config: object) -> str:
    with pytest.raises(GenieBuildError) as caught:
        validate_config(config)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_the_schema_reads_as_the_pure_python_yaml_loader_reads_it() -> None:
    """read_schema takes libyaml when PyYAML has it (faster at every Snakemake start); the schema must not differ."""
    assert read_schema() == yaml.load(DEFAULT_SCHEMA.read_text(), Loader=yaml.SafeLoader)
    assert read_schema() is read_schema()  # read once per process


def test_default_config_is_valid_and_gets_the_schema_defaults() -> None:
    original = copy.deepcopy(DEFAULT_CONFIG)
    config = validate_config(DEFAULT_CONFIG)
    assert DEFAULT_CONFIG == original, "the caller's dict must not be changed"
    assert config["variants"]["reference"] == {"toolchain": "reference", "weights_packing": True,
                                               "optimization_type": 3, "weight_sharing_enabled": True,
                                               "vtcm_mb": 0, "float_bitwidth": 16, "recipe": None}
    assert config["variants"]["qnn-htp"] == {**config["variants"]["reference"], "toolchain": "qnn-htp",
                                             "weights_packing": False}
    assert (config["bundle"]["variant"], config["bundle"]["embedding"]) == ("qnn-htp", "lut")
    assert config["report"]["baseline_variant"] == "reference"
    assert config["report"]["max_session_mb"] == 3840 and config["toolchains"] == {"qairt": {}}


def test_a_config_naming_only_its_variants_gets_every_other_section_from_the_defaults() -> None:
    config = validate_config({"variants": {"unpacked": {}, "packed": {"weights_packing": True}}})
    assert config["model"] == {"name": "demo"}
    assert config["target"] == {"chipset": "SM8750"}
    assert config["split"] == {"num_parts": 6, "embedding_alone": True}
    assert config["demo"]["layers"] == 8 and config["bundle"]["variant"] == "packed"


@pytest.mark.parametrize("bundle", [{"graph_switching": True}, {"graph_switching": False, "share_resources": True},
                                    {"share_resources": True}, {}])
def test_graph_switching_goes_with_anything_but_shared_resources(bundle: dict) -> None:
    assert validate_config(changed(bundle={**DEFAULT_CONFIG["bundle"], **bundle}))["bundle"].get("graph_switching") == bundle.get("graph_switching")


def test_defaults_are_copies_not_the_schemas_own_objects() -> None:
    first = validate_config({"variants": {"packed": {}, "unpacked": {}}})
    first["model"]["name"] = "changed"
    second = validate_config({"variants": {"packed": {}, "unpacked": {}}})
    assert second["model"]["name"] == "demo"


@pytest.mark.parametrize("config, expected", [
    (changed(split__num_parts="x"), "config split.num_parts: 'x' does not match '^auto$'"),
    (changed(split__num_parts=1), "config split.num_parts: 1 is less than the minimum of 2"),
    (changed(bogus_key=1), f"config bogus_key: unknown key (known: {TOP_LEVEL_KEYS})"),
    (changed(bogus_key=1, zz=2), f"config bogus_key: unknown key (known: {TOP_LEVEL_KEYS}); also unknown: zz"),
    (changed(variants={"packed": {"bogus": 1}, "unpacked": {}}),
     "config variants.packed.bogus: unknown key (known: toolchain, weights_packing, optimization_type, "
     "weight_sharing_enabled, vtcm_mb, float_bitwidth, recipe)"),
    (changed(split={"boundaries": ["a", 3]}), "config split.boundaries[1]: 3 is not of type 'string'"),
    (changed(variants={"a b": {}}), "config variants: 'a b' does not match '^[A-Za-z0-9_][A-Za-z0-9_-]*$'"),
    (changed(target__chipset="SM0000"), "config target.chipset: unknown chipset 'SM0000'; known: SM8550,"),
    (changed(bundle__variant="nope"), f"config bundle.variant: 'nope' is not one of the variants: {DEFAULT_VARIANTS}"),
    (changed(report__baseline_variant="nope"),
     f"config report.baseline_variant: 'nope' is not one of the variants: {DEFAULT_VARIANTS}"),
    (changed(split={"num_parts": None}), "config split: set exactly one of num_parts and max_part_mb (the other "
                                         "to null), got num_parts=None, max_part_mb=None"),
    (changed(split={"num_parts": 4, "max_part_mb": 10}), "config split: set exactly one of num_parts and "
                                                         "max_part_mb (the other to null), got num_parts=4"),
    (changed(split={"num_parts": None, "max_part_mb": float("nan")}),
     "config split.max_part_mb: nan is not a finite number"),
    (changed(report={"max_context_mb": float("inf")}), "config report.max_context_mb: inf is not a finite number"),
    (changed(demo__hidden=30), "config demo.hidden: 30 must split into 4 heads of even size"),
    (changed(demo__kv_heads=3), "config demo.kv_heads: 3 does not divide heads=4"),
    (changed(model={"name": "x", "prompt_onnx": "p.onnx"}), "config model: 'token_onnx' is a dependency of "
                                                            "'prompt_onnx'"),
    (changed(variants={1: {}}), "config variants.1: key 1 is not a string; quote it"),
    (changed(demo={"": 1}), "config demo.'': unknown key (known: layers,"),
    (changed(bundle__graph_switching=True, bundle__share_resources=True),
     "config bundle.graph_switching: true cannot go with bundle.share_resources: true (the HTP backend does not "
     "switch graphs of contexts that share resources): unset one"),
    (changed(bundle={"graph_switching": 3}), "config bundle.graph_switching: 3 is not of type 'boolean'"),
    (["model"], "config: must be a mapping of keys to values, got ['model']"),
    ({}, "config: 'variants' is a required property"),
])
def test_bad_values_are_one_line_naming_the_dotted_key(config: object, expected: str) -> None:
    assert error_of(config).startswith(expected)


@pytest.mark.parametrize("name", ["../x", "/abs", "a/b", "..", "", "a b", "x$y"])
def test_model_names_that_are_not_one_safe_folder_name_are_refused(name: str) -> None:
    message = error_of(changed(model={"name": name}))
    assert message.startswith(f"config model.name: {name!r} ")
    assert "cannot point outside results/" in message or "should be non-empty" in message


USER_PATHS = {"prompt_onnx": "p.onnx", "token_onnx": "t.onnx", "encodings": "e.json", "tokenizer": "tok.json",
              "hf_config": "c.json"}


@pytest.mark.parametrize(("config", "key", "value"), [
    ({"model": {"name": "-rf"}}, "model.name", "-rf"),
    ({"model": {"name": "ok", **USER_PATHS}, "variants": {"-v": {}}, "bundle": {"variant": "-v"}}, "variants", "-v"),
    *(({"model": {"name": "ok", **USER_PATHS, key: "-x"}}, f"model.{key}", "-x") for key in USER_PATHS),
    ({"model": {"name": "ok", **USER_PATHS, "encodings": {"prompt": "p.json", "token": "--token"}}},
     "model.encodings.token", "--token"),
    ({"model": {"name": "ok", "hf_checkpoint": "-ckpt"}}, "model.hf_checkpoint", "-ckpt"),
    ({"quantize": {"corpus": "-c.txt"}}, "quantize.corpus", "-c.txt"),
])
def test_names_and_paths_that_would_read_as_options_are_refused(config: dict, key: str, value: str) -> None:
    """A command would take '-rf' or a variant '-v' for an option and fail in argparse after the whole build."""
    sections = {section: ({**changed().get(section, {}), **body} if section != "variants" else body)
                for section, body in config.items()}
    message = error_of({**changed(), **sections})
    assert message.startswith(f"config {key}: {value!r} does not match ") and "option" in message, message


def test_demo_sizes_are_not_checked_for_a_user_model() -> None:
    paths = {"prompt_onnx": "p.onnx", "token_onnx": "t.onnx", "encodings": "e.json", "tokenizer": "tok.json",
             "hf_config": "c.json"}
    config = changed(model={"name": "mine", **paths}, demo__hidden=30)
    assert validate_config(config)["model"]["prompt_onnx"] == "p.onnx"


def test_the_caller_names_the_config_in_errors() -> None:
    with pytest.raises(GenieBuildError, match=r"^my\.yaml target\.chipset: unknown chipset"):
        validate_config(changed(target__chipset="nope"), where="my.yaml")


def test_load_config_reads_and_validates_a_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("variants: {a: {}}\nbundle: {variant: a}\nreport: {baseline_variant: a}\n")
    config = load_config(path)
    assert config["variants"]["a"]["toolchain"] == "reference" and config["split"]["num_parts"] == 6
    path.write_text("variants: {a: {}}\nbundle: {variant: b}\n")
    with pytest.raises(GenieBuildError, match=rf"^{re.escape(str(path))} bundle\.variant: 'b' is not one"):
        load_config(path)


@pytest.mark.parametrize("text, problem", [
    ("split: {num_parts: 3\n", r"not valid YAML: .* at line 2, column 1"),
    ("variants:\n  a: {}\n b: 1\n", r"not valid YAML: .* at line 3, column 2"),
    ("", r"'variants' is a required property"),
    ("on: 1\nvariants: {a: {}}\n", r"key True is not a string; quote it"),
    ("split: {boundaries: &b [x, *b]}\nvariants: {a: {}}\n", r"split\.boundaries\[1\]: refers to itself"),
    ("- a\n- b\n", r"must be a mapping of keys to values, got \['a', 'b'\]"),
    ("\udcff", r"not UTF-8 text"),
])
def test_load_config_names_the_file_for_unreadable_yaml(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(GenieBuildError) as caught:
        load_config(path)
    assert str(caught.value).startswith(str(path))
    assert re.search(problem, str(caught.value)) and "\n" not in str(caught.value)


def test_load_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(GenieBuildError, match="missing.yaml: file not found$"):
        load_config(tmp_path / "missing.yaml")


def test_a_copied_workflow_can_bring_its_own_schema(tmp_path: Path) -> None:
    schema = yaml.safe_load(DEFAULT_SCHEMA.read_text())
    schema["properties"]["target"]["properties"]["chipset"]["default"] = "SM8650"
    schema["properties"]["target"]["default"] = {"chipset": "SM8650"}
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    config = validate_config({"variants": {"packed": {}, "unpacked": {}}}, schema_path=tmp_path / "schema.yaml")
    assert config["target"]["chipset"] == "SM8650"
    with pytest.raises(GenieBuildError, match="nothing.yaml: cannot read the config schema"):
        validate_config(DEFAULT_CONFIG, schema_path=tmp_path / "nothing.yaml")


def test_snakemake_validates_with_this_function() -> None:
    """common.smk must call validate_config (one validator for the workflow and the tests), not Snakemake's
    validate followed by its own cross-key checks."""
    common = (REPO / "workflow" / "rules" / "common.smk").read_text()
    assert "validate_config(config" in common
    assert "snakemake.utils import validate" not in common


def test_numbers_and_booleans_given_as_text_are_read_as_the_schema_asks():
    """``snakemake --config demo='{layers: 24}'`` hands the validator strings."""
    default = yaml.safe_load((REPO / "config" / "config.yaml").read_text())

    def with_changes(**sections):
        config = copy.deepcopy(default)
        for section, values in sections.items():
            config[section].update(values)
        return config

    config = validate_config(with_changes(demo={"layers": "24", "seed": "3"}, split={"num_parts": "4"},
                                          report={"strict": "true", "max_context_mb": "1024.5"}))
    assert (config["demo"]["layers"], config["demo"]["seed"], config["split"]["num_parts"]) == (24, 3, 4)
    assert config["report"]["strict"] is True and config["report"]["max_context_mb"] == 1024.5
    with pytest.raises(GenieBuildError, match=r"config demo.layers: 'x24' is not of type 'integer'"):
        validate_config(with_changes(demo={"layers": "x24"}))
    with pytest.raises(GenieBuildError, match=r"config demo.layers: 'true' is not of type 'integer'"):
        validate_config(with_changes(demo={"layers": "true"}))
    assert validate_config(with_changes(model={"name": "123"}))["model"]["name"] == "123"  # stays a string


def test_a_variants_options_are_compile_options_fields() -> None:
    """A variant is defined once, as CompileOptions' fields (toolchains/base.py); the schema must offer exactly
    those options, each with the JSON type of its field, besides the toolchain and the recipe."""
    from genie_build.toolchains.base import VARIANT_SOURCE_KEYS, variant_options

    schema = yaml.safe_load(DEFAULT_SCHEMA.read_text())
    properties = schema["properties"]["variants"]["additionalProperties"]["properties"]
    json_types = {bool: "boolean", int: "integer"}
    assert {name: spec["type"] for name, spec in properties.items() if name not in VARIANT_SOURCE_KEYS} == \
        {name: json_types[kind] for name, kind in variant_options().items()}


def test_a_checkpoint_to_export_gets_the_export_defaults_and_excludes_the_user_paths() -> None:
    config = validate_config(changed(model={"name": "qwen", "hf_checkpoint": "checkpoints/qwen2.5-0.5b"}))
    assert config["export"] == {"ar": 128, "context": 4096}
    message = error_of(changed(model={"name": "qwen", "hf_checkpoint": "ck", "hf_config": "ck/config.json"}))
    assert message.startswith("config model.hf_checkpoint: ") and "unset hf_config" in message
    assert error_of(changed(export={"ar": 0})).startswith("config export.ar")


def test_a_config_of_nested_yaml_aliases_is_refused_before_anything_walks_it() -> None:
    """Nine lines of aliases stand for a billion values: refused in one line, not walked."""
    text = "a0: &a0 [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)) + "split: {boundaries: *a8}\n"
    config = {**changed(), **{key: value for key, value in yaml.safe_load(text).items() if key == "split"}}
    assert error_of(config) == f"config: holds more than {MAX_CONFIG_VALUES} values once its YAML aliases are expanded"


@pytest.mark.parametrize("model, demo, kind, chain", [
    ({"name": "m"}, {}, "demo", False),
    ({"name": "m"}, {"calibrator": "aimet"}, "demo", True),
    ({"name": "m", "hf_checkpoint": "ck"}, {}, "hf", True),
    ({"name": "m", "hf_config": "c.json"}, {}, "estimate", False),
    ({"name": "m", **USER_PATHS}, {}, "files", False),
    ({"name": "m", **{key: value for key, value in USER_PATHS.items() if key != "encodings"}}, {}, "files", True),
])
def test_the_source_kind_and_the_calibration_chain_are_named_once(model, demo, kind, chain) -> None:
    config = validate_config(changed(model=model, demo=demo))
    assert (source_kind(config), calibration_chain(config)) == (kind, chain)


def test_an_estimate_only_config_is_not_held_to_the_demos_shape() -> None:
    """Nothing builds the demo for an estimate-only config; the demo is held to its shape when it is built."""
    odd_demo = {"hidden": 250}
    assert error_of(changed(demo=odd_demo)).startswith("config demo.hidden")
    validate_config(changed(model={"name": "m", "hf_config": "c.json"}, demo=odd_demo))


def test_no_rule_file_decides_the_source_kind_from_the_model_keys() -> None:
    """The workflow asks the source object (genie_build.sources, which asks genie_build.config.source_kind, as the
    validator does)."""
    files = [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]
    guessed = [f"{path.name}:{number}" for path in files
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if re.search(r'"(prompt_onnx|hf_checkpoint|hf_config|encodings)" (not )?in config\["model"\]', line)]
    assert guessed == []
    assert "SOURCE = source_of(config, RUN_MEMORY)" in (REPO / "workflow" / "rules" / "common.smk").read_text()


def test_a_variant_names_its_recipe_only_in_a_build_that_calibrates() -> None:
    """A calibrating build fills each variant's recipe with quantize.recipe, which some variant must have (the split
    is weighed and checked by it); a build whose encodings come with its source has no recipe to name."""
    calibrating = {**DEFAULT_CONFIG, "demo": {**DEFAULT_CONFIG["demo"], "calibrator": "aimet"},
                   "variants": {"reference": {}, "qnn-htp": {"toolchain": "qnn-htp"},
                                "w8": {"toolchain": "qnn-htp", "recipe": "w8a16"}}}
    recipes = {name: variant["recipe"] for name, variant in validate_config(calibrating)["variants"].items()}
    assert recipes == {"reference": "w4a16", "qnn-htp": "w4a16", "w8": "w8a16"}
    with pytest.raises(GenieBuildError, match=r"^config quantize.recipe: 'w4a16', the recipe the split is weighed and "
                                              r"checked by, is no variant's \(theirs: w8a16\)"):
        validate_config({**calibrating, "variants": {"reference": {"recipe": "w8a16"},
                                                     "qnn-htp": {"toolchain": "qnn-htp", "recipe": "w8a16"}}})
    with pytest.raises(GenieBuildError, match=r"^config variants.w8.recipe: this build's encodings come with its "
                                              r"source"):
        validate_config({**DEFAULT_CONFIG, "variants": calibrating["variants"]})
    assert all(variant["recipe"] is None for variant in validate_config(DEFAULT_CONFIG)["variants"].values())
    with pytest.raises(GenieBuildError, match=r"^config variants.qnn-htp.recipe: 'w2a16' is not one of"):
        validate_config({**calibrating, "variants": {"reference": {}, "qnn-htp": {"toolchain": "qnn-htp",
                                                                                  "recipe": "w2a16"}}})


def _resolved(schema: dict, node: dict) -> dict:
    """``node`` with its ``$ref`` (into the schema's ``$defs``) followed."""
    while "$ref" in node:
        node = {**schema["$defs"][node["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _types(node: dict) -> list[str]:
    kinds = node.get("type", [])
    return [kinds] if isinstance(kinds, str) else list(kinds)


def _valid(schema: dict, node: dict) -> object:
    """A value ``node`` accepts: its default, its first enum value, or one built from its type."""
    node = _resolved(schema, node)
    if node.get("default") is not None:
        return copy.deepcopy(node["default"])
    if "enum" in node:
        return next(value for value in node["enum"] if value is not None)
    if "oneOf" in node:
        return _valid(schema, node["oneOf"][0])
    kinds = _types(node)
    if "integer" in kinds:
        return max(node.get("minimum", 1), 2)
    if "object" in kinds:
        return {key: _valid(schema, node["properties"][key]) for key in node.get("required", [])}
    if "array" in kinds:
        return [_valid(schema, node["items"])]
    return "x" if "string" in kinds else 1.5


def _integer_keys(schema: dict, node: dict, path: tuple = (), value: object = None) -> list[tuple[tuple, object]]:
    """Every key whose schema takes an integer, as (path, a valid integer): list items at index 0 (the list's default
    when it is one integer), the one variant ``packed``, precision overrides' first rule."""
    node = _resolved(schema, node)
    found = [(path, _valid(schema, node) if value is None else value)] if "integer" in _types(node) else []
    for key, child in node.get("properties", {}).items():
        found += _integer_keys(schema, child, (*path, key))
    if isinstance(node.get("additionalProperties"), dict):
        found += _integer_keys(schema, node["additionalProperties"], (*path, "packed"))
    if isinstance(node.get("items"), dict):
        default = node.get("default")
        found += _integer_keys(schema, node["items"], (*path, 0), default if isinstance(default, int) else None)
    return found


SCHEMA = read_schema()
INTEGER_KEYS = _integer_keys(SCHEMA, SCHEMA)


def _with_value(path: tuple, value: object) -> dict:
    """The default config with ``value`` at ``path``, the objects and lists on the way made valid."""
    config = copy.deepcopy(DEFAULT_CONFIG)
    node, schema = config, SCHEMA
    for step, key in enumerate(path):
        schema = _resolved(SCHEMA, schema)
        child = (schema["items"] if isinstance(key, int) else
                 schema.get("properties", {}).get(key) or schema["additionalProperties"])
        if step == len(path) - 1:
            node[key] = value
        else:
            if isinstance(key, int) or key not in node or not isinstance(node[key], (dict, list)):
                made = _valid(SCHEMA, child)
                if isinstance(key, int):
                    node[:] = [made]
                else:
                    node[key] = made if isinstance(made, (dict, list)) else ([made] if "array" in _types(
                        _resolved(SCHEMA, child)) else {})
            node = node[key]
        schema = child
    return config


def test_the_walk_finds_the_integer_keys_of_every_section() -> None:
    paths = {".".join(map(str, path)) for path, _ in INTEGER_KEYS}
    assert {"demo.context", "demo.context.0", "export.context.0", "split.num_parts", "bundle.context_size",
            "variants.packed.optimization_type", "report.load.sessions", "precision.layers",
            "precision.overrides.0.bitwidth", "quantize.num_samples", "evaluate.max_windows"} <= paths, paths


@pytest.mark.parametrize("path, integer", INTEGER_KEYS, ids=[".".join(map(str, path)) for path, _ in INTEGER_KEYS])
def test_every_integer_key_refuses_a_float_in_one_line_and_takes_the_integer(path: tuple, integer: int) -> None:
    """An integral float (``256.0``) where the schema asks for an integer is refused at parse, naming the key; the
    integer itself passes, so the refusal is the float's."""
    validate_config(_with_value(path, integer))
    message = error_of(_with_value(path, float(integer)))
    dotted = re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", ".".join(map(str, path)))
    assert f"config {dotted}: {float(integer)!r} is not an integer (write {integer})" in message, message


@pytest.mark.parametrize("num_samples, ar, windows", [(None, 128, 16), (None, 32, 64), (None, 96, 22), (8, 128, 8)])
def test_the_calibration_windows_hold_the_default_tokens_unless_num_samples_says(num_samples, ar, windows):
    """quantize.num_samples unset: the windows that hold DEFAULT_CALIBRATION_TOKENS of the prompt graph's AR (rounded
    up); set, it is the count."""
    quantize = validate_config({**DEFAULT_CONFIG, "quantize": {"num_samples": num_samples}})["quantize"]
    assert calibration_windows(quantize, ar) == windows
    assert DEFAULT_CALIBRATION_TOKENS == 2048
