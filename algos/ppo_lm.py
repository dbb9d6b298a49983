"""PPO for language models with a value head, on a task with a verifiable reward (addition-v0).

Ziegler et al. 2019, Ouyang et al. 2022: one sampled completion per prompt; each token's reward is
-kl_coef * (log pi - log ref) of that token, and the last token also gets the task's reward; a
linear value head on the policy's last layer; GAE over the completion's tokens; the clipped policy
and value losses of PPO, several epochs of minibatches per batch of rollouts. A step is one prompt
trained on; --save-model writes <run_dir>/model (from_pretrained) beside model.pt.

Run:    python algos/ppo_lm.py --seed 1
Quick:  python algos/ppo_lm.py --total-timesteps 1024
Results: benchmark/references.toml (ours-ppo_lm-addition-v0), README.md
"""

import copy
import csv
import difflib
import hashlib
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import warnings
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import gymnasium as gym  # the shared env check's; a task is not a Gymnasium env
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm


@dataclass
class Args:
    model: str = "benchmark/policies/lm-addition-base"
    """causal LM directory or id"""
    task: str | None = None
    """task file (JSON: name, max_new_tokens, [prompt, answer] lists train and heldout); default:
    <model>/task.json"""
    learning_rate: float = 3e-4
    """Adam learning rate of policy and value head (1e-4: a slower, smoother curve)"""
    num_prompts: int = 128
    """prompts per update, one sampled completion each"""
    update_epochs: int = 4
    """passes over each batch of rollouts"""
    num_minibatches: int = 4
    """minibatches per pass (must divide --num-prompts)"""
    gamma: float = 1.0
    """discount over the tokens of a completion"""
    gae_lambda: float = 0.95
    """GAE's lambda over tokens"""
    kl_coef: float = 0.05
    """weight of the per-token KL penalty to the reference in the reward (TRL: 0.05)"""
    clip_coef: float = 0.2
    """the ratio is clipped to [1 - clip_coef, 1 + clip_coef]"""
    vf_coef: float = 0.1
    """weight of the value loss (TRL: 0.1)"""
    clip_vloss: bool = True
    """clip the value's change to clip_coef as PPO's value loss does"""
    max_new_tokens: int | None = None
    """completion budget in tokens (default: the task's)"""
    temperature: float = 1.0
    """sampling temperature (the loss's log-probabilities use it too)"""
    max_grad_norm: float = 1.0
    """global gradient norm clip"""
    eval_prompts: int = 500
    """held-out prompts per greedy evaluation (at most the task's; 0: none)"""
    env_id: str = "addition-v0"
    """the task's name, checked against the task file"""
    total_timesteps: int = 12800
    """prompts trained on (updates * num_prompts)"""
    # ---- shared: args ----
    seed: int = 1
    """seed of torch, numpy, random and the envs"""
    cuda: bool = False
    """run on CUDA when available (the CNN scripts gain from it; small MLPs are fastest on a CPU)"""
    torch_deterministic: bool = True
    """torch.backends.cudnn.deterministic and one CPU thread"""
    track: bool = False
    """log to Weights & Biases (works offline with WANDB_MODE=offline)"""
    wandb_project_name: str = "canonrl"
    """wandb project"""
    wandb_entity: str | None = None
    """wandb entity (team)"""
    capture_video: bool = False
    """record episode 0 of the final evaluation to <run_dir>/videos"""
    save_model: bool = False
    """save <run_dir>/model.pt at the end"""
    eval_episodes: int = 10
    """evaluation episodes (the policy evaluate() runs) at the end and each --eval-every"""
    eval_every: int = 0
    """also evaluate every this many steps (0: only at the end); logs charts/train_seconds too"""
    run_dir: str | None = None
    """where the run is written (default runs/<env>__<script>__<seed>__<time>); must be new"""
    resume: str | None = None
    """continue the run in this directory (its flags; --total-timesteps may extend it)"""
    checkpoint_every: int = 50_000
    """save <run_dir>/checkpoint.pt every this many steps (and at the end and on Ctrl-C)"""
    # ---- end shared: args ----


# ---- shared: lm/model ----
def load_task(path: Path) -> dict:
    """The task file: {"name", "max_new_tokens", "train": [[prompt, answer], ...], "heldout"}."""
    return json.loads(Path(path).read_text())


def reward(completion: str | None, answer: str) -> float:
    """The verifiable reward: 1.0 for exactly the answer, 0.0 for a wrong one and for a malformed
    one (completion None: no end token within the budget)."""
    return float(completion is not None and completion == answer)


def completion_texts(tokenizer, completions: torch.Tensor) -> list[str | None]:
    """The text of each completion before its end token; None where it has none (truncated)."""
    texts = []
    for row in completions.tolist():
        if tokenizer.eos_token_id in row:
            texts.append(tokenizer.decode(row[: row.index(tokenizer.eos_token_id)]))
        else:
            texts.append(None)
    return texts


