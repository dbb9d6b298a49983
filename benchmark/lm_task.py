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

    python benchmark/lm_task.py --out benchmark/policies/lm-addition-base
    python benchmark/lm_task.py --pairs benchmark/policies/lm-addition-base
"""

import argparse
import hashlib
import json
import math
import random
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


def make_model(tokenizer, seed: int) -> LlamaForCausalLM:
    """A 3-layer, 128-wide Llama (0.8M parameters) with a 32-token context."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=32,
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


def sft_batch(tokenizer, prompts: list[str]):
    """input_ids, attention_mask, labels of prompt + answer + end; prompt and padding get -100."""
    ids = [
        tokenizer.encode(p) + tokenizer.encode(answer(p)) + [tokenizer.eos_token_id]
        for p in prompts
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


def train_base(steps: int, batch_size: int, lr: float, seed: int, target: float):
    """Supervised fine-tuning on the train prompts' answers (cross-entropy on the answer and end
    tokens only), AdamW with a 50-step linear warm-up. The loss leaves its plateau abruptly, so the
    budget is a target: stop at the first check (every 25 steps) where the greedy accuracy on 200
    train prompts reaches `target`, or after `steps`. Returns (model, tokenizer, steps run)."""
    tokenizer = make_tokenizer()
    model = make_model(tokenizer, seed)
    train, _ = prompt_sets()
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 50))
    for step in range(1, steps + 1):
        input_ids, mask, labels = sft_batch(tokenizer, rng.sample(train, batch_size))
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        warmup.step()
        if step % 25 == 0:
            model.eval()
            accuracy = greedy_accuracy(model, tokenizer, train[:200])
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
        "--replace",
        action="store_true",
        help="--out: replace the base in a folder this tool wrote (its base.json), and resample "
        "the preferences.json there from the new base; --pairs: replace preferences.json",
    )
    a = p.parse_args(argv)
    check_flags(p, a)
    torch.set_num_threads(1)
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
    start = time.time()
    model, tokenizer, steps = train_base(a.steps, a.batch_size, a.lr, a.seed, a.target)
    seconds = time.time() - start
    train, heldout = prompt_sets()
    model.eval()
    accuracy = greedy_accuracy(model, tokenizer, heldout)
    a.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(a.out)
    tokenizer.save_pretrained(a.out)
    write_task(a.out, train, heldout)
    command = (
        f"python benchmark/lm_task.py --out {a.out} --steps {a.steps} --target {a.target} "
        f"--batch-size {a.batch_size} --lr {a.lr} --seed {a.seed}"
    )
    recipe = {
        "task": TASK,
        "command": command,
        "commit": commit(),
        "seed": a.seed,
        "task_seed": TASK_SEED,
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
