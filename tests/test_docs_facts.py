"""What README.md and docs/architecture.md state about the code, checked on the code: the
commands, options, settings and environment variables they name exist; the folder listing and
the layer diagram are the package's; the quick start is what CI runs; the exit codes are
stated once.  (Dotted names of our code are checked by tests/test_docs_names.py.)"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from data_juicer_elastic.cli import build_parser
from data_juicer_elastic.settings import ElasticSettings
from tests.test_architecture import LAYERS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "data_juicer_elastic"
README = (ROOT / "README.md").read_text()
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section (up to the next heading of that level or higher)."""
    level = heading.split(" ")[0]
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    following = re.search(rf"\n#{{1,{len(level)}}} ", text[start:])
    return text[start : start + following.start()] if following else text[start:]


def code_blocks(text: str, language: str = "") -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def subcommands() -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def module_names() -> set[str]:
    return {p.stem for p in PACKAGE.rglob("*.py")} | {p.parent.name for p in PACKAGE.glob("*/__init__.py")}


def public_names() -> set[str]:
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return names


# -- README -------------------------------------------------------------------------------------------


def test_the_exit_codes_are_stated_once():
    assert README.count("Exit codes:") == 1
    paragraph = README[README.index("Exit codes:") :].split("\n\n", 1)[0]
    assert paragraph.count("`0`") == paragraph.count("`1`") == paragraph.count("`2`") == 1
    assert README.count(paragraph) == 1


def test_the_quick_start_commands_are_what_ci_runs():
    demo, tests = code_blocks(section(README, "## Quick start"), "bash")
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert tests.strip() == ci[-1]  # "(`.ci/run` runs exactly this)"
    install, run = demo.strip().split(" && ")
    assert install == "pip install -e ." and ci[-1].startswith('pip install -e ".[test]" && ')
    argv = shlex.split(run)
    assert argv[:2] == ["dj-process", "--config"] and (ROOT / argv[2]).is_file()
    recipe = (ROOT / argv[2]).read_text()
    written = re.search(r"writes `([^`]+)`", section(README, "## Quick start")).group(1)
    assert re.search(rf"^export_path: {re.escape(written)}\b", recipe, re.M)
    assert "executor_type: elastic_sharded" in recipe


def test_test_counts_are_stated_as_approximations():
    """Counts drift with every test added: the README rounds them ("about 1,200 tests")."""
    for match in re.finditer(r"\b(\d[\d,]+) tests\b", README):
        before = README[max(0, match.start() - 6) : match.start()]
        assert before.endswith("about "), f"an exact test count: {README[match.start() - 30 : match.end()]!r}"


def test_every_elastic_setting_is_in_the_readme_table_and_no_other():
    table = section(README, "## The `elastic:` block")
    keys = re.findall(r"^\| `([a-z_]+)` \|", table, re.M)
    assert keys == list(dict.fromkeys(keys))
    assert set(keys) == {f.name for f in dataclasses.fields(ElasticSettings)}


@pytest.mark.parametrize("doc", ["README.md", "docs/architecture.md"])
def test_every_elastic_key_named_exists(doc):
    fields = {f.name for f in dataclasses.fields(ElasticSettings)}
    text = (ROOT / doc).read_text()
    # an example of a refused key is quoted with the error that refuses it ("... is not accepted")
    text = re.sub(r"'elastic\.[a-z_]+' is not accepted", "", text)
    named = set(re.findall(r"(?<![\w.])elastic\.([a-z_]+)", text))
    assert named - fields == set()


# `key: true` in the docs reads as a recipe line: beside the elastic: keys, these switches are
# Data-Juicer's or an operator's, and these are fields of a JSON record the docs describe
OTHER_SWITCHES = {"adaptive_batching", "skip_op_error", "keep_stats_in_res_ds", "export_original_dataset"} | {
    "complete",
    "written",
}


def test_every_switch_the_docs_write_as_a_recipe_line_is_a_key_a_recipe_accepts():
    fields = {f.name for f in dataclasses.fields(ElasticSettings)}
    docs = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    written = {name for doc in docs for name in re.findall(r"`([a-z_]+): (?:true|false)`", doc.read_text())}
    assert written - fields - OTHER_SWITCHES == set()


