"""The language-model task and the small base model that algos/*_lm.py train.

Task addition-v0: two 3-digit numbers and their sum, each written least significant digit first
(the order a carry is computed in), then the end token: "321+654=" (123 + 456) -> "975" (579).
Reward: 1 for exactly the answer followed by the end token; 0 for a wrong answer and for a malformed
one (no end token within the completion budget). Train and held-out prompt sets: fixed, disjoint.
The base: a character-level LlamaForCausalLM (0.8M parameters) trained by supervised fine-tuning
until its greedy accuracy is in the middle, so that RL has room to improve it. task.json beside the
weights holds the prompts and answers; base.json the recipe, commit, seed and held-out accuracy.
Preference pairs for dpo_lm.py (preferences.json beside the weights): the model's own samples on
the train prompts, a correct completion chosen over a wrong one of the same prompt.

A base on a reasoning-gym task (--task rg:<dataset>[:<key>=<value>,...], built as the scripts'
--task builds it: canonrl.lm.reasoning_gym_task) has a word-level tokenizer made from the task's
texts (a word with the space before it, one digit, one sign: a prompt of about 20 tokens), a
64-token context, and is scored by the scripts' own reward (reasoning-gym's verifier).

    python benchmark/lm_task.py --out benchmark/policies/lm-addition-base
    python benchmark/lm_task.py --pairs benchmark/policies/lm-addition-base
    python benchmark/lm_task.py --out benchmark/policies/lm-chain-sum-base --steps 8000 \
        --target 0.4 --task rg:chain_sum:max_terms=4,max_digits=1
"""

import argparse
import collections
import hashlib
import json
import math
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
TASK = "addition-v0"
CHARS = "0123456789+="
PAD, EOS = "<pad>", "<eos>"
TASK_SEED = 12345  # fixes the prompt sets (not the model's training seed)
N_TRAIN, N_HELDOUT = 20_000, 500
MAX_NEW_TOKENS = 5  # up to 4 answer digits and the end token
REWARD_RULE = "1 for the exact answer followed by the end token; 0 otherwise (malformed: 0)"


def answer(prompt: str) -> str:
    """The correct completion of a prompt: the sum of its reversed operands, its digits reversed."""
    a, b = prompt.rstrip("=").split("+")
    return str(int(a[::-1]) + int(b[::-1]))[::-1]


def reward(completion: str | None, prompt: str) -> float:
    """completion: the text before the end token, None where no end token came (malformed)."""
    return float(completion is not None and completion == answer(prompt))


def prompt_sets(seed: int = TASK_SEED) -> tuple[list[str], list[str]]:
    """(train, held-out) prompts: distinct pairs of 3-digit numbers, the two sets disjoint."""
    rng = random.Random(seed)
    seen, prompts = set(), []
    while len(prompts) < N_TRAIN + N_HELDOUT:
        a = rng.randint(100, 999)
        b = rng.randint(100, 999)
        if (a, b) not in seen:
            seen.add((a, b))
            prompts.append(f"{str(a)[::-1]}+{str(b)[::-1]}=")
    return prompts[:N_TRAIN], prompts[N_TRAIN:]


