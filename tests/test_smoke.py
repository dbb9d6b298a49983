"""smoke tier: every script runs a few hundred steps, leaves the run contract behind, saves and
reloads, survives Ctrl-C and resumes."""

import json
import signal
import time

import numpy as np
import pytest
import torch
from conftest import (
    DISCRETE,
    LONG,
    MPE,
    MULTI_AGENT,
    OFFLINE,
    OFFLINE_DISCRETE,
    PER_FAMILY,
    SMAC_LITE,
    SMOKE,
    smoke_env,
)

from benchmark.references import load_references, score
from benchmark.runs import load_script, read_metrics, read_rows, run_script, start_script
from canonrl.lm import load_task, task_path
from canonrl.run import RunLogger


def rms(saved_stats: dict):
    """A gymnasium RunningMeanStd holding saved statistics (mean, var, count)."""
    from gymnasium.wrappers.utils import RunningMeanStd

    stats = RunningMeanStd(shape=np.shape(saved_stats["mean"]))
    # model.pt: tensors
    vars(stats).update({k: v.numpy() if torch.is_tensor(v) else v for k, v in saved_stats.items()})
    return stats


def loaded(module, cls: str, saved: dict, key: str, *sizes: str):
    net = getattr(module, cls)(*(saved[s] for s in sizes))
    net.load_state_dict(saved[key])
    return net


def actor_states(state: dict) -> list[dict]:
    """The state_dict of each module of a saved nn.ModuleList ({"0.network.0.weight": ...}), in
    order."""
    parts = {}
    for key, value in state.items():
        index, name = key.split(".", 1)
        parts.setdefault(int(index), {})[name] = value
    return [parts[i] for i in sorted(parts)]


def reloaded_lm(module, saved: dict, episodes: int) -> list[float]:
    """The LM scripts: the run's --model with the saved weights, greedy on the run's held-out
    prompts."""
    args = module.Args(**saved["args"])
    policy, tokenizer = module.load_policy(args.model)
    policy.load_state_dict(saved["policy"])
    task = load_task(task_path(args))
    budget = args.max_new_tokens or task["max_new_tokens"]
    pairs = task["heldout"][:episodes]
    if hasattr(module, "task_tool"):  # grpo_agent_lm.py: its rollouts call the task's tool
        tool = module.task_tool(task, args.max_calls)
        results = module.evaluate(policy, tokenizer, tool, pairs, task, budget)
    else:
        results = module.evaluate(policy, tokenizer, pairs, task, budget)
    return results["eval/episodic_return"]


