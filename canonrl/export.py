"""Write a script of algos/ as one standalone file: the code of canonrl.run that it uses (the shared
flags, the run directory, logging, checkpoints, the input checks) inlined, so that the file runs
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
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


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


def export(script: Path) -> str:
    """The standalone text of `script`."""
    source = script.read_text()
    tree = ast.parse(source)
    run_source = RUN.read_text()
    run_tree = ast.parse(run_source)
    ours = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module in ("canonrl.run",)]
    if len(ours) != 1:
        raise ValueError(f"{script} does not import canonrl.run in one `from canonrl.run import`")
    wanted = {a.name for a in ours[0].names}
    code = needed(run_tree.body, wanted)
    defs = [n for n in code if not isinstance(n, (ast.Import, ast.ImportFrom))]
    run_imports = [n for n in code if isinstance(n, (ast.Import, ast.ImportFrom))]
    used = set().union(*(used_names(n) for n in defs)) if defs else set()
    run_imports = [n for n in run_imports if bound_names(n) & used]
    lines = source.splitlines()
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    imports = [n for n in imports if n is not ours[0] and n.lineno < ours[0].lineno]
    first, last = imports[0].lineno - 1, ours[0].end_lineno
    args_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Args")
    main_guard = next(
        n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)
    )
    base = [n for n in defs if bound_names(n) & {"RunArgs"}]
    rest = [n for n in defs if n not in base]
    # the folder an error's suggested scripts are looked for in: the exported file's own
    texts = [
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
        "# ---- the run contract (canonrl.run, inlined by python -m canonrl.export) ----",
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
    print(f"{a.output}: {a.script.name} with canonrl.run inlined ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
