"""Tasks from reasoning-gym (--task rg:<dataset>[:<key>=<value>,...]): the train and held-out sets
are the same on every build and disjoint, the dataset's own verifier scores a completion (with the
problem's metadata where the verifier needs it), a bad spec is one line before anything is
written, and the LM scripts train on such a task with --env-id taken from it."""

import json

import pytest
from conftest import one_error_line

from benchmark.runs import load_script, read_metrics, run_script
from canonrl.lm import RG_HELDOUT, RG_TRAIN, load_task, reasoning_gym_name

SPEC = "rg:chain_sum:max_terms=4,max_digits=1"  # the task of benchmark/policies/lm-chain-sum-base
NAME = "rg:chain_sum:max_digits=1,max_terms=4"


@pytest.fixture(scope="module")
def grpo():
    return load_script("grpo_lm.py")


@pytest.fixture(scope="module")
def chain_sum():
    return load_task(SPEC)


def test_the_sets_are_fixed_disjoint_and_named_by_their_spec(chain_sum):
    import reasoning_gym

    assert chain_sum["name"] == NAME == reasoning_gym_name("rg:chain_sum:max_digits=1,max_terms=4")
    assert len(chain_sum["train"]) == RG_TRAIN and len(chain_sum["heldout"]) == RG_HELDOUT
    assert chain_sum == load_task(SPEC), "the same sets on every build"
    train = {q for q, _ in chain_sum["train"]}
    assert not any(q in train for q, _ in chain_sum["heldout"]), "held-out apart from train"
    first = reasoning_gym.create_dataset("chain_sum", max_terms=4, max_digits=1, seed=12345, size=1)
    assert chain_sum["train"][0] == [first[0]["question"], first[0]["answer"]]
    assert chain_sum["rewards"] == "reasoning_gym"


def test_the_datasets_verifier_scores_the_stated_answer(grpo, chain_sum):
    task = chain_sum
    assert grpo.reward_reasoning_gym("240", "240", task) == 1.0
    assert grpo.reward_reasoning_gym(" 240", "240", task) == 1.0
    assert grpo.reward_reasoning_gym("so <answer>240</answer>", "240", task) == 1.0
    assert grpo.reward_reasoning_gym("#### 2,40", "240", task) == 1.0, "its rule: commas stripped"
    assert grpo.reward_reasoning_gym("241", "240", task) == 0.0
    assert grpo.reward_reasoning_gym("2", "240", task) == 0.0
    assert grpo.reward_reasoning_gym("1240", "240", task) == 0.75, "its partial credit"
    scores = grpo.score(["240", "241", None], [("240", None)] * 3, task)
    assert scores["total"] == [1.0, 0.0, 0.0], "no end token (None) scores 0"
    accuracy = load_script("grpo_lm.py")  # (the first reward is the task's correctness)
    assert accuracy.REWARDS["reasoning_gym"] is accuracy.reward_reasoning_gym


def test_a_verifier_that_needs_the_metadata_gets_it(grpo, monkeypatch):
    import canonrl.lm

    # countdown's generator searches for a solution of each problem (20,000 take minutes): a
    # smaller build of the same code
    monkeypatch.setattr(canonrl.lm, "RG_TRAIN", 40)
    monkeypatch.setattr(canonrl.lm, "RG_HELDOUT", 10)
    task = load_task("rg:countdown")
    assert len(task["train"]) == 40 and len(task["heldout"]) == 10
    prompt, answer, info = task["heldout"][0]
    assert "numbers" in info and "target" in info
    assert grpo.score([answer], grpo.problem_targets([[prompt, answer, info]]), task)["total"] == [
        1.0
    ]
    assert grpo.reward_reasoning_gym(answer, answer, task, {}) < 1.0, "without it: not right"


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("rg:chain_summ", "reasoning-gym has no dataset 'chain_summ'; did you mean 'chain_sum'?"),
        ("rg:chain_sum:max_terms", "write the configuration as key=value pairs"),
        ("rg:chain_sum:max_termz=3", "reasoning-gym refuses the configuration"),
        ("rg:chain_sum:max_terms=1", "reasoning-gym refuses the configuration"),
        ("rg:chain_sum:seed=3", "the seed and size of the train and held-out sets are fixed"),
        ("rg:arc_agi", "does not give its own answers a score of 1"),
    ],
)
def test_a_bad_spec_is_one_line_before_anything_is_written(spec, expected, tmp_path):
    line = one_error_line("grpo_lm.py", ["--task", spec], tmp_path / "run")
    assert expected in line, line


def test_grpo_trains_on_a_reasoning_gym_task_and_saves_it(tmp_path):
    run_dir = tmp_path / "run"
    flags = ["--task", SPEC, "--num-prompts", "4", "--group-size", "2", "--total-timesteps", "8"]
    flags += ["--eval-prompts", "20", "--max-new-tokens", "6", "--save-model"]
    model = "benchmark/policies/lm-chain-sum-base"
    out = run_script("grpo_lm.py", ["--model", model] + flags, run_dir, fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["args"]["env_id"] == NAME, "--env-id taken from the task"
    metrics = read_metrics(run_dir)
    assert metrics["eval/accuracy"][0].tolist() == [0, 8]
    saved = json.loads((run_dir / "model" / "task.json").read_text())
    assert saved == load_task(SPEC), "the task beside the saved model is the task trained on"
