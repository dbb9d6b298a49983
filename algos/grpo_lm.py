"""GRPO for language models on a task with a verifiable reward (addition-v0 and the project's base).

Shao et al. 2024 (DeepSeekMath): G sampled completions per prompt, advantages relative to the group,
the clipped token-level ratio objective, an optional k3 KL penalty to the frozen reference (--beta).
Variants: Dr. GRPO (Liu et al. 2025): --no-scale-rewards --loss-type dr_grpo; DAPO (Yu et al. 2025):
--clip-eps-high 0.28 --loss-type token --dynamic-sampling --mask-truncated; RLOO (Ahmadian et al.
2024): --baseline rloo --no-scale-rewards. A step is one prompt; --save-model adds <run_dir>/model.

Run:    python algos/grpo_lm.py --seed 1
Quick:  python algos/grpo_lm.py --total-timesteps 1600
2 GPUs: torchrun --standalone --nproc-per-node 2 algos/grpo_lm.py --cuda (the comment below main)
Results: benchmark/references.toml (ours-grpo_lm-addition-v0-4800), README.md
"""

import copy
import re
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.utils.checkpoint import checkpoint

from canonrl.distributed import Ranks
from canonrl.lm import (
    check_task,
    default_env_id,
    find,
    prompt_text,
    save_model_folder,
    task_rewards,
)
from canonrl.run import LMRunArgs, RNGs, check_ranges, fail, load_states, start_run


