"""The language-model scripts' tasks and model folders: a task file (prompts with their answers,
train and held-out, and the rewards that score them) read and checked whole, prompts that are
conversations written through the tokenizer's chat template, the model folder checked before
anything is written (loaded with trust_remote_code=False: a model folder is data), paths given
relative to the checkout.

A task file is JSON: {"name": "addition-v0", "max_new_tokens": 5, "train": [[prompt, answer], ...],
"heldout": [...]} (an entry may be [prompt, answer, info]: an object a reward reads, such as a
reasoning-gym problem's metadata), and optionally "rewards": a reward's name or a list of names
(default "exact"; the scripts' REWARDS: exact, final_answer, format, reasoning_gym), "format":
the regular expression a completion must match whole under the format reward, "reasoning_gym":
{"dataset": name} for that reward, and "reward": the rule in words. A prompt is a string or a
conversation, a list of {"role": ..., "content": ...} messages (system, user, ...) that the
tokenizer's chat template writes, ending with the turn the model answers.

--task rg:<dataset>[:<key>=<value>,...] builds the task from reasoning-gym (a library of procedural
reasoning tasks with verifiers): its dataset with that configuration, a train set of 20,000 and a
held-out set of 500 problems (fixed seeds; no held-out question is a train question), scored by
the dataset's own verifier (the reasoning_gym reward)."""

import difflib
import json
import re
import socket
from importlib.metadata import version
from pathlib import Path
from urllib.parse import urlparse

from canonrl.run import fail, finite, first_line, other_family


def find(path: str) -> str:
    """path made absolute where it exists, here or relative to the repository root (where a LoRA
    adapter records its base); a hub id as given."""
    root = Path(__file__).resolve().parents[1]  # the checkout that holds canonrl/ and algos/
    for candidate in (Path(path), root / path):
        if candidate.exists():
            return str(candidate.resolve())
    return path


RG = "rg:"  # --task rg:<dataset>[:<key>=<value>,...]: a reasoning-gym task
RG_SEED, RG_TRAIN, RG_HELDOUT = 12345, 20_000, 500  # the sets' seed and sizes
RG_MAX_NEW_TOKENS = 16  # the completion budget of a reasoning-gym task (--max-new-tokens: more)


def reasoning_gym_spec(spec: str) -> tuple[str, dict]:
    """(dataset, configuration) of "rg:<dataset>[:<key>=<value>,...]"; a value is a JSON number,
    true, false or null, or else text."""
    dataset, _, rest = spec.removeprefix(RG).partition(":")
    config = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            fail(
                f"--task {spec}: write the configuration as key=value pairs, e.g. "
                "rg:chain_sum:max_terms=3"
            )
        try:
            config[key.strip()] = json.loads(value)
        except ValueError:
            config[key.strip()] = value
    return dataset.strip(), config


def reasoning_gym_name(spec: str) -> str:
    """The task name of a reasoning-gym spec: rg:<dataset>, its configuration's keys sorted."""
    dataset, config = reasoning_gym_spec(spec)
    pairs = ",".join(
        f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in sorted(config.items())
    )
    return RG + dataset + (f":{pairs}" if pairs else "")


