"""GRPO for language models on a task with a verifiable reward (addition-v0 and the project's base).

Shao et al. 2024 (DeepSeekMath): G sampled completions per prompt, advantages relative to the group,
the clipped token-level ratio objective, an optional k3 KL penalty to the frozen reference (--beta).
Variants as flags: Dr. GRPO (Liu et al. 2025): --no-scale-rewards --loss-type dr_grpo; DAPO (Yu et
al. 2025): --clip-eps-high 0.28 --loss-type token --dynamic-sampling --mask-truncated; RLOO's
leave-one-out baseline (Ahmadian et al. 2024): --baseline rloo --no-scale-rewards. A step is one
prompt trained on; --save-model writes <run_dir>/model (from_pretrained) beside model.pt.

Run:    python algos/grpo_lm.py --seed 1
Quick:  python algos/grpo_lm.py --total-timesteps 1600
Results: benchmark/references.toml (ours-grpo_lm-addition-v0-4800), README.md
"""

import copy
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import tyro

from canonrl.lm import check_task, find, save_model_folder, task_path
from canonrl.run import LMRunArgs, RNGs, RunLogger, check_ranges, fail, load_states, start_run


@dataclass
class Args(LMRunArgs):
    model: str = "benchmark/policies/lm-addition-base"
    """causal LM directory or id"""
    task: str | None = None
    """task file (JSON: name, max_new_tokens, [prompt, answer] lists train and heldout); default:
    <model>/task.json"""
    learning_rate: float = 3e-4
    """Adam learning rate (1e-4: slower; 1e-3 collapses to 0 accuracy)"""
    num_prompts: int = 16
    """prompts per update: a batch is num_prompts * group_size completions"""
    group_size: int = 8
    """G: completions sampled per prompt"""
    update_epochs: int = 1
    """passes over each batch of completions (GRPO's mu)"""
    num_minibatches: int = 1
    """minibatches per pass (must divide the number of completions)"""
    clip_eps: float = 0.2
    """the ratio is clipped to [1 - clip_eps, 1 + clip_eps]"""
    clip_eps_high: float | None = None
    """DAPO's clip-higher: the upper end is 1 + this (DAPO: 0.28)"""
    beta: float = 0.0
    """weight of the k3 KL penalty to the reference (TRL: 0; GRPO paper: 0.04)"""
    loss_type: Literal["grpo", "token", "dr_grpo"] = "grpo"
    """normalisation: see clipped_loss"""
    scale_rewards: bool = True
    """divide advantages by the group's reward std (Dr. GRPO, RLOO: no)"""
    baseline: Literal["mean", "rloo"] = "mean"
    """group mean (GRPO) or mean of the other G-1 (RLOO)"""
    dynamic_sampling: bool = False
    """DAPO: drop groups with all-equal rewards, sample more prompts"""
    max_sampling_rounds: int = 4
    """dynamic sampling: at most this many rounds of prompts per update"""
    mask_truncated: bool = False
    """DAPO's overlong filtering: no loss on completions never ended"""
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
    total_timesteps: int = 4800
    """prompts trained on (updates * num_prompts)"""


# ---- shared: lm/model ----
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
    # a model folder is data: the Python code its config may name (auto_map) is never run, and
    # transformers does not ask whether to run it
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # a folder refused is one line, with no warning before it
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        lm = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, trust_remote_code=False
        )
    finally:
        logging.set_verbosity(verbosity)
    return Policy(lm, tokenizer.pad_token_id, tokenizer.eos_token_id).to(device), tokenizer


# ---- end shared: lm/model ----