@dataclass
class Args(LMRunArgs):
    model: str = "benchmark/policies/lm-addition-base"
    """causal LM directory or id"""
    task: str | None = None
    """task file (JSON: name, max_new_tokens, [prompt, answer] lists train and heldout, optional
    rewards and format; a prompt is text or a list of chat messages), or rg:<dataset>[:<key>=
    <value>,...]: a reasoning-gym task (e.g. rg:chain_sum:max_terms=3); default:
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
    """minibatches per pass, one optimiser step each (must divide the number of completions)"""
    gradient_accumulation_steps: int = 1
    """micro-batches each minibatch is computed in, their gradients summed into its one step (the
    same step in less memory)"""
    gradient_checkpointing: bool = False
    """recompute the layers' activations in the backward pass instead of keeping them (less
    memory, about a third more compute)"""
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
    lora_r: int = 0
    """rank of LoRA adapters (peft) that train instead of the weights (0: the weights train)"""
    lora_alpha: float = 16.0
    """LoRA's scale: the adapters' product is multiplied by lora_alpha / lora_r"""
    lora_target_modules: tuple[str, ...] = ("all-linear",)
    """linear layers given adapters, by name (q_proj v_proj ...; all-linear: all but the output)"""
    reward_weights: tuple[float, ...] | None = None
    """weight of each reward the task names, in its order; the reward is their weighted sum
    (default: 1 each)"""
    max_new_tokens: int | None = None
    """completion budget in tokens (default: the task's)"""
    temperature: float = 1.0
    """sampling temperature (the loss's log-probabilities use it too)"""
    max_grad_norm: float = 1.0
    """global gradient norm clip"""
    eval_prompts: int = 500
    """held-out prompts per greedy evaluation (at most the task's; 0: none)"""
    env_id: str = "addition-v0"
    """the task's name, checked against the task file (with --task rg:..., default: its name)"""
    total_timesteps: int = 4800
    """prompts trained on (updates * num_prompts)"""


# ---- shared: lm/model ----
def final_answer(text: str) -> str | None:
    """The answer a completion states last: the rest of the line after "####" (GSM8K), the
    contents of \\boxed{...} (MATH, braces matched) or of <answer>...</answer>; None if none."""
    found = [(m.start(), m.group(1)) for m in re.finditer(r"####[ \t]*([^\n]*)", text)]
    found += [(m.start(), m.group(1)) for m in re.finditer(r"<answer>(.*?)</answer>", text, re.S)]
    for m in re.finditer(r"\\boxed\{", text):
        depth = 1
        end = m.end()
        while end < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        if depth == 0:
            found.append((m.start(), text[m.end() : end - 1]))
    return max(found)[1].strip() if found else None


def same_answer(given: str, answer: str) -> bool:
    """given states answer: the same text, the same number (thousands commas aside), or the same
    mathematics by math-verify (1/2 and \\frac{1}{2}, 2x+1 and 1+2x)."""
    if given.strip() == answer.strip():
        return True
    try:
        return float(given.replace(",", "")) == float(answer.replace(",", ""))
    except ValueError:
        from math_verify import parse, verify

        return verify(parse(f"${answer}$"), parse(f"${given}$"))


def reward_exact(completion: str, answer: str, task: dict, info=None) -> float:
    """1.0 for exactly the answer (the whole completion), else 0.0."""
    return float(completion == answer)


def reward_final_answer(completion: str, answer: str, task: dict, info=None) -> float:
    """1.0 where the answer the completion states last (final_answer) is the answer."""
    given = final_answer(completion)
    return float(given is not None and same_answer(given, answer))


def reward_format(completion: str, answer: str, task: dict, info=None) -> float:
    """1.0 where the whole completion matches the task's "format" expression."""
    return float(re.fullmatch(task["format"], completion, re.DOTALL) is not None)


def reward_reasoning_gym(completion: str, answer: str, task: dict, info=None) -> float:
    """reasoning-gym's verifier of the task's dataset (its score_answer, given the problem's
    answer and metadata, info) on the answer the completion states last (final_answer), or on the
    whole completion where it states none: 1.0 for the right answer, part of 1 for some near
    misses (the dataset's rule), else 0.0."""
    from reasoning_gym import get_score_answer_fn

    given = final_answer(completion)
    verify = get_score_answer_fn(task["reasoning_gym"]["dataset"])
    entry = {"answer": answer, "metadata": info or {}}
    return float(verify((completion if given is None else given).strip(), entry))


REWARDS = {
    "exact": reward_exact,
    "final_answer": reward_final_answer,
    "format": reward_format,
    "reasoning_gym": reward_reasoning_gym,
}


def problem_targets(pairs: list) -> list[tuple]:
    """(answer, info) of each task entry [prompt, answer] or [prompt, answer, info]: what its
    completions are scored against (info: data a reward reads, such as a reasoning-gym problem's
    metadata; None where the entry has none)."""
    return [(x[1], x[2] if len(x) > 2 else None) for x in pairs]


def score(texts: list, targets: list[tuple], task: dict, weights=None) -> dict:
    """Each reward the task names (canonrl.lm.task_rewards) of each completion text against its
    (answer, info) target, and "total": their sum weighted by `weights` (default 1 each). A
    malformed completion (text None: no end token within the budget) scores 0 under every
    reward."""
    names = task_rewards(task)
    weights = weights or [1.0] * len(names)
    scores = {
        name: [
            0.0 if t is None else REWARDS[name](t, answer, task, info)
            for t, (answer, info) in zip(texts, targets)
        ]
        for name in names
    }
    scores["total"] = [
        sum(w * scores[n][i] for n, w in zip(names, weights)) for i in range(len(texts))
    ]
    return scores


def completion_texts(tokenizer, completions: torch.Tensor, end_ids) -> list[str | None]:
    """The text of each completion before its first end token; None where it has none
    (truncated)."""
    texts = []
    for row in completions.tolist():
        end = next((i for i, token in enumerate(row) if token in end_ids), None)
        texts.append(None if end is None else tokenizer.decode(row[:end]))
    return texts


LOGIT_CHUNK = 2**24  # logits token_logprobs computes at once (64 MB of float32)


class Policy(nn.Module):
    """A causal language model (transformers) as a policy over tokens. Prompts are padded on the
    left, completions on the right after their end token (any of end_ids); positions count real
    tokens only."""

    def __init__(self, lm, pad_id: int, end_ids: list[int]):
        super().__init__()
        self.lm = lm
        self.pad_id = pad_id
        self.end_ids = end_ids
        self.register_buffer("end_tensor", torch.tensor(end_ids), persistent=False)

    def forward(self, ids, mask, past_key_values=None, positions=None):
        """The next-token logits of the last position only (generation's use), with the cache."""
        # on a GPU: bf16 mixed precision (the weights and Adam's state stay float32)
        with torch.autocast("cuda", torch.bfloat16, enabled=ids.is_cuda):
            return self.lm(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=past_key_values,
                use_cache=True,
                logits_to_keep=1,
            )

    def token_logprobs(self, ids, mask, n_prompt: int, temperature: float = 1.0):
        """Log-probabilities and entropies (B, T) of the tokens ids[:, n_prompt:] (the completions)
        under the policy at `temperature`, and the last layer's states (B, T, hidden) at the
        positions that predict them (a value head reads these). One pass through the layers, then
        the output layer over chunks of positions: a token's log-probability is its logit minus
        the log-sum-exp of all, so the (B, T, vocabulary) logits are never held at once (with
        gradients, a chunk's logits are recomputed in the backward pass instead of kept). The
        entropy is a statistic, without gradient."""
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.autocast("cuda", torch.bfloat16, enabled=ids.is_cuda):
            out = self.lm.get_decoder()(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
            )
        hidden = out.last_hidden_state[:, n_prompt - 1 : -1]
        targets = ids[:, n_prompt:]
        vocab = self.lm.get_output_embeddings().out_features
        chunk = max(1, LOGIT_CHUNK // (len(ids) * vocab))  # positions per chunk
        pieces = []
        for start in range(0, targets.shape[1], chunk):
            part = (
                hidden[:, start : start + chunk],
                targets[:, start : start + chunk],
                temperature,
            )
            if torch.is_grad_enabled():
                pieces.append(checkpoint(self.chunk_logprobs, *part, use_reentrant=False))
            else:
                pieces.append(self.chunk_logprobs(*part))
        token_logp = torch.cat([p[0] for p in pieces], 1)
        entropy = torch.cat([p[1] for p in pieces], 1)
        return token_logp, entropy, hidden

    def chunk_logprobs(self, hidden, targets, temperature: float):
        """(log-probability, entropy) of the targets (B, t) from the states (B, t, hidden)."""
        with torch.autocast("cuda", torch.bfloat16, enabled=hidden.is_cuda):
            logits = self.lm.get_output_embeddings()(hidden)
        logits = logits.float() / temperature
        log_z = logits.logsumexp(-1)
        token_logp = logits.gather(-1, targets[..., None]).squeeze(-1) - log_z
        with torch.no_grad():
            entropy = log_z - (logits.softmax(-1) * logits).sum(-1)
        return token_logp, entropy

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
        and including the end token) and each sampled token's log-probability (0 where masked).
        The model samples in eval mode (in train mode, gradient checkpointing turns off the
        cache)."""
        from transformers import DynamicCache

        was_training = self.training
        self.eval()
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
            done = done | torch.isin(token, self.end_tensor)
            if done.all():
                break
            mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
            step_ids = token[:, None]
            positions = mask.sum(-1, keepdim=True) - 1
        self.train(was_training)
        pad = (0, max_new_tokens - len(tokens))  # every batch is max_new_tokens wide
        completions = nn.functional.pad(torch.stack(tokens, 1), pad, value=self.pad_id)
        c_mask = nn.functional.pad(torch.stack(alive, 1).long(), pad)
        return completions, c_mask, nn.functional.pad(torch.stack(logps, 1), pad)


def encode_prompts(tokenizer, prompts: list, device):
    """(ids, mask) of prompts (text, or conversations through the chat template) padded on the
    left to the longest of them."""
    tokenizer.padding_side = "left"
    texts = [prompt_text(tokenizer, p) for p in prompts]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


@torch.no_grad()
def evaluate(
    policy, tokenizer, pairs: list, task: dict, max_new_tokens: int, device="cpu", batch_size=500
):
    """Greedy completions of held-out [prompt, answer] pairs: eval/episodic_return, each prompt's
    total reward, and, where the task names several rewards, eval/reward_<name> of each."""
    scores = {}
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        ids, mask = encode_prompts(tokenizer, [x[0] for x in chunk], device)
        completions, _, _ = policy.generate(ids, mask, max_new_tokens, greedy=True)
        texts = completion_texts(tokenizer, completions, policy.end_ids)
        for name, values in score(texts, problem_targets(chunk), task).items():
            scores.setdefault(name, []).extend(values)
    results = {"eval/episodic_return": scores.pop("total")}
    if len(scores) > 1:
        results.update({f"eval/reward_{name}": values for name, values in scores.items()})
    return results


def load_policy(model: str, device="cpu"):
    """(Policy, tokenizer) from a from_pretrained directory or id (a directory may be given relative
    to the repository: the default base). A completion ends at any end token the tokenizer or the
    generation config names; a tokenizer without a pad token pads with its end token."""
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
    ends = lm.generation_config.eos_token_id if lm.generation_config is not None else None
    ends = [ends] if isinstance(ends, int) else list(ends or [])
    end_ids = sorted(
        {*ends, *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])}
    )
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token  # (masked everywhere it pads)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (end_ids or [0])[0]
    return Policy(lm, pad_id, end_ids).to(device), tokenizer


def add_lora(policy, r: int, alpha: float, target_modules: tuple[str, ...]):
    """LoRA (Hu et al. 2021) through peft: rank-r adapters, scaled by alpha / r, on the linear
    layers named target_modules ("all-linear": every one but the output layer), zero at the start;
    the base's weights are frozen, so only the adapters train."""
    from peft import LoraConfig, get_peft_model

    targets = "all-linear" if tuple(target_modules) == ("all-linear",) else list(target_modules)
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0)
    policy.lm = get_peft_model(policy.lm, config)


