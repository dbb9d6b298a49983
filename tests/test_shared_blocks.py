"""The blocks every script shares (the shared Args fields, errors, the env check, the run's files,
checkpoints, progress and evaluation plumbing) are byte-identical in every file of algos/, and one
command copies them."""

import shutil
import subprocess
import sys

import shared_blocks
from shared_blocks import ALGOS, blocks, copy_differences, differences, fix, scripts

REQUIRED = {"args", "helpers"}


def test_every_script_holds_the_same_blocks():
    paths = scripts()
    for p in paths:
        assert REQUIRED <= set(blocks(p.read_text())), f"{p.name} lacks a shared block"
    assert differences(paths) == [], (
        "run `python tests/shared_blocks.py --fix algos/<the script you edited>.py`"
    )


def test_a_hand_made_difference_fails_and_fix_repairs_it(tmp_path):
    for p in scripts():
        shutil.copy(p, tmp_path / p.name)
    original = (tmp_path / "dqn.py").read_text()
    (tmp_path / "dqn.py").write_text(original.replace("exit status 2", "exit status 3", 1))
    problems = differences(scripts(tmp_path))
    assert (
        len(problems) == 1
        and "'helpers' differs" in problems[0]
        and {"dqn.py", "ppo.py"} <= set(problems[0].replace("|", " ").replace(",", " ").split())
    )
    cli = [sys.executable, shared_blocks.__file__, "--algos", str(tmp_path)]
    assert subprocess.run(cli, capture_output=True).returncode == 1
    assert fix(tmp_path / "ppo.py", scripts(tmp_path)) == [tmp_path / "dqn.py"]
    assert (tmp_path / "dqn.py").read_text() == original and differences(scripts(tmp_path)) == []
    assert subprocess.run(cli, capture_output=True).returncode == 0


def test_a_missing_block_is_reported(tmp_path):
    for p in scripts():
        shutil.copy(p, tmp_path / p.name)
    text = (tmp_path / "ppo.py").read_text()
    start, end = (
        text.index("    # ---- shared: args ----"),
        text.index("    # ---- end shared: args ----\n"),
    )
    (tmp_path / "ppo.py").write_text(
        text[:start] + text[end + len("    # ---- end shared: args ----\n") :]
    )
    assert "ppo.py: lacks shared block 'args'" in differences(scripts(tmp_path))


def test_the_blocks_hold_the_shared_flags():
    args_block = blocks((ALGOS / "ppo.py").read_text())["args"]
    for field in (
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
    ):
        assert f"    {field}:" in args_block


def test_every_script_reads_algorithm_first():
    """The order a reader meets: Args, the env, networks, losses and buffer, main(); the run
    plumbing (check_args and the shared helpers) below main(). The first network class sits within
    the first third of the file."""
    import re

    for p in scripts():
        lines = p.read_text().splitlines()
        where = {
            name: next((i for i, line in enumerate(lines) if re.match(pattern, line)), None)
            for name, pattern in {
                "args": r"class Args:",
                "net": r"class \w+\(nn\.Module\)",
                "main": r"def main\(",
                "check": r"def check_args\(",
                "helpers": r"# ---- shared: helpers ----",
                "run": r"if __name__ ==",
            }.items()
        }
        assert None not in where.values(), f"{p.name}: {where}"
        assert (
            where["args"]
            < where["net"]
            < where["main"]
            < where["check"]
            < where["helpers"]
            < where["run"]
        ), (
            f"{p.name}: the order is Args, networks, main(), "
            f"check_args(), the shared helpers ({where})"
        )
        assert where["net"] < len(lines) / 3, (
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


# The marker blocks main() may hold: the env step (episode accounting under same-step autoreset)
# and the offline loop's end and finish (model.pt as the reevaluation reads it). Everything else in
# main() is plain lines or a call, so that main() reads as one piece.
MAIN_BLOCKS = {
    "classic/step",
    "atari/step",
    "continuous/step",
    "offline/loop_end",
    "offline_continuous/finish",
}


def test_main_holds_no_marker_block_but_the_step_and_the_offline_loop_end():
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
