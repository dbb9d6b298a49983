"""A run folder, a model or a dataset may come from someone else: it is data. No file that such a
folder names is ever imported or run (a config.json's "script" naming an outside file, an absolute
path or ../ out of algos/)."""

import json
import shutil

import pytest

from benchmark import datasets, reevaluate
from benchmark.runs import load_script, script_path

POLICY = datasets.MEDIUM_SAC  # a committed model.pt of sac_continuous.py with its config.json
BASE = script_path("grpo_lm.py").parents[1] / "benchmark" / "policies" / "lm-addition-base"


@pytest.mark.parametrize("name", ["absolute", "dotdot", "subdir"])
def test_a_config_naming_an_outside_file_runs_nothing(name, tmp_path, capsys):
    planted = tmp_path / "evil.py"
    marker = tmp_path / "ran"
    planted.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(POLICY, run / "model.pt")
    config = json.loads((POLICY.parent / "config.json").read_text())
    config["script"] = {
        "absolute": str(planted),
        "dotdot": f"../../../../../../../..{planted}",
        "subdir": "../tests/conftest.py",
    }[name]
    (run / "config.json").write_text(json.dumps(config))
    assert (
        datasets.main(
            [
                "--kind",
                "medium",
                "--policy",
                str(run / "model.pt"),
                "--expert",
                "-150",
                "--root",
                str(tmp_path / "d"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert not marker.exists(), "the file named by config.json ran"
    (run / "checkpoint.pt").write_bytes(b"x")
    (run / "checkpoint.sha256").write_text("0\n")
    with pytest.raises(ValueError):
        reevaluate.final_actor(run)
    assert not marker.exists()


def test_load_script_takes_only_bare_names_of_algos(tmp_path):
    planted = tmp_path / "evil.py"
    planted.write_text("raise SystemExit('ran')\n")
    for bad in (str(planted), "../tests/conftest.py", "sub/ppo.py", "ppo", "", None):
        with pytest.raises(FileNotFoundError):
            load_script(bad)
    assert script_path("ppo.py").name == "ppo.py"


def auto_map_folder(tmp_path):
    """A copy of the project's base whose config and tokenizer config name a module of the folder
    (auto_map) under a model type transformers does not know: loading it would need that code."""
    folder = tmp_path / "model"
    shutil.copytree(BASE, folder)
    marker = tmp_path / "ran"
    (folder / "custom.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "custommodel"
    config["auto_map"] = {"AutoConfig": "custom.C", "AutoModelForCausalLM": "custom.M"}
    (folder / "config.json").write_text(json.dumps(config))
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    tok["auto_map"] = {"AutoTokenizer": ["custom.T", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    return folder, marker


def test_a_model_folder_that_names_its_own_code_is_refused_without_a_prompt(tmp_path):
    """On a terminal (where transformers would ask "Do you wish to run the custom code? [y/N]" and
    wait), grpo_lm.py with such a folder prints one error line and exits 2 at once, having imported
    nothing from it and written nothing; 'y' typed in advance is never read as an answer. The loader
    is the LM family's shared block: one script stands for the three."""
    import os
    import pty
    import select
    import subprocess
    import sys
    import time

    from benchmark.runs import run_env

    folder, marker = auto_map_folder(tmp_path)
    leader, follower = pty.openpty()
    cmd = [sys.executable, str(script_path("grpo_lm.py")), "--model", str(folder)]
    cmd += ["--run-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(
        cmd, stdin=follower, stdout=follower, stderr=follower, env=run_env(), cwd=tmp_path
    )
    os.close(follower)
    os.write(leader, b"y\ny\ny\ny\n")
    output = b""
    deadline = time.time() + 240
    while proc.poll() is None and time.time() < deadline:
        if select.select([leader], [], [], 1)[0]:
            try:
                output += os.read(leader, 4096)
            except OSError:
                break
    proc.wait(timeout=30)
    try:
        while select.select([leader], [], [], 0.5)[0]:
            output += os.read(leader, 4096)
    except OSError:
        pass
    os.close(leader)
    text = output.decode(errors="replace").replace("\r", "")
    lines = [ln for ln in text.splitlines() if ln.strip() and ln.strip() not in ("y", "y y")]
    assert proc.returncode == 2, text
    assert "Do you wish" not in text and "custom code" not in text.lower(), text
    assert len(lines) == 1 and lines[0].startswith("error: --model"), text
    assert not marker.exists(), "the model folder's code was imported"
    assert not (tmp_path / "run").exists()


def test_the_trl_baseline_refuses_such_a_folder_too(tmp_path, capsys):
    from benchmark import trl_baseline

    folder, marker = auto_map_folder(tmp_path)
    with pytest.raises(SystemExit) as e:
        trl_baseline.main(
            [
                "--same-as",
                "grpo_lm.py",
                "--env-id",
                "addition-v0",
                "--total-timesteps",
                "128",
                "--run-dir",
                str(tmp_path / "run"),
                "--model",
                str(folder),
            ]
        )
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("error: --model")
    assert not marker.exists()
    assert not (tmp_path / "run").exists()
