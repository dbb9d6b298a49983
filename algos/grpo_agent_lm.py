"""GRPO for a language model that calls a tool between its tokens (calc-v0 and the project's base).

Multi-turn rollouts: the model samples until it closes a call (<calc>47*63</calc>), the environment
computes it by a small grammar (calculate; never eval: a completion is data) and appends the result
(<r>2961</r>), and the model goes on through the same KV cache, at most --max-calls calls. The
tool's tokens are context, never trained on; the loss is grpo_lm.py's (group advantages of whole
trajectories, the clipped token ratio, --loss-type, --beta) over one pass on the whole sequence.

Run:    python algos/grpo_agent_lm.py --seed 1
Quick:  python algos/grpo_agent_lm.py --total-timesteps 320
Results: benchmark/references.toml (ours-grpo_agent_lm-calc-v0-1600), README.md
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

from canonrl.lm import check_task, find, prompt_text, save_model_folder, task_rewards
from canonrl.run import (
    LMRunArgs,
    RNGs,
    RunLogger,
    check_ranges,
    fail,
    load_states,
    start_run,
)


@dataclass
class Args(LMRunArgs):
    model: str = "benchmark/policies/lm-calc-base"
    """causal LM directory or id"""
    task: str | None = None
    """task file (JSON: name, max_new_tokens, tool, [prompt, answer] lists train and heldout,
    optional rewards; see Tool); default: <model>/task.json"""
    learning_rate: float = 3e-4
    """Adam learning rate"""
    num_prompts: int = 16
    """prompts per update: a batch is num_prompts * group_size trajectories"""
    group_size: int = 8
    """G: trajectories sampled per prompt"""
    update_epochs: int = 1
    """passes over each batch of trajectories (GRPO's mu)"""
    num_minibatches: int = 1
    """minibatches per pass, one optimiser step each (must divide the number of trajectories)"""
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
    lora_r: int = 0
    """rank of LoRA adapters (peft) that train instead of the weights (0: the weights train)"""
    lora_alpha: float = 16.0
    """LoRA's scale: the adapters' product is multiplied by lora_alpha / lora_r"""
    lora_target_modules: tuple[str, ...] = ("all-linear",)
    """linear layers given adapters, by name (q_proj v_proj ...; all-linear: all but the output)"""
    reward_weights: tuple[float, ...] | None = None
    """weight of each reward the task names, in its order; the reward is their weighted sum
    (default: 1 each)"""
    max_calls: int | None = None
    """tool calls a trajectory may make; one more scores 0 (default: the task's tool's)"""
    max_new_tokens: int | None = None
    """trajectory budget in tokens after the prompt, the model's and the tool's (default: the
    task's)"""
    temperature: float = 1.0
    """sampling temperature (the loss's log-probabilities use it too)"""
    max_grad_norm: float = 1.0
    """global gradient norm clip"""
    eval_prompts: int = 500
    """held-out prompts per greedy evaluation (at most the task's; 0: none)"""
    env_id: str = "calc-v0"
    """the task's name, checked against the task file"""
    total_timesteps: int = 1600
    """prompts trained on (updates * num_prompts)"""


# ---- copied from grpo_lm.py (checked as copies): rewards, the policy, advantages, loss ----
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


# ---- end of the copies ----


# ---- the environment: the tool and the multi-turn rollout ----
NUMBER = r"\d{1,12}"
EXPRESSION = re.compile(rf"{NUMBER}(?:[+\-*]{NUMBER}){{0,7}}")


def calculate(expression: str) -> int | None:
    """The value of a call's expression, or None where it is not one (a malformed call). The
    grammar: expression := term (("+" | "-") term)*, term := number ("*" number)*, number := 1 to
    12 digits, at most 8 numbers, spaces ignored; * before + and -, left to right. Parsed here,
    never by Python's eval: the expression is text the model wrote, data."""
    expression = re.sub(r"\s+", "", expression)
    if EXPRESSION.fullmatch(expression) is None:
        return None
    total = 0
    for sign, term in re.findall(r"([+-]?)([^+-]+)", expression):
        value = 1
        for number in term.split("*"):
            value *= int(number)
        total += -value if sign == "-" else value
    return total


@dataclass
class Tool:
    """The task's tool (its "tool" entry): a call is the text between call[0] and call[1], its
    result is written between result[0] and result[1]; max_calls calls per trajectory."""

    call: tuple[str, str]
    result: tuple[str, str]
    max_calls: int

    def read_turn(self, text: str) -> tuple[str, int | None]:
        """Where the model's turn (its text since the last result) stands: ("call", value) once it
        closes a call ("malformed", None where the call does not parse or was never opened);
        ("open", None) while a call is open; ("text", None) otherwise."""
        opened = text.rfind(self.call[0])
        closed = text.find(self.call[1])
        if closed >= 0:
            if opened < 0 or opened > closed:
                return "malformed", None
            value = calculate(text[opened + len(self.call[0]) : closed])
            return ("malformed", None) if value is None else ("call", value)
        return ("open", None) if opened >= 0 else ("text", None)

    def result_text(self, value: int) -> str:
        return f"{self.result[0]}{value}{self.result[1]}"


@torch.no_grad()
def rollout(
    policy,
    tokenizer,
    tool: Tool,
    prompt_ids,
    prompt_mask,
    max_new_tokens: int,
    greedy: bool = False,
    temperature: float = 1.0,
):
    """Multi-turn trajectories. The model samples (or, greedy, takes the most probable) token by
    token with a KV cache, as Policy.generate does; where its turn closes a call, the tool's result
    is fed in after it, one token a step through the same cache (the environment's tokens: their
    log-probability is 0 and they are never trained on), and the model goes on. A trajectory ends
    with the model's end token, a malformed call, a call past tool.max_calls, or max_new_tokens
    tokens in all. Returns (tokens, mask, own, logp, info): (B, max_new_tokens) tensors, mask 1 for
    each token of the trajectory (the model's and the tool's, up to and including its last), own 1
    for the model's; info, a list per key, one value per trajectory: "answer" (the text after the
    last result, None where it earns nothing: a failed or unended trajectory), "calls",
    "malformed", "over_limit", "turns", "truncated"."""
    from transformers import DynamicCache

    was_training = policy.training
    policy.eval()
    n = len(prompt_ids)
    device = prompt_ids.device
    cache = DynamicCache()
    mask = prompt_mask
    step_ids = prompt_ids
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    turn = [[] for _ in range(n)]  # the model's tokens since the last result
    feed = [[] for _ in range(n)]  # the tool's tokens still to come
    info = {"answer": [None] * n, "calls": [0] * n, "malformed": [0] * n, "over_limit": [0] * n}
    tokens = []
    alive = []
    own = []
    logps = []
    for _ in range(max_new_tokens):
        logits = policy(step_ids, mask, cache, positions).logits[:, -1].float() / temperature
        dist = torch.distributions.Categorical(logits=logits, validate_args=False)
        token = logits.argmax(-1) if greedy else dist.sample()
        fed = torch.tensor([bool(f) for f in feed], device=device)
        if fed.any():
            token[fed] = torch.tensor([f.pop(0) for f in feed if f], device=device)
        token = torch.where(done, policy.pad_id, token)
        mine = ~done & ~fed
        tokens.append(token)
        alive.append(~done)
        own.append(mine)
        logps.append(torch.where(mine, dist.log_prob(token), 0.0))
        ended = done.clone()
        for i in mine.nonzero().flatten().tolist():  # the environment reads the model's token
            if int(token[i]) in policy.end_ids:
                text = tokenizer.decode(turn[i])
                ended[i] = True
                if tool.call[0] in text:  # a call never closed
                    info["malformed"][i] = 1
                else:
                    info["answer"][i] = text
                continue
            turn[i].append(int(token[i]))
            state, value = tool.read_turn(tokenizer.decode(turn[i]))
            if state == "malformed":
                info["malformed"][i] = 1
                ended[i] = True
            elif state == "call" and info["calls"][i] == tool.max_calls:
                info["over_limit"][i] = 1
                ended[i] = True
            elif state == "call":
                info["calls"][i] += 1
                feed[i] = tokenizer.encode(tool.result_text(value), add_special_tokens=False)
                turn[i] = []
        done = ended
        if done.all():
            break
        mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
        step_ids = token[:, None]
        positions = mask.sum(-1, keepdim=True) - 1
    policy.train(was_training)
    for i in (~done).nonzero().flatten().tolist():  # out of tokens within a call: malformed too
        if tool.read_turn(tokenizer.decode(turn[i]))[0] == "open":
            info["malformed"][i] = 1
    info["turns"] = [c + 1 for c in info["calls"]]
    info["truncated"] = (~done).long().tolist()  # out of tokens before the trajectory ended
    pad = (0, max_new_tokens - len(tokens))  # every batch is max_new_tokens wide
    tokens = nn.functional.pad(torch.stack(tokens, 1), pad, value=policy.pad_id)
    c_mask = nn.functional.pad(torch.stack(alive, 1).long(), pad)
    own = nn.functional.pad(torch.stack(own, 1).long(), pad)
    return tokens, c_mask, own, nn.functional.pad(torch.stack(logps, 1), pad), info


# ---- end of the environment ----


def trajectory_stats(info: dict, c_mask, own) -> dict:
    """Per trajectory (lists): tool_call (1 where it called the tool), calls, malformed_call,
    over_call_limit, truncated, turns, generated_tokens (the model's), masked_tokens (the tool's:
    no loss on them)."""
    return {
        "tool_call": [float(c > 0) for c in info["calls"]],
        "calls": [float(c) for c in info["calls"]],
        "malformed_call": [float(m) for m in info["malformed"]],
        "over_call_limit": [float(m) for m in info["over_limit"]],
        "truncated": [float(t) for t in info["truncated"]],
        "turns": [float(t) for t in info["turns"]],
        "generated_tokens": own.sum(1).float().tolist(),
        "masked_tokens": (c_mask - own).sum(1).float().tolist(),
    }


@torch.no_grad()
def evaluate(
    policy,
    tokenizer,
    tool: Tool,
    pairs: list,
    task: dict,
    max_new_tokens: int,
    device="cpu",
    batch_size=500,
):
    """Greedy trajectories of held-out [prompt, answer] pairs: per prompt eval/episodic_return (its
    total reward), where the task names several rewards eval/reward_<name> of each, and the
    trajectory's statistics (trajectory_stats) as eval/<name>."""
    results = {}
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        ids, mask = encode_prompts(tokenizer, [x[0] for x in chunk], device)
        _, c_mask, own, _, info = rollout(
            policy, tokenizer, tool, ids, mask, max_new_tokens, greedy=True
        )
        scores = score(info["answer"], problem_targets(chunk), task)
        for name, values in scores.items():
            key = "eval/episodic_return" if name == "total" else f"eval/reward_{name}"
            if name == "total" or len(scores) > 2:
                results.setdefault(key, []).extend(values)
        for name, values in trajectory_stats(info, c_mask, own).items():
            results.setdefault(f"eval/{name}", []).extend(values)
    return results


def sample_groups(
    policy,
    tokenizer,
    tool: Tool,
    prompts: list,
    answers: list[tuple],
    task: dict,
    args: Args,
    max_new_tokens: int,
) -> dict:
    """args.group_size trajectories of each prompt: per trajectory its prompt ids and mask
    (padded to the longest of these prompts), its tokens, mask, own (the model's tokens: the
    loss's), log-probabilities at sampling, and statistics (trajectory_stats); per prompt the
    total rewards of its group (P, G) and, where the task names several rewards, the mean of each
    ("reward_<name>")."""
    device = policy.end_tensor.device
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts, device)
    ids = prompt_ids.repeat_interleave(args.group_size, dim=0)
    mask = prompt_mask.repeat_interleave(args.group_size, dim=0)
    completions, c_mask, own, logp, info = rollout(
        policy, tokenizer, tool, ids, mask, max_new_tokens, temperature=args.temperature
    )
    targets = [a for a in answers for _ in range(args.group_size)]
    scores = score(info["answer"], targets, task, args.reward_weights)
    rewards = torch.tensor(scores.pop("total"), device=device)
    means = {f"reward_{name}": float(np.mean(v)) for name, v in scores.items()}
    return {
        "ids": ids,
        "mask": mask,
        "completions": completions,
        "c_mask": c_mask,
        "own": own,
        "logp": logp,
        "stats": trajectory_stats(info, c_mask, own),
        "rewards": rewards.view(-1, args.group_size),
        "means": means if len(means) > 1 else {},
    }


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_flags, __file__)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    task, policy, tokenizer, tool = check_model_and_task(args, device)  # (nothing written yet)
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
    minibatch = args.num_prompts * args.group_size // args.num_minibatches
    num_iterations = args.total_timesteps // args.num_prompts
    clip_high = args.clip_eps_high if args.clip_eps_high is not None else args.clip_eps
    iteration = 0

    def run_eval():  # greedy, on the held-out prompts
        return evaluate(policy, tokenizer, tool, heldout, task, max_new_tokens, device)

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
        idx = np_rng.choice(len(answers), args.num_prompts, replace=False)
        b = sample_groups(
            policy,
            tokenizer,
            tool,
            [prompts[i] for i in idx],
            [answers[i] for i in idx],
            task,
            args,
            max_new_tokens,
        )
        tokens_done += int(b["c_mask"].sum())
        generation_seconds += time.time() - phase_start
        phase_start = time.time()
        advantages = group_advantages(b["rewards"], args.scale_rewards, args.baseline).flatten()
        loss_mask = b["own"]  # the tool's tokens: context, no loss
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
                # what the loss is normalised by: the counts of the whole minibatch
                completions = torch.tensor(float(len(mb)), device=device)
                tokens = loss_mask[mb].sum().float()
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
                    micro_stats["entropy"] = (entropy * loss_mask[micro]).sum() / tokens.clamp(
                        min=1
                    )
                    for k, v in micro_stats.items():
                        stats[k] = stats.get(k, 0.0) + v
                nn.utils.clip_grad_norm_(trained, args.max_grad_norm)
                optimizer.step()
        update_seconds += time.time() - phase_start
        update_tokens += int(full_mask.sum()) * args.update_epochs
        logger.last_return = float(b["rewards"].mean())
        global_step = iteration * args.num_prompts
        seconds = max(time.time() - sampling_start - logger.eval_seconds, 1e-9)
        logger.log(
            global_step,
            {
                "train/episodic_return": b["rewards"].mean(),
                "train/episodic_length": b["c_mask"].sum(1).float().mean(),
                **{f"charts/{k}": float(np.mean(v)) for k, v in b["stats"].items()},
                "charts/tokens_per_s": tokens_done / seconds,
                "charts/generation_tokens_per_s": tokens_done / generation_seconds,
                "charts/update_tokens_per_s": update_tokens / update_seconds,
                **{f"train/{k}": v for k, v in b["means"].items()},
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
        save_also=lambda run_dir: save_model_folder(run_dir, policy.lm, tokenizer, task),
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
            "gradient_accumulation_steps": "x >= 1",
            "lora_r": "x >= 0",
            "lora_alpha": "x > 0",
            "max_calls": "x >= 1",
        },
    )
    from canonrl.distributed import Ranks

    if Ranks().world_size > 1:
        fail("grpo_agent_lm.py runs in one process; run it without torchrun")
    completions = args.num_prompts * args.group_size
    if completions % args.num_minibatches:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide the batch num_prompts * "
            f"group_size = {completions}"
        )
    minibatch = completions // args.num_minibatches
    if args.gradient_accumulation_steps > minibatch:
        fail(
            f"--gradient-accumulation-steps {args.gradient_accumulation_steps} exceeds the "
            f"{minibatch} trajectories of a minibatch"
        )
    if args.total_timesteps < args.num_prompts:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one update "
            f"(--num-prompts {args.num_prompts})"
        )