class Policy(nn.Module):
    """A causal language model (transformers) as a policy over tokens. Prompts are padded on the
    left, completions on the right after their end token; positions count real tokens only."""

    def __init__(self, lm, pad_id: int, eos_id: int):
        super().__init__()
        self.lm = lm
        self.pad_id = pad_id
        self.eos_id = eos_id

    def forward(self, ids, mask, past_key_values=None, positions=None, hidden=False):
        if positions is None:
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
        # on a GPU: bf16 mixed precision (the weights and Adam's state stay float32)
        with torch.autocast("cuda", torch.bfloat16, enabled=ids.is_cuda):
            return self.lm(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=past_key_values,
                use_cache=past_key_values is not None,
                output_hidden_states=hidden,
            )

    def token_logprobs(self, ids, mask, n_prompt: int, temperature: float = 1.0):
        """Log-probabilities and entropies (B, T) of the tokens ids[:, n_prompt:] (the completions)
        under the policy at `temperature`, and the last layer's states (B, T, hidden) at the
        positions that predict them (a value head reads these): one forward pass."""
        out = self(ids, mask, hidden=True)
        logits = out.logits[:, n_prompt - 1 : -1].float() / temperature
        logp = torch.log_softmax(logits, dim=-1)
        token_logp = logp.gather(-1, ids[:, n_prompt:, None]).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        return token_logp, entropy, out.hidden_states[-1][:, n_prompt - 1 : -1]

    @torch.no_grad()
    def generate(
        self,
        prompt_ids,
        prompt_mask,
        max_new_tokens: int,
        greedy: bool = False,
        temperature: float = 1.0,
    ):
        """Sample (or, greedy, take the most probable) completions token by token with a KV cache.
        Returns completions (B, max_new_tokens) padded after the end token, their mask (1 up to
        and including the end token) and each sampled token's log-probability (0 where masked)."""
        from transformers import DynamicCache

        cache = DynamicCache()
        mask = prompt_mask
        step_ids = prompt_ids
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        done = torch.zeros(len(prompt_ids), dtype=torch.bool, device=prompt_ids.device)
        tokens = []
        alive = []
        logps = []
        for _ in range(max_new_tokens):
            logits = self(step_ids, mask, cache, positions).logits[:, -1].float() / temperature
            dist = torch.distributions.Categorical(logits=logits, validate_args=False)
            token = logits.argmax(-1) if greedy else dist.sample()
            token = torch.where(done, self.pad_id, token)
            tokens.append(token)
            alive.append(~done)
            logps.append(torch.where(done, 0.0, dist.log_prob(token)))
            done = done | (token == self.eos_id)
            if done.all():
                break
            mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
            step_ids = token[:, None]
            positions = mask.sum(-1, keepdim=True) - 1
        pad = (0, max_new_tokens - len(tokens))  # every batch is max_new_tokens wide
        completions = nn.functional.pad(torch.stack(tokens, 1), pad, value=self.pad_id)
        c_mask = nn.functional.pad(torch.stack(alive, 1).long(), pad)
        return completions, c_mask, nn.functional.pad(torch.stack(logps, 1), pad)


def encode_prompts(tokenizer, prompts: list[str], device):
    """(ids, mask) of prompts padded on the left to the longest."""
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


@torch.no_grad()
def evaluate(
    policy, tokenizer, pairs: list, max_new_tokens: int, device="cpu", batch_size: int = 500
):
    """Greedy completions of held-out [prompt, answer] pairs; returns one reward per prompt."""
    rewards = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        ids, mask = encode_prompts(tokenizer, [p for p, _ in chunk], device)
        completions, _, _ = policy.generate(ids, mask, max_new_tokens, greedy=True)
        texts = completion_texts(tokenizer, completions)
        rewards += [reward(text, answer) for text, (_, answer) in zip(texts, chunk)]
    return rewards


def load_policy(model: str, device="cpu"):
    """(Policy, tokenizer) from a from_pretrained directory or id (a directory may be given relative
    to the repository: the default base)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()  # the weights of a small model load at once
    path = find(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return Policy(lm, tokenizer.pad_token_id, tokenizer.eos_token_id).to(device), tokenizer


def find(path: str) -> str:
    """path as given, or relative to the repository root where it exists only there."""
    if not Path(path).exists() and (ALGOS.parent / path).exists():
        return str(ALGOS.parent / path)
    return path


# ---- end shared: lm/model ----


class ValueHead(nn.Module):
    """V(prompt and completion so far): a linear map of the last layer's state, 0 at first."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden):
        return self.linear(hidden.float()).squeeze(-1)


def token_rewards(score, logp, ref_logp, mask, kl_coef: float):
    """Per-token rewards (B, T): -kl_coef * (logp - ref_logp) at every completion token, plus the
    task's score (B,) at the last one (Ziegler et al. 2019, eq. 2 spread over tokens)."""
    rewards = -kl_coef * (logp - ref_logp) * mask
    last = mask.sum(1).long() - 1
    rewards[torch.arange(len(score)), last] += score
    return rewards


def token_gae(rewards, values, mask, gamma: float, gae_lambda: float):
    """GAE (Schulman et al. 2016) over each completion's tokens: delta_t = r_t + gamma V_{t+1} -
    V_t, with V after the last token 0 (the episode ends there); padding gets 0. Returns
    (advantages, returns), both (B, T)."""
    advantages = torch.zeros_like(rewards)
    last_gae = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        next_values = values[:, t + 1] * mask[:, t + 1] if t + 1 < rewards.shape[1] else 0.0
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last_gae = (delta + gamma * gae_lambda * last_gae) * mask[:, t]
        advantages[:, t] = last_gae
    return advantages, advantages + values


def masked_whiten(x, mask):
    """(x - mean) / std over the masked entries, as PPO normalises advantages."""
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = (((x - mean) * mask) ** 2).sum() / (n - 1).clamp(min=1)
    return (x - mean) / (var.sqrt() + 1e-8) * mask


