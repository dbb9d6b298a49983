"""Where a new report goes: a file name no earlier report has, so that a references entry citing a
report keeps citing the run it names (reports of the same suite and day used to overwrite each
other)."""

import datetime
import itertools
from pathlib import Path

from benchmark.runs import git_head


def new_report_path(
    report_dir: Path | str, name: str, device: str, now: datetime.datetime | None = None
) -> Path:
    """<report_dir>/<name>-<device>-<YYYY-MM-DD>-<HHMM>-<commit>[-dirty].md, created (empty) here so
    that no other report takes it. A stem that any file or folder in report_dir already has (an
    earlier report, its .json, its curves folder) gets -2, -3, ...: nothing is overwritten. The
    caller writes the report into the file and names its other outputs after the same stem
    (path.with_suffix(".json"), path.with_suffix("") for a folder)."""
    now = now or datetime.datetime.now()
    commit, dirty = git_head()
    base = f"{name}-{device}-{now:%Y-%m-%d-%H%M}-{commit}" + ("-dirty" if dirty else "")
    report_dir = Path(report_dir)
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
        return report_dir / f"{stem}.md"
