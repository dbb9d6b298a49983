"""The family blocks (algorithm code that several scripts hold, such as compute_gae or the Atari
replay buffer) are byte-identical in every script of their family, and one command copies them. The
run contract (the shared flags, errors, the env check, the run's files, checkpoints, progress and
evaluation) is not copied: every script imports it from canonrl.run."""

import ast
import dataclasses
import shutil
import subprocess
import sys

import shared_blocks
from conftest import FAMILY
from shared_blocks import copy_differences, differences, fix, scripts

from canonrl.run import LMRunArgs, RunArgs, TrialRunArgs

# what canonrl.run holds, never defined again in a script
RUN_CONTRACT = {
    "RunLogger",
    "start_run",
    "fail",
    "check_ranges",
    "env_spaces",
    "RNGs",
    "RunArgs",
    "LMRunArgs",
    "SharedArgs",
}


def test_every_script_holds_the_same_blocks():
    assert differences(scripts()) == [], (
        "run `python tests/shared_blocks.py --fix algos/<the script you edited>.py`"
    )


def test_every_script_imports_the_run_contract_and_defines_none_of_it():
    for p in scripts():
        tree = ast.parse(p.read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | {
            t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
        }
        assert not defined & RUN_CONTRACT, f"{p.name} defines {sorted(defined & RUN_CONTRACT)}"
        imported = {
            a.name
            for n in tree.body
            if isinstance(n, ast.ImportFrom) and n.module == "canonrl.run"
            for a in n.names
        }
        base = (
            "LMRunArgs"
            if p.name.endswith("_lm.py")
            else "TrialRunArgs"
            if FAMILY.get(p.name) == "meta"
            else "RunArgs"
        )
        # a script that runs under torchrun takes its RunLogger from canonrl.distributed's Ranks
        ranks = any(
            isinstance(n, ast.ImportFrom)
            and n.module == "canonrl.distributed"
            and "Ranks" in [a.name for a in n.names]
            for n in tree.body
        )
        assert {base, "start_run"} <= imported and ("RunLogger" in imported or ranks), p.name
        args = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Args")
        assert [ast.unparse(b) for b in args.bases] == [base], p.name


def test_a_hand_made_difference_fails_and_fix_repairs_it(tmp_path):
    for p in scripts():
        shutil.copy(p, tmp_path / p.name)
    original = (tmp_path / "a2c.py").read_text()
    (tmp_path / "a2c.py").write_text(
        original.replace("(Schulman et al. 2016, eq. 16)", "(eq. 17)", 1)
    )
    problems = differences(scripts(tmp_path))
    assert (
        len(problems) == 1
        and "'gae/compute_gae' differs" in problems[0]
        and {"a2c.py", "ppo.py"} <= set(problems[0].replace("|", " ").replace(",", " ").split())
    )
    cli = [sys.executable, shared_blocks.__file__, "--algos", str(tmp_path)]
    assert subprocess.run(cli, capture_output=True).returncode == 1
    assert fix(tmp_path / "ppo.py", scripts(tmp_path)) == [tmp_path / "a2c.py"]
    assert (tmp_path / "a2c.py").read_text() == original and differences(scripts(tmp_path)) == []
    assert subprocess.run(cli, capture_output=True).returncode == 0


def test_a_missing_block_is_reported(tmp_path):
    for p in scripts():
        shutil.copy(p, tmp_path / p.name)
    text = (tmp_path / "ppo.py").read_text()
    start, end = (
        text.index("# ---- shared: gae/compute_gae ----"),
        text.index("# ---- end shared: gae/compute_gae ----\n"),
    )
    (tmp_path / "ppo.py").write_text(
        text[:start] + text[end + len("# ---- end shared: gae/compute_gae ----\n") :]
    )
    assert "ppo.py: lacks shared block 'gae/compute_gae'" in differences(scripts(tmp_path))


def test_the_base_holds_the_shared_flags_and_no_script_redefines_one():
    shared = {f.name for f in dataclasses.fields(RunArgs)}
    assert shared == {
        "seed",
        "cuda",
        "torch_deterministic",
        "track",
        "wandb_project_name",
        "wandb_entity",
        "capture_video",
        "save_model",
        "eval_episodes",
        "eval_every",
        "run_dir",
        "resume",
        "checkpoint_every",
        "stop_at",
    }
    assert {f.name for f in dataclasses.fields(LMRunArgs)} == shared - {
        "capture_video",
        "eval_episodes",
    }
    # meta-RL: an episode is a trial on a new task, of an env with nothing to film
    assert {f.name for f in dataclasses.fields(TrialRunArgs)} == shared - {"capture_video"}
    for p in scripts():
        tree = ast.parse(p.read_text())
        args = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Args")
        own = {n.target.id for n in args.body if isinstance(n, ast.AnnAssign)}
        assert not own & shared, f"{p.name} redefines {sorted(own & shared)}"


def test_every_script_reads_algorithm_first():
    """The order a reader meets: Args, the env, networks, losses and buffer, main(); the input
    checks (check_args) below main(). The first network class sits within the first 40% of the
    file."""
    import re

    for p in scripts():
        lines = p.read_text().splitlines()
        where = {
            name: next((i for i, line in enumerate(lines) if re.match(pattern, line)), None)
            for name, pattern in {
                "args": r"class Args\(",
                "net": r"class \w+\(nn\.Module\)",
                "main": r"def main\(",
                "check": r"def check_args\(",
                "run": r"if __name__ ==",
            }.items()
        }
        assert None not in where.values(), f"{p.name}: {where}"
        assert where["args"] < where["net"] < where["main"] < where["check"] < where["run"], (
            f"{p.name}: the order is Args, networks, main(), check_args() ({where})"
        )
        assert where["net"] < 0.4 * len(lines), (
            f"{p.name}: the first network is at line {where['net'] + 1} of {len(lines)}"
        )


def test_the_copied_networks_and_losses_are_the_same_text():
    """COPIES: e.g. ppo_atari_multigpu.py's Agent, make_env, evaluate and minibatch_loss are
    ppo_atari.py's; a drift prints the diff."""
    assert copy_differences(scripts()) == []


def test_a_drifted_copy_is_reported_with_its_diff(tmp_path):
    for p in scripts():
        shutil.copy(p, tmp_path / p.name)
    text = (tmp_path / "ppo_atari_multigpu.py").read_text()
    start = text.index("def minibatch_loss(")
    body = text.index("\n    ", start)
    changed = text[:body] + "\n    # changed in one copy" + text[body:]
    (tmp_path / "ppo_atari_multigpu.py").write_text(changed)
    [problem] = copy_differences(scripts(tmp_path))
    assert problem.startswith("copy 'minibatch_loss' differs") and "+    # changed" in problem


# The marker blocks main() may hold: the env step (episode accounting under same-step autoreset).
# Everything else in main() is plain lines or a call, so that main() reads as one piece.
MAIN_BLOCKS = {"classic/step", "atari/step", "continuous/step"}


def test_main_holds_no_marker_block_but_the_step():
    import re

    for p in scripts():
        lines = p.read_text().splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("def main("))
        end = next(
            i for i in range(start + 1, len(lines)) if lines[i] and not lines[i][0].isspace()
        )
        inside = [re.search(r"# ---- shared: (\S+) ----", line) for line in lines[start:end]]
        names = {m.group(1) for m in inside if m}
        assert names <= MAIN_BLOCKS, f"{p.name}: main() holds {sorted(names - MAIN_BLOCKS)}"
