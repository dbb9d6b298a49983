"""cli tier: --help for every script, the shared flags, and bad input -> one line, exit 2, nothing
written.

What the shared blocks do (the env-id check, the ranges every script shares, the run directory,
--resume) is the same code in every script (tests/test_shared_blocks.py): it is run on one script
per family (conftest.REPRESENTATIVE) and checked statically to be called by every script. What each
script holds is run on every script: its --help (its own Args), its own ranges, its action-space
check."""

import ast
import dataclasses

import pytest
import tyro
from conftest import ENV_TYPO, FAMILY, REPRESENTATIVE, SCRIPTS, SMOKE, WRONG_ENV, smoke_env

from benchmark.runs import ALGOS, load_script, run_script

SHARED_FLAGS = [
    "--env-id",
    "--seed",
    "--total-timesteps",
    "--cuda",
    "--no-cuda",
    "--torch-deterministic",
    "--track",
    "--wandb-project-name",
    "--wandb-entity",
    "--capture-video",
    "--save-model",
    "--eval-episodes",
    "--run-dir",
    "--resume",
]
REPRESENTATIVES = sorted(REPRESENTATIVE.values())
NO_LM_FLAGS = {"--capture-video", "--eval-episodes"}  # absent from the language-model scripts
ABSENT = {"lm": NO_LM_FLAGS, "meta": {"--capture-video"}}  # meta-RL's tasks have nothing to film
# gymnasium ids (env_spaces, and canonrl's checks that call it); smac_lite maps; mpe2 and LM tasks
ENV_CHECKS = {
    "env_spaces",
    "check_continuous_env",
    "check_offline_args",
    "check_map",
    "check_task",
}


def test_every_script_is_covered():
    assert SCRIPTS and set(SCRIPTS) == set(SMOKE), "add new scripts to tests/conftest.py SMOKE"
    assert set(FAMILY) == set(SCRIPTS), "put new scripts in a family: tests/conftest.py FAMILY"
    assert all(FAMILY[script] == family for family, script in REPRESENTATIVE.items())
    assert set(REPRESENTATIVE) == set(FAMILY.values())


def args_fields(script: str) -> list[str]:
    """The fields of the script's Args dataclass, read from its source."""
    tree = ast.parse((ALGOS / script).read_text())
    args = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Args")
    return [n.target.id for n in args.body if isinstance(n, ast.AnnAssign)]


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_every_flag(script):
    """--help works (tyro reads the script's own Args) and lists every flag: the shared ones and the
    script's."""
    out = run_script(script, ["--help"], fork=True)
    assert out.returncode == 0, out.stderr
    absent = ABSENT.get(FAMILY[script], set())
    shared = [f for f in SHARED_FLAGS if f not in absent]
    flags = shared + [f"--{name.replace('_', '-')}" for name in args_fields(script)]
    missing = [f for f in flags if f not in out.stdout]
    assert not missing, f"{script} lacks {missing}"
    assert not [f for f in absent if f in out.stdout], out.stdout
    if FAMILY[script] == "lm":  # no envs, so no episodes and no video
        assert "the envs" not in out.stdout


@pytest.mark.parametrize("script", ["grpo_lm.py", "grpo_agent_lm.py", "ppo_lm.py", "dpo_lm.py"])
def test_a_language_model_script_never_imports_gymnasium(script):
    import subprocess
    import sys

    code = (
        "import runpy, sys\n"
        f"sys.argv = [{str(ALGOS / script)!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_path({str(ALGOS / script)!r}, run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('gymnasium' in sys.modules, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.stderr.strip().splitlines()[-1] == "False", proc.stderr[-2000:]


def call_graph(script: str) -> tuple[dict[str, set[str]], list[ast.Call]]:
    """{module-level function: the names it calls} of the script, and every call in it."""
    tree = ast.parse((ALGOS / script).read_text())
    graph = {
        n.name: {
            c.func.id
            for c in ast.walk(n)
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
        }
        for n in tree.body
        if isinstance(n, ast.FunctionDef)
    }
    return graph, [c for c in ast.walk(tree) if isinstance(c, ast.Call)]


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for name in graph.get(todo.pop(), ()):
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_calls_the_shared_checks(script):
    """The representatives' runs below stand for every script because each one runs the same shared
    code: its main starts with canonrl.run's start_run(args, check_args, __file__) (the run
    directory, --resume, seeding), and its check_args calls check_ranges (the shared ranges) and its
    family's env check (env_spaces, check_map or check_task)."""
    graph, calls = call_graph(script)
    assert {"check_args", "main"} <= set(graph), f"{script} lacks main or check_args"
    assert not {"start_run", "check_ranges"} & set(graph), f"{script} redefines the run contract"
    starts = [c for c in calls if isinstance(c.func, ast.Name) and c.func.id == "start_run"]
    assert len(starts) == 1
    # a language-model script checks its flags at the start, then the model it loads (once) and
    # its task before anything is written
    checks_first = "check_flags" if FAMILY[script] == "lm" else "check_args"
    assert [ast.unparse(a) for a in starts[0].args] == ["args", checks_first, "__file__"]
    assert "start_run" in reaches(graph, "main"), f"{script}: main does not call start_run"
    if FAMILY[script] == "lm":
        assert "check_task" in reaches(graph, "main") and "check_flags" in graph["check_args"]
    checks = reaches(graph, "check_args")
    assert checks & {"check_ranges", "check_offline_args"}, f"{script}: no check_ranges"
    assert checks & ENV_CHECKS, f"{script}: check_args calls no env check ({sorted(ENV_CHECKS)})"


def assert_clean_error(out, run_dir, *expected):
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    for text in expected:
        assert text in lines[0]
    assert not run_dir.exists(), "a bad-input run must not write anything"


@pytest.mark.parametrize("script", sorted(SMOKE))
@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--learning-rate", "-1"], ["--learning-rate -1.0", "x > 0"]),
        (["--learning-rate", "0"], ["--learning-rate 0.0"]),
        (["--gamma", "1.5"], ["--gamma 1.5"]),
    ],
)
def test_own_ranges(script, flags, expected, tmp_path):
    """Ranges each script sets for its own hyperparameters (bc_continuous.py has no discount)."""
    if flags[0][2:].replace("-", "_") not in args_fields(script):
        pytest.skip(f"{script} has no {flags[0]}")
    out = run_script(script, ["--env-id", smoke_env(script), *flags], tmp_path / "run", fork=True)
    assert_clean_error(out, tmp_path / "run", *expected)


