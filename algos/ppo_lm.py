"""PPO for language models with a value head, on a task with a verifiable reward (addition-v0).

Ziegler et al. 2019, Ouyang et al. 2022: one sampled completion per prompt; each token's reward is
-kl_coef * (log pi - log ref) of that token, and the last token also gets the task's reward; a
linear value head on the policy's last layer; GAE over the completion's tokens; the clipped policy
and value losses of PPO, several epochs of minibatches per batch of rollouts. A step is one prompt
trained on; --save-model writes <run_dir>/model (from_pretrained) beside model.pt.

Run:    python algos/ppo_lm.py --seed 1
Quick:  python algos/ppo_lm.py --total-timesteps 1024
2 GPUs: torchrun --standalone --nproc-per-node 2 algos/ppo_lm.py --cuda (the comment below main)
Results: benchmark/references.toml (ours-ppo_lm-addition-v0), README.md
"""

import copy
import re
import time
from dataclasses import dataclass

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
    """Adam learning rate of policy and value head (1e-4: a slower, smoother curve)"""
    num_prompts: int = 128
    """prompts per update, one sampled completion each"""
    update_epochs: int = 4
    """passes over each batch of rollouts"""
    num_minibatches: int = 4
    """minibatches per pass, one optimiser step each (must divide --num-prompts)"""
    gradient_accumulation_steps: int = 1
    """micro-batches each minibatch is computed in, their gradients summed into its one step (the
    same step in less memory)"""
    gradient_checkpointing: bool = False
    """recompute the layers' activations in the backward pass instead of keeping them (less
    memory, about a third more compute)"""
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
    total_timesteps: int = 12800
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


def masked_whiten(x, mask, sum_over=lambda t: t):
    """(x - mean) / std over the masked entries, as PPO normalises advantages. sum_over: a sum's
    total over every part of the batch (Ranks.sum where each process holds a part)."""
    n = sum_over(mask.sum())
    mean = sum_over((x * mask).sum()) / n
    var = sum_over((((x - mean) * mask) ** 2).sum()) / (n - 1).clamp(min=1)
    return (x - mean) / (var.sqrt() + 1e-8) * mask