def make_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, pad (id 0) and end (id 1) tokens; prompts are padded on the left."""
    vocab = {PAD: 0, EOS: 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, padding_side="left"
    )


WORD_PIECE = r" ?[A-Za-z]+| ?[0-9]| ?[^ A-Za-z0-9]| "  # a word, digit or sign, its space before


def make_word_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of the pieces of `texts` (WORD_PIECE: " the", " 7", "7", " +"),
    pad (id 0) and end (id 1) tokens; prompts are padded on the left."""
    pieces = sorted({m.group() for t in texts for m in re.finditer(WORD_PIECE, t)})
    vocab = {PAD: 0, EOS: 1, **{c: i + 2 for i, c in enumerate(pieces)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(WORD_PIECE), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, padding_side="left"
    )


def make_model(tokenizer, seed: int, context: int = 32) -> LlamaForCausalLM:
    """A 3-layer, 128-wide Llama (0.8M parameters with the addition tokenizer) with a
    `context`-token context."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=context,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


CHAT_TEMPLATE = (  # Qwen2's turn markers, a system turn where the conversation has one
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tiny_qwen(out: Path, seed: int = 0, vocab_size: int | None = None, layers: int = 2):
    """A randomly initialised Qwen2ForCausalLM (64 wide) with a byte-level BPE tokenizer trained
    here on arithmetic and words, written to `out` as a folder from_pretrained loads: a stand-in
    for a real chat model (Qwen2.5-Instruct) on a machine with no model hub. Like Qwen's base
    tokenizer it has no pad token; its end is <|endoftext|>, its chat template ends turns with
    <|im_end|>, and the generation config names both as end tokens. vocab_size: the embedding's
    rows (default: the tokenizer's; more rows make the output layer as wide as a real model's)."""
    from tokenizers import trainers
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    rng = random.Random(seed)
    words = "the sum of and is answer so we add carry then total final a b".split()
    corpus = [
        " ".join(rng.choice(words) for _ in range(8))
        + f" {rng.randint(0, 9999)}+{rng.randint(0, 999)}"
        for _ in range(2000)
    ]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", padding_side="left"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": specials[1:]})
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    end_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    config = Qwen2Config(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=end_ids,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=end_ids)
    out.mkdir(parents=True, exist_ok=False)
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return model, tokenizer


def sft_batch(tokenizer, prompts: list[str], answers: list[str] | None = None):
    """input_ids, attention_mask, labels of prompt + answer + end; prompt and padding get -100.
    answers: the prompts' answers (default: addition-v0's)."""
    answers = answers or [answer(p) for p in prompts]
    ids = [
        tokenizer.encode(p) + tokenizer.encode(a) + [tokenizer.eos_token_id]
        for p, a in zip(prompts, answers)
    ]
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), tokenizer.pad_token_id)
    labels = torch.full((len(ids), width), -100)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, (x, p) in enumerate(zip(ids, prompts)):
        n = len(tokenizer.encode(p))
        input_ids[i, : len(x)] = torch.tensor(x)
        labels[i, n : len(x)] = torch.tensor(x[n:])
        mask[i, : len(x)] = 1
    return input_ids, mask, labels


@torch.no_grad()
def greedy_accuracy(model, tokenizer, prompts: list[str]) -> float:
    """Share of prompts whose greedy completion (MAX_NEW_TOKENS tokens at most) earns reward 1."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    for _ in range(MAX_NEW_TOKENS):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    total = 0.0
    for p, c in zip(prompts, ids[:, enc["input_ids"].shape[1] :].tolist()):
        eos = tokenizer.eos_token_id
        total += reward(tokenizer.decode(c[: c.index(eos)]) if eos in c else None, p)
    return total / len(prompts)


CHECKED = 200  # train prompts the stopping check reads