@pytest.mark.parametrize("script", REPRESENTATIVES)
@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--env-id", "CartPol-v1"], ["CartPol-v1", "did you mean 'CartPole-v1'"]),
        (["--eval-episodes", "-1"], ["--eval-episodes"]),
        (["--total-timesteps", "0"], ["--total-timesteps"]),
        (["--checkpoint-every", "0"], ["--checkpoint-every"]),
    ],
)
def test_shared_bad_input(script, flags, expected, tmp_path):
    """The env-id check and the ranges of the shared blocks, on one script per family."""
    if FAMILY[script] == "lm" and flags[0] in NO_LM_FLAGS:
        pytest.skip(f"{script} has no {flags[0]}")
    # multi-agent: their env ids are smac_lite maps or mpe2 tasks
    if script in ENV_TYPO and "CartPol-v1" in flags:
        typo, meant = ENV_TYPO[script]
        flags, expected = ["--env-id", typo], [typo, f"did you mean '{meant}'"]
    flags = flags if "--env-id" in flags else ["--env-id", smoke_env(script), *flags]
    assert_clean_error(
        run_script(script, flags, tmp_path / "run", fork=True), tmp_path / "run", *expected
    )


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_wrong_action_space_names_only_scripts_that_exist(script, tmp_path):
    """An env of the other action space (a MuJoCo one for discrete scripts): one error line (no
    MuJoCo or deprecation warning before it), nothing left in the working directory (MuJoCo writes
    MUJOCO_LOG.TXT there), and any script the error suggests exists."""
    env_id, word = WRONG_ENV[script]
    out = run_script(script, ["--env-id", env_id], tmp_path / "run", cwd=tmp_path, fork=True)
    assert_clean_error(out, tmp_path / "run", word, env_id)
    assert list(tmp_path.iterdir()) == [], "the env check left files in the working directory"
    for word in out.stderr.replace(";", " ").split():
        if word.endswith(".py"):
            assert (ALGOS / word).is_file(), f"the error names {word}, which does not exist"