def group_advantages(rewards, scale: bool = True, baseline: str = "mean", eps: float = 1e-4):
    """rewards (P, G): G completions of each of P prompts -> advantages (P, G). GRPO (Shao et al.
    2024, section 4.1.2): (r - mean of the group) / (std of the group + eps); baseline "rloo": r
    minus the mean of the other G-1 rewards (Ahmadian et al. 2024); scale False: no division."""
    group_size = rewards.shape[1]
    if baseline == "rloo":
        base = (rewards.sum(1, keepdim=True) - rewards) / (group_size - 1)
    else:
        base = rewards.mean(1, keepdim=True)
    advantages = rewards - base
    if scale:  # std with Bessel's correction, as TRL; eps keeps an all-equal group at 0
        advantages = advantages / (rewards.std(1, keepdim=True) + eps)
    return advantages


def k3_kl(logp, ref_logp):
    """Per-token estimate of KL(pi || ref) from samples of pi (Schulman 2020, "Approximating KL
    divergence", k3): exp(ref - logp) - (ref - logp) - 1, unbiased and never negative."""
    log_ratio = ref_logp - logp
    return log_ratio.exp() - log_ratio - 1


def clipped_loss(
    logp,
    old_logp,
    advantages,
    mask,
    clip_low: float,
    clip_high: float,
    loss_type: str,
    max_new_tokens: int,
    ref_logp=None,
    beta: float = 0.0,
):
    """The clipped token-level objective of GRPO (Shao et al. 2024, eq. 3), negated, + beta * k3 KL.
    logp, old_logp, mask, ref_logp: (B, T) over completion tokens; advantages (B,), one each.
    Normalisation (what the per-token terms are averaged over):
      grpo:    mean over each completion's tokens, then mean over completions (the paper's 1/|o_i|);
      token:   sum over all tokens / number of tokens in the batch (DAPO, eq. 8);
      dr_grpo: sum over all tokens / (completions * max_new_tokens), a constant (Dr. GRPO).
    Returns (loss, statistics)."""
    ratio = (logp - old_logp).exp()
    adv = advantages[:, None]
    per_token = -torch.min(ratio * adv, ratio.clamp(1 - clip_low, 1 + clip_high) * adv)
    kl = k3_kl(logp, ref_logp) if ref_logp is not None else torch.zeros_like(logp)
    if beta:
        per_token = per_token + beta * kl
    mask = mask.to(per_token.dtype)
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
    elif loss_type == "token":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
    else:
        loss = (per_token * mask).sum() / (mask.shape[0] * max_new_tokens)
    with torch.no_grad():  # a token is clipped where the clip removed its gradient (as TRL counts)
        clipped = ((ratio < 1 - clip_low) & (adv < 0)) | ((ratio > 1 + clip_high) & (adv > 0))
        n = mask.sum().clamp(min=1)
        stats = {
            "policy_loss": loss,
            "kl": (kl * mask).sum() / n,
            "clipfrac": (clipped * mask).sum() / n,
            "approx_kl": (((ratio - 1) - (logp - old_logp)) * mask).sum() / n,
        }
    return loss, {k: v.detach() for k, v in stats.items()}


def sample_groups(
    policy,
    tokenizer,
    prompt_ids,
    prompt_mask,
    answers: list[str],
    group_size: int,
    max_new_tokens: int,
    temperature: float,
) -> dict:
    """group_size completions of each prompt: per completion its prompt ids and mask, the
    completion, its mask, its token log-probabilities at sampling and whether it was truncated
    (no end token); per prompt the rewards of its group (P, G)."""
    ids = prompt_ids.repeat_interleave(group_size, dim=0)
    mask = prompt_mask.repeat_interleave(group_size, dim=0)
    completions, c_mask, logp = policy.generate(ids, mask, max_new_tokens, temperature=temperature)
    texts = completion_texts(tokenizer, completions)
    targets = [a for a in answers for _ in range(group_size)]
    rewards = torch.tensor([reward(t, a) for t, a in zip(texts, targets)], device=ids.device)
    truncated = torch.tensor([t is None for t in texts], device=ids.device)
    return {
        "ids": ids,
        "mask": mask,
        "completions": completions,
        "c_mask": c_mask,
        "logp": logp,
        "truncated": truncated,
        "rewards": rewards.view(-1, group_size),
    }