def ppo_loss(
    logp,
    old_logp,
    advantages,
    values,
    old_values,
    returns,
    mask,
    clip_coef,
    clip_vloss,
    tokens=None,
):
    """PPO's clipped policy loss and (clipped) value loss, each a mean over the batch's completion
    tokens (`tokens` of them: the whole minibatch's where these rows are one micro-batch of it, so
    that its micro-batches' losses and statistics sum to its own). Returns (policy loss, value
    loss, statistics)."""
    n = (mask.sum() if tokens is None else tokens).clamp(min=1)
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
    ranks = Ranks()  # torchrun's processes (see the comment below main); without torchrun: one
    with ranks.said_by_rank_0():  # bad input stops every rank; rank 0 alone says why
        args, ckpt, run_dir = start_run(args, check_flags, __file__)
        device = ranks.device(args.cuda)
        task, policy, tokenizer = check_model_and_task(args, device)  # (nothing is written yet)
    ranks.join(device)
    max_new_tokens = args.max_new_tokens or task["max_new_tokens"]
    value_head = ValueHead(policy.lm.config.hidden_size).to(device)
    reference = None  # the frozen base of the KL penalty: none at --kl-coef 0 or with LoRA
    if args.kl_coef and not args.lora_r:
        reference = copy.deepcopy(policy).eval().requires_grad_(False)
    if args.gradient_checkpointing:
        policy.lm.gradient_checkpointing_enable({"use_reentrant": False})
    # with LoRA: the adapters and the value head
    params = [p for p in [*policy.parameters(), *value_head.parameters()] if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=args.learning_rate)
    np_rng = np.random.default_rng(args.seed)  # which train prompts each update samples
    heldout = task["heldout"][: args.eval_prompts]
    prompts = [x[0] for x in task["train"]]
    answers = problem_targets(task["train"])  # (answer, info) of each train prompt
    my_prompts = args.num_prompts // ranks.world_size  # this rank's prompts of each update
    minibatch = my_prompts // args.num_minibatches  # (this rank's part)
    num_iterations = args.total_timesteps // args.num_prompts
    iteration = 0

    def run_eval():  # greedy, on the held-out prompts
        return evaluate(policy, tokenizer, heldout, task, max_new_tokens, device)

    stateful = {
        "policy": policy,
        "value_head": value_head,
        "optimizer": optimizer,
        "rng": RNGs(np_rng),
    }  # saved and resumed
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)
        iteration = ckpt["iteration"]
    ranks.check_same_weights(policy, value_head)
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
        idx = torch.as_tensor(np_rng.choice(len(answers), args.num_prompts, replace=False))
        idx = idx[ranks.share(args.num_prompts)]  # every rank draws the same, keeps its part
        ids, mask = encode_prompts(tokenizer, [prompts[i] for i in idx], device)
        completions, c_mask, _ = policy.generate(
            ids, mask, max_new_tokens, temperature=args.temperature
        )
        generation_seconds += time.time() - phase_start
        phase_start = time.time()
        texts = completion_texts(tokenizer, completions, policy.end_ids)
        scores = score(texts, [answers[i] for i in idx], task, args.reward_weights)
        total = torch.tensor(scores.pop("total"), device=device)
        reward_means = {
            f"train/reward_{k}": np.mean(v) for k, v in scores.items() if len(scores) > 1
        }
        reward_means = ranks.mean_of(reward_means)  # (every rank as many prompts)
        full_ids = torch.cat([ids, completions], dim=1)
        full_mask = torch.cat([mask, c_mask], dim=1)
        n_prompt = ids.shape[1]
        c_mask = c_mask.float()
        with torch.no_grad():  # the rollout's log-probabilities and values, recomputed in batch
            old_logp, _, hidden = policy.token_logprobs(
                full_ids, full_mask, n_prompt, args.temperature
            )
            old_values = value_head(hidden) * c_mask
            ref_logp = old_logp  # (no reference at --kl-coef 0: no penalty)
            if args.kl_coef:
                ref_logp = reference_logprobs(
                    policy, reference, full_ids, full_mask, n_prompt, args.temperature
                )
            rewards = token_rewards(total, old_logp, ref_logp, c_mask, args.kl_coef)
            advantages, returns = token_gae(
                rewards, old_values, c_mask, args.gamma, args.gae_lambda
            )
            advantages = masked_whiten(advantages, c_mask, ranks.sum)  # over the whole batch
        tokens_done += int(ranks.sum(c_mask.sum()))
        policy.train()
        for epoch in range(args.update_epochs):
            perm = torch.randperm(my_prompts, device=device)
            for start in range(0, my_prompts, minibatch):
                mb = perm[start : start + minibatch]
                # what the losses are normalised by: the tokens of the whole minibatch, all ranks'
                # parts of it, so that the ranks' losses sum to the loss of one process
                tokens = ranks.sum(c_mask[mb].sum())
                optimizer.zero_grad()
                stats = {}
                # one optimiser step per minibatch, its gradient summed over micro-batches
                for micro in mb.tensor_split(args.gradient_accumulation_steps):
                    logp, entropy, hidden = policy.token_logprobs(
                        full_ids[micro], full_mask[micro], n_prompt, args.temperature
                    )
                    policy_loss, value_loss, micro_stats = ppo_loss(
                        logp,
                        old_logp[micro],
                        advantages[micro],
                        value_head(hidden),
                        old_values[micro],
                        returns[micro],
                        c_mask[micro],
                        args.clip_coef,
                        args.clip_vloss,
                        tokens,
                    )
                    loss = policy_loss + args.vf_coef * value_loss
                    loss.backward()
                    micro_stats["policy_loss"] = policy_loss.detach()
                    micro_stats["value_loss"] = value_loss.detach()
                    micro_stats["entropy"] = (entropy * c_mask[micro]).sum() / tokens
                    for k, v in micro_stats.items():
                        stats[k] = stats.get(k, 0.0) + v
                # the sum over the ranks: each rank's loss is its part of the minibatch's
                ranks.reduce_gradients(params, average=False)
                nn.utils.clip_grad_norm_(params, args.max_grad_norm)
                optimizer.step()
        # the last minibatch's losses: each rank's part of them, summed
        stats = ranks.sum_of(stats)
        update_seconds += time.time() - phase_start
        update_tokens += int(ranks.sum(full_mask.sum())) * args.update_epochs
        n = ranks.sum(c_mask.sum())
        # the whole batch's: the means of the ranks' parts (of the same size)
        mean_return = ranks.mean(total.mean())
        logger.last_return = float(mean_return)
        global_step = iteration * args.num_prompts
        seconds = max(time.time() - sampling_start - logger.eval_seconds, 1e-9)
        logger.log(
            global_step,
            {
                "train/episodic_return": mean_return,
                "train/episodic_length": ranks.mean(c_mask.sum(1).mean()),
                "charts/tokens_per_s": tokens_done / seconds,
                "charts/generation_tokens_per_s": tokens_done / generation_seconds,
                "charts/update_tokens_per_s": update_tokens / update_seconds,
                **reward_means,
                "losses/kl": ranks.sum(((old_logp - ref_logp) * c_mask).sum()) / n,
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
        model={"policy": policy.state_dict(), "value_head": value_head.state_dict()},
        save_also=lambda run_dir: save_model_folder(run_dir, policy.lm, tokenizer, task),
    )


# Several processes: torchrun --standalone --nproc-per-node N algos/ppo_lm.py ... (NCCL between
# GPUs with --cuda, gloo between CPU processes; one process without torchrun). Every rank draws the
# same prompts and samples the completions of its own num_prompts / N of them; the advantages are
# whitened with the whole batch's mean and std, each minibatch's losses are normalised by the tokens
# of the whole minibatch (every rank's part of it) and the gradients are summed over the ranks
# before the step: the step of one process on the whole batch. Rank 0 alone logs (the whole batch's
# statistics), evaluates and writes the run directory; the others wait for it at the next update.
# Ctrl-C (torchrun passes it to every rank) stops every rank after the same iteration, saved by rank
# 0; bad flags stop every rank before the process group starts, rank 0 alone printing the error.
# --num-prompts, the steps and the checkpoint are those of the whole batch, so a run resumes with
# any number of processes.


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
            "kl_coef": "x >= 0",
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
    prompts = args.num_prompts // world_size  # of each rank's batch
    if prompts % args.num_minibatches:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide --num-prompts "
            f"{args.num_prompts}"
            + (f" ({prompts} in each of {world_size} processes)" if world_size > 1 else "")
        )
    if args.gradient_accumulation_steps > prompts // args.num_minibatches:
        fail(
            f"--gradient-accumulation-steps {args.gradient_accumulation_steps} exceeds the "
            f"{prompts // args.num_minibatches} prompts of a minibatch"
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