@pytest.mark.parametrize("script", REPRESENTATIVES)
def test_new_run_refuses_a_directory_that_holds_a_run(script, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.csv").write_text("global_step,wall_time,name,value\n1,0,train/x,1\n")
    assert_clean_error(
        run_script(script, SMOKE[script], run_dir, fork=True), tmp_path / "nothing", "--resume"
    )
    assert (run_dir / "metrics.csv").read_text().endswith("1,0,train/x,1\n") and len(
        list(run_dir.iterdir())
    ) == 1


def test_ppo_minibatches_must_divide_batch(tmp_path):
    out = run_script(
        "ppo.py",
        ["--num-envs", "4", "--num-steps", "10", "--num-minibatches", "3"],
        tmp_path / "run",
        fork=True,
    )
    assert_clean_error(out, tmp_path / "run", "--num-minibatches 3", "40")


def test_dqn_batch_larger_than_buffer(tmp_path):
    out = run_script(
        "dqn.py", ["--batch-size", "256", "--buffer-size", "100"], tmp_path / "run", fork=True
    )
    assert_clean_error(out, tmp_path / "run", "--batch-size")


@pytest.mark.parametrize("script", REPRESENTATIVES)
def test_resume_missing_or_corrupt(script, tmp_path):
    out = run_script(script, ["--resume", str(tmp_path / "nope")], fork=True)
    assert (
        out.returncode == 2
        and "no checkpoint" in out.stderr
        and len(out.stderr.strip().splitlines()) == 1
    )
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.csv").write_text(
        "global_step,wall_time,name,value\n1,0,train/x,1\n"
    )
    (tmp_path / "bad" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    out = run_script(script, ["--resume", str(tmp_path / "bad")], fork=True)
    assert (
        out.returncode == 2
        and "corrupt" in out.stderr
        and len(out.stderr.strip().splitlines()) == 1
    )
    assert (tmp_path / "bad" / "metrics.csv").read_text().endswith("1,0,train/x,1\n"), (
        "existing logs must be kept"
    )
    assert (tmp_path / "bad" / "checkpoint.pt").read_bytes() == b"not a checkpoint"


def quick_command(script: str) -> list[str]:
    """The flags of the `Quick:` command of the script's docstring (a backslash continues it on the
    next line)."""
    doc = ast.get_docstring(ast.parse((ALGOS / script).read_text()))
    text = doc[doc.index("\nQuick:") :].split("\n", 2)
    line = text[1] + (" " + text[2].split("\n")[0] if text[1].endswith("\\") else "")
    words = line.replace("\\", " ").split("#")[0].split()
    return words[words.index(f"algos/{script}") + 1 :]


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_docstring_shows_a_short_command(script):
    """Every docstring shows one command of a small budget (a minute or so on one CPU core), with
    flags the script has: the default budgets are the papers' (hours to days on a CPU)."""
    flags = quick_command(script)
    names = [f[2:].replace("-", "_") for f in flags if f.startswith("--")]
    module = load_script(script)
    fields = {f.name for f in dataclasses.fields(module.Args)}  # the shared ones included
    assert names and set(names) <= fields, names
    budget = int(flags[flags.index("--total-timesteps") + 1])
    assert budget <= 20_480, f"{script}: --total-timesteps {budget} is not a short run"
    if FAMILY[script] == "offline":  # its dataset is made by the docstring's Run: command first
        return
    try:
        # flags that fit together (an error exits)
        module.check_args(tyro.cli(module.Args, args=flags))
    except SystemExit as e:
        pytest.fail(f"{script}: the Quick: command is refused (exit {e.code})")


@pytest.mark.parametrize("script", ["qmix_smac_lite.py", "vdn_smac_lite.py"])
def test_a_replay_buffer_larger_than_memory_is_one_line(script, tmp_path):
    """bane_vs_bane at pymarl's 5,000 episodes asked for 37 GB and died in torch.zeros; a buffer
    over half the free memory is refused before the run starts, with a size that fits."""
    flags = ["--buffer-size", "100000000"]
    out = run_script(script, flags, tmp_path / "run", fork=True)
    assert_clean_error(out, tmp_path / "run", "--buffer-size 100000000 episodes of 3m need")


def test_episode_bytes_is_what_the_buffer_allocates():
    qmix = load_script("qmix_smac_lite.py")
    rb = qmix.EpisodeBuffer(7, 2, 60, 3, 30, 48, 9, "cpu")
    per_row = sum(t[0].numel() * t.element_size() for t in rb.episodes.values())
    assert qmix.EpisodeBuffer.episode_bytes(60, 3, 30, 48, 9) == per_row
    assert all(len(t) == 8 for t in rb.episodes.values())


def test_the_map_pattern_that_words_errors_knows_every_smac_lite_map():
    """canonrl.run tells a smac_lite map id given to another script by a pattern of SMAC's map
    names, so that a CartPole script need not import smac_lite: every map matches it, no gymnasium
    id does."""
    import re

    import gymnasium as gym

    from canonrl.run import SMAC_MAP
    from smac_lite.maps import MAPS

    assert all(re.fullmatch(SMAC_MAP, name) for name in MAPS)
    assert not [env_id for env_id in gym.registry if re.fullmatch(SMAC_MAP, env_id)]


def logger_calls(node) -> set[str]:
    return {
        c.func.attr
        for c in ast.walk(node)
        if isinstance(c, ast.Call)
        and isinstance(c.func, ast.Attribute)
        and isinstance(c.func.value, ast.Name)
        and c.func.value.id == "logger"
    }


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_training_loop_ends_its_iterations_through_the_logger(script):
    """Ctrl-C, resume with a new budget, the --eval-every and --checkpoint-every schedules run end
    to end on one script per family (tests/test_smoke.py); they stand for the rest because each
    training loop of main() ends its iteration with logger.end_iteration (ppo_atari_multigpu.py:
    save_checkpoint and exit_stopped, after its ranks agree) and the run with logger.finish
    or logger.close."""
    tree = ast.parse((ALGOS / script).read_text())
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    loops = [n for n in ast.walk(main) if isinstance(n, (ast.For, ast.While))]
    in_loops = set().union(*(logger_calls(loop) for loop in loops))
    ends = {"end_iteration"} if script != "ppo_atari_multigpu.py" else {"save_checkpoint"}
    assert ends <= in_loops, f"{script}: no logger.{ends.pop()} in a loop of main()"
    assert logger_calls(main) & {"finish", "close"}, f"{script}: main() never closes the run"
