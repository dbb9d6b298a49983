"""The `imitation` library's GAIL (1.0.1) on our demonstrations, run by
benchmark/imitation_baseline.py inside imitation's own venv (gymnasium 0.29, stable-baselines3
2.2): it imports nothing of this project, only imitation, stable-baselines3, gymnasium, numpy and
torch.

    <imitation venv>/bin/python benchmark/imitation_gail.py SPEC.json

SPEC.json (written by imitation_baseline.py) holds the env, seed, budget, evaluation schedule, the
hyperparameters mapped from algos/gail.py and the path of an .npz of the demonstrations (obs,
next_obs, actions, dones: every transition). The run writes <run_dir>/metrics.csv as our scripts do
(global_step, wall_time, name, value): train/episodic_return per training episode (the env's own
reward), charts/train_seconds and eval/episodic_return per episode of a deterministic evaluation
(seeds seed + 100000 + episode) every eval_every env steps and at the end.
"""

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch


def evaluate(learner, vecnorm, env_id, episodes, seed):
    """Deterministic episodes on a fresh env (the mean or most probable action, clipped to the
    bounds by SB3's predict), the observations normalised by vecnorm's frozen statistics."""
    env, returns = gym.make(env_id), []
    for ep in range(episodes):
        (obs, _), done, total = env.reset(seed=seed + ep), False, 0.0
        while not done:
            x = vecnorm.normalize_obs(obs[None]) if vecnorm.norm_obs else obs[None]
            action = learner.predict(x, deterministic=True)[0][0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return returns


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("spec", type=Path, help="the SPEC.json that imitation_baseline.py wrote")
    spec = json.loads(p.parse_args(argv).spec.read_text())
    # imitation is in its own venv only: imported after the arguments, so that --help works
    # anywhere
    from imitation.algorithms.adversarial.gail import GAIL
    from imitation.data import types
    from imitation.data.wrappers import RolloutInfoWrapper
    from imitation.rewards.reward_nets import BasicRewardNet
    from imitation.util import logger as imitation_logger
    from imitation.util.networks import RunningNorm
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    h, run_dir = spec["hyperparameters"], Path(spec["run_dir"])
    torch.set_num_threads(1)
    torch.manual_seed(spec["seed"])
    demos = np.load(spec["demonstrations"])
    transitions = types.Transitions(
        obs=demos["obs"],
        acts=demos["actions"],
        infos=np.array([{}] * len(demos["obs"])),
        next_obs=demos["next_obs"],
        dones=demos["dones"].astype(bool),
    )
    env_fns = [lambda: RolloutInfoWrapper(gym.make(spec["env_id"]))] * h["num_envs"]
    venv = DummyVecEnv(env_fns)
    venv.seed(spec["seed"])
    learner = PPO(
        "MlpPolicy",
        venv,
        n_steps=h["num_steps"],
        batch_size=h["minibatch_size"],
        n_epochs=h["update_epochs"],
        learning_rate=h["learning_rate"],
        gamma=h["gamma"],
        gae_lambda=h["gae_lambda"],
        clip_range=h["clip_coef"],
        ent_coef=h["ent_coef"],
        vf_coef=h["vf_coef"],
        max_grad_norm=h["max_grad_norm"],
        target_kl=h["target_kl"],
        normalize_advantage=h["norm_adv"],
        policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh),
        seed=spec["seed"],
        device="cpu",
    )
    reward_net = BasicRewardNet(
        venv.observation_space,
        venv.action_space,
        hid_sizes=(64, 64),
        activation=torch.nn.Tanh,
        normalize_input_layer=RunningNorm,
    )
    trainer = GAIL(
        demonstrations=transitions,
        demo_batch_size=h["minibatch_size"],
        gen_replay_buffer_capacity=h["batch_size"],
        n_disc_updates_per_round=h["disc_updates"],
        venv=venv,
        gen_algo=learner,
        reward_net=reward_net,
        disc_opt_kwargs={"lr": h["disc_learning_rate"]},
        allow_variable_horizon=True,  # CartPole's episodes end when the pole falls
        init_tensorboard=False,
        # imitation's own log (its statistics per round) as a CSV in the run, not on the terminal
        custom_logger=imitation_logger.configure(str(run_dir / "imitation-log"), ["csv"]),
    )
    # observations (Box actions) and the learnt rewards normalised as algos/gail.py does, above
    # the wrappers that record the env's observations for the discriminator and put its reward in
    vecnorm = VecNormalize(
        trainer.venv_train,
        norm_obs=h["normalize_obs"],
        norm_reward=h["normalize_reward"],
        clip_obs=10.0,
        clip_reward=10.0,
        gamma=h["gamma"],
    )
    learner.set_env(vecnorm)

    f = open(run_dir / "metrics.csv", "w", newline="")
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(["global_step", "wall_time", "name", "value"])
    start, eval_seconds, step = time.time(), 0.0, 0

    def log_episodes(infos_list):
        # RolloutInfoWrapper's per-episode record of the env's own rewards
        for info in infos_list:
            if "rollout" in info:
                writer.writerow(
                    [
                        step,
                        f"{time.time():.3f}",
                        "train/episodic_return",
                        float(np.sum(info["rollout"]["rews"])),
                    ]
                )

    def log_eval(at):
        nonlocal eval_seconds
        writer.writerow(
            [at, f"{time.time():.3f}", "charts/train_seconds", time.time() - start - eval_seconds]
        )
        t = time.time()
        returns = evaluate(
            learner, vecnorm, spec["env_id"], spec["eval_episodes"], spec["seed"] + 100_000
        )
        eval_seconds += time.time() - t
        writer.writerows([at, f"{time.time():.3f}", "eval/episodic_return", r] for r in returns)
        f.flush()
        return returns

    class Log(BaseCallback):
        def _on_step(self) -> bool:
            nonlocal step
            step += h["num_envs"]
            log_episodes(self.locals["infos"])
            return True

    trainer.gen_callback = [trainer.gen_callback, Log()]
    batch, iterations, every = (
        h["batch_size"],
        spec["total_timesteps"] // h["batch_size"],
        spec["eval_every"],
    )
    for iteration in range(1, iterations + 1):
        # algos/gail.py's schedules, one value per rollout (SB3's own would restart at every round)
        frac = 1.0 - (iteration - 1.0) / iterations
        lr = frac * h["learning_rate"] if h["anneal_lr"] else h["learning_rate"]
        clip = frac * h["clip_coef"] if h["anneal_clip"] else h["clip_coef"]
        learner.lr_schedule = lambda _, lr=lr: lr
        learner.clip_range = lambda _, clip=clip: clip
        trainer.train(batch)  # one round: a rollout, its PPO update, then the discriminator's
        last, now = (iteration - 1) * batch, iteration * batch
        if every and iteration < iterations and now // every > last // every:
            vecnorm.training = False
            log_eval(now)
            vecnorm.training = True
    vecnorm.training = False
    returns = log_eval(iterations * batch)
    f.close()
    print(f"eval/episodic_return: {np.mean(returns):.2f} over {len(returns)} episodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
