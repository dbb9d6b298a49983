"""How much of each script of algos/ is run plumbing rather than algorithm, by one rule for all.

Counted: the lines of code (blank lines, comment lines and docstrings left out). A line is plumbing
when it belongs to
- an import from canonrl (the libraries the algorithm is written in, torch, numpy, gymnasium, are
  counted with the algorithm), or the `if __name__ == "__main__":` block;
- a function whose name starts with `check_` (the input checks), or the statements of a
  `# ---- shared: <family>/check_args ----` block;
- a simple statement (an assignment, a call, a return, ...) anywhere that names the run contract:
  what canonrl.run gives (start_run, RunLogger and the logger, checkpoints and their `stateful`
  dict, save_model, load_states, fail, the run directory) or the evaluation schedule
  (`args.eval_every`, `args.checkpoint_every`, `args.save_model`, `args.capture_video`,
  `args.track`, the `--resume` checkpoint `ckpt`);
- the test of an `if` that does (`if args.eval_every and ...:`), with its body.
Everything else is algorithm: Args (the hyperparameters), the env, networks, losses, buffers,
evaluation episodes, the rollout and the update.

    python benchmark/plumbing.py          # a table: lines, plumbing lines, share, first network
"""

import argparse
import ast
import io
import re
import sys
import tokenize
from pathlib import Path

ALGOS = Path(__file__).resolve().parents[1] / "algos"
CONTRACT = {
    "start_run",
    "RunLogger",
    "logger",
    "stateful",
    "save_model",
    "load_states",
    "fail",
    "ckpt",
    "run_dir",
    "RNGs",
    "check_ranges",
    "env_spaces",
    "check_map",
}
SCHEDULE = {"eval_every", "checkpoint_every", "save_model", "capture_video", "track"}


def code_lines(source: str) -> set[int]:
    """The lines that hold code: not blank, not only a comment, not a docstring."""
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT):
            continue
        if tok.type in (tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                lines -= set(range(body[0].lineno, body[0].end_lineno + 1))
    # the docstrings under Args' fields
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    lines -= set(range(stmt.lineno, stmt.end_lineno + 1))
    return lines


def names_contract(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in CONTRACT:
            return True
        if (
            isinstance(n, ast.Attribute)
            and n.attr in SCHEDULE
            and isinstance(n.value, ast.Name)
            and n.value.id == "args"
        ):
            return True
    return False


def span(node: ast.AST) -> set[int]:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return set(range(start, node.end_lineno + 1))


def plumbing_lines(source: str) -> set[int]:
    tree = ast.parse(source)
    lines: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("canonrl"):
            lines |= span(node)
        elif isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            lines |= span(node)
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("check_"):
            lines |= span(node)
    for m in re.finditer(
        r"^[ \t]*# ---- shared: (\w+/check_\w+) ----\n(.*?)^[ \t]*# ---- end shared: \1 ----",
        source,
        re.M | re.S,
    ):
        first = source[: m.start()].count("\n") + 1
        lines |= set(range(first, first + m.group(0).count("\n") + 1))
    for node in ast.walk(tree):
        compound = isinstance(node, (ast.If, ast.For, ast.While, ast.With, ast.Try))
        if isinstance(node, ast.stmt) and not compound and not hasattr(node, "body"):
            if names_contract(node):
                lines |= span(node)
        elif isinstance(node, ast.If) and names_contract(node.test):
            lines |= span(node)
    return lines


def measure(path: Path) -> dict:
    source = path.read_text()
    code = code_lines(source)
    plumbing = plumbing_lines(source) & code
    all_lines = source.splitlines()
    net = next(
        (i for i, line in enumerate(all_lines) if re.match(r"class \w+\(nn\.Module\)", line)),
        None,
    )
    return {
        "script": path.name,
        "lines": len(all_lines),
        "code": len(code),
        "plumbing": len(plumbing),
        "share": len(plumbing) / max(len(code), 1),
        "first_network": None if net is None else (net + 1) / len(all_lines),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.parse_args(argv)
    rows = [measure(path) for path in sorted(ALGOS.glob("*.py"))]
    print("| script | lines | code lines | plumbing | share | first network |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['script']} | {r['lines']} | {r['code']} | {r['plumbing']} | "
            f"{r['share']:.0%} | {r['first_network']:.0%} |"
        )
    lines = sorted(r["lines"] for r in rows)
    print(
        f"\nmedian lines {lines[len(lines) // 2]}, most {lines[-1]}; plumbing at most "
        f"{max(r['share'] for r in rows):.0%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
