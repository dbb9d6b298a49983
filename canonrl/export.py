"""Write a script of algos/ as one standalone file: the code of canonrl that it uses (the shared
flags, the run directory, logging, checkpoints, the input checks, env registrations, dataset and
task readers) inlined, so that the file runs
with only the pip dependencies, in any folder, and writes the same metrics as the original.

    python -m canonrl.export algos/ppo.py -o my_ppo.py

The shared flags (RunArgs) go above the script's Args, which inherits them; the rest goes below
main(), before the `if __name__ == "__main__":` line. Nothing else of the script changes.
"""

import argparse
import ast
import sys
from pathlib import Path

RUN = Path(__file__).resolve().parent / "run.py"


def bound_names(node: ast.stmt) -> set[str]:
    """The names a top-level statement of run.py defines."""
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return set()


def used_names(node: ast.AST) -> set[str]:
    """The names a statement reads (a dataclass field's name is no use of a function of it)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def needed(statements: list[ast.stmt], wanted: set[str]) -> list[ast.stmt]:
    """The statements of run.py that define `wanted` and, transitively, what those use."""
    by_name = {name: s for s in statements for name in bound_names(s)}
    keep, todo = set(), list(wanted)
    while todo:
        s = by_name.get(todo.pop())
        if s is None or id(s) in keep:
            continue
        keep.add(id(s))
        todo += sorted(used_names(s))
    return [s for s in statements if id(s) in keep]


def segment(source: str, node: ast.stmt) -> str:
    """The statement's source text with its decorators and the comment lines right above it."""
    lines = source.splitlines()
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    while start > 0 and lines[start - 1].startswith("#"):
        start -= 1
    return "\n".join(lines[start : node.end_lineno])


def name_order(name: str):
    """isort's order of imported names: constants, classes, then the rest, each alphabetical."""
    bare = name.split(" as ")[0]
    kind = 0 if bare.isupper() else 1 if bare[:1].isupper() else 2
    return kind, bare.lower(), bare


def merge_imports(imports: list[ast.stmt]) -> list[str]:
    """The import lines of both files, each module once (`from m import` with the names of every
    statement that imports from m), in isort's order: the standard library, then the rest; in each,
    `import m` lines, then `from m import` lines."""
    plain, froms = set(), {}
    for node in imports:
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                froms.setdefault(node.module, set()).add(
                    a.name + (f" as {a.asname}" if a.asname else "")
                )
        else:
            plain.add(ast.unparse(node))
    sections = []
    for stdlib in (True, False):

        def ours(module: str) -> bool:
            return (module.split(".")[0] in sys.stdlib_module_names) == stdlib

        lines = sorted((m for m in plain if ours(m.split()[1])), key=lambda m: m.split()[1])
        for module in sorted(m for m in froms if ours(m)):
            names = ", ".join(sorted(froms[module], key=name_order))
            line = f"from {module} import {names}"
            if len(line) > 100:
                names = "".join(f"    {n},\n" for n in sorted(froms[module], key=name_order))
                line = f"from {module} import (\n{names})"
            lines.append(line)
        if lines:
            sections.append("\n".join(lines))
    return sections