def task_accuracy(model, tokenizer, pairs: list, task: dict) -> float:
    """Share of [prompt, answer] pairs whose greedy completion earns the task's reward 1 (the
    scripts' evaluation: grpo_lm.py's evaluate)."""
    lm = scripts_block()
    policy = lm.Policy(model, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    rewards = lm.evaluate(policy, tokenizer, pairs, task, task["max_new_tokens"])
    return sum(r == 1.0 for r in rewards["eval/episodic_return"]) / len(pairs)


def scripts_block():
    """grpo_lm.py as a module: its Policy, evaluate and rewards are the LM scripts' own."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmark.runs import load_script

    return load_script("grpo_lm.py")


def sft_optimizer(model, lr: float):
    """(AdamW, its 50-step linear warm-up) of the bases' supervised fine-tuning."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 50))


def sft_step(model, optimizer, warmup, input_ids, mask, labels) -> torch.Tensor:
    """One step of supervised fine-tuning: the cross-entropy of the labels (-100: no loss)."""
    loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    warmup.step()
    return loss


def train_base(steps: int, batch_size: int, lr: float, seed: int, target: float, task=None):
    """Supervised fine-tuning on the train prompts' answers (cross-entropy on the answer and end
    tokens only), AdamW with a 50-step linear warm-up. The loss leaves its plateau abruptly, so the
    budget is a target: stop at the first check (every 25 steps) where the greedy accuracy on 200
    train prompts reaches `target`, or after `steps`. task: a task dict (a reasoning-gym task;
    default addition-v0), whose first CHECKED train problems of a question found nowhere else in
    the train set are kept out of the fine-tuning and make the check: held-out questions are new,
    and a check on trained ones measures memory (0.30 there was 0.08 held-out). Returns (model,
    tokenizer, steps run)."""
    if task is None:
        tokenizer = make_tokenizer()
        model = make_model(tokenizer, seed)
        train, _ = prompt_sets()
        pairs = None
    else:
        pairs = task["train"]
        texts = [t for x in task["train"] + task["heldout"] for t in x[:2]]
        tokenizer = make_word_tokenizer(texts)
        model = make_model(tokenizer, seed, context=64)
        # the stopping check's problems: the first CHECKED whose question is nowhere else in the
        # train set, kept out of the fine-tuning (held-out problems are new questions too)
        count = collections.Counter(x[0] for x in pairs)
        checked = [i for i, x in enumerate(pairs) if count[x[0]] == 1][:CHECKED]
        train = sorted(set(range(len(pairs))) - set(checked))
    rng = random.Random(seed)
    optimizer, warmup = sft_optimizer(model, lr)
    for step in range(1, steps + 1):
        batch = rng.sample(train, batch_size)
        if pairs is None:
            input_ids, mask, labels = sft_batch(tokenizer, batch)
        else:
            prompts, answers = zip(*[pairs[i][:2] for i in batch])
            input_ids, mask, labels = sft_batch(tokenizer, list(prompts), list(answers))
        loss = sft_step(model, optimizer, warmup, input_ids, mask, labels)
        if step % 25 == 0:
            model.eval()
            if pairs is None:
                accuracy = greedy_accuracy(model, tokenizer, train[:200])
            else:
                accuracy = task_accuracy(model, tokenizer, [pairs[i] for i in checked], task)
            model.train()
            print(f"step {step} loss {loss.item():.3f} greedy train accuracy {accuracy:.3f}")
            if accuracy >= target:
                return model, tokenizer, step
    return model, tokenizer, steps


def write_task(out: Path, train: list[str], heldout: list[str]):
    """task.json: name, reward rule, completion budget, [prompt, answer] of both sets."""
    task = {
        "name": TASK,
        "reward": REWARD_RULE,
        "max_new_tokens": MAX_NEW_TOKENS,
        "train": [[q, answer(q)] for q in train],
        "heldout": [[q, answer(q)] for q in heldout],
    }
    (out / "task.json").write_text(json.dumps(task, separators=(",", ":")) + "\n")


def make_pairs(model_dir: Path, samples: int, seed: int) -> dict:
    """Preference pairs from the model's own samples: `samples` completions (temperature 1) of
    every train prompt; a prompt with a correct one and a wrong one gives the pair [prompt, the
    first correct, the first wrong]. A wrong completion is one that ended with the end token: a
    truncated one has no text to prefer against. The file names its task and the SHA-256 of the
    weights it was sampled from."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmark.runs import load_script
    from canonrl.lm import load_task

    lm = load_script("grpo_lm.py")  # its Policy samples as the LM scripts do
    policy, tokenizer = lm.load_policy(str(model_dir))
    policy.eval()
    task = load_task(model_dir / "task.json")
    torch.manual_seed(seed)
    pairs = []
    for start in range(0, len(task["train"]), 1000):
        chunk = task["train"][start : start + 1000]
        ids, mask = lm.encode_prompts(tokenizer, [p for p, _ in chunk], "cpu")
        ids, mask = ids.repeat_interleave(samples, 0), mask.repeat_interleave(samples, 0)
        completions, _, _ = policy.generate(ids, mask, task["max_new_tokens"])
        texts = lm.completion_texts(tokenizer, completions, policy.end_ids)
        for i, (prompt, answer_) in enumerate(chunk):
            group = texts[i * samples : (i + 1) * samples]
            right = [t for t in group if t == answer_]
            wrong = [t for t in group if t is not None and t != answer_]
            if right and wrong:
                pairs.append([prompt, right[0], wrong[0]])
    with open(model_dir / "model.safetensors", "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {
        "task": task["name"],
        "model_sha256": digest,
        "command": f"python benchmark/lm_task.py --pairs {model_dir} --samples {samples} "
        f"--seed {seed}",
        "commit": commit(),
        "samples_per_prompt": samples,
        "seed": seed,
        "pairs": pairs,
    }


def commit() -> str:
    """The short commit of HEAD, with -dirty when this file differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    diff = subprocess.run(
        ["git", "status", "--porcelain", __file__], capture_output=True, text=True
    )
    return head.stdout.strip() + ("-dirty" if diff.stdout.strip() else "")


def main(argv: list[str] | None = None):
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmark.runs import OneLineParser

    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="directory to write the task and base model to")
    p.add_argument(
        "--pairs", type=Path, help="write preferences.json into this model directory instead"
    )
    p.add_argument("--samples", type=int, default=4, help="--pairs: completions per prompt")
    p.add_argument("--steps", type=int, default=2000, help="most SFT steps")
    p.add_argument(
        "--target",
        type=float,
        default=0.3,
        help="stop once the greedy accuracy on 200 train prompts reaches this",
    )
    p.add_argument("--batch-size", type=int, default=64, help="examples per SFT step")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--seed", type=int, default=1, help="seed of the initialisation and batches")
    p.add_argument(
        "--task",
        help="--out: a base on this reasoning-gym task (rg:<dataset>[:<key>=<value>,...]) instead "
        "of addition-v0",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="--out: replace the base in a folder this tool wrote (its base.json), and resample "
        "the preferences.json there from the new base; --pairs: replace preferences.json",
    )
    a = p.parse_args(argv)
    check_flags(p, a)
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    if a.pairs:
        out = a.pairs / "preferences.json"
        if out.exists() and not a.replace:
            p.error(f"{out} exists; pass --replace to write new pairs over it")
        write_pairs(a.pairs, a.samples, a.seed)
        return
    if a.out is None:
        p.error("pass --out DIR (a new task and base) or --pairs MODEL_DIR")
    prefs = a.out / "preferences.json"
    resample = None
    if prefs.exists():  # the pairs of the base replaced, made again from the new one
        try:
            old = json.loads(prefs.read_text())
            resample = (int(old["samples_per_prompt"]), int(old["seed"]))
        except (OSError, ValueError, KeyError, TypeError):
            resample = (4, 1)
    task = None
    if a.task is not None:  # (a bad spec: one error line before anything is written)
        from canonrl.lm import load_task

        task = load_task(a.task)
    start = time.time()
    model, tokenizer, steps = train_base(a.steps, a.batch_size, a.lr, a.seed, a.target, task)
    seconds = time.time() - start
    model.eval()
    if task is None:
        train, heldout = prompt_sets()
        accuracy = greedy_accuracy(model, tokenizer, heldout)
    else:
        heldout = task["heldout"]
        accuracy = task_accuracy(model, tokenizer, heldout, task)
    a.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(a.out)
    tokenizer.save_pretrained(a.out)
    if task is None:
        write_task(a.out, train, heldout)
    else:
        (a.out / "task.json").write_text(json.dumps(task, separators=(",", ":")) + "\n")
    command = (
        f"python benchmark/lm_task.py --out {a.out} --steps {a.steps} --target {a.target} "
        f"--batch-size {a.batch_size} --lr {a.lr} --seed {a.seed}"
        + (f" --task {a.task}" if a.task else "")
    )
    recipe = {
        "task": TASK if task is None else task["name"],
        "command": command,
        "commit": commit(),
        "seed": a.seed,
        "task_seed": TASK_SEED if task is None else task["reasoning_gym"]["seed"],
        "sft_steps": steps,
        "batch_size": a.batch_size,
        "lr": a.lr,
        "parameters": sum(p.numel() for p in model.parameters()),
        "heldout_greedy_accuracy": accuracy,
        "heldout_prompts": len(heldout),
        "train_seconds": round(seconds, 1),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if task is not None:
        from importlib.metadata import version

        recipe["reasoning_gym"] = version("reasoning-gym")
    (a.out / "base.json").write_text(json.dumps(recipe, indent=2) + "\n")
    print(f"greedy held-out accuracy {accuracy:.3f} after {steps} SFT steps ({seconds:.0f} s)")
    if resample is not None:
        write_pairs(a.out, *resample)


def write_pairs(model_dir: Path, samples: int, seed: int):
    prefs = make_pairs(model_dir, samples, seed)
    out = model_dir / "preferences.json"
    out.write_text(json.dumps(prefs, separators=(",", ":")) + "\n")
    print(f"{len(prefs['pairs'])} preference pairs written to {out}")


def check_flags(p: argparse.ArgumentParser, a):
    """Bad flags and folders that are not this tool's: one error line before anything is written
    (no base and no preference file is replaced without --replace)."""
    if a.steps < 1 or not 1 <= a.batch_size <= 4096 or a.samples < 2:
        p.error("--steps must be >= 1, --batch-size from 1 to 4096 and --samples >= 2")
    if not (math.isfinite(a.lr) and a.lr > 0) or not 0 < a.target <= 1:
        p.error("--lr must be a finite number > 0 and --target within (0, 1]")
    if a.task is not None and not a.task.startswith("rg:"):
        p.error(f"--task {a.task}: give a reasoning-gym task, rg:<dataset>[:<key>=<value>,...]")
    if a.task is not None and a.pairs is not None:
        p.error("--task makes a base (--out); --pairs samples from a base that has its task")
    if a.pairs is not None:
        try:
            task = json.loads((a.pairs / "task.json").read_text())
            ok = isinstance(task, dict) and (a.pairs / "model.safetensors").is_file()
        except (OSError, ValueError):
            ok = False
        if not ok:
            p.error(f"--pairs {a.pairs} is not a model folder of this tool (task.json, weights)")
        from benchmark.runs import load_script
        from canonrl.lm import task_problem
        from canonrl.run import finite

        lm = load_script("grpo_lm.py")
        try:  # the scripts' loader: trust_remote_code=False
            policy, _ = lm.load_policy(str(a.pairs))
        except Exception as e:
            p.error(f"--pairs {a.pairs}: the model does not load ({type(e).__name__})")
        if not finite(policy.state_dict()):
            p.error(f"--pairs {a.pairs}: the model holds weights that are not finite numbers")
        problem = task_problem(task)
        if problem:
            p.error(f"--pairs {a.pairs}: its task.json {problem}")
    if a.out is None:
        return
    if a.out.exists() and not a.out.is_dir():
        p.error(f"--out {a.out} is a file; pass a new directory")
    if a.out.is_dir() and any(a.out.iterdir()):
        if not a.replace:
            p.error(
                f"--out {a.out} is not empty; choose a new directory, or pass --replace to "
                "replace the base this tool wrote there"
            )
        if not (a.out / "base.json").is_file():
            p.error(f"--out {a.out} holds no base.json: not a base of this tool, left as it is")


if __name__ == "__main__":
    main()
