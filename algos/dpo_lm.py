"""DPO for language models: preference pairs of the base's own samples (addition-v0).

Rafailov et al. 2023: maximise log sigmoid(beta * (log-ratio of the chosen completion - log-ratio
of the rejected one)), each log-ratio the policy's log-probability of a completion minus the
frozen reference's. The pairs (preferences.json beside the model, made by benchmark/lm_task.py):
a correct completion chosen over a wrong one of the same train prompt. A step is one pair trained
on; --save-model writes <run_dir>/model (from_pretrained) beside model.pt.

Run:    python algos/dpo_lm.py --seed 1
Quick:  python algos/dpo_lm.py --total-timesteps 1280
Results: benchmark/references.toml (ours-dpo_lm-addition-v0), README.md
"""

import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path

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
    max_grad_norm: float = 1.0
    """global gradient norm clip"""
    max_new_tokens: int | None = None
    """completion budget of the greedy evaluation in tokens (default: the task's)"""
    eval_prompts: int = 500
    """held-out prompts per greedy evaluation (at most the task's; 0: none)"""
    env_id: str = "addition-v0"
    """the task's name, checked against the task file"""
    total_timesteps: int = 14784
    """preference pairs trained on (updates * batch_size: 231 x 64, two epochs of the 7,409)"""


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


def load_preferences(path: Path) -> dict:
    """The preference file: {"task", "pairs": [[prompt, chosen, rejected], ...]}."""
    return json.loads(Path(path).read_text())


def encode_pairs(tokenizer, pairs: list, max_new_tokens: int, device):
    """Token ids and mask of each pair's prompt (padded on the left), repeated for its chosen and
    rejected completion: rows [chosen of pair 0..B-1, rejected of pair 0..B-1]. A completion is its
    text and the end token, padded on the right to max_new_tokens. Returns (ids, mask, n_prompt)."""
    ids, mask = encode_prompts(tokenizer, [p for p, _, _ in pairs] * 2, device)
    completions = [c for _, c, _ in pairs] + [r for _, _, r in pairs]
    c_ids = torch.full((len(completions), max_new_tokens), tokenizer.pad_token_id)
    c_mask = torch.zeros((len(completions), max_new_tokens), dtype=torch.long)
    for i, text in enumerate(completions):
        tokens = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
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
    args, ckpt, run_dir = start_run(args, check_flags, __file__)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    task, policy, tokenizer = check_model_and_task(args, device)  # (nothing is written yet)
    max_new_tokens = args.max_new_tokens or task["max_new_tokens"]
    pairs = load_preferences(preferences_path(args))["pairs"]
    reference = copy.deepcopy(policy).eval().requires_grad_(False)  # the frozen base
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.learning_rate)
    heldout = task["heldout"][: args.eval_prompts]
    num_iterations = args.total_timesteps // args.batch_size
    iteration = 0

    def run_eval():  # greedy, on the held-out prompts
        rewards = evaluate(policy, tokenizer, heldout, max_new_tokens, device)
        return {"eval/episodic_return": rewards}

    stateful = {"policy": policy, "optimizer": optimizer, "rng": RNGs()}  # saved and resumed
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)
        iteration = ckpt["iteration"]
    global_step = iteration * args.batch_size
    logger = RunLogger(
        args, run_dir, num_iterations * args.batch_size, global_step, ckpt=ckpt, script=__file__
    )
    if ckpt is None and heldout:  # the first evaluation: the model as loaded
        logger.evaluate(global_step, run_eval)
    tokens_done = 0
    start_time = time.time()
    for iteration in range(iteration + 1, num_iterations + 1):
        first = (iteration - 1) * args.batch_size
        batch = [pairs[i] for i in pair_indices(args.seed, first, args.batch_size, len(pairs))]
        ids, mask, n_prompt = encode_pairs(tokenizer, batch, max_new_tokens, device)
        c_mask = mask[:, n_prompt:]
        with torch.no_grad():
            ref_logp, _, _ = reference.token_logprobs(ids, mask, n_prompt)
        policy.train()
        logp, entropy, _ = policy.token_logprobs(ids, mask, n_prompt)
        seq_logp = (logp * c_mask).sum(1)
        ref_seq_logp = (ref_logp * c_mask).sum(1)
        n = len(batch)
        loss, stats = dpo_loss(
            seq_logp[:n], seq_logp[n:], ref_seq_logp[:n], ref_seq_logp[n:], args.beta
        )
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
        optimizer.step()
        policy.eval()
        tokens_done += int(mask.sum())
        global_step = iteration * args.batch_size
        seconds = max(time.time() - start_time - logger.eval_seconds, 1e-9)
        logger.log(
            global_step,
            {
                "train/episodic_length": c_mask.sum(1).float().mean(),
                "charts/tokens_per_s": tokens_done / seconds,
                "losses/entropy": (entropy.detach() * c_mask).sum() / c_mask.sum(),
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
    check_ranges(args, {"beta": "x > 0"})
    if args.total_timesteps < args.batch_size:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one update "
            f"(--batch-size {args.batch_size})"
        )


def check_model_and_task(args: Args, device="cpu"):
    """The model and the task file (canonrl.lm.check_task) and what they must fit, before
    anything is written; returns (task, policy, tokenizer): main() trains the model loaded here."""
    task, policy, tokenizer = check_task(args, load_policy, device)
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
    train = {p for p, _ in task["train"]}
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
    main(tyro.cli(Args, description=__doc__))
