"""python -m canonrl.export writes a script as one file again: the run contract it imports from
canonrl inlined. The file runs in an empty folder where canonrl cannot be imported and writes
the metrics the original writes (timing rows aside)."""

import ast
import subprocess
import sys

import pytest
from conftest import SMOKE

from benchmark.runs import ALGOS, read_rows, run_env, run_script

TIMING = ("charts/sps", "charts/train_seconds")


def values(run_dir) -> list[tuple]:
    return [
        (r["global_step"], r["name"], repr(r["value"]))
        for r in read_rows(run_dir)
        if r["name"] not in TIMING and not r["name"].endswith("_per_s")
    ]


@pytest.mark.parametrize("script", ["ppo.py", "grpo_lm.py"])
def test_an_exported_script_stands_alone_and_writes_the_same_metrics(script, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = empty / f"my_{script}"
    cli = [sys.executable, "-m", "canonrl.export", str(ALGOS / script), "-o", str(out)]
    subprocess.run(cli, check=True, capture_output=True, cwd=ALGOS.parent, timeout=120)
    tree = ast.parse(out.read_text())
    imported = {
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    assert not any(m.startswith("canonrl") for m in imported), sorted(imported)
    # a canonrl that cannot be imported, ahead of the installed one on the path
    blocker = tmp_path / "blocker" / "canonrl"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('canonrl is not installed here')\n")
    flags = SMOKE[script] + ["--seed", "3"]
    if script.endswith("_lm.py"):  # the default base is found relative to the repository
        flags += ["--model", str(ALGOS.parent / "benchmark" / "policies" / "lm-addition-base")]
    proc = subprocess.run(
        [sys.executable, out.name, *flags, "--run-dir", "run"],
        cwd=empty,
        env=run_env(PYTHONPATH=str(blocker.parent)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    original = run_script(script, flags, tmp_path / "original", timeout=600)
    assert original.returncode == 0, original.stderr[-3000:]
    assert values(empty / "run") == values(tmp_path / "original")
    assert len(values(empty / "run")) > 20


def test_export_never_overwrites(tmp_path):
    out = tmp_path / "mine.py"
    out.write_text("# mine\n")
    cli = [sys.executable, "-m", "canonrl.export", str(ALGOS / "ppo.py"), "-o", str(out)]
    proc = subprocess.run(cli, capture_output=True, text=True, cwd=ALGOS.parent, timeout=120)
    assert proc.returncode == 2 and "exists" in proc.stderr
    assert out.read_text() == "# mine\n"
