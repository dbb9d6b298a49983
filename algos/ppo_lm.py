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
import time
from dataclasses import dataclass

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
    args, ckpt, run_dir = start_run(args, check_flags, __file__)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    task, policy, tokenizer = check_model_and_task(args, device)  # (nothing is written yet)
    max_new_tokens = args.max_new_tokens or task["max_new_tokens"]
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
        logger.end_iteration(stateful, iteration, global_step, run_eval if heldout else None)
    logger.finish(
        stateful,
        num_iterations,
        global_step,
        run_eval if heldout else None,
        model={"policy": policy.state_dict(), "value_head": value_head.state_dict()},
        save_also=lambda run_dir: save_model_folder(run_dir, policy.lm, tokenizer, task_path(args)),
    )


def check_args(args: Args):
    """Every flag, then the model, the task and what they must fit (the way main() checks them)."""
    check_flags(args)
    check_model_and_task(args)


def check_flags(args: Args):
    """The flags alone: ranges and the sizes that must fit together."""
    check_ranges(args, {"kl_coef": "x >= 0"})
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


def check_model_and_task(args: Args, device="cpu"):
    """The model and the task file (canonrl.lm.check_task) and what they must fit, before
    anything is written; returns (task, policy, tokenizer): main() trains the model loaded here."""
    task, policy, tokenizer = check_task(args, load_policy, device)
    if len(task["train"]) < args.num_prompts:
        fail(f"--num-prompts {args.num_prompts} exceeds the {len(task['train'])} train prompts")
    return task, policy, tokenizer


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