def ppo_loss(logp, old_logp, advantages, values, old_values, returns, mask, clip_coef, clip_vloss):
    """PPO's clipped policy loss and (clipped) value loss, each a mean over the batch's completion
    tokens. Returns (policy loss, value loss, statistics)."""
    n = mask.sum().clamp(min=1)
    ratio = (logp - old_logp).exp()
    pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef))
    policy_loss = (pg * mask).sum() / n
    v_loss = (values - returns) ** 2
    if clip_vloss:
        clipped = old_values + (values - old_values).clamp(-clip_coef, clip_coef)
        v_loss = torch.max(v_loss, (clipped - returns) ** 2)
    value_loss = 0.5 * (v_loss * mask).sum() / n
    with torch.no_grad():
        stats = {
            "clipfrac": (((ratio - 1).abs() > clip_coef).float() * mask).sum() / n,
            "approx_kl": (((ratio - 1) - (logp - old_logp)) * mask).sum() / n,
        }
    return policy_loss, value_loss, stats


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    task = load_task(task_path(args))
    max_new_tokens = args.max_new_tokens or task["max_new_tokens"]
    policy, tokenizer = load_policy(args.model, device)
    value_head = ValueHead(policy.lm.config.hidden_size).to(device)
    reference = copy.deepcopy(policy).eval().requires_grad_(False)  # the frozen base: KL penalty
    params = [*policy.parameters(), *value_head.parameters()]
    optimizer = torch.optim.Adam(params, lr=args.learning_rate)
    np_rng = np.random.default_rng(args.seed)  # which train prompts each update samples
    heldout = task["heldout"][: args.eval_prompts]
    train_ids, train_mask = encode_prompts(tokenizer, [p for p, _ in task["train"]], device)
    answers = [a for _, a in task["train"]]
    minibatch = args.num_prompts // args.num_minibatches
    num_iterations = args.total_timesteps // args.num_prompts
    iteration = 0

    def run_eval():  # greedy, on the held-out prompts
        rewards = evaluate(policy, tokenizer, heldout, max_new_tokens, device)
        return {"eval/episodic_return": rewards}

    stateful = {
        "policy": policy,
        "value_head": value_head,
        "optimizer": optimizer,
        "rng": RNGs(np_rng),
    }  # saved and resumed
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)
        iteration = ckpt["iteration"]
    global_step = iteration * args.num_prompts
    logger = RunLogger(args, run_dir, num_iterations * args.num_prompts, global_step, ckpt=ckpt)
    if ckpt is None and heldout:  # the first evaluation: the model as loaded
        log_eval(logger, global_step, logger.evaluate(global_step, run_eval))
    tokens_done = 0
    sampling_start = time.time()
    generation_seconds = 0.0
    update_seconds = 0.0
    update_tokens = 0
    for iteration in range(iteration + 1, num_iterations + 1):
        phase_start = time.time()
        policy.eval()  # sampling: no dropout
        idx = torch.as_tensor(np_rng.choice(len(answers), args.num_prompts, replace=False))
        ids = train_ids[idx]
        mask = train_mask[idx]
        completions, c_mask, _ = policy.generate(
            ids, mask, max_new_tokens, temperature=args.temperature
        )
        generation_seconds += time.time() - phase_start
        phase_start = time.time()
        texts = completion_texts(tokenizer, completions)
        score = torch.tensor([reward(t, answers[i]) for t, i in zip(texts, idx)], device=device)
        full_ids = torch.cat([ids, completions], dim=1)
        full_mask = torch.cat([mask, c_mask], dim=1)
        n_prompt = ids.shape[1]
        c_mask = c_mask.float()
        with torch.no_grad():  # the rollout's log-probabilities and values, recomputed in batch
            old_logp, _, hidden = policy.token_logprobs(
                full_ids, full_mask, n_prompt, args.temperature
            )
            old_values = value_head(hidden) * c_mask
            ref_logp, _, _ = reference.token_logprobs(
                full_ids, full_mask, n_prompt, args.temperature
            )
            rewards = token_rewards(score, old_logp, ref_logp, c_mask, args.kl_coef)
            advantages, returns = token_gae(
                rewards, old_values, c_mask, args.gamma, args.gae_lambda
            )
            advantages = masked_whiten(advantages, c_mask)
        tokens_done += int(c_mask.sum())
        policy.train()
        for epoch in range(args.update_epochs):
            perm = torch.randperm(args.num_prompts, device=device)
            for start in range(0, args.num_prompts, minibatch):
                mb = perm[start : start + minibatch]
                logp, entropy, hidden = policy.token_logprobs(
                    full_ids[mb], full_mask[mb], n_prompt, args.temperature
                )
                policy_loss, value_loss, stats = ppo_loss(
                    logp,
                    old_logp[mb],
                    advantages[mb],
                    value_head(hidden),
                    old_values[mb],
                    returns[mb],
                    c_mask[mb],
                    args.clip_coef,
                    args.clip_vloss,
                )
                loss = policy_loss + args.vf_coef * value_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, args.max_grad_norm)
                optimizer.step()
        stats = {k: float(v) for k, v in stats.items()}  # (on a GPU: waits for the update)
        update_seconds += time.time() - phase_start
        update_tokens += int(full_mask.sum()) * args.update_epochs
        n = c_mask.sum()
        logger.last_return = float(score.mean())
        global_step = iteration * args.num_prompts
        seconds = max(time.time() - sampling_start - logger.eval_seconds, 1e-9)
        logger.log(
            global_step,
            {
                "train/episodic_return": score.mean(),
                "train/episodic_length": c_mask.sum(1).mean(),
                "charts/tokens_per_s": tokens_done / seconds,
                "charts/generation_tokens_per_s": tokens_done / generation_seconds,
                "charts/update_tokens_per_s": update_tokens / update_seconds,
                "losses/policy_loss": policy_loss.detach(),
                "losses/value_loss": value_loss.detach(),
                "losses/kl": ((old_logp - ref_logp) * c_mask).sum() / n,
                "losses/entropy": (entropy.detach() * c_mask[mb]).sum() / c_mask[mb].sum(),
                **{f"losses/{k}": v for k, v in stats.items()},
            },
        )
        logger.progress(global_step)
        if (
            args.eval_every
            and iteration < num_iterations
            and heldout
            and (global_step % args.eval_every < args.num_prompts)
        ):
            log_eval(logger, global_step, logger.evaluate(global_step, run_eval))
        every = max(1, args.checkpoint_every // args.num_prompts)
        if iteration % every == 0 or logger.stop_requested:
            logger.save_checkpoint(stateful, iteration, global_step)
        if logger.stop_requested:  # Ctrl-C: the iteration it came in is finished and saved
            logger.exit_interrupted()
    results = logger.evaluate(global_step, run_eval) if heldout else {"eval/episodic_return": []}
    log_eval(logger, global_step, results)
    logger.save_checkpoint(stateful, num_iterations, global_step, finished=True)
    if args.save_model:
        policy.lm.save_pretrained(run_dir / "model")
        tokenizer.save_pretrained(run_dir / "model")
        # the task beside the weights: --model <run_dir>/model runs on it without --task
        (run_dir / "model" / "task.json").write_text(task_path(args).read_text())
        save_model(
            {
                "policy": policy.state_dict(),
                "value_head": value_head.state_dict(),
                "args": asdict(args),
                "eval_returns": results["eval/episodic_return"],
            },
            run_dir,
        )
    logger.close(results)


def check_args(args: Args):
    check_ranges(
        args,
        {
            "learning_rate": "x > 0",
            "num_prompts": "x >= 1",
            "update_epochs": "x >= 1",
            "num_minibatches": "x >= 1",
            "gamma": "0 <= x <= 1",
            "gae_lambda": "0 <= x <= 1",
            "kl_coef": "x >= 0",
            "clip_coef": "x > 0",
            "vf_coef": "x >= 0",
            "max_new_tokens": "x >= 1",
            "temperature": "x > 0",
            "max_grad_norm": "x > 0",
            "eval_prompts": "x >= 0",
        },
    )
    if args.capture_video:
        fail(f"--capture-video: {SCRIPT} has no video to record (its env is a text task)")
    if args.eval_episodes != Args().eval_episodes:
        fail(f"--eval-episodes does not apply to {SCRIPT}: --eval-prompts sets the prompts")
    if args.num_prompts % args.num_minibatches:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide --num-prompts "
            f"{args.num_prompts}"
        )
    if args.total_timesteps < args.num_prompts:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one update "
            f"(--num-prompts {args.num_prompts})"
        )
    task = check_task(args)
    if len(task["train"]) < args.num_prompts:
        fail(f"--num-prompts {args.num_prompts} exceeds the {len(task['train'])} train prompts")