def keep_groups(rounds: list, num_prompts: int, group_size: int) -> dict:
    """The groups kept in the sampling rounds ([(batch, keep (P,)), ...]) as one batch of at most
    num_prompts groups, in the order they were sampled."""
    batch = {}
    for key in rounds[0][0]:
        if key == "rewards":
            batch[key] = torch.cat([b[key][keep] for b, keep in rounds])[:num_prompts]
        else:
            parts = [b[key][keep.repeat_interleave(group_size)] for b, keep in rounds]
            batch[key] = torch.cat(parts)[: num_prompts * group_size]
    return batch


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_flags, __file__)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    task, policy, tokenizer = check_model_and_task(args, device)  # (nothing is written yet)
    max_new_tokens = args.max_new_tokens or task["max_new_tokens"]
    reference = copy.deepcopy(policy).eval().requires_grad_(False)  # the frozen base: KL and --beta
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.learning_rate)
    np_rng = np.random.default_rng(args.seed)  # which train prompts each update samples
    heldout = task["heldout"][: args.eval_prompts]
    train_ids, train_mask = encode_prompts(tokenizer, [p for p, _ in task["train"]], device)
    answers = [a for _, a in task["train"]]
    minibatch = args.num_prompts * args.group_size // args.num_minibatches
    num_iterations = args.total_timesteps // args.num_prompts
    clip_high = args.clip_eps_high if args.clip_eps_high is not None else args.clip_eps
    iteration = 0

    def run_eval():  # greedy, on the held-out prompts
        rewards = evaluate(policy, tokenizer, heldout, max_new_tokens, device)
        return {"eval/episodic_return": rewards}

    stateful = {"policy": policy, "optimizer": optimizer, "rng": RNGs(np_rng)}  # saved and resumed
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)
        iteration = ckpt["iteration"]
    global_step = iteration * args.num_prompts
    logger = RunLogger(
        args, run_dir, num_iterations * args.num_prompts, global_step, ckpt=ckpt, script=__file__
    )
    if ckpt is None and heldout:  # the first evaluation: the model as loaded
        logger.evaluate(global_step, run_eval)
    tokens_done = 0
    sampling_start = time.time()
    generation_seconds = 0.0
    update_seconds = 0.0
    update_tokens = 0
    for iteration in range(iteration + 1, num_iterations + 1):
        phase_start = time.time()
        policy.eval()  # sampling: no dropout
        rounds = []
        rewards_seen = []
        lengths = []
        for _ in range(args.max_sampling_rounds if args.dynamic_sampling else 1):
            idx = torch.as_tensor(np_rng.choice(len(answers), args.num_prompts, replace=False))
            sampled = sample_groups(
                policy,
                tokenizer,
                train_ids[idx],
                train_mask[idx],
                [answers[i] for i in idx],
                args.group_size,
                max_new_tokens,
                args.temperature,
            )
            keep = torch.ones(args.num_prompts, dtype=torch.bool, device=device)
            if args.dynamic_sampling:  # DAPO eq. 11: a group of equal rewards has no signal
                keep = sampled["rewards"].std(1) > 0
            rounds.append((sampled, keep))
            rewards_seen.append(sampled["rewards"].flatten())
            lengths.append(sampled["c_mask"].sum(1))
            if sum(int(k.sum()) for _, k in rounds) >= args.num_prompts:
                break
        if not any(bool(k.any()) for _, k in rounds):  # none kept: the last round (advantages 0)
            rounds[-1] = (rounds[-1][0], torch.ones_like(rounds[-1][1]))
        b = keep_groups(rounds, args.num_prompts, args.group_size)
        tokens_done += int(torch.cat(lengths).sum())
        generation_seconds += time.time() - phase_start
        phase_start = time.time()
        advantages = group_advantages(b["rewards"], args.scale_rewards, args.baseline).flatten()
        loss_mask = b["c_mask"] * ~b["truncated"][:, None] if args.mask_truncated else b["c_mask"]
        full_ids = torch.cat([b["ids"], b["completions"]], dim=1)
        full_mask = torch.cat([b["mask"], b["c_mask"]], dim=1)
        n_prompt = b["ids"].shape[1]
        with torch.no_grad():
            ref_logp, _, _ = reference.token_logprobs(
                full_ids, full_mask, n_prompt, args.temperature
            )
        policy.train()
        n = len(full_ids)
        for epoch in range(args.update_epochs):
            perm = torch.randperm(n, device=device)
            for start in range(0, n, minibatch):
                mb = perm[start : start + minibatch]
                logp, entropy, _ = policy.token_logprobs(
                    full_ids[mb], full_mask[mb], n_prompt, args.temperature
                )
                loss, stats = clipped_loss(
                    logp,
                    b["logp"][mb],
                    advantages[mb],
                    loss_mask[mb],
                    args.clip_eps,
                    clip_high,
                    args.loss_type,
                    max_new_tokens,
                    ref_logp[mb],
                    args.beta,
                )
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
                optimizer.step()
                c_mask = b["c_mask"][mb]
                stats["entropy"] = (entropy.detach() * c_mask).sum() / c_mask.sum().clamp(min=1)
        stats = {k: float(v) for k, v in stats.items()}  # (on a GPU: waits for the update)
        update_seconds += time.time() - phase_start
        update_tokens += int(full_mask.sum()) * args.update_epochs
        all_rewards = torch.cat(rewards_seen)
        logger.last_return = float(all_rewards.mean())
        global_step = iteration * args.num_prompts
        seconds = max(time.time() - sampling_start - logger.eval_seconds, 1e-9)
        logger.log(
            global_step,
            {
                "train/episodic_return": all_rewards.mean(),
                "train/episodic_length": torch.cat(lengths).float().mean(),
                "charts/truncated": b["truncated"].float().mean(),
                "charts/kept_groups": len(b["rewards"]) / (len(all_rewards) / args.group_size),
                "charts/tokens_per_s": tokens_done / seconds,
                "charts/generation_tokens_per_s": tokens_done / generation_seconds,
                "charts/update_tokens_per_s": update_tokens / update_seconds,
                **{f"losses/{k}": v for k, v in stats.items()},
            },
        )
        logger.progress(global_step)
        logger.end_iteration(stateful, iteration, global_step, run_eval if heldout else None)
    logger.finish(
        stateful,
        num_iterations,
        global_step,
        run_eval if heldout else None,
        model={"policy": policy.state_dict()},
        save_also=lambda run_dir: save_model_folder(run_dir, policy.lm, tokenizer, task_path(args)),
    )


def check_args(args: Args):
    """Every flag, then the model, the task and what they must fit (the way main() checks them)."""
    check_flags(args)
    check_model_and_task(args)


def check_flags(args: Args):
    """The flags alone: ranges and the sizes that must fit together."""
    check_ranges(
        args,
        {
            "group_size": "x >= 2",
            "clip_eps": "x > 0",
            "clip_eps_high": "x > 0",
            "beta": "x >= 0",
            "max_sampling_rounds": "x >= 1",
        },
    )
    if (args.num_prompts * args.group_size) % args.num_minibatches:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide the batch num_prompts * "
            f"group_size = {args.num_prompts * args.group_size}"
        )
    if args.total_timesteps < args.num_prompts:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one update "
            f"(--num-prompts {args.num_prompts})"
        )


def check_model_and_task(args: Args, device="cpu"):
    """The model and the task file (canonrl.lm.check_task) and what they must fit, before
    anything is written; returns (task, policy, tokenizer): main() trains the model loaded here."""
    task, policy, tokenizer = check_task(args, load_policy, device)
    if len(task["train"]) < args.num_prompts:
        fail(f"--num-prompts {args.num_prompts} exceeds the {len(task['train'])} train prompts")
    return task, policy, tokenizer


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