# Rebuild each script's policy from model.pt alone and evaluate it as the script does at the end of
# training: script -> (module, saved, env_id, episodes, seed) -> returns
RELOAD = {
    **{
        script: lambda m, s, *a: m.evaluate(
            loaded(m, "Agent", s, "agent", "obs_dim", "n_actions"), *a
        )
        for script in ("ppo.py", "a2c.py")
    },
    "ppo_lstm.py": lambda m, s, *a: m.evaluate(
        loaded(m, "Agent", s, "agent", "obs_dim", "n_actions", "lstm_size", "continuous"),
        rms(s["obs_rms"]),
        *a,
    ),
    "ppo_rnd.py": lambda m, s, *a: m.evaluate(
        loaded(m, "Agent", s, "agent", "view_shape", "n_actions"), *a, layout=s["layout"]
    ),
    "gail.py": lambda m, s, *a: m.evaluate(
        loaded(m, "Agent", s, "agent", "obs_dim", "action_dim", "continuous"),
        rms(s["obs_rms"]),
        *a,
    ),
    "impala.py": lambda m, s, *a: m.evaluate(
        loaded(m, "Agent", s, "agent", "obs_shape", "n_actions"), *a
    ),
    "rl2.py": lambda m, s, env, episodes, seed: m.evaluate(
        loaded(m, "Agent", s, "agent", "n_inputs", "n_actions", "gru_size"),
        env,
        s["args"]["episodes_per_trial"],
        episodes,
        seed,
    ),
    "dqn.py": lambda m, s, *a: m.evaluate(
        loaded(m, "QNetwork", s, "q_network", "obs_dim", "n_actions"), *a
    ),
    "pqn.py": lambda m, s, *a: m.evaluate(
        loaded(m, "QNetwork", s, "q_network", "obs_shape", "n_actions"), *a
    ),
    "qrdqn.py": lambda m, s, *a: m.evaluate(
        loaded(m, "QNetwork", s, "q_network", "obs_dim", "n_actions", "n_quantiles"), *a
    ),
    "c51.py": lambda m, s, *a: m.evaluate(
        loaded(m, "QNetwork", s, "q_network", "obs_dim", "n_actions", "n_atoms", "v_min", "v_max"),
        *a,
    ),
    **{
        script: lambda m, s, *a: m.evaluate(loaded(m, "QNetwork", s, "q_network", "n_actions"), *a)
        for script in ("dqn_atari.py", "ddqn_atari.py")
    },
    "sac_atari.py": lambda m, s, *a: m.evaluate(loaded(m, "Actor", s, "actor", "n_actions"), *a),
    "iqn_atari.py": lambda m, s, *a: m.evaluate(
        loaded(m, "QNetwork", s, "q_network", "n_actions", "n_cos", "n_policy_quantiles"), *a
    ),
    "rainbow_atari.py": lambda m, s, *a: m.evaluate(
        loaded(m, "QNetwork", s, "q_network", "n_actions", "n_atoms", "v_min", "v_max"), *a
    ),
    "c51_atari.py": lambda m, s, *a: m.evaluate(
        loaded(m, "QNetwork", s, "q_network", "n_actions", "n_atoms", "v_min", "v_max"), *a
    ),
    **{
        script: lambda m, s, *a: m.evaluate(loaded(m, "Agent", s, "agent", "n_actions"), *a)
        for script in ("ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_multigpu.py")
    },
    **{
        script: lambda m, s, *a: m.evaluate(
            loaded(
                m, "Agent", s, "agent", "obs_dim", "state_dim", "n_agents", "n_actions", "hidden"
            ),
            *a,
        )
        for script in ("mappo_smac_lite.py", "ippo_smac_lite.py")
    },
    **{
        script: lambda m, s, *a: m.evaluate(
            loaded(m, "RNNAgent", s, "agent", "input_dim", "n_actions", "hidden"), *a
        )
        for script in ("qmix_smac_lite.py", "vdn_smac_lite.py")
    },
    **{
        script: lambda m, s, env, episodes, _: m.evaluate(
            loaded(
                m, "Agent", s, "agent", "obs_dim", "state_dim", "n_agents", "n_actions", "hidden"
            ),
            env,
            episodes,
            # the MPE scripts' evaluation seed (run
            # seed 7)
            7 + 10**9,
        )
        for script in ("mappo_mpe.py", "ippo_mpe.py")
    },
    "maddpg_mpe.py": lambda m, s, env, episodes, _: m.evaluate(
        torch.nn.ModuleList(
            loaded(
                m,
                "Actor",
                {**s, "actor": state, "obs_dim": o, "action_dim": a},
                "actor",
                "obs_dim",
                "action_dim",
                "hidden",
            )
            for o, a, state in zip(s["obs_dims"], s["action_dims"], actor_states(s["actors"]))
        ),
        env,
        episodes,
        7 + 10**9,
    ),
    "ppo_continuous.py": lambda m, s, *a: m.evaluate(
        loaded(m, "Agent", s, "agent", "obs_dim", "action_dim"), rms(s["obs_rms"]), *a
    ),
    **{
        script: lambda m, s, *a: m.evaluate(
            loaded(m, "Actor", s, "actor", "obs_dim", "action_dim"), *a
        )
        for script in (
            "ddpg_continuous.py",
            "sac_continuous.py",
            "td3_continuous.py",
            *OFFLINE - OFFLINE_DISCRETE,
        )
    },
    "bc_discrete.py": lambda m, s, *a: m.evaluate(
        loaded(m, "Actor", s, "actor", "obs_shape", "n_actions"), *a
    ),
    "cql_discrete.py": lambda m, s, *a: m.evaluate(
        loaded(m, "QNetwork", s, "q_network", "obs_shape", "n_actions"), *a
    ),
    "grpo_lm.py": lambda m, s, env, episodes, _: reloaded_lm(m, s, episodes),
    "grpo_agent_lm.py": lambda m, s, env, episodes, _: reloaded_lm(m, s, episodes),
    "dpo_lm.py": lambda m, s, env, episodes, _: reloaded_lm(m, s, episodes),
    "ppo_lm.py": lambda m, s, env, episodes, _: reloaded_lm(m, s, episodes),
}