# ---- shared: lm/checks ----
def log_eval(logger, step: int, results: dict):
    """eval/accuracy (share of held-out prompts answered exactly), eval/reward (mean reward)."""
    rewards = results["eval/episodic_return"]
    if len(rewards):
        logger.log(
            step,
            {
                "eval/accuracy": float(np.mean(np.asarray(rewards) == 1.0)),
                "eval/reward": float(np.mean(rewards)),
            },
        )


def task_path(args) -> Path:
    return Path(find(args.task)) if args.task else Path(find(args.model)) / "task.json"


def check_task(args) -> dict:
    """The model (config, weights, tokenizer), then the task file, before anything is written.
    Returns the task."""
    try:
        policy, tokenizer = load_policy(args.model)
    except Exception as e:
        reason = (str(e).strip() or " ").splitlines()[0][:120]
        fail(f"--model {args.model} does not load ({type(e).__name__}: {reason})")
    if not finite(policy.state_dict()):
        fail(f"--model {args.model} holds weights that are not finite numbers")
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        fail(f"the tokenizer of --model {args.model} has no pad or no end (eos) token")
    path = task_path(args)
    try:
        task = load_task(path)
        names = task["name"]
        prompts = [p for p, _ in task["train"] + task["heldout"]]
        max_new_tokens = args.max_new_tokens or int(task["max_new_tokens"])
    except Exception as e:
        fail(f"task file {path} cannot be read ({type(e).__name__}); pass --task FILE.json")
    if args.env_id != names:
        close = difflib.get_close_matches(args.env_id, [names], n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        fail(
            f"{args.env_id} is not the task of {path} (it holds task '{names}'){hint}",
            *other_family(args.env_id),
        )
    longest = max(len(x) for x in tokenizer(prompts, add_special_tokens=False)["input_ids"])
    context = getattr(policy.lm.config, "max_position_embeddings", None)
    if context is not None and longest + max_new_tokens > context:
        fail(
            f"prompts of up to {longest} tokens + --max-new-tokens {max_new_tokens} exceed the "
            f"model's context of {context} tokens"
        )
    return task


# ---- end shared: lm/checks ----


# ---- shared: helpers ----
SCRIPT = Path(__file__).name
ALGOS = Path(__file__).resolve().parent


def fail(msg: str, *scripts: str):
    """Bad input: one line on stderr, exit status 2. It suggests those of `scripts` that exist
    beside this one."""
    found = [s for s in scripts if s != SCRIPT and (ALGOS / s).is_file()]
    print(f"error: {msg}" + (f"; use {' or '.join(found)}" if found else ""), file=sys.stderr)
    sys.exit(2)


def other_family(env_id: str) -> tuple[str, ...]:
    """The scripts that take env_id, an id of another family of envs (Atari, MinAtar, mpe2,
    smac_lite)."""
    if env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4"):
        return "ppo_atari.py", "dqn_atari.py"
    if env_id.startswith("MinAtar/"):
        return "dqn_atari.py", "ddqn_atari.py"
    if re.fullmatch(r"(simple\w*|collect_treasure)_v\d+", env_id):
        return "mappo_mpe.py", "maddpg_mpe.py"
    if (
        importlib.util.find_spec("smac_lite")
        and env_id in importlib.import_module("smac_lite.maps").MAPS
    ):
        return "mappo_smac_lite.py", "qmix_smac_lite.py"
    return ()


def env_spaces(env_id: str):
    """(observation space, action space) of env_id, or a one-line error. The env is made with the
    start-up messages of ALE (its banner) and MuJoCo (compiler warnings, which it also writes to
    MUJOCO_LOG.TXT) turned off through their own settings: nothing may precede an error."""
    if env_id not in gym.registry:
        scripts = other_family(env_id)
        if scripts:
            fail(f"{env_id} is not an env of {SCRIPT}", *scripts)
        close = difflib.get_close_matches(env_id, list(gym.registry), n=1)
        fail(f"unknown env id '{env_id}'" + (f"; did you mean '{close[0]}'?" if close else ""))
    entry_point = str(gym.spec(env_id).entry_point)
    if entry_point.startswith("ale_py"):
        import ale_py

        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    mujoco = importlib.import_module("mujoco") if "mujoco" in entry_point else None
    if mujoco:
        mujoco.set_mju_user_warning(lambda message: None)
    try:
        with warnings.catch_warnings(action="ignore"), gym.make(env_id) as env:
            return env.observation_space, env.action_space
    except Exception as e:
        reason = (str(e).strip() or " ").splitlines()[0]
        fail(f"cannot make env '{env_id}': {type(e).__name__}: {reason}")
    finally:
        if mujoco:
            mujoco.set_mju_user_warning(None)  # MuJoCo's default: print and log


# The ranges a flag may be given, by the name its error message shows (plain code, no eval).
RANGES = {
    "x >= 0": lambda x: x >= 0,
    "x >= 1": lambda x: x >= 1,
    "x >= 2": lambda x: x >= 2,
    "x > 0": lambda x: x > 0,
    "0 <= x <= 1": lambda x: 0 <= x <= 1,
    "0 < x <= 1": lambda x: 0 < x <= 1,
    "0 < x < 1": lambda x: 0 < x < 1,
}


def check_ranges(args, rules: dict):
    """Fail on a flag that is not a finite number or lies outside its range: rules maps a flag to
    one of RANGES (e.g. "0 <= x <= 1")."""
    rules = {
        "total_timesteps": "x >= 1",
        "eval_episodes": "x >= 0",
        "eval_every": "x >= 0",
        "checkpoint_every": "x >= 1",
        **rules,
    }
    for name, x in asdict(args).items():
        if isinstance(x, float) and not np.isfinite(x):
            fail(f"--{name.replace('_', '-')} {x} is not a finite number")
    for name, rule in rules.items():
        x = getattr(args, name)
        if x is not None and not RANGES[rule](x):
            fail(f"--{name.replace('_', '-')} {x} is out of range: it must satisfy {rule}")


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def start_run(args, check_args):
    """Resume (--resume DIR), check the flags, choose the run directory (a new run never writes
    into one that holds files), seed everything. Returns (args, checkpoint, dir)."""
    ckpt = None
    if args.resume:
        args, ckpt = resume_run(args)
    check_args(args)
    if args.track:
        check_wandb()
    # SDL warns on every render without it
    if args.capture_video and not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="canonrl-xdg-")
    name = f"{args.env_id.replace('/', '-')}__{SCRIPT[:-3]}__{args.seed}__{time.time():.0f}"
    run_dir = Path(args.run_dir or f"runs/{name}")
    if run_dir.exists() and not run_dir.is_dir():
        fail(f"--run-dir {run_dir} is a file; pass a directory")
    if ckpt is None and run_dir.is_dir() and any(run_dir.iterdir()):
        if (run_dir / "metrics.csv").is_file():
            fail(
                f"--run-dir {run_dir} holds a run; continue it "
                f"with --resume {run_dir} or choose a new --run-dir"
            )
        fail(f"--run-dir {run_dir} is not empty and holds no run; choose a new --run-dir")
    check_writable(run_dir)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    # 1: fastest for small nets
    torch.set_num_threads(1 if args.torch_deterministic else torch.get_num_threads())
    return args, ckpt, run_dir


