"""DPO for language models: preference pairs of the base's own samples (addition-v0).

Rafailov et al. 2023: maximise log sigmoid(beta * (log-ratio of the chosen completion - log-ratio
of the rejected one)), each log-ratio the policy's log-probability of a completion minus the
frozen reference's. The pairs (preferences.json beside the model, made by benchmark/lm_task.py):
a correct completion chosen over a wrong one of the same train prompt. A step is one pair trained
on; --save-model writes <run_dir>/model (from_pretrained) beside model.pt.

Run:    python algos/dpo_lm.py --seed 1
Quick:  python algos/dpo_lm.py --total-timesteps 1280
2 GPUs: torchrun --standalone --nproc-per-node 2 algos/dpo_lm.py --cuda (the comment below main)
Results: benchmark/references.toml (ours-dpo_lm-addition-v0), README.md
"""

import copy
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

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
    preferences: str | None = None
    """preference file (JSON: task, pairs [prompt, chosen, rejected]); default:
    <model>/preferences.json"""
    learning_rate: float = 3e-4
    """Adam learning rate (1e-3 with beta 0.1: accuracy falls to 0.08)"""
    beta: float = 1.0
    """DPO's beta: the strength of the implicit KL to the reference (TRL: 0.1; here 0.1 lowers the
    accuracy while the implicit reward margin grows)"""
    batch_size: int = 64
    """preference pairs per update"""
    gradient_accumulation_steps: int = 1
    """micro-batches each update is computed in, their gradients summed into its one step (the
    same step in less memory)"""
    gradient_checkpointing: bool = False
    """recompute the layers' activations in the backward pass instead of keeping them (less
    memory, about a third more compute)"""
    lora_r: int = 0
    """rank of LoRA adapters (peft) that train instead of the weights (0: the weights train)"""
    lora_alpha: float = 16.0
    """LoRA's scale: the adapters' product is multiplied by lora_alpha / lora_r"""
    lora_target_modules: tuple[str, ...] = ("all-linear",)
    """linear layers given adapters, by name (q_proj v_proj ...; all-linear: all but the output)"""
    max_grad_norm: float = 1.0
    """global gradient norm clip"""
    max_new_tokens: int | None = None
    """completion budget of the greedy evaluation in tokens (default: the task's)"""
    eval_prompts: int = 500
    """held-out prompts per greedy evaluation (at most the task's; 0: none)"""
    env_id: str = "addition-v0"
    """the task's name, checked against the task file (with --task rg:..., default: its name)"""
    total_timesteps: int = 14784
    """preference pairs trained on (updates * batch_size: 231 x 64, two epochs of the 7,409)"""


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


def load_preferences(path: Path) -> dict:
    """The preference file: {"task", "pairs": [[prompt, chosen, rejected], ...]}."""
    return json.loads(Path(path).read_text())


def encode_pairs(policy, tokenizer, pairs: list, max_new_tokens: int, device):
    """Token ids and mask of each pair's prompt (padded on the left), repeated for its chosen and
    rejected completion: rows [chosen of pair 0..B-1, rejected of pair 0..B-1]. A completion is its
    text and an end token (the tokenizer's, else the model's first), padded on the right to
    max_new_tokens. Returns (ids, mask, n_prompt)."""
    ids, mask = encode_prompts(tokenizer, [p for p, _, _ in pairs] * 2, device)
    completions = [c for _, c, _ in pairs] + [r for _, _, r in pairs]
    end = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else policy.end_ids[0]
    c_ids = torch.full((len(completions), max_new_tokens), policy.pad_id)
    c_mask = torch.zeros((len(completions), max_new_tokens), dtype=torch.long)
    for i, text in enumerate(completions):
        tokens = tokenizer.encode(text, add_special_tokens=False) + [end]
        c_ids[i, : len(tokens)] = torch.tensor(tokens)
        c_mask[i, : len(tokens)] = 1
    full_ids = torch.cat([ids, c_ids.to(device)], dim=1)
    full_mask = torch.cat([mask, c_mask.to(device)], dim=1)
    return full_ids, full_mask, ids.shape[1]


def dpo_loss(chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp, beta: float):
    """DPO's loss (Rafailov et al. 2023, eq. 7): -log sigmoid(beta * (chosen log-ratio - rejected
    log-ratio)), averaged over pairs; each argument is a completion's summed log-probability (B,).
    Returns (loss, statistics): the implicit rewards beta * log-ratio of chosen and rejected, their
    margin and the share of pairs where the chosen one's is higher."""
    chosen_reward = beta * (chosen_logp - ref_chosen_logp)
    rejected_reward = beta * (rejected_logp - ref_rejected_logp)
    margin = chosen_reward - rejected_reward
    loss = -nn.functional.logsigmoid(margin).mean()
    stats = {
        "policy_loss": loss,
        "chosen_reward": chosen_reward.mean(),
        "rejected_reward": rejected_reward.mean(),
        "reward_margin": margin.mean(),
        "reward_accuracy": (margin > 0).float().mean(),
    }
    return loss, {k: v.detach() for k, v in stats.items()}


