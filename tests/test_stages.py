"""docs/stages.md is the map of the stages: every rule has its row, and every rule, command, module and test file a
row names exists; a rule runs the command its row names."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from genie_build.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
STAGES = REPO / "docs" / "stages.md"
RULE_FILES = [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]
RULE = re.compile(r"^[ \t]*(?:rule|checkpoint)[ \t]+(\w+)[ \t]*:", re.MULTILINE)
# the command a rule's shell runs: `{params.python} -m genie_build [--benchmark X] <command>`
COMMAND = re.compile(r"-m genie_build (?:--benchmark \S+ )?([a-z][a-z-]*)")
NONE = "—"


def rule_commands() -> dict[str, str | None]:
    """Every rule of the workflow -> the genie_build command its shell runs (None: a target without a shell). A rule
    written once per source kind (in files the Snakefile includes for that kind only) runs one command."""
    rules: dict[str, str | None] = {}
    for path in RULE_FILES:
        text = path.read_text()
        starts = list(RULE.finditer(text))
        for start, end in zip(starts, [*starts[1:], None]):
            found = COMMAND.search(text[start.end():end.start() if end else len(text)])
            command = found.group(1) if found else None
            assert rules.setdefault(start.group(1), command) == command, f"rule {start.group(1)} runs two commands"
    return rules


def table(heading: str) -> list[list[str]]:
    """The cells of the table under ``## heading`` in docs/stages.md, header and rule lines left out."""
    section = STAGES.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]


def names(cell: str) -> list[str]:
    """The names in a cell: `a`, `b` -> [a, b]; the dash -> []."""
    return [] if cell == NONE else re.findall(r"`([^`]+)`", cell)


def commands() -> set[str]:
    return set(build_parser()._subparsers._group_actions[0].choices)


def module_exists(name: str) -> bool:
    path = REPO / "workflow" / "genie_build" / Path(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_rule_has_its_row_and_every_row_its_rule():
    rows = [names(row[0])[0] for row in table("The map")]
    assert len(rows) == len(set(rows)), "a rule has two rows"
    rules = rule_commands()
    assert sorted(set(rules) - set(rows)) == [], "rules without a row in docs/stages.md"
    assert sorted(set(rows) - set(rules)) == [], "rows naming no rule of the workflow"


def test_each_row_names_the_command_its_rule_runs():
    rules = rule_commands()
    wrong = {rule: (rules[rule], command) for rule, command in
             ((names(row[0])[0], (names(row[1]) or [None])[0]) for row in table("The map"))
             if rule in rules and rules[rule] != command}
    assert wrong == {}, "rule: (command it runs, command its row names)"


@pytest.mark.parametrize("heading, columns", [("The map", (1, 2, 3)), ("Commands without a rule", (0, 1, 2))])
def test_every_command_module_and_test_file_a_row_names_exists(heading, columns):
    known = commands()
    command, module, tests = columns
    missing = []
    for row in table(heading):
        missing += [f"command {name}" for name in names(row[command]) if name not in known]
        missing += [f"module {name}" for name in names(row[module]) if not module_exists(name)]
        missing += [f"test file {name}" for name in names(row[tests]) if not (REPO / "tests" / name).is_file()]
    assert missing == []


def test_every_command_is_on_the_map():
    mapped = {name for row in table("The map") for name in names(row[1])}
    mapped |= {name for row in table("Commands without a rule") for name in names(row[0])}
    assert sorted(commands() - mapped) == []


def test_the_rows_are_short():
    assert [line[:40] for line in STAGES.read_text().splitlines() if len(line) > 250] == []


def test_the_rule_parser_sees_a_rule_missing_from_the_map(tmp_path, monkeypatch):
    """The check above can fail: a rule file with one more rule is reported."""
    extra = tmp_path / "extra.smk"
    extra.write_text('rule made_up_stage:\n    shell:\n        "{params.python} -m genie_build split"\n')
    monkeypatch.setattr(sys.modules[__name__], "RULE_FILES", [*RULE_FILES, extra])
    with pytest.raises(AssertionError, match="made_up_stage"):
        test_every_rule_has_its_row_and_every_row_its_rule()
