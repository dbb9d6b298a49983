"""A run folder, a model or a dataset may come from someone else: it is data. No file that such a
folder names is ever imported or run (a config.json's "script" naming an outside file, an absolute
path or ../ out of algos/)."""

import json
import shutil

import pytest

from benchmark import datasets, reevaluate
from benchmark.runs import load_script, script_path

POLICY = datasets.MEDIUM_SAC  # a committed model.pt of sac_continuous.py with its config.json


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
