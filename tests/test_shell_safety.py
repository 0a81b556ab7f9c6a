"""Shell safety: every value a rule puts into a shell command is quoted, so paths with spaces, quotes, ``$``,
backticks or ``$(...)`` reach the commands as they are and never run anything.

Two checks: every ``{placeholder}`` in a ``shell:`` string of workflow/rules/*.smk is ``:q``-quoted or on an explicit
allowlist saying why it is safe; and a whole build in a working directory, and of a user model, whose paths hold
all of those characters.
"""

from __future__ import annotations

import ast
import io
import shutil
import string
import tokenize
from pathlib import Path

import onnx
import pytest

from bundle_helpers import build_reference_bundle
from workflow_helpers import REPO, copy_workflow, load_json, run_snakemake, write_config

# Placeholders allowed without ":q", and why each cannot carry a shell metacharacter.
UNQUOTED_ALLOWED = {
    "params.python": "shlex.quote()d interpreter path (common.smk PYTHON, python_for)",
    "params.context_size": "integer (schema), 0 when unset",
    "params.strict": "boolean (schema): True or False",
    "params.share_resources": "boolean (schema): True or False",
    "params.float_bitwidth": "integer: schema enum [16, 32], or the \\d+ of the converter wildcard",
    "params.vocab": "integer (schema)",
    "params.max_context_mb": "number (schema)",
    "params.max_session_mb": "number (schema)",
    "wildcards.part": r"constrained to \d+_of_\d+",
    "wildcards.unit": r"constrained to u\d+_of_\d+",
    "wildcards.variant": "constrained to the variant names, which the schema limits to [A-Za-z0-9_-]+",
}
# Shell metacharacters in every path of the user-model build: a missing quote either breaks the build or runs
# `touch PWNED`.
HOSTILE = """'single' "double" $HOME `touch PWNED` $(touch PWNED)"""


def shell_commands(smk: Path) -> list[tuple[int, str]]:
    """(line, command) of every ``shell:`` directive of ``smk``: its adjacent string literals joined."""
    tokens = list(tokenize.generate_tokens(io.StringIO(smk.read_text()).readline))
    skipped = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT}
    commands = []
    for index, token in enumerate(tokens[:-1]):
        if token.type == tokenize.NAME and token.string == "shell" and tokens[index + 1].string == ":":
            pieces, following = [], tokens[index + 2:]
            for item in following:
                if item.type == tokenize.STRING:
                    pieces.append(ast.literal_eval(item.string))
                elif item.type not in skipped:
                    break
            commands.append((token.start[0], "".join(pieces)))
    return commands


def unquoted_placeholders(command: str) -> list[str]:
    return [field for _, field, spec, _ in string.Formatter().parse(command) if field is not None and spec != "q"]


def test_every_rule_has_a_shell_command_we_can_read() -> None:
    commands = [command for smk in sorted((REPO / "workflow" / "rules").glob("*.smk"))
                for _, command in shell_commands(smk)]
    assert len(commands) >= 15 and all("genie_build" in c or "params.python" in c for c in commands)


def test_shell_placeholders_are_quoted_or_allowlisted() -> None:
    unsafe, used = [], set()
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for line, command in shell_commands(smk):
            for field in unquoted_placeholders(command):
                used.add(field)
                if field not in UNQUOTED_ALLOWED:
                    unsafe.append(f"{smk.name}:{line}: {{{field}}} is neither :q-quoted nor allowlisted")
    assert unsafe == []
    assert sorted(set(UNQUOTED_ALLOWED) - used) == [], "allowlist entries no rule uses any more: remove them"


def test_the_placeholder_reader_finds_an_unquoted_value(tmp_path: Path) -> None:
    smk = tmp_path / "x.smk"
    smk.write_text('rule x:\n    shell:\n        "{GB} run {input.a:q}"\n        " --name {params.name} > {log:q}"\n')
    assert [unquoted_placeholders(c) for _, c in shell_commands(smk)] == [["GB", "params.name"]]


def _save_with_hostile_names(source: Path, dest: Path, graph: str) -> str:
    """Save ``graph``'s ONNX under a hostile name with its weights in a hostile data file; returns the name."""
    name = f"{graph} {HOSTILE}.onnx"
    onnx.save(onnx.load(source / f"{graph}.onnx"), dest / name, save_as_external_data=True,
              location=f"{graph} weights {HOSTILE}.data")
    return name


@pytest.fixture(scope="module")
def hostile_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The whole workflow run in a directory, and on a user model, whose paths hold every character of HOSTILE."""
    base = tmp_path_factory.mktemp("shell")
    source = build_reference_bundle(base / "demo").source
    workdir = base / f"work {HOSTILE}"
    workdir.mkdir()
    copy_workflow(workdir)
    exports = Path("exports") / f"model {HOSTILE}"
    (workdir / exports).mkdir(parents=True)
    model = {"name": "hostile", "tokenizer": str(exports / f"tok {HOSTILE}.json"),
             "hf_config": str(exports / f"it's {HOSTILE}.json"), "encodings": {}}
    shutil.copy(source / "tokenizer.json", workdir / model["tokenizer"])
    shutil.copy(source / "config.json", workdir / model["hf_config"])
    for graph in ("prompt", "token"):
        model[f"{graph}_onnx"] = str(exports / _save_with_hostile_names(source, workdir / exports, graph))
        model["encodings"][graph] = str(exports / f"enc {graph} {HOSTILE}.json")
        shutil.copy(source / f"{graph}.encodings.json", workdir / model["encodings"][graph])
    config = write_config(workdir, {"model": model, "split": {"num_parts": 2}}, name=f"config {HOSTILE}.yaml")
    run_snakemake(workdir, config_file=config)
    return workdir, model


@pytest.mark.workflow
def test_build_with_hostile_paths_succeeds_and_runs_nothing(hostile_build: tuple[Path, dict]) -> None:
    workdir, _ = hostile_build
    out = workdir / "results" / "hostile"
    assert load_json(out / "bundle_check.json")["errors"] == 0
    # part 1, the embedding alone, is the qnn-htp bundle's CPU table
    assert sorted(p.name for p in (out / "genie_bundle").glob("*.bin")) == ["embedding_table.bin",
                                                                         "hostile_part_2_of_2.bin"]
    assert list(workdir.parent.rglob("PWNED")) == [] and not Path("PWNED").exists()


@pytest.mark.workflow
def test_hostile_values_reached_the_commands_unchanged(hostile_build: tuple[Path, dict]) -> None:
    """The config travels to the bundle command as one shell-quoted JSON argument; the manifest records what
    arrived, so any expansion or word splitting on the way would show here."""
    workdir, model = hostile_build
    manifest = load_json(workdir / "results" / "hostile" / "genie_bundle" / "manifest.json")
    assert manifest["config_used"]["model"] == model
