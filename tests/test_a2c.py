"""A2C is a special case of PPO (Huang et al. 2022): ppo.py with one epoch of one minibatch of the
whole rollout, no advantage normalisation, RMSprop, GAE lambda 1, A2C's learning rate and no
annealing takes, update by update, the same steps as a2c.py. The probability ratio of PPO's single
step is exactly 1, so clipping has no effect."""

import pytest
import torch

from benchmark.runs import load_script, read_rows

A2C = dict(
    env_id="CartPole-v1",
    total_timesteps=4000,
    num_envs=8,
    num_steps=5,
    learning_rate=7e-4,
    gamma=0.99,
    gae_lambda=1.0,
    vf_coef=1.0,
    ent_coef=0.0,
    max_grad_norm=0.5,
    rmsprop=True,
    norm_adv=False,
    anneal_lr=False,
    save_model=True,
    eval_episodes=2,
    seed=3,
)


def test_ppo_with_a2c_settings_takes_the_steps_of_a2c(tmp_path, monkeypatch):
    a2c = load_script("a2c.py")
    a2c.main(a2c.Args(**A2C, run_dir=str(tmp_path / "a2c")))
    ppo = load_script("ppo.py")
    # ppo.py shuffles the rollout before cutting minibatches; with one minibatch the order changes
    # only the rounding of sums, but the shuffle draws from torch's generator, which then samples
    # other actions: keep the order
    monkeypatch.setattr(torch, "randperm", lambda n, device=None: torch.arange(n, device=device))
    ppo.main(
        ppo.Args(
            **A2C,
            update_epochs=1,
            num_minibatches=1,
            anneal_clip=False,
            run_dir=str(tmp_path / "ppo"),
        )
    )

    rows = {
        name: {
            (r["global_step"], r["name"]): r["value"]
            for r in read_rows(tmp_path / name)
            if r["name"].startswith(("losses/", "train/", "eval/"))
        }
        for name in ("a2c", "ppo")
    }
    updates = [k for k in rows["a2c"] if k[1] == "losses/policy_loss"]
    assert len(updates) == 4000 // 40
    # every update's losses, every episode, the final evaluation
    for key, value in rows["a2c"].items():
        # -A log pi against PPO's -A pi/pi_old: other values, the same gradient
        if key[1] != "losses/policy_loss":
            assert rows["ppo"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    # the ratio is 1 up to rounding: the rollout's forward pass (8 observations) and the
    # update's (40) may round differently on some CPUs (approx_kl of -3e-9 seen here), so no
    # ratio ever reaches the clip
    assert all(rows["ppo"][k] == 0 for k in rows["ppo"] if k[1] == "losses/clipfrac")
    assert all(abs(rows["ppo"][k]) < 1e-6 for k in rows["ppo"] if k[1] == "losses/approx_kl")
    weights = [
        torch.load(tmp_path / name / "model.pt", weights_only=True)["agent"]
        for name in ("a2c", "ppo")
    ]
    for name, w in weights[0].items():
        torch.testing.assert_close(weights[1][name], w, rtol=1e-5, atol=1e-6)
    assert any(
        (w != load_script("a2c.py").Agent(4, 2).state_dict()[n]).any()
        for n, w in weights[0].items()
    )