def reference_logprobs(policy, reference, ids, mask, n_prompt: int, temperature: float = 1.0):
    """Token log-probabilities (B, T) of the completions under the frozen base: the reference
    model, or, with LoRA (reference None), the policy with its adapters turned off (no second
    copy of the weights)."""
    with torch.no_grad():
        if reference is not None:
            return reference.token_logprobs(ids, mask, n_prompt, temperature)[0]
        with policy.lm.disable_adapter():
            return policy.token_logprobs(ids, mask, n_prompt, temperature)[0]


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
    batch=None,
):
    """The clipped token-level objective of GRPO (Shao et al. 2024, eq. 3), negated, + beta * k3 KL.
    logp, old_logp, mask, ref_logp: (B, T) over completion tokens; advantages (B,), one each.
    Normalisation (what the per-token terms are averaged over):
      grpo:    mean over each completion's tokens, then mean over completions (the paper's 1/|o_i|);
      token:   sum over all tokens / number of tokens in the batch (DAPO, eq. 8);
      dr_grpo: sum over all tokens / (completions * max_new_tokens), a constant (Dr. GRPO).
    batch: (completions, tokens) of the whole minibatch where these rows are one micro-batch of it
    (gradient accumulation): the counts above are the minibatch's, so that the losses and the
    statistics of its micro-batches sum to its own. Returns (loss, statistics); kl where ref_logp
    is given."""
    completions, tokens = batch if batch is not None else (len(mask), mask.sum())
    ratio = (logp - old_logp).exp()
    adv = advantages[:, None]
    per_token = -torch.min(ratio * adv, ratio.clamp(1 - clip_low, 1 + clip_high) * adv)
    kl = k3_kl(logp, ref_logp) if ref_logp is not None else None
    if beta:
        per_token = per_token + beta * kl
    mask = mask.to(per_token.dtype)
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / completions
    elif loss_type == "token":
        loss = (per_token * mask).sum() / tokens.clamp(min=1)
    else:
        loss = (per_token * mask).sum() / (completions * max_new_tokens)
    with torch.no_grad():  # a token is clipped where the clip removed its gradient (as TRL counts)
        clipped = ((ratio < 1 - clip_low) & (adv < 0)) | ((ratio > 1 + clip_high) & (adv > 0))
        n = tokens.clamp(min=1)
        stats = {
            "policy_loss": loss,
            "clipfrac": (clipped * mask).sum() / n,
            "approx_kl": (((ratio - 1) - (logp - old_logp)) * mask).sum() / n,
        }
        if kl is not None:
            stats["kl"] = (kl * mask).sum() / n
    return loss, {k: v.detach() for k, v in stats.items()}