def test_every_dj_elastic_command_and_option_in_the_readme_exists():
    commands = subcommands()
    rows = re.findall(r"^\| `([a-z]+)([^`]*)` \|", section(README, "## `dj-elastic`"), re.M)
    assert {name for name, _ in rows} == set(commands)
    for name, usage in rows:
        options = {s for a in commands[name]._actions for s in a.option_strings}
        named = set(re.findall(r"--[a-z][a-z-]*", usage))
        assert named - options == set(), name


def test_every_dj_elastic_command_line_in_the_docs_parses():
    commands = subcommands()
    for doc in (README, ARCHITECTURE):
        for line in re.findall(r"`dj-elastic ([a-z]+(?: [^`]*)?)`", doc):
            argv = shlex.split(line.replace("\\|", "|"))
            assert argv[0] in commands, line
            options = {s for a in commands[argv[0]]._actions for s in a.option_strings}
            assert {a.split("=")[0] for a in argv[1:] if a.startswith("--")} - options == set(), line


@pytest.mark.parametrize("doc", ["README.md", "docs/architecture.md"])
def test_every_environment_variable_named_is_read_by_the_code(doc):
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    named = set(re.findall(r"\bDJ_ELASTIC_[A-Z_]+\b", (ROOT / doc).read_text()))
    assert {name for name in named if f'"{name}"' not in source} == set()


# -- docs/architecture.md -----------------------------------------------------------------------------


def test_the_folder_listing_is_the_package():
    listing = code_blocks(section(ARCHITECTURE, "## The folder listing is the architecture"))[0]
    packages = set(re.findall(r"^  ([a-z_]+)/", listing, re.M))
    top_modules = set(re.findall(r"^  ([a-z_]+)\.py", listing, re.M))
    assert packages == {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    on_disk = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert top_modules <= on_disk and on_disk - top_modules <= set(re.findall(r"([a-z_]+)\.py", listing))


def test_every_snake_case_name_in_the_folder_listing_exists():
    listing = code_blocks(section(ARCHITECTURE, "## The folder listing is the architecture"))[0]
    known = module_names() | public_names() | {"data_juicer_elastic"}
    named = {word for word in re.findall(r"\b[a-z]+(?:_[a-z]+)+\b", listing)}
    assert named - known == set()


def test_the_layer_diagram_is_the_one_the_architecture_test_checks():
    diagram = code_blocks(section(ARCHITECTURE, "## Layers"))[0]
    drawn: dict[int, set[str]] = {}
    for line in diagram.splitlines():
        if match := re.match(r"^ ?(\d+)  (.*)$", line):
            words = re.split(r"\s{2,}", match.group(2).strip())
            drawn[int(match.group(1))] = {w for w in words if w in module_names() or w == "__init__"}
    checked = {index: {name for name in layer if name != "__init__"} for index, layer in enumerate(LAYERS)}
    assert drawn == checked


# -- the whole tree -------------------------------------------------------------------------------------

ISSUE_REFERENCE = re.compile(r"(?i)\bissues?\s*#?\s*\d")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".sh", ".txt", ".json"}


def test_no_code_test_or_doc_cites_an_issue_number():
    """Code, tests and docs say what is and why; an issue number means nothing to their reader."""
    places = [ROOT / "README.md"] + [
        path
        for folder in ("data_juicer_elastic", "tests", "docs", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in TEXT_SUFFIXES and path.is_file()
    ]
    wrong = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in places
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if ISSUE_REFERENCE.search(line)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_issue_pattern_finds_what_it_is_for():
    for word, number in (("see issue ", "12"), ("Issue #", "7"), ("fixes issues ", "3 and 4"), ("issue#", "15")):
        assert ISSUE_REFERENCE.search(word + number), word  # written in two parts: this file is scanned too
    for text in ("an issue with the lease", "tissue 5", "issued 3 claims"):
        assert not ISSUE_REFERENCE.search(text), text