def test_run_contract_and_saved_model(smoke_script, smoke_runs, tmp_path):
    run_dir = tmp_path / "run"
    run = smoke_runs(smoke_script, run_dir)  # SMOKE + --save-model --seed 7
    out = run.out
    assert f"run saved in {run.run_dir}" in out.stdout, "the last lines say where the run is"
    env_id = smoke_env(smoke_script)
    ours = [
        r
        for r in load_references()
        if (r.script, r.env_id) == (smoke_script, env_id)
        and r.values
        and
        # e.g. CartPole-v1; Hopper-v5 has none of ours yet
        r.score in ("final_eval", "final_win_rate")
    ]
    # a reference of a script that reads a dataset (offline, gail.py) is of its dataset; the
    # smoke runs' tiny datasets have none
    if smoke_script in OFFLINE or "--dataset" in SMOKE[smoke_script]:
        ours = []
    config = json.loads((run_dir / "config.json").read_text())
    # the verdict compares only with a reference of the run's hyperparameters
    logger = object.__new__(RunLogger)
    logger.args = load_script(smoke_script).Args(**config["args"])
    same = [r for r in ours if logger.same_flags(list(r.flags))]
    expected = (
        f"reference ours-{smoke_script[:-3]}-{env_id}"
        if same
        else f"no reference with these flags for {smoke_script} on {env_id}"
        if ours
        else f"no reference for {smoke_script} on {env_id}"
    )
    assert expected in out.stdout, (
        "and compare it with the script's reference (or say there is none)"
    )
    assert (
        config["script"] == smoke_script
        and config["args"]["seed"] == 7
        and "torch" in config["versions"]
    )
    metrics = read_metrics(run_dir)
    names = (
        (
            "train/episodic_return_team",
            "train/episodic_length",
            "train/win_rate",
            "eval/episodic_return_team",
            "eval/win_rate",
        )
        if smoke_script in SMAC_LITE
        else (
            "train/episodic_return_agent_mean",
            "train/episodic_length",
            "eval/episodic_return_agent_mean",
        )
        if smoke_script in MPE
        else ("eval/episodic_return", "eval/normalized_score")
        if smoke_script in OFFLINE
        else ("eval/accuracy", "eval/episodic_return")  # DPO trains on pairs, not episodes
        if smoke_script == "dpo_lm.py"
        else ("train/episodic_return", "train/episodic_length", "eval/episodic_return")
    )
    for name in names + ("charts/sps",):
        assert name in metrics, f"{name} missing from metrics.csv"
    assert any(n.startswith("losses/") for n in metrics)
    assert list(run_dir.glob("events.out.tfevents.*")), "no TensorBoard events"
    assert (run_dir / "checkpoint.pt").is_file()

    # the saved model evaluates to the return logged at the end of training
    saved = torch.load(run_dir / "model.pt", weights_only=True)
    saved_returns = saved["eval_returns"]  # multi-agent: {metric name: one value per episode}
    episodes = len(
        next(iter(saved_returns.values())) if smoke_script in MULTI_AGENT else saved_returns
    )
    returns = RELOAD[smoke_script](load_script(smoke_script), saved, env_id, episodes, 7 + 100_000)
    assert returns == saved_returns, "the reloaded model must evaluate exactly as it did when saved"
    if smoke_script in SMAC_LITE:
        assert np.mean(returns["eval/win_rate"]) == pytest.approx(score(metrics, "final_win_rate"))
    returns = returns["eval/episodic_return_agent_mean"] if smoke_script in MPE else returns
    if smoke_script not in SMAC_LITE:
        assert np.mean(returns) == pytest.approx(score(metrics, "final_eval"))