def sample_groups(
    policy,
    tokenizer,
    prompts: list,
    answers: list[tuple],
    task: dict,
    args: Args,
    max_new_tokens: int,
) -> dict:
    """args.group_size completions of each prompt: per completion its prompt ids and mask (padded
    to the longest of these prompts), the completion, its mask, its token log-probabilities at
    sampling and whether it was truncated (no end token); per prompt the total rewards of its group
    (P, G) and, per reward the task names, its mean ("reward_<name>")."""
    device = policy.end_tensor.device
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts, device)
    ids = prompt_ids.repeat_interleave(args.group_size, dim=0)
    mask = prompt_mask.repeat_interleave(args.group_size, dim=0)
    completions, c_mask, logp = policy.generate(
        ids, mask, max_new_tokens, temperature=args.temperature
    )
    texts = completion_texts(tokenizer, completions, policy.end_ids)
    targets = [a for a in answers for _ in range(args.group_size)]
    scores = score(texts, targets, task, args.reward_weights)
    rewards = torch.tensor(scores.pop("total"), device=device)
    truncated = torch.tensor([t is None for t in texts], device=device)
    means = {f"reward_{name}": float(np.mean(v)) for name, v in scores.items()}
    return {
        "ids": ids,
        "mask": mask,
        "completions": completions,
        "c_mask": c_mask,
        "logp": logp,
        "truncated": truncated,
        "rewards": rewards.view(-1, args.group_size),
        "means": means if len(means) > 1 else {},
    }


