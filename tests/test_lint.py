"""``snakemake --lint`` on the workflow: no lint but the one this workflow accepts (docs/snakemake.md, "Lint").

The rules run the project venv's interpreter, not a conda env or container (QAIRT and the package come from
pip, and envs/core.yaml cannot be deployed by Snakemake's ``conda:``), so "Specify a conda environment or
container for each rule" is the one lint left; any other lint fails this test.

And the workflow's own rule (docs/snakemake.md, "Values, not command lines"): a rule's command line is written in its
``shell:``; an option only some builds have comes from the rule's one ``<rule>_extra`` function."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from workflow_helpers import REPO, copy_workflow, run_snakemake

ACCEPTED = {"Specify a conda environment or container for each rule."}


def test_snakemake_lint_reports_nothing_but_the_accepted_lint(tmp_path) -> None:
    workdir = copy_workflow(tmp_path)
    result = run_snakemake(workdir, "--lint", check=False, timeout=300)
    output = result.stdout + result.stderr
    titles = re.findall(r"^\s+\* (.+?):$", output, re.MULTILINE)
    assert titles, output[-3000:]  # the accepted lint is there, so the linter did run
    assert set(titles) <= ACCEPTED, sorted(set(titles) - ACCEPTED)


def options_outside_shell(smk: Path) -> list[tuple[int, str]]:
    """(line, top-level statement) of every string literal in ``smk`` that starts a command option (``"--x"``,
    ``f"--{x}"``) outside a ``shell:`` directive; the statement is the line at column 0 that holds it."""
    text = smk.read_text()
    lines = text.splitlines()
    skipped = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT}
    found, in_shell, previous = [], False, None
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if previous is not None and previous.string == "shell" and token.string == ":":
            in_shell = True
        elif token.type != tokenize.STRING and token.type not in skipped and token.string != ":":
            in_shell = False
        option = token.type == tokenize.STRING and token.string.lstrip("rfbRFB").strip("\"'").startswith("--")
        if option and not in_shell:
            line = token.start[0]
            owner = next(lines[index] for index in range(line - 1, -1, -1)
                         if lines[index][:1] not in ("", " ", "\t", "#", ")", "]", "}"))
            found.append((line, owner))
        if token.type not in skipped:
            previous = token
    return found


def test_rules_pass_values_and_build_options_only_in_their_extra_functions() -> None:
    rule_files = [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]
    outside = [f"{smk.name}:{line}: {owner}" for smk in rule_files
               for line, owner in options_outside_shell(smk) if not re.match(r"def \w+_extra\(", owner)]
    assert outside == [], "options built outside a shell: command and a <rule>_extra function"


def test_the_option_reader_finds_a_flag_list_in_params(tmp_path: Path) -> None:
    smk = tmp_path / "x.smk"
    smk.write_text('def x_extra(wildcards):\n    return ["--a"]\n\n\nrule x:\n    params:\n'
                   '        b=lambda wc: ["--b"] if wc else [],\n    shell:\n        "run --c {params.b:q}"\n')
    assert options_outside_shell(smk) == [(2, "def x_extra(wildcards):"), (7, "rule x:")]


def config_read_beside_the_jobs_files(smk: Path) -> list[str]:
    """Param functions of ``smk`` that take the job's ``input`` or ``output`` and read ``config``: Snakemake does not
    compare such params with the last run's (measured with Snakemake 9), so a changed config value would not rerun
    the job."""
    found = []
    for match in re.finditer(r"^def (\w+)\(wildcards, (?:input|output)[^)]*\):\n((?:(?: .*)?\n)+)", smk.read_text(),
                             re.M):
        if re.search(r"\bconfig\b", match.group(2)):
            found.append(match.group(1))
    return found


def test_a_param_that_reads_the_config_is_of_the_wildcards_only() -> None:
    assert [(smk.name, name) for smk in sorted((REPO / "workflow" / "rules").glob("*.smk"))
            for name in config_read_beside_the_jobs_files(smk)] == []


def test_the_config_reader_finds_a_param_function_of_the_input_reading_the_config(tmp_path: Path) -> None:
    smk = tmp_path / "x.smk"
    smk.write_text('def x_extra(wildcards, input):\n    return [config["a"], input.b]\n\n\ndef y_extra(wildcards):\n'
                   '    return [config["a"]]\n')
    assert config_read_beside_the_jobs_files(smk) == ["x_extra"]