def resume_run(args):
    """--resume DIR: the run's saved flags and its checkpoint, which is data: its SHA-256 must match
    checkpoint.sha256, and it is read with weights_only=True. A flag given now that differs from
    the saved one is ignored, except --total-timesteps, which extends the run."""
    path = Path(args.resume) / "checkpoint.pt"
    if not path.is_file():
        fail(f"no checkpoint at {path}; pass the run directory of an earlier {SCRIPT} run")
    try:
        if sha256(path) != (path.parent / "checkpoint.sha256").read_text().strip():
            raise ValueError("its SHA-256 differs from checkpoint.sha256")
        ckpt = torch.load(path, weights_only=True)
        saved = Args(**ckpt["args"])
    except Exception as e:
        fail(
            f"{path} is corrupt or not a {SCRIPT} checkpoint "
            f"({type(e).__name__}); delete it or start anew"
        )
    changed = []
    for name, value in asdict(args).items():
        if name in ("resume", "run_dir") or value == getattr(saved, name):
            continue
        if name in given_flags() or value != getattr(Args(), name):
            changed.append(name)
    if "total_timesteps" in changed:
        if args.total_timesteps < ckpt["global_step"]:
            fail(
                f"--total-timesteps {args.total_timesteps} is below "
                f"the {ckpt['global_step']} steps already done"
            )
        print(
            f"resume: --total-timesteps {args.total_timesteps} (was {saved.total_timesteps})",
            file=sys.stderr,
        )
        saved.total_timesteps = args.total_timesteps
    elif ckpt["finished"]:
        print(f"the run in {path.parent} is finished; give a larger --total-timesteps to extend it")
        sys.exit(0)
    ignored = [f"--{name.replace('_', '-')}" for name in changed if name != "total_timesteps"]
    if ignored:
        print(
            f"resume: the run's saved flags are kept; ignored: {' '.join(ignored)}",
            file=sys.stderr,
        )
    saved.resume = str(path.parent)
    saved.run_dir = str(path.parent)
    check_metrics(path.parent / "metrics.csv")
    return saved, ckpt


