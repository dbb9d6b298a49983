"""The multi-turn task with a tool, calc-v0, and the small base model algos/grpo_agent_lm.py trains.

Task calc-v0: the product of two 2-digit numbers, "47*63=" -> "2961". A 0.8M-parameter model cannot
multiply reliably by itself, but it can use a calculator: it writes a call, <calc>47*63</calc>, the
environment computes the expression (whole numbers and + - *, parsed by a small grammar, never by
Python's eval) and appends the result, <r>2961</r>, and the model goes on; after at most
max_calls calls it writes its answer and the end token. Reward: 1 where the text after the last
result (the whole completion, without a call) is the product; 0 for a wrong answer, a malformed
call (one that does not parse, or is never closed), a call past max_calls, and a completion that
runs out of tokens. Train and held-out problems: fixed and disjoint (as unordered pairs: 47*63 and
63*47 are in the same set).

The base: a character-level LlamaForCausalLM (the tags <calc> </calc> <r> </r> one token each),
trained by supervised fine-tuning on a mix the way a model is taught a tool before RL: it answers
directly, except where the first number is 70 or more, or on a random tenth of the others, where it
calls the calculator and copies the result (the result's tokens are the environment's: no loss on
them). Greedily it then calls on about a third of held-out problems and answers about a third
right: RL has to learn to call on the others, and to call correctly. task.json beside the weights
holds the problems and the tool; base.json the recipe, commit, seed and measured rates.

    python benchmark/agent_task.py --out benchmark/policies/lm-calc-base
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmark.lm_task import EOS, PAD, make_model, sft_optimizer, sft_step  # noqa: E402

TASK = "calc-v0"
TAGS = ["<calc>", "</calc>", "<r>", "</r>"]
CHARS = "0123456789+-*="
TASK_SEED = 12345  # fixes the problem sets (not the model's training seed)
N_HELDOUT = 500  # unordered pairs held out; the train set is every other ordered pair
MAX_NEW_TOKENS = 24  # a call, its result and the answer: 18 tokens at most
MAX_CALLS = 2
TOOL = {
    "name": "calculator",
    "description": "computes an expression of whole numbers and + - * (* first): write "
    "<calc>EXPRESSION</calc> and its value follows as <r>VALUE</r>",
    "call": ["<calc>", "</calc>"],
    "result": ["<r>", "</r>"],
    "max_calls": MAX_CALLS,
}
REWARD_RULE = (
    "1 where the text after the last tool result (the whole completion if no call) is the "
    "product; 0 otherwise: a wrong answer, a malformed call, a call past max_calls, no end token"
)
CALL_FROM = 70  # the base's SFT traces call the tool where the first number is at least this
CALL_NOISE = 0.1  # and on this share of the other problems


def make_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character or tag, pad (id 0) and end (id 1) tokens; prompts padded on the
    left."""
    vocab = {PAD: 0, EOS: 1, **{c: i + 2 for i, c in enumerate(TAGS + list(CHARS))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    pattern = "|".join(t.replace("/", "\\/") for t in TAGS) + "|."
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, padding_side="left"
    )


def problem_sets(seed: int = TASK_SEED) -> tuple[list, list]:
    """(train, held-out) [prompt, answer] pairs: every ordered pair of 2-digit numbers, N_HELDOUT
    unordered pairs (both orders) held out, the rest shuffled for training."""
    pairs = [(a, b) for a in range(10, 100) for b in range(a, 100)]
    random.Random(seed).shuffle(pairs)
    held = pairs[:N_HELDOUT]
    train = [(a, b) for x, y in pairs[N_HELDOUT:] for a, b in {(x, y), (y, x)}]
    random.Random(seed + 1).shuffle(train)

    def entry(a, b):
        return [f"{a}*{b}=", str(a * b)]

    heldout = [entry(*p) if i % 2 else entry(*p[::-1]) for i, p in enumerate(held)]
    return [entry(a, b) for a, b in train], heldout


def sft_example(tokenizer, prompt: str, answer: str, use_tool: bool):
    """(ids, labels) of one SFT example: the prompt, then the answer directly or through one call
    (<calc>a*b</calc><r>product</r>product), then the end token; the prompt and the tool's result
    get no loss (-100)."""
    ids = tokenizer.encode(prompt)
    labels = [-100] * len(ids)

    def add(text: str, learn: bool):
        part = tokenizer.encode(text)
        ids.extend(part)
        labels.extend(part if learn else [-100] * len(part))

    if use_tool:
        add(f"<calc>{prompt.rstrip('=')}</calc>", True)
        add(f"<r>{answer}</r>", False)
    add(answer, True)
    ids.append(tokenizer.eos_token_id)
    labels.append(tokenizer.eos_token_id)
    return ids, labels


def uses_tool(prompt: str, rng: random.Random) -> bool:
    """Whether the base's SFT trace of a problem calls the calculator."""
    return int(prompt.split("*")[0]) >= CALL_FROM or rng.random() < CALL_NOISE


def train_base(steps: int, batch_size: int, lr: float, seed: int, train: list):
    """Supervised fine-tuning on the train problems (uses_tool decides each example's form),
    AdamW with a 50-step linear warm-up. Returns (model, tokenizer)."""
    tokenizer = make_tokenizer()
    model = make_model(tokenizer, seed, context=64)
    rng = random.Random(seed)
    optimizer, warmup = sft_optimizer(model, lr)
    for step in range(1, steps + 1):
        problems = rng.sample(train, batch_size)
        batch = [sft_example(tokenizer, p, a, uses_tool(p, rng)) for p, a in problems]
        width = max(len(x) for x, _ in batch)
        input_ids = torch.full((batch_size, width), tokenizer.pad_token_id)
        labels = torch.full((batch_size, width), -100)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        for i, (x, y) in enumerate(batch):
            input_ids[i, : len(x)] = torch.tensor(x)
            labels[i, : len(y)] = torch.tensor(y)
            mask[i, : len(x)] = 1
        loss = sft_step(model, optimizer, warmup, input_ids, mask, labels)
        if step % 250 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    return model, tokenizer


def write_task(out: Path, train: list, heldout: list):
    task = {
        "name": TASK,
        "reward": REWARD_RULE,
        "max_new_tokens": MAX_NEW_TOKENS,
        "tool": TOOL,
        "train": train,
        "heldout": heldout,
    }
    (out / "task.json").write_text(json.dumps(task, separators=(",", ":")) + "\n")


def measure(model_dir: Path) -> dict:
    """The base's greedy held-out rates, measured by grpo_agent_lm.py's own evaluation."""
    from benchmark.runs import load_script
    from canonrl.lm import load_task

    agent = load_script("grpo_agent_lm.py")
    policy, tokenizer = agent.load_policy(str(model_dir))
    task = load_task(model_dir / "task.json")
    tool = agent.task_tool(task)
    results = agent.evaluate(policy, tokenizer, tool, task["heldout"], task, MAX_NEW_TOKENS)
    return {k.removeprefix("eval/"): round(sum(v) / len(v), 4) for k, v in results.items()}


def main(argv: list[str] | None = None):
    from benchmark.runs import OneLineParser, git_commit

    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="a new directory for the task and base")
    p.add_argument("--steps", type=int, default=1500, help="SFT steps")
    p.add_argument("--batch-size", type=int, default=64, help="examples per SFT step")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--seed", type=int, default=1, help="seed of the initialisation and batches")
    a = p.parse_args(argv)
    if a.steps < 1 or not 1 <= a.batch_size <= 4096 or not a.lr > 0:
        p.error("--steps must be >= 1, --batch-size from 1 to 4096 and --lr > 0")
    if a.out.exists() and (not a.out.is_dir() or any(a.out.iterdir())):
        p.error(f"--out {a.out} exists and is not an empty directory; choose a new one")
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    train, heldout = problem_sets()
    start = time.time()
    model, tokenizer = train_base(a.steps, a.batch_size, a.lr, a.seed, train)
    seconds = time.time() - start
    a.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(a.out)
    tokenizer.save_pretrained(a.out)
    write_task(a.out, train, heldout)
    rates = measure(a.out)
    recipe = {
        "task": TASK,
        "command": f"python benchmark/agent_task.py --out {a.out} --steps {a.steps} "
        f"--batch-size {a.batch_size} --lr {a.lr} --seed {a.seed}",
        "commit": git_commit(),
        "seed": a.seed,
        "task_seed": TASK_SEED,
        "sft_steps": a.steps,
        "batch_size": a.batch_size,
        "lr": a.lr,
        "sft_mix": f"a call where the first number >= {CALL_FROM}, or else with probability "
        f"{CALL_NOISE}; a direct answer otherwise",
        "parameters": sum(p.numel() for p in model.parameters()),
        "heldout_greedy": rates,
        "heldout_prompts": len(heldout),
        "train_seconds": round(seconds, 1),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    (a.out / "base.json").write_text(json.dumps(recipe, indent=2) + "\n")
    print(json.dumps(rates))


if __name__ == "__main__":
    main()