@pytest.mark.parametrize("script", sorted(set(SMOKE) - DISCRETE - MULTI_AGENT - OFFLINE))
def test_continuous_scripts_run_on_halfcheetah(script, tmp_path):
    """The second MuJoCo env of the smoke tier: 17-dim observations, 6-dim actions, no early
    termination (no training episode ends within the smoke budget), so the scripts must not rely on
    one ending."""
    flags = list(SMOKE[script])
    flags[flags.index("--env-id") + 1] = "HalfCheetah-v5"
    out = run_script(script, flags + ["--save-model"], tmp_path / "run", fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    steps, returns = read_metrics(tmp_path / "run")["eval/episodic_return"]
    assert len(returns) == 2 and np.isfinite(returns).all()
    saved = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    assert (saved["obs_dim"], saved["action_dim"]) == (17, 6)


def test_track_offline_wandb(tmp_path):
    out = run_script(
        "ppo.py", SMOKE["ppo.py"] + ["--track"], tmp_path / "run", WANDB_MODE="offline", fork=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*")), "no offline wandb run written"


@pytest.mark.parametrize("script", sorted(MULTI_AGENT))
def test_multi_agent_capture_video_saves_the_first_evaluation_episode(script, tmp_path):
    """--capture-video: a GIF of evaluation battle (episode) 0, frame by frame until it ends, in
    <run_dir>/videos."""
    import imageio.v2 as imageio

    out = run_script(script, SMOKE[script] + ["--capture-video"], tmp_path / "run", fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    gifs = list((tmp_path / "run" / "videos").glob("*.gif"))
    assert len(gifs) == 1, gifs
    frames = imageio.mimread(gifs[0])
    assert len(frames) > 2 and frames[0].ndim == 3 and frames[0].shape[0] > 50
    assert any((f != frames[0]).any() for f in frames[1:]), "the battle moves"


@pytest.mark.parametrize("smoke_script", PER_FAMILY)
def test_ctrl_c_keeps_metrics_and_resume_continues(smoke_script, tmp_path):
    run_dir = tmp_path / "run"
    flags = SMOKE[smoke_script] + [
        "--total-timesteps",
        str(LONG[smoke_script]),
        "--checkpoint-every",
        "1000000",
    ]
    # SIGINT raises KeyboardInterrupt in the run
    proc = start_script(smoke_script, flags, run_dir, fork=True)
    deadline = time.time() + 60
    while time.time() < deadline:  # wait until training has logged losses, then press Ctrl-C
        if (run_dir / "metrics.csv").exists() and "losses/" in (
            run_dir / "metrics.csv"
        ).read_text():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-2000:]
    assert "--resume" in stderr
    before = read_rows(run_dir)
    assert before and (run_dir / "checkpoint.pt").is_file()
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    ckpt_step = ckpt["global_step"]
    # replay: the steps the checkpoint counts are the steps it stores (before the ring wraps)
    rb = ckpt.get("rb")
    if rb is not None and not torch.as_tensor(rb["full"]).any():
        # dqn_atari: frames, one per step + episode ends
        stored = int(rb["valid"].sum()) if "valid" in rb else rb["pos"]
        assert stored == ckpt_step, "a transition stored twice (or lost) across Ctrl-C and resume"

    out = run_script(smoke_script, ["--resume", str(run_dir)], fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    after = read_rows(run_dir)
    kept = [r for r in before if r["global_step"] <= ckpt_step]
    assert after[: len(kept)] == kept, "resuming keeps every row up to the checkpoint as it was"
    resumed = after[len(kept) :]
    assert resumed and resumed[-1]["name"].startswith("eval/")
    assert resumed[-1]["global_step"] >= 0.95 * LONG[smoke_script], (
        "the resumed run trains to the end of its budget"
    )
    assert min(r["global_step"] for r in resumed) > ckpt_step, (
        "a resumed run continues from its checkpoint"
    )
    steps = [r["global_step"] for r in after]
    assert steps == sorted(steps), (
        "the redone steps of the interrupted rollout are not logged twice"
    )


@pytest.mark.parametrize("smoke_script", PER_FAMILY)
def test_resume_extends_the_budget_and_keeps_the_other_flags(smoke_script, smoke_runs, tmp_path):
    run_dir = tmp_path / "run"
    smoke_runs(smoke_script, run_dir)
    first_end = max(r["global_step"] for r in read_rows(run_dir))
    # twice the first
    budget = 2 * int(SMOKE[smoke_script][SMOKE[smoke_script].index("--total-timesteps") + 1])
    out = run_script(
        smoke_script,
        ["--resume", str(run_dir), "--total-timesteps", str(budget), "--learning-rate", "0.5"],
        fork=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert (
        f"--total-timesteps {budget} (was" in out.stderr
        and "ignored: --learning-rate" in out.stderr
    )
    rows = read_rows(run_dir)
    steps = [r["global_step"] for r in rows]
    assert steps == sorted(steps) and max(steps) > first_end and max(steps) > budget - 256
    config = torch.load(run_dir / "checkpoint.pt", weights_only=True)["args"]
    assert config["total_timesteps"] == budget and (
        config["learning_rate"] == load_script(smoke_script).Args().learning_rate
    )
