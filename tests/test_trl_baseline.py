"""benchmark/trl_baseline.py: TRL with our LM scripts' hyperparameters (the "trl:" rows of a suite).

The flag mapping (our Args -> TRL's config) without training, then two updates each of GRPO and DPO
on the committed base, whose run directory must hold what benchmark/run.py scores."""

import json

import pytest

pytest.importorskip("trl")

from benchmark.runs import read_metrics, run_finished, run_script, script_command  # noqa: E402
from benchmark.trl_baseline import dpo_config, grpo_config, parse  # noqa: E402


def test_dispatch():
    cmd = script_command("trl:grpo_lm.py", ["--seed", "1"], "runs/x")
    assert cmd[1].endswith("benchmark/trl_baseline.py")
    assert cmd[2:4] == ["--same-as", "grpo_lm.py"] and cmd[-2:] == ["--run-dir", "runs/x"]


def mapped(*flags, same_as="grpo_lm.py", steps=4800):
    argv = ["--same-as", same_as, "--env-id", "addition-v0", "--total-timesteps", str(steps)]
    _, a, ours = parse([*argv, *flags, "--run-dir", "/nonexistent/trl-run", "--no-cuda"])
    if same_as == "dpo_lm.py":
        return ours, dpo_config(a, ours)
    return ours, grpo_config(a, ours, max_new_tokens=5)


def test_grpo_mapping():
    ours, (name, c) = mapped()
    assert name == "GRPOTrainer"
    assert (c.num_generations, c.generation_batch_size, c.per_device_train_batch_size) == (
        8,
        128,
        128,
    )
    assert (c.steps_per_generation, c.gradient_accumulation_steps, c.max_steps) == (1, 1, 300)
    assert c.learning_rate == 3e-4 and c.lr_scheduler_type == "constant" and c.weight_decay == 0.0
    assert (c.warmup_steps, c.max_grad_norm, c.beta, c.num_iterations) == (0, 1.0, 0.0, 1)
    assert (c.epsilon, c.epsilon_high, c.temperature, c.max_completion_length) == (0.2, 0.2, 1.0, 5)
    assert (c.loss_type, c.scale_rewards, c.mask_truncated_completions) == ("grpo", "group", False)
    assert not c.bf16 and not c.gradient_checkpointing
    # Dr. GRPO
    _, (_, c) = mapped("--no-scale-rewards", "--loss-type", "dr_grpo")
    assert (c.loss_type, c.scale_rewards) == ("dr_grpo", "none")
    # DAPO: tyro's boolean flags and an optional float
    ours, (_, c) = mapped(
        "--clip-eps-high", "0.28", "--loss-type", "token", "--dynamic-sampling", "--mask-truncated"
    )
    assert ours.dynamic_sampling and ours.clip_eps_high == 0.28
    assert (c.epsilon_high, c.loss_type, c.mask_truncated_completions) == (0.28, "dapo", True)
    # RLOO
    _, (name, c) = mapped("--baseline", "rloo", "--no-scale-rewards")
    assert name == "RLOOTrainer" and c.beta == 0.0 and not c.normalize_advantages
    # mu 2, two minibatches: an optimizer step per minibatch, 4 per update
    _, (_, c) = mapped("--update-epochs", "2", "--num-minibatches", "2", steps=160)
    assert (c.per_device_train_batch_size, c.steps_per_generation) == (64, 2)
    assert (c.generation_batch_size, c.num_iterations, c.max_steps) == (128, 2, 40)


def test_dpo_mapping():
    _, (name, c) = mapped(same_as="dpo_lm.py", steps=14784)
    assert name == "DPOTrainer"
    assert (c.per_device_train_batch_size, c.max_steps, c.beta, c.learning_rate) == (
        64,
        231,
        1.0,
        3e-4,
    )
    assert c.loss_type == ["sigmoid"] and c.max_length is None and c.weight_decay == 0.0
    assert c.lr_scheduler_type == "constant" and c.max_grad_norm == 1.0