def given_flags() -> set[str]:
    """The Args fields named on the command line (--name, --name=value, --no-name): on --resume, a
    flag given there counts even when its value is the default."""
    names = set()
    for token in sys.argv[1:]:
        if token.startswith("--"):
            name = token[2:].split("=")[0].replace("-", "_")
            names.add(name)
            names.add(name.removeprefix("no_"))
    return names


def check_metrics(path: Path):
    """Fail on a line of metrics.csv that is not global_step,wall_time,name,value (before --resume
    rewrites it)."""
    lines = path.read_text().splitlines()[1:] if path.is_file() else []
    for number, line in enumerate(lines, start=2):
        fields = line.split(",")
        if len(fields) != 4 or not fields[0].isdigit():
            fail(
                f"{path} line {number} is not 'global_step,wall_time,name,value'; "
                "delete that line and resume again"
            )


def check_wandb():
    """--track needs a wandb login, or WANDB_MODE=offline: checked before anything is written."""
    from wandb.sdk import wandb_setup
    from wandb.sdk.lib import wbauth

    try:
        settings = wandb_setup.singleton().settings
    except Exception as e:
        fail(f"--track: wandb cannot start ({type(e).__name__}: {str(e).strip().splitlines()[0]})")
    if settings.mode in ("offline", "dryrun", "disabled"):
        return
    if not (
        os.getenv("WANDB_API_KEY")
        or wbauth.read_netrc_auth(host=settings.base_url)
        or settings.api_key
    ):
        fail(
            "--track needs a wandb login: run `wandb login`, "
            "or set WANDB_MODE=offline to log to files only"
        )


def check_writable(run_dir: Path):
    """Fail unless files can be written in run_dir; the folders made to find out are removed
    again."""
    made = [p for p in [run_dir, *run_dir.parents] if not p.exists()]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as e:
        fail(
            f"--run-dir {run_dir} cannot be written "
            f"({e.strerror or type(e).__name__}); choose another --run-dir"
        )
    finally:
        for p in made:
            # only empty folders go; another process (a rank of the same job) may have removed
            # or filled one meanwhile
            try:
                p.rmdir()
            except OSError:
                pass


