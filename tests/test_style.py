"""style tier: one formatter and one linter for the whole repository (ruff, configured in
pyproject.toml: line length 100, rules E, W, F, I), plus what ruff has no rule for: no tuple used as
a statement and no backslash continuation; in the scripts and smac_lite, one assignment per
statement (no `a, b = x, y`, no `:=`). And the scripts' docstrings stay short and carry no
status (gates, seed lists): that lives in benchmark/references.toml and benchmark/RESULTS.md.

    ruff format . && ruff check --fix .    # what to run when a test here fails
"""

import ast
import io
import re
import subprocess
import sys
import tokenize
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXCLUDED = set(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"].get("extend-exclude", [])
)
SOURCES = sorted(
    p
    for folder in ("algos", "benchmark", "smac_lite", "tests")
    for p in (ROOT / folder).rglob("*.py")
    if "__pycache__" not in p.parts and p.relative_to(ROOT).as_posix() not in EXCLUDED
)
SCRIPTS = [p for p in SOURCES if p.parent == ROOT / "algos"]
READ = [p for p in SOURCES if p.parent in (ROOT / "algos", ROOT / "smac_lite")]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True
    )


def test_ruff_format():
    out = ruff("format", "--check", "--no-cache", ".")
    assert out.returncode == 0, f"run `ruff format .`:\n{out.stdout}{out.stderr}"


def test_ruff_check():
    out = ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert out.returncode == 0, f"run `ruff check --fix .`, then fix the rest:\n{out.stdout}"


def tuple_statements(source: str) -> list[int]:
    """Lines of the statements that are a bare tuple, `a.close(), b.close()`: one statement each."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Tuple)
    ]


def backslash_continuations(source: str) -> list[int]:
    """Lines that end in a backslash outside a string (inside one, e.g. a docstring's command,
    it is part of the text): brackets continue a line."""
    in_string = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.STRING:
            in_string.update(range(token.start[0], token.end[0]))
    return [
        number
        for number, line in enumerate(source.splitlines(), 1)
        if line.endswith("\\") and number not in in_string and not line.lstrip().startswith("#")
    ]


def packed_assignments(source: str) -> list[int]:
    """Lines that assign several values in one statement, `a, b = x, y` (the values written out
    as a tuple), or assign inside an expression, `if (n := len(x)) > 3`."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.NamedExpr)
        or isinstance(node, ast.Assign)
        and isinstance(node.targets[0], (ast.Tuple, ast.List))
        and isinstance(node.value, ast.Tuple)
    ]


def test_the_checks_find_what_they_look_for():
    source = 'a, b = [], []\na.append(1), b.append(2)\nx = 1 + \\\n    2\ny = """\\\n"""\n'
    assert tuple_statements(source) == [2]
    assert backslash_continuations(source) == [3]
    source = "a, b = [], []\nc, d = f()\nif (n := len(a)) > 3:\n    pass\n"
    assert packed_assignments(source) == [1, 3]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_one_statement_per_line_without_backslashes(path):
    source = path.read_text()
    assert tuple_statements(source) == [], "a tuple used as a statement: one statement per line"
    assert backslash_continuations(source) == [], "a backslash continuation: use brackets"


@pytest.mark.parametrize("path", READ, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_one_assignment_per_statement(path):
    assert packed_assignments(path.read_text()) == [], "one assignment per line: `a = x`, `b = y`"


def string_evaluations(source: str) -> list[int]:
    """The lines that call the builtins eval or exec: no string runs as code."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("eval", "exec")
    ]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_string_is_evaluated_as_code(path):
    assert string_evaluations(path.read_text()) == [], "eval/exec of a string: write plain code"


# status, not description: a CI gate, seed lists ("seeds 1-10", "10 seeds", "seed 3"), evidence
STATUS = re.compile(r"\bCI\b|\bgates?\b|(?<![-\w])seeds? \d|\d+ seeds\b|\bevidence\b", re.I)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_the_docstring_is_short_and_holds_no_status(path):
    """At most 12 lines (what the algorithm is, its paper, how to run it, where its results are),
    and no status: gates, seeds and evidence go stale and belong in benchmark/references.toml."""
    node = ast.parse(path.read_text()).body[0]
    assert isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant), "no docstring"
    text = path.read_text().split("\n")[node.lineno - 1 : node.end_lineno]
    lines = text[:-1] if text[-1].strip() == '"""' else text
    assert len(lines) <= 12, f"{len(lines)} lines: at most 12"
    found = [line for line in lines if STATUS.search(line)]
    assert not found, f"status in the docstring (move it to benchmark/references.toml): {found}"
    assert "Results: benchmark/" in node.value.value, "say where its results are"
