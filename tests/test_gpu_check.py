"""benchmark/gpu.sh: the short GPU check runs every step end to end (on the CPU with --dry-run: tiny
budgets, the same code) and writes one report naming the device; without a GPU the real check stops
at once with one line."""

import os
import re
import subprocess

import pytest
import torch

from benchmark.runs import ROOT


def gpu_sh(*args, **env):
    return subprocess.run(
        ["bash", "benchmark/gpu.sh", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )


def test_dry_run_writes_every_section(tmp_path):
    out = gpu_sh("--dry-run", REPORT_DIR=str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    [report] = tmp_path.glob("gpu-check/gpu-check-cpu-*.md")
    text = report.read_text()
    assert text.startswith("# GPU check: CPU dry run") and f"torch {torch.__version__}" in text
    assert "A step failed" not in text
    section_1 = text.split("## 2.")[0].splitlines()
    speed = [line for line in section_1 if line.startswith("| ") and line.count("|") == 7][1:]
    assert [row.split("|")[1].strip() for row in speed] == [
        "ppo.py",
        "sac_continuous.py",
        "dqn_atari.py",
        "dqn_atari.py",
        "ppo_atari_envpool.py",
        "ppo_atari_envpool.py",
        "mappo_smac_lite.py",
        "qmix_smac_lite.py",
        "mappo_mpe.py",
    ]
    for row in speed:  # every script trained (steps done) and ended by the cut-off, not by an error
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert int(cells[4].replace(",", "")) > 0 and cells[5].startswith(
            ("cut off", "finished")
        ), row
    assert re.search(r"\| 16 \| [\d,]+ \|", text) and re.search(r"\| 32 \| [\d,]+ \|", text), (
        "smac_lite battles"
    )
    assert re.search(r"\| 256 \| \d\.\d\d \| \d+ \|", text), "MAPPO's first evaluation"
    assert re.search(r"## 4\..*\n\n[1-9][\d,]* steps in at most", text), "the Pong run trained"
    assert re.search(r"## 5\.(.*\n)+\| [1-9][\d,]* \| [\d.,]+ \| [\d,]+ \| [\d,]+ \|", text), (
        "grpo_lm.py on the Qwen2-shaped model trained"
    )
    peers = re.findall(r"\| (\S+) \| sb3:\1 \| \S+ \| ([\d,]+) \| ([\d,]+) \| ([\d.]+) \|", text)
    assert [p[0] for p in peers] == ["ppo.py", "sac_continuous.py"], "SB3 beside ours"


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU"
)
def test_without_a_gpu_the_check_says_so_in_one_line():
    out = gpu_sh()
    assert out.returncode == 2 and out.stderr.strip() == "gpu.sh: no CUDA device visible to torch"
    assert gpu_sh("--no-such-mode").returncode == 2