def finite(state) -> bool:
    """True when every floating-point tensor of a (nested) state_dict is finite."""
    if isinstance(state, dict):
        return all(finite(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return all(finite(v) for v in state)
    if torch.is_tensor(state) and state.is_floating_point():
        return bool(torch.isfinite(state).all())
    return True


def load_states(stateful: dict, ckpt: dict, run_dir: Path):
    """Resume every object of `stateful` ({name: object with load_state_dict}) from the
    checkpoint."""
    for name, obj in stateful.items():
        # a buffer may hold unwritten slots
        weights = isinstance(obj, (torch.nn.Module, torch.optim.Optimizer))
        if weights and not finite(ckpt.get(name)):
            fail(f"{run_dir / 'checkpoint.pt'} holds non-finite values in {name}; start anew")
        try:
            obj.load_state_dict(ckpt[name])
        except Exception as e:
            fail(
                f"{run_dir / 'checkpoint.pt'} does not fit this "
                f"run's {name} ({type(e).__name__}); start anew"
            )


def save_with_digest(state: dict, path: Path):
    """torch.save(state) to path, written then renamed (a crash never leaves half a file), and its
    SHA-256 beside it (checkpoint.pt: checkpoint.sha256, model.pt: model.sha256): a file is checked
    against it before it is read."""
    torch.save(state, path.with_suffix(".tmp"))
    digest = sha256(path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)
    path.with_suffix(".sha256").write_text(digest + "\n")


def save_model(state: dict, run_dir: Path):
    """model.pt: the weights and what evaluation needs (numpy arrays as tensors, so that
    torch.load(weights_only=True) reads it), with its SHA-256 in model.sha256."""
    save_with_digest(plain(state), run_dir / "model.pt")


def plain(obj):
    """obj with numpy arrays as tensors and numpy scalars as numbers: what
    torch.load(weights_only=True) reads."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def by_name(results) -> dict:
    """Evaluation results as {metric name: one value per episode}; a list of returns is
    eval/episodic_return."""
    return results if isinstance(results, dict) else {"eval/episodic_return": results}


class RNGs:
    """torch's global generator and the given numpy Generators, checkpointed as one object."""

    def __init__(self, *np_rngs: np.random.Generator):
        self.np_rngs = np_rngs

    def state_dict(self):
        return {
            "torch": torch.get_rng_state(),
            "numpy": [rng.bit_generator.state for rng in self.np_rngs],
        }

    def load_state_dict(self, state):
        torch.set_rng_state(state["torch"])
        for rng, rng_state in zip(self.np_rngs, state["numpy"], strict=True):
            rng.bit_generator.state = rng_state


def write_config(args, run_dir: Path):
    """config.json: every flag, the script, the git commit of algos/ (if any), package versions."""
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ALGOS)
    config = {
        "script": SCRIPT,
        "args": asdict(args),
        "git_commit": git.stdout.strip() or None,
        "versions": {p: version(p) for p in ("torch", "gymnasium", "numpy")},
    }
    (run_dir / "config.json").write_text(json.dumps(config, indent=2))


class RunLogger:
    """What a run shows and leaves behind: config.json, metrics.csv (global_step, wall_time, name,
    value; append-only), TensorBoard events, a wandb run with --track, the progress bar,
    checkpoint.pt. Resuming drops the rows logged after the checkpoint (those steps are redone): no
    step is logged twice. The training clock stops during evaluations. Ctrl-C sets stop_requested:
    the script finishes its iteration, saves it and calls exit_interrupted()."""

    def __init__(self, args, run_dir: Path, total: int, step: int, ckpt: dict | None):
        run_dir.mkdir(parents=True, exist_ok=True)
        metrics = run_dir / "metrics.csv"
        header = "global_step,wall_time,name,value\n"
        if ckpt is not None:  # keep the rows up to the checkpoint's step
            lines = metrics.read_text().splitlines(keepends=True)[1:] if metrics.is_file() else []
            kept = [line for line in lines if int(line.split(",")[0]) <= step]
            (run_dir / "metrics.tmp").write_text(header + "".join(kept))
            os.replace(run_dir / "metrics.tmp", metrics)
        else:
            write_config(args, run_dir)
            metrics.write_text(header)
        if total != args.total_timesteps:
            print(
                f"{total:,} steps will run: whole iterations up "
                f"to --total-timesteps {args.total_timesteps:,}"
            )
        self.args = args
        self.run_dir = run_dir
        self.wandb = None
        if args.track:  # every row of metrics.csv is one wandb row, plotted against global_step
            import wandb

            self.wandb = wandb.init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                config=asdict(args),
                name=run_dir.name,
                dir=str(run_dir),
                id=run_dir.name,
                resume="allow",
            )
            self.wandb.define_metric("global_step")
            self.wandb.define_metric("*", step_metric="global_step")
        self.file = open(metrics, "a", newline="")
        self.csv = csv.writer(self.file, lineterminator="\n")
        self.tb = SummaryWriter(str(run_dir))
        self.bar = tqdm(total=total, initial=step, unit="step", mininterval=1.0)
        self.first_step = step
        self.start = time.time()
        self.eval_seconds = 0.0
        self.last_return = float("nan")
        # of the run resumed
        self.seconds_before = ckpt.get("train_seconds", 0.0) if ckpt is not None else 0.0
        self.stop_requested = False
        self.duration_said = False
        signal.signal(signal.SIGINT, self.request_stop)

    def request_stop(self, *_):
        self.stop_requested = True
        # a second Ctrl-C stops at once, unsaved
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print(
            "\nCtrl-C: stopping after this iteration (again: at once, without saving it)",
            file=sys.stderr,
        )

    def log(self, step: int, metrics: dict, to_wandb: bool = True):
        """One row per metric in metrics.csv and TensorBoard; one wandb row for them all. A
        non-finite loss stops the run (the weights have diverged) before it is written; the last
        checkpoint is kept."""
        values = {}
        for name, value in metrics.items():
            # a loss may require grad
            values[name] = float(value.detach() if torch.is_tensor(value) else value)
            if (
                name.startswith("losses/")
                and name != "losses/explained_variance"
                and not np.isfinite(values[name])
            ):
                self.close_files()
                fail(
                    f"{name} is {values[name]} at step {step}: training diverged; "
                    f"{self.run_dir} keeps its last checkpoint (try a lower --learning-rate)"
                )
        for name, value in values.items():
            self.csv.writerow([step, f"{time.time():.3f}", name, repr(value)])
            self.tb.add_scalar(name, value, step)
        self.file.flush()
        if self.wandb is not None and to_wandb:
            self.wandb.log({"global_step": step, **values})

    def train_seconds(self) -> float:
        """Seconds of training (evaluations excluded), those of the run resumed included."""
        return self.seconds_before + time.time() - self.start - self.eval_seconds

    def progress(self, step: int):
        """Log charts/sps (environment steps per training second) and update the progress bar."""
        seconds = time.time() - self.start - self.eval_seconds  # training, in this process
        sps = int((step - self.first_step) / max(seconds, 1e-9))
        self.log(step, {"charts/sps": sps})
        self.bar.update(step - self.bar.n)
        self.bar.set_postfix(sps=sps, ret=f"{self.last_return:.1f}", refresh=False)
        if not self.duration_said and seconds > 20:
            self.duration_said = True
            hours = (self.bar.total - step) / max(sps, 1) / 3600
            if hours > 1:
                self.bar.write(
                    f"at {sps:,} steps/s the rest of this run takes about "
                    f"{hours:.1f} hours here; --total-timesteps sets the budget"
                )

    def evaluate(self, step: int, run_episodes):
        """Log charts/train_seconds, then one row per episode of run_episodes(): a list of episodic
        returns (logged as eval/episodic_return) or a dict {metric name: one value per episode}
        (multi-agent: team return, win)."""
        self.log(step, {"charts/train_seconds": self.train_seconds()})
        start = time.time()
        results = run_episodes()
        self.eval_seconds += time.time() - start
        returns = by_name(results).get("eval/episodic_return", [])
        if len(returns):  # the progress bar's ret= (all the offline scripts show)
            self.last_return = float(np.mean(returns))
        for name, values in by_name(results).items():
            for value in values:
                self.log(step, {name: value}, to_wandb=False)
            # wandb keeps one value per step: the mean, and a histogram
            if self.wandb is not None and len(values):
                import wandb

                self.wandb.log(
                    {
                        "global_step": step,
                        name: float(np.mean(values)),
                        f"{name}_histogram": wandb.Histogram(np.asarray(values, dtype=np.float64)),
                    }
                )
        return results

    def save_checkpoint(
        self, stateful: dict, iteration: int, global_step: int, finished: bool = False
    ):
        """checkpoint.pt: the flags, the counters and the state_dict() of every object of
        `stateful`, written then renamed (a crash never leaves half a checkpoint), and its SHA-256
        in checkpoint.sha256."""
        state = {
            "args": asdict(self.args),
            "iteration": iteration,
            "global_step": global_step,
            "finished": finished,
            "train_seconds": self.train_seconds(),
            **{name: obj.state_dict() for name, obj in stateful.items()},
        }
        save_with_digest(plain(state), self.run_dir / "checkpoint.pt")

    def close_files(self):
        self.bar.close()
        self.file.close()
        self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()

    def exit_interrupted(self):
        self.close_files()
        print(f"interrupted: metrics kept, resume with --resume {self.run_dir}", file=sys.stderr)
        sys.exit(130)

    def close(self, results):
        """Close the files; the last lines say the evaluation, where the run is and how it compares
        with the script's reference."""
        self.bar.update(self.bar.total - self.bar.n)
        self.close_files()
        for name, values in by_name(results).items():
            if len(values):
                mean = np.mean(values)
                std = np.std(values)
                print(f"{name}: {mean:.2f} +- {std:.2f} over {len(values)} episodes")
        saved = "model.pt, checkpoint.pt" if self.args.save_model else "checkpoint.pt"
        print(f"run saved in {self.run_dir} ({saved})")
        self.compare_with_reference(by_name(results))

    def compare_with_reference(self, results: dict):
        """Print our multi-seed reference of this script and env (of the budget nearest this run's),
        when benchmark/references.toml is beside algos/, and where this run's evaluation lies."""
        path = ALGOS.parent / "benchmark" / "references.toml"
        refs = tomllib.loads(path.read_text())["reference"] if path.is_file() else []
        refs = [r for r in refs if "values" in r and self.same_setting(r)]
        refs = [r for r in refs if r["score"] in ("final_eval", "final_win_rate")]
        if not refs:
            print(f"no reference for {SCRIPT} on {self.args.env_id} to compare with")
            return
        budget = self.args.total_timesteps
        r = min(refs, key=lambda r: abs(r["total_timesteps"] - budget))
        values = r["values"]
        print(
            f"reference {r['id']} ({r['total_timesteps']:,} steps, {r['score']}, "
            f"{len(values)} seeds): {np.mean(values):.2f} +- {np.std(values):.2f}, "
            f"seeds from {min(values):.2f} to {max(values):.2f}"
        )
        wanted = "win" if r["score"] == "final_win_rate" else "episodic_return"
        name = next((n for n in results if wanted in n), None)
        if name is None or not len(results[name]):
            return
        mean = float(np.mean(results[name]))
        if r["total_timesteps"] != budget:
            print(f"this run: {mean:.2f} after {budget:,} steps: another budget, not compared")
        elif min(values) <= mean <= max(values):
            print(f"this run: {mean:.2f}, within the reference's seeds")
        else:
            side = "below" if mean < min(values) else "above"
            print(f"this run: {mean:.2f}, {side} every seed of the reference")

    def same_setting(self, reference: dict) -> bool:
        """True for a reference of this script and env (and, for an offline script, of this
        dataset)."""
        if (reference["script"], reference["env_id"]) != (SCRIPT, self.args.env_id):
            return False
        flags = reference.get("flags", [])
        if not hasattr(self.args, "dataset") or "--dataset" not in flags:
            return True
        ours = Path(self.args.dataset)  # a directory, or an id such as canonrl/cartpole/medium-v0
        theirs = Path(flags[flags.index("--dataset") + 1]).name  # runs/datasets/cartpole-medium-v0
        return theirs in (ours.name, "-".join(ours.parts[-2:]))


# ---- end shared: helpers ----


if __name__ == "__main__":
    main(tyro.cli(Args))