def test_no_bos_and_eos_ids():
    """TRL tokenizes the prompts with special tokens: the base's tokenizer adds none (no BOS), and
    "<eos>" appended to a completion's text is the end token's id."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        "benchmark/policies/lm-addition-base", trust_remote_code=False
    )
    assert tok.bos_token_id is None
    assert tok("321+654=")["input_ids"] == tok("321+654=", add_special_tokens=False)["input_ids"]
    assert tok("975" + tok.eos_token, add_special_tokens=False)["input_ids"][-1] == tok.eos_token_id


@pytest.mark.parametrize(
    "script, env_id, steps, every, unit",
    [
        ("trl:grpo_lm.py", "addition-v0", 32, 16, 16),
        ("trl:grpo_agent_lm.py", "calc-v0", 32, 16, 16),
        ("trl:dpo_lm.py", "addition-v0", 128, 64, 64),
    ],
)
def test_two_updates(tmp_path, script, env_id, steps, every, unit):
    run_dir = tmp_path / "run"
    flags = ["--env-id", env_id, "--total-timesteps", str(steps), "--seed", "1"]
    flags += ["--eval-every", str(every), "--eval-prompts", "12", "--no-cuda"]
    result = run_script(script, flags, run_dir, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["script"] == script and config["args"]["total_timesteps"] == steps
    assert config["difference"]
    m = read_metrics(run_dir)
    evals = m["eval/episodic_return"]
    assert sorted(set(evals[0].tolist())) == [0, unit, 2 * unit]
    assert all((evals[0] == s).sum() == 12 for s in (0, unit, 2 * unit))
    assert set(evals[1].tolist()) <= {0.0, 1.0}
    assert m["eval/accuracy"][0].tolist() == [0, unit, 2 * unit]
    assert m["charts/train_seconds"][0].tolist() == [0, unit, 2 * unit]
    assert m["charts/train_seconds"][1][0] == 0.0 and (m["charts/train_seconds"][1][1:] > 0).all()
    assert m["charts/tokens_per_s"][0].tolist() == [unit, 2 * unit]
    assert (m["charts/tokens_per_s"][1] > 0).all() and len(m["charts/update_seconds"][1]) == 2
    assert run_finished(run_dir)
    if script == "trl:grpo_agent_lm.py":  # the trajectories' statistics, as ours logs them
        assert m["eval/tool_call"][0].tolist().count(0) == 12 and "charts/tool_call" in m


def test_the_trl_reward_is_our_score_of_the_text_before_the_first_end_token():
    """TRL's completion ids (of any lengths) scored by our script's score(): the text before the
    first end token, a completion with none scores 0; the info column is each problem's JSON."""
    from benchmark.runs import load_script
    from benchmark.trl_baseline import task_reward

    lm = load_script("grpo_lm.py")
    policy, tokenizer = lm.load_policy("benchmark/policies/lm-addition-base")
    eos = tokenizer.eos_token_id
    ids = [tokenizer.encode("975") + [eos], tokenizer.encode("976") + [eos], tokenizer.encode("97")]
    counters = {}
    reward = task_reward(lm, tokenizer, {"name": "addition-v0"}, [eos], None, counters)
    out = reward([""] * 3, [""] * 3, ids, ["975"] * 3, ["null"] * 3)
    assert out == [1.0, 0.0, 0.0]
    assert counters == {"tokens": 10, "rewards": [1.0, 0.0, 0.0]}
    rg = {"rewards": ["reasoning_gym", "format"], "reasoning_gym": {"dataset": "chain_sum"}}
    rg["format"] = r"\d+"
    reward = task_reward(lm, tokenizer, rg, [eos], [1.0, 0.5], {})
    assert reward([""] * 3, [""] * 3, ids, ["975"] * 3, ["{}"] * 3) == [1.5, 0.5, 0.0]


def test_the_agent_rollout_gives_trl_the_trajectories_with_the_tools_tokens_masked():
    """trl:grpo_agent_lm.py's rollout_func: one trajectory per prompt TRL gives it (repeated
    already), each completion the model's and the calculator's tokens up to the last, env_mask 0
    exactly on the calculator's result, the sampling log-probabilities 0 there; the reward is our
    score of the trajectory's answer."""
    from types import SimpleNamespace

    import torch

    from benchmark.runs import load_script
    from benchmark.trl_baseline import agent_reward, agent_rollout
    from canonrl.lm import load_task

    agent = load_script("grpo_agent_lm.py")
    policy, tokenizer = agent.load_policy("benchmark/policies/lm-calc-base")
    task = load_task("benchmark/policies/lm-calc-base/task.json")
    tool = agent.task_tool(task)
    counters = {}
    rollout = agent_rollout(agent, tokenizer, tool, policy.end_ids, 24, 1.0, counters)
    trainer = SimpleNamespace(
        model=policy.lm, accelerator=SimpleNamespace(unwrap_model=lambda m: m)
    )
    prompts = [x[0] for x in task["heldout"][:8] for _ in range(4)]
    torch.manual_seed(0)
    out = rollout(prompts, trainer)
    assert len(out["completion_ids"]) == len(prompts) == len(out["trajectory_answer"])
    called = 0
    for ids, mask, logp in zip(out["completion_ids"], out["env_mask"], out["logprobs"]):
        assert len(ids) == len(mask) == len(logp)
        tool_part = tokenizer.decode([t for t, m in zip(ids, mask) if m == 0])
        text = tokenizer.decode(ids)
        if "</calc>" in text and "<r>" in text:
            called += 1
            assert tool_part.startswith("<r>") and tool_part.endswith("</r>"), text
        assert all(lp == 0.0 for lp, m in zip(logp, mask) if m == 0)
    assert called > 0
    assert counters["tokens"] == sum(len(ids) for ids in out["completion_ids"])
    reward = agent_reward(agent, task, None, counters)
    answers = [x[1] for x in task["heldout"][:8] for _ in range(4)]
    got = reward(prompts, [""] * 32, answers, ["null"] * 32, out["trajectory_answer"])
    assert got == [float(a == b) for a, b in zip(out["trajectory_answer"], answers)]
