"""Where a new report goes: benchmark/reports/<suite or tool>/, under a file name no earlier report
has, so that a references entry citing a report keeps citing the run it names (reports of the same
suite and day used to overwrite each other); and the index of the reports,
benchmark/reports/README.md, grouped by suite or tool, newest first.

    python benchmark/report_path.py     # rewrite benchmark/reports/README.md
"""

import datetime
import itertools
import re
import sys
from pathlib import Path

if __name__ == "__main__":  # `python benchmark/report_path.py`: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmark.runs import git_head


def new_report_path(
    report_dir: Path | str, name: str, device: str, now: datetime.datetime | None = None
) -> Path:
    """<report_dir>/<name>/<name>-<device>-<YYYY-MM-DD>-<HHMM>-<commit>[-dirty].md, created (empty)
    here so that no other report takes it, and listed in <report_dir>/README.md. A stem that any
    file or folder in its folder already has (an earlier report, its .json, its curves folder) gets
    -2, -3, ...: nothing is overwritten. The caller writes the report into the file and names its
    other outputs after the same stem (path.with_suffix(".json"), path.with_suffix("") for a
    folder)."""
    now = now or datetime.datetime.now()
    commit, dirty = git_head()
    base = f"{name}-{device}-{now:%Y-%m-%d-%H%M}-{commit}" + ("-dirty" if dirty else "")
    root = Path(report_dir)
    report_dir = root / name
    report_dir.mkdir(parents=True, exist_ok=True)
    taken = {p.name for p in report_dir.iterdir()}
    for i in itertools.count(1):
        stem = base if i == 1 else f"{base}-{i}"
        if any(t == stem or t.startswith(stem + ".") for t in taken):
            continue
        try:
            # exclusive: a report started at the same minute loses
            (report_dir / f"{stem}.md").open("x").close()
        except FileExistsError:
            continue
        write_index(root)
        return report_dir / f"{stem}.md"


REPORTS = Path(__file__).resolve().parent / "reports"
STAMP = re.compile(r"-(cpu|cuda)-(\d{4}-\d\d-\d\d)(?:-(\d{4}))?")


def write_index(root: Path = REPORTS) -> Path:
    """Write root/README.md, index_text(root)."""
    index = root / "README.md"
    index.write_text(index_text(root))
    return index


def index_text(root: Path = REPORTS) -> str:
    """Every report (root/<group>/*.md), grouped by suite or tool, the groups by name, each
    group's reports newest first (by the date and time in their names)."""
    groups = {}
    for path in sorted(root.glob("*/*.md")):
        stamp = STAMP.search(path.name)
        when = (stamp.group(2), stamp.group(3) or "0000") if stamp else ("", "")
        groups.setdefault(path.parent.name, []).append((when, path))
    lines = [
        "# Reports",
        "",
        "Every report of this project, by the suite (benchmark/run.py) or tool that wrote it, "
        "newest first. A report is never overwritten: its name holds the device, date, time and "
        "commit.",
        "",
    ]
    lines += [f"- [{g}](#{g.lower()}) ({len(reports)})" for g, reports in sorted(groups.items())]
    for group, reports in sorted(groups.items()):
        lines += ["", f"## {group}", ""]
        lines += [
            f"- [{p.stem}]({group}/{p.name})"
            for _, p in sorted(reports, key=lambda r: (r[0], r[1].name), reverse=True)
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__).parse_args()
    print(write_index())