def eager_names(tree: ast.Module) -> set[str]:
    """The names a module's top level uses when it runs: all of a plain statement, a class's bases,
    decorators and body, a function's decorators and defaults (not the function's body)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.FunctionDef):
            parts = [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]
            names |= set().union(set(), *(used_names(x) for x in parts if x is not None))
        else:
            names |= used_names(node)
    return names


def canonrl_imports(tree: ast.Module) -> list[ast.ImportFrom]:
    """The `from canonrl.<module> import ...` statements of a file."""
    return [
        n
        for n in tree.body
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("canonrl.")
    ]


def package_statements(modules: list[str]) -> tuple[str, list[ast.stmt]]:
    """The text of these canonrl modules and of those they import from, run first, one after the
    other, and their top-level statements (line numbers into that text) less their imports of each
    other."""
    todo, seen = list(modules), []
    while todo:
        module = todo.pop(0)
        if module not in seen:
            seen.append(module)
            tree = ast.parse((RUN.parent / f"{module.split('.')[1]}.py").read_text())
            todo += [n.module for n in canonrl_imports(tree)]
    seen.sort(key=lambda m: m != "canonrl.run")
    text, statements = "", []
    for module in seen:
        source = (RUN.parent / f"{module.split('.')[1]}.py").read_text()
        offset = text.count("\n")
        text += source + "\n"
        for node in ast.parse(source).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("canonrl"):
                continue
            ast.increment_lineno(node, offset)
            statements.append(node)
    return text, statements


def export(script: Path) -> str:
    """The standalone text of `script`."""
    source = script.read_text()
    tree = ast.parse(source)
    ours = canonrl_imports(tree)
    if "canonrl.run" not in [n.module for n in ours]:
        raise ValueError(f"{script} does not import canonrl.run")
    run_source, statements = package_statements([n.module for n in ours])
    code = needed(statements, {a.name for n in ours for a in n.names})
    defs = [n for n in code if not isinstance(n, (ast.Import, ast.ImportFrom))]
    run_imports = [n for n in code if isinstance(n, (ast.Import, ast.ImportFrom))]
    used = set().union(*(used_names(n) for n in defs)) if defs else set()
    run_imports = [n for n in run_imports if bound_names(n) & used]
    lines = source.splitlines()
    last_ours = max(n.end_lineno for n in ours)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    imports = [n for n in imports if n not in ours and n.lineno < last_ours]
    first, last = imports[0].lineno - 1, last_ours
    args_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Args")
    main_guard = next(
        n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)
    )
    # what the script's top level runs when it is imported (Args' base, register_minatar(), ...)
    # goes above Args; the rest below main()
    above = {
        id(n) for n in needed(defs, eager_names(tree) & {a.name for n in ours for a in n.names})
    }
    base = [n for n in defs if id(n) in above]
    rest = [n for n in defs if id(n) not in above]
    texts = [
        # the folder an error's suggested scripts are looked for in: the exported file's own
        "ALGOS = Path(__file__).resolve().parent  # scripts an error may suggest: those beside this"
        if bound_names(n) == {"ALGOS"}
        else segment(run_source, n)
        for n in rest
    ]
    args_start = min([args_class.lineno] + [d.lineno for d in args_class.decorator_list]) - 1
    guard_start = main_guard.lineno - 1
    header = "\n".join(lines[:first])
    import_block = "\n\n".join(merge_imports(imports + run_imports))
    between = "\n".join(lines[last:args_start]).strip("\n")
    body = "\n".join(lines[args_start:guard_start]).rstrip("\n")
    guard = "\n".join(lines[guard_start:])
    parts = [header.rstrip("\n") + "\n\n" + import_block + (f"\n\n{between}" if between else "")]
    parts += [
        "# ---- the run contract (canonrl, inlined by python -m canonrl.export) ----",
        "\n\n\n".join(segment(run_source, n) for n in base),
        body,
        "# ---- the run contract, continued ----",
        "\n\n\n".join(texts),
        guard,
    ]
    return "\n\n\n".join(p.strip("\n") for p in parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m canonrl.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("script", type=Path, help="a script of algos/, e.g. algos/ppo.py")
    p.add_argument("-o", "--output", type=Path, required=True, help="the file to write (new)")
    a = p.parse_args(argv)
    if not a.script.is_file():
        p.error(f"{a.script} is not a file; pass a script of algos/")
    if a.output.exists():
        p.error(f"{a.output} exists; choose a new file (nothing is overwritten)")
    try:
        text = export(a.script)
    except (SyntaxError, ValueError, StopIteration) as e:
        p.error(f"{a.script} cannot be exported: {e or 'not a script of algos/'}")
    a.output.write_text(text)
    lines = text.count(chr(10))
    print(f"{a.output}: {a.script.name} with the canonrl code it uses inlined ({lines} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
