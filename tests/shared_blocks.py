"""The blocks every script of algos/ shares, kept byte-identical.

A block starts with a line `# ---- shared: <name> ----` and ends with `# ---- end shared: <name> ----` (either may be
indented, as inside `class Args`). Every script holds every block, and each block is the same text in every script.

    python tests/shared_blocks.py                      # check: list every block that differs or is missing; exit 1
    python tests/shared_blocks.py --fix algos/ppo.py   # copy ppo.py's blocks into every other script of algos/
"""
import argparse
import re
import sys
from pathlib import Path

ALGOS = Path(__file__).resolve().parents[1] / "algos"
BLOCK = re.compile(r"^([ \t]*)# ---- shared: (\S+) ----\n(.*?)^\1# ---- end shared: \2 ----\n", re.M | re.S)


def blocks(text: str) -> dict[str, str]:
    """{name: the block's text between its markers} of one script."""
    found = {}
    for m in BLOCK.finditer(text):
        if m.group(2) in found:
            raise ValueError(f"block {m.group(2)!r} appears twice")
        found[m.group(2)] = m.group(3)
    return found


def scripts(algos: Path = ALGOS) -> list[Path]:
    return sorted(algos.glob("*.py"))


def differences(paths: list[Path]) -> list[str]:
    """One line per problem: a block missing from a script, or a block with more than one text (the scripts of
    each text are listed, separated by |)."""
    texts = {p: blocks(p.read_text()) for p in paths}
    names = sorted({n for t in texts.values() for n in t})
    problems = []
    for name in names:
        holders = [p for p in paths if name in texts[p]]
        problems += [f"{p.name}: lacks shared block {name!r}" for p in paths if p not in holders]
        versions = sorted({texts[p][name] for p in holders}, key=lambda t: -sum(texts[p][name] == t for p in holders))
        if len(versions) > 1:  # name the scripts of each version, the most common version first
            groups = [", ".join(p.name for p in holders if texts[p][name] == v) for v in versions]
            problems.append(f"shared block {name!r} differs: " + " | ".join(groups))
    return problems


def fix(source: Path, paths: list[Path]) -> list[Path]:
    """Copy the blocks of `source` into every other path that has the markers; returns the files changed. A block
    a script lacks altogether is not added (where it goes is the script author's choice): differences() reports it."""
    wanted, changed = blocks(source.read_text()), []

    def copy(m):  # the block rebuilt around the source's text (a block the source lacks stays as it is)
        indent, name, body = m.group(1), m.group(2), m.group(3)
        return f"{indent}# ---- shared: {name} ----\n{wanted.get(name, body)}{indent}# ---- end shared: {name} ----\n"

    for p in paths:
        if p.resolve() == source.resolve():
            continue
        text = p.read_text()
        new = BLOCK.sub(copy, text)
        if new != text:
            p.write_text(new)
            changed.append(p)
    return changed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fix", type=Path, metavar="SCRIPT", help="copy this script's shared blocks into the others")
    p.add_argument("--algos", type=Path, default=ALGOS, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    paths = scripts(a.algos)
    if a.fix:
        if not a.fix.is_file():
            p.error(f"no script {a.fix}")
        for changed in fix(a.fix, paths):
            print(f"updated {changed}")
    problems = differences(paths)
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