def reasoning_gym_task(spec: str) -> dict:
    """The task of "rg:<dataset>[:<key>=<value>,...]": reasoning-gym's dataset with that
    configuration, RG_TRAIN train problems (seed RG_SEED) and RG_HELDOUT held-out ones drawn after
    them, a held-out question that is also a train question skipped; [question, answer] pairs,
    scored by the dataset's own verifier, with the problem's metadata as a third element where the
    verifier needs it (a dataset whose verifier does not score its own answers 1 even so is
    refused)."""
    try:
        import reasoning_gym
    except ImportError:
        fail(f"--task {spec} needs reasoning-gym: pip install reasoning-gym")
    dataset, config = reasoning_gym_spec(spec)
    from reasoning_gym.factory import DATASETS

    if dataset not in DATASETS:
        close = difflib.get_close_matches(dataset, list(DATASETS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        fail(f"--task {spec}: reasoning-gym has no dataset '{dataset}'{hint}")
    if {"seed", "size"} & set(config):
        fail(f"--task {spec}: the seed and size of the train and held-out sets are fixed here")

    def make(seed: int, size: int):
        try:
            return reasoning_gym.create_dataset(dataset, **config, seed=seed, size=size)
        except (TypeError, ValueError, AssertionError) as e:
            fail(f"--task {spec}: reasoning-gym refuses the configuration ({first_line(e)})")

    def problem(entry) -> list:  # [question, answer, metadata] (JSON, as a task file holds it)
        info = json.loads(json.dumps(entry.get("metadata", {}), default=str))
        return [entry["question"], str(entry["answer"]), info]

    train = [problem(x) for x in make(RG_SEED, RG_TRAIN)]
    questions = {x[0] for x in train}
    heldout = []
    for x in make(RG_SEED + RG_TRAIN, 4 * RG_HELDOUT):
        if x["question"] not in questions and len(heldout) < RG_HELDOUT:
            questions.add(x["question"])
            heldout.append(problem(x))
    if len(heldout) < RG_HELDOUT:
        fail(
            f"--task {spec}: too few distinct problems for a held-out set apart from the train set"
        )
    verify = reasoning_gym.get_score_answer_fn(dataset)

    def verified(pairs, with_info: bool) -> bool:  # each oracle answer scores 1
        try:
            return all(
                verify(x[1], {"answer": x[1], "metadata": x[2] if with_info else {}}) == 1.0
                for x in pairs
            )
        except Exception:
            return False

    if verified(heldout, with_info=False):  # scored on the answer alone: no metadata kept
        train, heldout = [x[:2] for x in train], [x[:2] for x in heldout]
    elif not verified(heldout, with_info=True):
        fail(
            f"--task {spec}: reasoning-gym's verifier of {dataset} does not give its own answers "
            "a score of 1 from the answer and metadata alone, so this task cannot be scored here"
        )
    return {
        "name": reasoning_gym_name(spec),
        "reward": f"reasoning-gym {version('reasoning-gym')}'s verifier of {dataset} "
        "(score_answer) on the answer the completion states (its final answer, or the whole "
        "completion)",
        "rewards": "reasoning_gym",
        "reasoning_gym": {"dataset": dataset, "config": config, "seed": RG_SEED},
        "max_new_tokens": RG_MAX_NEW_TOKENS,
        "train": train,
        "heldout": heldout,
    }


def load_task(source) -> dict:
    """The task: a task file's contents (a path), or a reasoning-gym task ("rg:..."), as
    {"name", "max_new_tokens", "train": [[prompt, answer], ...], "heldout", ...}."""
    if isinstance(source, str) and source.startswith(RG):
        return reasoning_gym_task(source)
    return json.loads(Path(source).read_text())


def save_model_folder(run_dir: Path, lm, tokenizer, task: dict):
    """<run_dir>/model: the weights and tokenizer as a folder from_pretrained loads, with the task
    beside them as task.json (--model <run_dir>/model runs on it without --task)."""
    lm.save_pretrained(run_dir / "model")
    tokenizer.save_pretrained(run_dir / "model")
    (run_dir / "model" / "task.json").write_text(json.dumps(task, separators=(",", ":")) + "\n")


def task_rewards(task: dict) -> list[str]:
    """The names of the rewards a task is scored by, in its order (the first is its correctness:
    eval/accuracy is the share of held-out prompts where it is 1)."""
    names = task.get("rewards", "exact")
    return [names] if isinstance(names, str) else list(names)


def is_conversation(prompt) -> bool:
    """A prompt that is a list of chat messages {"role": str, "content": str}, not empty."""
    return (
        isinstance(prompt, list)
        and len(prompt) > 0
        and all(
            isinstance(m, dict)
            and set(m) == {"role", "content"}
            and all(isinstance(v, str) for v in m.values())
            for m in prompt
        )
    )


def prompt_text(tokenizer, prompt) -> str:
    """The text of a prompt as the model reads it: a string as it is; a conversation through the
    tokenizer's chat template, with the opening of the assistant's turn after it."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def task_problem(task, rewards=("exact",)) -> str | None:
    """What is wrong with a task file's contents (None: nothing): {"name": str, "max_new_tokens":
    int >= 1, "train": [[prompt, answer], ...] (not empty), "heldout": the same (not empty)}, every
    prompt a string (not empty) or a conversation, every answer a string; its rewards among
    `rewards` (the script's), a "format" expression that compiles where the format reward is
    named."""
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
                if not (isinstance(x, list) and len(x) in (2, 3) and isinstance(x[1], str))
                or not (isinstance(x[0], str) and x[0] or is_conversation(x[0]))
                or len(x) == 3
                and not isinstance(x[2], dict)
            ),
            None,
        )
        if bad is not None:
            return (
                f"holds {bad!r} in {part}: each entry is [prompt, answer] or [prompt, answer, "
                'info], the prompt a string or a list of {"role", "content"} messages, the '
                "answer a string, info an object"
            )
    names = task.get("rewards", "exact")
    if not (isinstance(names, str) or isinstance(names, list) and names):
        return f"has rewards {names!r}: give a reward's name or a list of names"
    unknown = [n for n in task_rewards(task) if n not in rewards]
    if unknown:
        return f"names reward {unknown[0]!r}: the rewards are {', '.join(rewards)}"
    rg = task.get("reasoning_gym")
    if "reasoning_gym" in task_rewards(task) and not (
        isinstance(rg, dict) and isinstance(rg.get("dataset"), str)
    ):
        return 'names the reasoning_gym reward but no "reasoning_gym": {"dataset": name}'
    if "format" in task_rewards(task):
        try:
            re.compile(task["format"])
        except (KeyError, TypeError, re.error) as e:
            why = "it has none" if isinstance(e, KeyError) else first_line(e)
            return f'names the format reward but no "format" expression that compiles ({why})'
    return None


def task_path(args):
    """Where the task comes from: --task (a file, or a reasoning-gym spec "rg:..."), else the
    model folder's task.json."""
    if args.task and args.task.startswith(RG):
        return args.task
    return Path(find(args.task)) if args.task else Path(find(args.model)) / "task.json"


def default_env_id(args):
    """With --task rg:..., an --env-id left at its default becomes the reasoning-gym task's name
    (called before the run folder is named)."""
    task = getattr(args, "task", None)
    if task and task.startswith(RG) and args.env_id == getattr(type(args), "env_id", None):
        args.env_id = reasoning_gym_name(task)


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


def check_task(args, load_policy, device="cpu", rewards=("exact",), add_lora=None) -> tuple:
    """The model (config, weights, tokenizer; loaded by the script's load_policy onto device), then
    the task file and its rewards (`rewards`: the names the script has), then, with --lora-r, the
    adapters (the script's add_lora), before anything is written. Returns (task, policy,
    tokenizer): the model is loaded once, for the checks and the training."""
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
    if not policy.end_ids:
        fail(
            f"neither the tokenizer nor the generation config of --model {args.model} names an "
            "end (eos) token"
        )
    path = task_path(args)
    try:
        task = load_task(path)
    except (OSError, ValueError) as e:
        fail(f"task file {path} cannot be read ({type(e).__name__}); pass --task FILE.json")
    problem = task_problem(task, tuple(rewards))
    if problem:
        fail(f"task file {path} {problem}")
    names = task["name"]
    prompts = [x[0] for x in task["train"] + task["heldout"]]
    if any(not isinstance(p, str) for p in prompts) and not tokenizer.chat_template:
        fail(
            f"task file {path} holds conversations and the tokenizer of --model has no chat "
            "template: give prompts as text or a model whose tokenizer has one"
        )
    weights = getattr(args, "reward_weights", None)
    if weights is not None and len(weights) != len(task_rewards(task)):
        fail(
            f"--reward-weights gives {len(weights)} weights for the {len(task_rewards(task))} "
            f"rewards of task file {path} ({', '.join(task_rewards(task))})"
        )
    max_new_tokens = args.max_new_tokens or task["max_new_tokens"]
    # text the tokenizer cannot write (a character outside its vocabulary) would be scored wrong
    contents = [m["content"] for p in prompts if not isinstance(p, str) for m in p]
    answers = [x[1] for x in task["train"] + task["heldout"]]
    texts = sorted({t for t in [p for p in prompts if isinstance(p, str)] + contents + answers})
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
    written = [prompt_text(tokenizer, p) for p in prompts]
    longest = max(len(x) for x in tokenizer(written, add_special_tokens=False)["input_ids"])
    context = getattr(policy.lm.config, "max_position_embeddings", None)
    if context is not None and longest + max_new_tokens > context:
        fail(
            f"prompts of up to {longest} tokens + --max-new-tokens {max_new_tokens} exceed the "
            f"model's context of {context} tokens"
        )
    if getattr(args, "lora_r", 0):
        try:
            add_lora(policy, args.lora_r, args.lora_alpha, args.lora_target_modules)
        except ImportError:
            fail("--lora-r needs peft: pip install peft")
        except ValueError as e:
            fail(f"--lora-target-modules {' '.join(args.lora_target_modules)}: {first_line(e)}")
    return task, policy, tokenizer