def keep_groups(rounds: list, num_prompts: int, group_size: int) -> dict:
    """The groups kept in the sampling rounds ([(batch, keep (P,)), ...]) as one batch of at most
    num_prompts groups, in the order they were sampled."""
    batch = {}
    for key in rounds[0][0]:
        if key == "means":
            continue
        if key == "rewards":
            batch[key] = torch.cat([b[key][keep] for b, keep in rounds])[:num_prompts]
        else:
            parts = [b[key][keep.repeat_interleave(group_size)] for b, keep in rounds]
            if key in ("ids", "mask"):  # each round's prompts padded on the left to its longest
                width = max(x.shape[1] for x in parts)
                parts = [nn.functional.pad(x, (width - x.shape[1], 0)) for x in parts]
            batch[key] = torch.cat(parts)[: num_prompts * group_size]
    return batch


def main(args: Args):
    ranks = Ranks()  # torchrun's processes (see the comment below main); without torchrun: one
    with ranks.said_by_rank_0():  # bad input stops every rank; rank 0 alone says why
        args, ckpt, run_dir = start_run(args, check_flags, __file__)
        device = ranks.device(args.cuda)
        task, policy, tokenizer = check_model_and_task(args, device)  # (nothing is written yet)
    ranks.join(device)
    max_new_tokens = args.max_new_tokens or task["max_new_tokens"]
    reference = None  # the frozen base of the KL penalty: none at --beta 0 or with LoRA
    if args.beta and not args.lora_r:
        reference = copy.deepcopy(policy).eval().requires_grad_(False)
    if args.gradient_checkpointing:
        policy.lm.gradient_checkpointing_enable({"use_reentrant": False})
    trained = [p for p in policy.parameters() if p.requires_grad]  # with LoRA: the adapters
    optimizer = torch.optim.Adam(trained, lr=args.learning_rate)
    np_rng = np.random.default_rng(args.seed)  # which train prompts each update samples
    heldout = task["heldout"][: args.eval_prompts]
    prompts = [x[0] for x in task["train"]]
    answers = problem_targets(task["train"])  # (answer, info) of each train prompt
    my_prompts = args.num_prompts // ranks.world_size  # this rank's prompts of each update
    minibatch = my_prompts * args.group_size // args.num_minibatches  # (this rank's part)
    num_iterations = args.total_timesteps // args.num_prompts
    clip_high = args.clip_eps_high if args.clip_eps_high is not None else args.clip_eps
    iteration = 0

    def run_eval():  # greedy, on the held-out prompts
        return evaluate(policy, tokenizer, heldout, task, max_new_tokens, device)

    stateful = {"policy": policy, "optimizer": optimizer, "rng": RNGs(np_rng)}  # saved and resumed
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)
        iteration = ckpt["iteration"]
    ranks.check_same_weights(policy)
    if ranks.rank > 0:  # each rank its own samples (rank 0's: those of one process)
        torch.manual_seed(args.seed + 10_000 * ranks.rank + iteration)
    global_step = iteration * args.num_prompts
    # the RunLogger (rank 0 alone writes the run)
    logger = ranks.logger(
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
            idx = idx[ranks.share(args.num_prompts)]  # every rank draws the same, keeps its part
            sampled = sample_groups(
                policy,
                tokenizer,
                [prompts[i] for i in idx],
                [answers[i] for i in idx],
                task,
                args,
                max_new_tokens,
            )
            keep = torch.ones(my_prompts, dtype=torch.bool, device=device)
            if args.dynamic_sampling:  # DAPO eq. 11: a group of equal rewards has no signal
                keep = sampled["rewards"].std(1) > 0
            rounds.append((sampled, keep))
            rewards_seen.append(sampled["rewards"].flatten())
            lengths.append(sampled["c_mask"].sum(1))
            if sum(int(k.sum()) for _, k in rounds) >= my_prompts:
                break
        if not any(bool(k.any()) for _, k in rounds):  # none kept: the last round (advantages 0)
            rounds[-1] = (rounds[-1][0], torch.ones_like(rounds[-1][1]))
        b = keep_groups(rounds, my_prompts, args.group_size)
        tokens_done += int(ranks.sum(torch.cat(lengths).sum()))
        generation_seconds += time.time() - phase_start
        phase_start = time.time()
        advantages = group_advantages(b["rewards"], args.scale_rewards, args.baseline).flatten()
        loss_mask = b["c_mask"] * ~b["truncated"][:, None] if args.mask_truncated else b["c_mask"]
        full_ids = torch.cat([b["ids"], b["completions"]], dim=1)
        full_mask = torch.cat([b["mask"], b["c_mask"]], dim=1)
        n_prompt = b["ids"].shape[1]
        ref_logp = None
        if args.beta:
            ref_logp = reference_logprobs(
                policy, reference, full_ids, full_mask, n_prompt, args.temperature
            )
        policy.train()
        n = len(full_ids)
        for epoch in range(args.update_epochs):
            perm = torch.randperm(n, device=device)
            for start in range(0, n, minibatch):
                mb = perm[start : start + minibatch]
                # what the loss is normalised by: the counts of the whole minibatch, all ranks'
                # parts of it, so that the ranks' losses sum to the loss of one process
                completions, tokens, c_tokens = ranks.sum(
                    torch.tensor(
                        [len(mb), loss_mask[mb].sum(), b["c_mask"][mb].sum()], device=device
                    ).float()
                )
                optimizer.zero_grad()
                stats = {}
                # one optimiser step per minibatch, its gradient summed over micro-batches
                for micro in mb.tensor_split(args.gradient_accumulation_steps):
                    logp, entropy, _ = policy.token_logprobs(
                        full_ids[micro], full_mask[micro], n_prompt, args.temperature
                    )
                    loss, micro_stats = clipped_loss(
                        logp,
                        b["logp"][micro],
                        advantages[micro],
                        loss_mask[micro],
                        args.clip_eps,
                        clip_high,
                        args.loss_type,
                        max_new_tokens,
                        None if ref_logp is None else ref_logp[micro],
                        args.beta,
                        (completions, tokens),
                    )
                    loss.backward()
                    c_mask = b["c_mask"][micro]
                    micro_stats["entropy"] = (entropy * c_mask).sum() / c_tokens.clamp(min=1)
                    for k, v in micro_stats.items():
                        stats[k] = stats.get(k, 0.0) + v
                # the sum over the ranks: each rank's loss is its part of the minibatch's
                ranks.reduce_gradients(trained, average=False)
                nn.utils.clip_grad_norm_(trained, args.max_grad_norm)
                optimizer.step()
        # the last minibatch's losses: each rank's part of them, summed
        stats = ranks.sum_of(stats)
        update_seconds += time.time() - phase_start
        update_tokens += int(ranks.sum(full_mask.sum())) * args.update_epochs
        all_rewards = torch.cat(rewards_seen)
        reward_means = {  # each reward the task names, where it names several
            f"train/{k}": np.mean([r[0]["means"][k] for r in rounds]) for k in rounds[0][0]["means"]
        }
        batch_stats = {
            "train/episodic_return": all_rewards.mean(),
            "train/episodic_length": torch.cat(lengths).float().mean(),
            "charts/truncated": b["truncated"].float().mean(),
            "charts/kept_groups": len(b["rewards"]) / (len(all_rewards) / args.group_size),
        }
        # the whole batch's: the means of the ranks' parts (of the same size: no dynamic sampling)
        batch_stats = ranks.mean_of(batch_stats)
        reward_means = ranks.mean_of(reward_means)
        logger.last_return = batch_stats["train/episodic_return"]
        global_step = iteration * args.num_prompts
        seconds = max(time.time() - sampling_start - logger.eval_seconds, 1e-9)
        logger.log(
            global_step,
            {
                **batch_stats,
                "charts/tokens_per_s": tokens_done / seconds,
                "charts/generation_tokens_per_s": tokens_done / generation_seconds,
                "charts/update_tokens_per_s": update_tokens / update_seconds,
                **reward_means,
                **{f"losses/{k}": v for k, v in stats.items()},
            },
        )
        logger.progress(global_step)
        ranks.agree_to_stop(logger)
        logger.end_iteration(stateful, iteration, global_step, run_eval if heldout else None)
    ranks.leave()  # no collective after it: the other ranks end while rank 0 evaluates
    logger.finish(
        stateful,
        num_iterations,
        global_step,
        run_eval if heldout else None,
        model={"policy": policy.state_dict()},
        save_also=lambda run_dir: save_model_folder(run_dir, policy.lm, tokenizer, task),
    )


# Several processes: torchrun --standalone --nproc-per-node N algos/grpo_lm.py ... (NCCL between
# GPUs with --cuda, gloo between CPU processes; one process without torchrun). Every rank draws the
# same prompts and samples the completions of its own num_prompts / N of them; each minibatch's loss
# is normalised by the counts of the whole minibatch (every rank's part of it) and the gradients are
# summed over the ranks before the step: the step of one process on the whole batch. Rank 0 alone
# logs (the whole batch's statistics), evaluates and writes the run directory; the others wait for
# it at the next update. Ctrl-C (torchrun passes it to every rank) stops every rank after the same
# iteration, saved by rank 0; bad flags stop every rank before the process group starts, rank 0
# alone printing the error. --num-prompts, the steps and the checkpoint are those of the whole
# batch, so a run resumes with any number of processes.


def check_args(args: Args):
    """Every flag, then the model, the task and what they must fit (the way main() checks them)."""
    check_flags(args)
    check_model_and_task(args)


def check_flags(args: Args):
    """The flags alone: ranges and the sizes that must fit together."""
    default_env_id(args)  # --task rg:...: --env-id is its name
    check_ranges(
        args,
        {
            "group_size": "x >= 2",
            "clip_eps": "x > 0",
            "clip_eps_high": "x > 0",
            "beta": "x >= 0",
            "max_sampling_rounds": "x >= 1",
            "gradient_accumulation_steps": "x >= 1",
            "lora_r": "x >= 0",
            "lora_alpha": "x > 0",
        },
    )
    world_size = Ranks().world_size  # torchrun's processes, each its share of the prompts
    if args.num_prompts % world_size:
        fail(
            f"--num-prompts {args.num_prompts} cannot be shared by {world_size} processes; "
            "make it a multiple of torchrun's --nproc-per-node"
        )
    if world_size > 1 and args.dynamic_sampling:
        fail(
            "--dynamic-sampling runs in one process only (each rank would keep a different "
            "number of groups); drop it or run without torchrun"
        )
    completions = args.num_prompts // world_size * args.group_size  # of each rank's batch
    if completions % args.num_minibatches:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide the batch num_prompts * "
            f"group_size = {args.num_prompts * args.group_size}"
            + (f" ({completions} in each of {world_size} processes)" if world_size > 1 else "")
        )
    minibatch = completions // args.num_minibatches
    if args.gradient_accumulation_steps > minibatch:
        fail(
            f"--gradient-accumulation-steps {args.gradient_accumulation_steps} exceeds the "
            f"{minibatch} completions of a minibatch"
        )
    if args.total_timesteps < args.num_prompts:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one update "
            f"(--num-prompts {args.num_prompts})"
        )


def check_model_and_task(args: Args, device="cpu"):
    """The model and the task file (canonrl.lm.check_task) and what they must fit, before
    anything is written; returns (task, policy, tokenizer): main() trains the model loaded here."""
    task, policy, tokenizer = check_task(args, load_policy, device, REWARDS, add_lora)
    if len(task["train"]) < args.num_prompts:
        fail(f"--num-prompts {args.num_prompts} exceeds the {len(task['train'])} train prompts")
    return task, policy, tokenizer


if __name__ == "__main__":
    with Ranks().said_by_rank_0():  # a flag that cannot be parsed: said once, not once per rank
        cli_args = tyro.cli(Args, description=__doc__)
    main(cli_args)