def pair_indices(seed: int, first: int, count: int, n: int) -> list[int]:
    """Which of the n pairs are the run's pairs first .. first + count - 1: every epoch (n pairs)
    goes through all of them in its own order, drawn from (seed, epoch)."""
    steps = range(first, first + count)
    orders = {e: np.random.default_rng([seed, e]).permutation(n) for e in {k // n for k in steps}}
    return [int(orders[k // n][k % n]) for k in steps]


def main(args: Args):
    ranks = Ranks()  # torchrun's processes (see the comment below main); without torchrun: one
    with ranks.said_by_rank_0():  # bad input stops every rank; rank 0 alone says why
        args, ckpt, run_dir = start_run(args, check_flags, __file__)
        device = ranks.device(args.cuda)
        task, policy, tokenizer = check_model_and_task(args, device)  # (nothing is written yet)
    ranks.join(device)
    max_new_tokens = args.max_new_tokens or task["max_new_tokens"]
    pairs = load_preferences(preferences_path(args))["pairs"]
    reference = None  # the frozen base; with LoRA, the policy with its adapters off
    if not args.lora_r:
        reference = copy.deepcopy(policy).eval().requires_grad_(False)
    if args.gradient_checkpointing:
        policy.lm.gradient_checkpointing_enable({"use_reentrant": False})
    trained = [p for p in policy.parameters() if p.requires_grad]  # with LoRA: the adapters
    optimizer = torch.optim.Adam(trained, lr=args.learning_rate)
    heldout = task["heldout"][: args.eval_prompts]
    num_iterations = args.total_timesteps // args.batch_size
    iteration = 0

    def run_eval():  # greedy, on the held-out prompts
        return evaluate(policy, tokenizer, heldout, task, max_new_tokens, device)

    stateful = {"policy": policy, "optimizer": optimizer, "rng": RNGs()}  # saved and resumed
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)
        iteration = ckpt["iteration"]
    ranks.check_same_weights(policy)
    global_step = iteration * args.batch_size
    # the RunLogger (rank 0 alone writes the run)
    logger = ranks.logger(
        args, run_dir, num_iterations * args.batch_size, global_step, ckpt=ckpt, script=__file__
    )
    if ckpt is None and heldout:  # the first evaluation: the model as loaded
        logger.evaluate(global_step, run_eval)
    tokens_done = 0
    start_time = time.time()
    for iteration in range(iteration + 1, num_iterations + 1):
        first = (iteration - 1) * args.batch_size
        batch = [pairs[i] for i in pair_indices(args.seed, first, args.batch_size, len(pairs))]
        mine = batch[ranks.share(len(batch))]  # this rank's pairs (all of them in one process)
        policy.train()
        optimizer.zero_grad()
        stats = {}
        lengths = []
        entropy_sum = 0.0
        # one optimiser step per update, its gradient summed over micro-batches of pairs
        for micro in np.array_split(np.arange(len(mine)), args.gradient_accumulation_steps):
            part = [mine[i] for i in micro]
            ids, mask, n_prompt = encode_pairs(policy, tokenizer, part, max_new_tokens, device)
            c_mask = mask[:, n_prompt:]
            ref_logp = reference_logprobs(policy, reference, ids, mask, n_prompt)
            logp, entropy, _ = policy.token_logprobs(ids, mask, n_prompt)
            seq_logp = (logp * c_mask).sum(1)
            ref_seq_logp = (ref_logp * c_mask).sum(1)
            n = len(part)
            loss, micro_stats = dpo_loss(
                seq_logp[:n], seq_logp[n:], ref_seq_logp[:n], ref_seq_logp[n:], args.beta
            )
            share = n / len(batch)  # the update's loss and statistics: means over all its pairs
            (loss * share).backward()
            for k, v in micro_stats.items():
                stats[k] = stats.get(k, 0.0) + v * share
            lengths.append(c_mask.sum(1))
            entropy_sum = entropy_sum + (entropy * c_mask).sum()
            tokens_done += int(ranks.sum(mask.sum()))
        # the sum over the ranks: each rank's loss is its share of the batch's mean
        ranks.reduce_gradients(trained, average=False)
        nn.utils.clip_grad_norm_(trained, args.max_grad_norm)
        optimizer.step()
        policy.eval()
        lengths = torch.cat(lengths)  # (every rank as many completions)
        global_step = iteration * args.batch_size
        seconds = max(time.time() - start_time - logger.eval_seconds, 1e-9)
        logger.log(
            global_step,
            {
                "train/episodic_length": ranks.mean(lengths.float().mean()),
                "charts/tokens_per_s": tokens_done / seconds,
                "losses/entropy": ranks.sum(entropy_sum) / ranks.sum(lengths.sum()),
                **{f"losses/{k}": v for k, v in ranks.sum_of(stats).items()},
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


# Several processes: torchrun --standalone --nproc-per-node N algos/dpo_lm.py ... (NCCL between
# GPUs with --cuda, gloo between CPU processes; one process without torchrun). Every rank takes the
# same batch of pairs and computes the loss of its own batch_size / N of them, weighted by its share
# of the whole batch; the gradients are summed over the ranks before the step: the step of one
# process on the whole batch. Rank 0 alone logs (the whole batch's statistics), evaluates and writes
# the run directory; the others wait for it at the next update. Ctrl-C (torchrun passes it to every
# rank) stops every rank after the same iteration, saved by rank 0; bad flags stop every rank before
# the process group starts, rank 0 alone printing the error. --batch-size, the steps and the
# checkpoint are those of the whole batch, so a run resumes with any number of processes.


def preferences_path(args: Args) -> Path:
    if args.preferences:
        return Path(find(args.preferences))
    return Path(find(args.model)) / "preferences.json"


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
            "beta": "x > 0",
            "gradient_accumulation_steps": "x >= 1",
            "lora_r": "x >= 0",
            "lora_alpha": "x > 0",
        },
    )
    world_size = Ranks().world_size  # torchrun's processes, each its share of the pairs
    if args.batch_size % world_size:
        fail(
            f"--batch-size {args.batch_size} cannot be shared by {world_size} processes; "
            "make it a multiple of torchrun's --nproc-per-node"
        )
    if args.gradient_accumulation_steps > args.batch_size // world_size:
        fail(
            f"--gradient-accumulation-steps {args.gradient_accumulation_steps} exceeds "
            f"--batch-size {args.batch_size}"
            + (f" ({args.batch_size // world_size} pairs per process)" if world_size > 1 else "")
        )
    if args.total_timesteps < args.batch_size:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one update "
            f"(--batch-size {args.batch_size})"
        )


def check_model_and_task(args: Args, device="cpu"):
    """The model and the task file (canonrl.lm.check_task) and what they must fit, before
    anything is written; returns (task, policy, tokenizer): main() trains the model loaded here."""
    task, policy, tokenizer = check_task(args, load_policy, device, REWARDS, add_lora)
    path = preferences_path(args)
    try:
        prefs = load_preferences(path)
        name = prefs["task"]
        pairs = prefs["pairs"]
        ok = all(len(p) == 3 and all(isinstance(x, str) for x in p) for p in pairs)
    except Exception as e:
        fail(f"preference file {path} cannot be read ({type(e).__name__}); pass --preferences FILE")
    if name != task["name"]:
        fail(f"preference file {path} is of task '{name}', not of the task '{task['name']}'")
    if not pairs or not ok:
        fail(f"preference file {path} holds no pairs [prompt, chosen, rejected] of strings")
    train = {x[0] for x in task["train"]}
    if not all(p in train for p, _, _ in pairs):
        fail(f"preference file {path} holds prompts that are not train prompts of its task")
    same = next((p for p in pairs if p[1] == p[2]), None)
    if same is not None:  # its loss has no gradient: nothing to prefer
        fail(f"preference file {path} holds a pair whose chosen is its rejected: {same!r}")
    if args.batch_size > len(pairs):
        fail(f"--batch-size {args.batch_size} exceeds the {len(pairs)} pairs of {path}")
    longest = max(len(tokenizer.encode(c, add_special_tokens=False)) for p in pairs for c in p[1:])
    max_new_tokens = args.max_new_tokens or task["max_new_tokens"]
    if longest + 1 > max_new_tokens:
        fail(
            f"preference file {path} holds completions of {longest} tokens + the end token, over "
            f"--max-new-tokens {max_new_tokens}"
        )
    return task, policy, tokenizer


if __name__ == "__main__":
    with Ranks().said_by_rank_0():  # a flag that cannot be parsed: said once, not once per rank
        cli_args = tyro.cli(Args, description=__doc__)
    main(cli_args)
