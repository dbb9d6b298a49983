"""The language-model scripts' tasks and model folders: a task file (prompts with their answers,
train and held-out) read and checked whole, the model folder checked before anything is written
(loaded with trust_remote_code=False: a model folder is data), paths given relative to the
checkout, and the evaluation metrics they log."""

import difflib
import json
import socket
from pathlib import Path
from urllib.parse import urlparse

from canonrl.run import fail, finite, first_line, other_family


def find(path: str) -> str:
    """path as given, or relative to the repository root where it exists only there."""
    root = Path(__file__).resolve().parents[1]  # the checkout that holds canonrl/ and algos/
    if not Path(path).exists() and (root / path).exists():
        return str(root / path)
    return path


def load_task(path: Path) -> dict:
    """The task file: {"name", "max_new_tokens", "train": [[prompt, answer], ...], "heldout"}."""
    return json.loads(Path(path).read_text())


def save_model_folder(run_dir: Path, lm, tokenizer, task: Path):
    """<run_dir>/model: the weights and tokenizer as a folder from_pretrained loads, with the task
    beside them (--model <run_dir>/model runs on it without --task)."""
    lm.save_pretrained(run_dir / "model")
    tokenizer.save_pretrained(run_dir / "model")
    (run_dir / "model" / "task.json").write_text(task.read_text())


def task_problem(task) -> str | None:
    """What is wrong with a task file's contents (None: nothing): {"name": str, "max_new_tokens":
    int >= 1, "train": [[prompt, answer], ...] (not empty), "heldout": the same (not empty)}, every
    prompt and answer a string, no prompt empty."""
    if not isinstance(task, dict) or not isinstance(task.get("name"), str):
        return "is not an object with a task name"
    budget = task.get("max_new_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        return f"has max_new_tokens {budget!r}: give a whole number of tokens >= 1"
    for part in ("train", "heldout"):
        pairs = task.get(part)
        if not isinstance(pairs, list) or not pairs:
            return f"holds no {part} prompts: give a list of [prompt, answer] pairs"
        bad = next(
            (
                x
                for x in pairs
                if not (isinstance(x, list) and len(x) == 2 and all(isinstance(y, str) for y in x))
                or not x[0]
            ),
            None,
        )
        if bad is not None:
            return f"holds {bad!r} in {part}: each entry is [prompt, answer], two strings"
    return None


def task_path(args) -> Path:
    return Path(find(args.task)) if args.task else Path(find(args.model)) / "task.json"


def check_model_folder(model: str):
    """--model is a folder here, or a hub id that can be fetched: one in the hub's cache, or one
    whose hub answers within seconds. A path of no folder, or an id with no copy here while the hub
    cannot be reached, is one error line (transformers would retry the hub for about a minute)."""
    if Path(find(model)).exists():
        return
    hub_id = model.count("/") <= 1 and not model.startswith((".", "/", "~"))
    if not hub_id or not all(c.isalnum() or c in "-_./" for c in model):
        fail(
            f"--model {model}: no such folder; give a model folder (one from_pretrained "
            "reads) or a hub id such as Qwen/Qwen2.5-0.5B-Instruct"
        )
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(model, "config.json"), str):
        return
    if constants.HF_HUB_OFFLINE:
        fail(
            f"--model {model}: no such folder, no copy in the hub's cache, and HF_HUB_OFFLINE "
            "is set"
        )
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=5).close()
    except OSError as e:
        fail(
            f"--model {model}: no such folder, no copy in the hub's cache, and the hub ({host}) "
            f"cannot be reached ({e.strerror or type(e).__name__}); give a model folder"
        )


def check_task(args, load_policy, device="cpu") -> tuple:
    """The model (config, weights, tokenizer; loaded by the script's load_policy onto device), then
    the task file, before anything is written. Returns (task, policy, tokenizer): the model is
    loaded once, for the checks and the training."""
    check_model_folder(args.model)
    try:
        policy, tokenizer = load_policy(args.model, device)
    except Exception as e:
        if "trust_remote_code" in str(e):
            fail(
                f"--model {args.model} needs the Python code its folder names (auto_map), and "
                "a model folder is data, never run here: use a model whose type transformers has"
            )
        fail(f"--model {args.model} does not load ({first_line(e)})")
    if not finite(policy.state_dict()):
        fail(f"--model {args.model} holds weights that are not finite numbers")
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        fail(f"the tokenizer of --model {args.model} has no pad or no end (eos) token")
    path = task_path(args)
    try:
        task = load_task(path)
    except Exception as e:
        fail(f"task file {path} cannot be read ({type(e).__name__}); pass --task FILE.json")
    problem = task_problem(task)
    if problem:
        fail(f"task file {path} {problem}")
    names = task["name"]
    prompts = [p for p, _ in task["train"] + task["heldout"]]
    max_new_tokens = args.max_new_tokens or task["max_new_tokens"]
    # text the tokenizer cannot write (a character outside its vocabulary) would be scored wrong
    texts = sorted({text for pair in task["train"] + task["heldout"] for text in pair})
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    lost = next((t for t, i in zip(texts, ids) if tokenizer.decode(i) != t), None)
    if lost is not None:
        fail(f"task file {path} holds {lost!r}, which the tokenizer of --model cannot write")
    held = len(task["heldout"])
    if args.eval_prompts > held and args.eval_prompts != type(args)().eval_prompts:
        fail(f"--eval-prompts {args.eval_prompts} exceeds the {held} held-out prompts of {path}")
    if args.env_id != names:
        close = difflib.get_close_matches(args.env_id, [names], n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        fail(
            f"{args.env_id} is not the task of {path} (it holds task '{names}'){hint}",
            *other_family(args.env_id),
        )
    longest = max(len(x) for x in tokenizer(prompts, add_special_tokens=False)["input_ids"])
    context = getattr(policy.lm.config, "max_position_embeddings", None)
    if context is not None and longest + max_new_tokens > context:
        fail(
            f"prompts of up to {longest} tokens + --max-new-tokens {max_new_tokens} exceed the "
            f"model's context of {context} tokens"
        )
    return task, policy, tokenizer