def task_tool(task: dict, max_calls: int | None = None) -> Tool:
    """The task's tool (its "tool" entry: description, call and result tags, max_calls, which
    max_calls replaces where given); a task with none, or with max_calls < 1, is one error line."""
    spec = task.get("tool")
    tags = [spec.get(k) for k in ("call", "result")] if isinstance(spec, dict) else []
    if not (
        len(tags) == 2
        and all(isinstance(t, list) and len(t) == 2 for t in tags)
        and all(isinstance(s, str) and s for t in tags for s in t)
        and isinstance(spec.get("description"), str)
    ):
        fail(
            f'task {task["name"]} describes no tool: give it "tool": {{"description": text, '
            '"call": [open, close], "result": [open, close], "max_calls": K}'
        )
    max_calls = max_calls if max_calls is not None else spec.get("max_calls")
    if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1:
        fail(
            f"the tool of task {task['name']} allows max_calls {max_calls!r}: give a whole "
            "number >= 1 (or --max-calls)"
        )
    return Tool(tuple(tags[0]), tuple(tags[1]), max_calls)


def check_model_and_task(args: Args, device="cpu"):
    """The model and the task file (canonrl.lm.check_task), then the task's tool: its call and
    result tags, which the tokenizer must write, and its max_calls (or --max-calls), before
    anything is written; returns (task, policy, tokenizer, tool): main() trains the model loaded
    here."""
    task, policy, tokenizer = check_task(args, load_policy, device, REWARDS, add_lora)
    if len(task["train"]) < args.num_prompts:
        fail(f"--num-prompts {args.num_prompts} exceeds the {len(task['train'])} train prompts")
    tool = task_tool(task, args.max_calls)
    example = f"{tool.call[0]}12*34{tool.call[1]}{tool.result_text(408)}"
    written = tokenizer.decode(tokenizer.encode(example, add_special_tokens=False))
    if written != example:
        fail(
            f"the tokenizer of --model cannot write the tool's syntax: {example!r} comes back "
            f"as {written!r}"
        )
    return task, policy, tokenizer, tool


if __name__ == "__main__":
    cli_args = tyro.cli(Args, description=__doc__)
    main(cli_args)
