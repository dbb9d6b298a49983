"""TRL (1.16.0) with one of our LM scripts' hyperparameters, on the same base model, prompts, reward
and budget, run the way our scripts run: both in one benchmark report (benchmark/run.py).

    python benchmark/trl_baseline.py --same-as grpo_lm.py --env-id addition-v0 \\
        --total-timesteps 4800 --seed 1 --eval-every 960 --run-dir runs/trl-grpo-1
    python benchmark/trl_baseline.py --same-as grpo_lm.py --env-id addition-v0 \\
        --total-timesteps 4800 --seed 1 --baseline rloo --no-scale-rewards --run-dir runs/trl-rloo-1
    python benchmark/trl_baseline.py --same-as dpo_lm.py --env-id addition-v0 \\
        --total-timesteps 14784 --seed 1 --eval-every 1480 --run-dir runs/trl-dpo-1

In a suite (benchmark/suites.toml) the script "trl:<our script>" runs this file with --same-as <our
script>. The hyperparameters are our script's defaults (its `Args`), with any of its flags given
here (tyro's spelling: --no-scale-rewards, --dynamic-sampling, --clip-eps-high 0.28), mapped onto
TRL's trainer by grpo_config / rloo_config / dpo_config below:

  grpo_lm.py -> GRPOTrainer (RLOOTrainer with --baseline rloo): num_generations = --group-size, a
  generation batch of --num-prompts x --group-size completions, per_device_train_batch_size = that
  batch / --num-minibatches (steps_per_generation = --num-minibatches, no gradient accumulation), so
  that one optimizer step is one of our minibatch steps and max_steps = updates x --update-epochs x
  --num-minibatches; num_iterations = --update-epochs; learning_rate, constant schedule, no warm-up,
  weight_decay 0 (AdamW without decay: Adam, betas and eps as torch's defaults, as ours);
  max_grad_norm, beta, epsilon = --clip-eps, epsilon_high = --clip-eps-high (or --clip-eps),
  temperature, top_p 1, top_k 0, max_completion_length = --max-new-tokens or the task's; loss_type
  grpo -> "grpo", token -> "dapo", dr_grpo -> "dr_grpo"; scale_rewards "group" / "none";
  mask_truncated_completions = --mask-truncated. The reward function is ours: 1.0 when the
  completion's token ids hold the end token and the text before it is the answer, else 0 (it reads
  completion_ids, not TRL's decoded text, which drops special tokens and so cannot tell a truncated
  completion from an ended one).
  grpo_agent_lm.py -> GRPOTrainer as for grpo_lm.py, with rollout_func: our multi-turn rollout
  (grpo_agent_lm.py's, on the trainer's model) samples each trajectory, the calculator's tokens
  marked 0 in env_mask so that TRL's loss skips them; the reward is our score() of each
  trajectory's answer (agent_rollout, agent_reward below).
  dpo_lm.py -> DPOTrainer: beta, learning_rate, per_device_train_batch_size = --batch-size,
  max_steps = --total-timesteps // --batch-size (two epochs of the pairs by default), the sigmoid
  loss, no truncation (max_length None), chosen and rejected completions followed by the end token.

The run leaves what the benchmark reads from ours: config.json and metrics.csv with, per update,
charts/tokens_per_s (ours' count: completion tokens sampled for GRPO, prompt and completion tokens
of both sides of each pair for DPO, per second of training), charts/update_seconds and
train/episodic_return (GRPO); at step 0, every --eval-every prompts (pairs) and at the end
charts/train_seconds (evaluations excluded), eval/episodic_return once per held-out prompt and
eval/accuracy, from OUR greedy evaluation (grpo_lm.py's evaluate) of the trainer's model. The
training clock starts when TRL's training loop starts (its set-up is not training time).

Where TRL cannot do what ours does (DIFFERENCES, also written into config.json):
  - DAPO's dynamic sampling (--dynamic-sampling): TRL 1.16 has none. The trl: row trains on every
    group, those with all-equal rewards included (their advantage is 0, so they only enlarge the
    token normaliser of the "dapo" loss); ours samples up to --max-sampling-rounds rounds of prompts
    to fill the batch with groups whose rewards differ.
  - RLOO (RLOOTrainer): the ratio and its clip are per sequence (the sum of the completion's token
    log-probabilities) and the loss is the mean over completions of -min(r A, clip(r) A): each
    token's gradient is A, not A / |o| as ours (--loss-type grpo: mean over each completion's
    tokens). TRL's RLOO has no per-group std scaling (only a batch normalisation, off here):
    --scale-rewards with --baseline rloo has no TRL counterpart. Its KL (beta > 0) is a k1 penalty
    on the reward, ours a k3 term in the loss (beta is 0 by default in both rows).
  - Prompt order: TRL's RepeatSampler walks a seeded permutation of the train prompts (without
    replacement until all 20,000 are used); ours draws --num-prompts distinct prompts afresh each
    update. DPO: TRL's dataloader shuffles each epoch and drops each epoch's last partial batch
    (7,409 pairs: 115 batches of 64, 49 pairs left out per epoch), ours walks each epoch's own
    permutation across epoch boundaries.
  - Sampling: TRL samples with transformers' generate (the same left padding and positions; the
    prompts here all have 8 tokens, so there is no padding), not with our KV-cache loop; the
    random streams differ, so no completion is the same as ours for a seed.
  - Old log-probabilities: with one pass (mu 1) TRL's ratio is that of the policy to itself
    (per_token_logps.detach()), ours the policy to the sampling log-probabilities; the same up to
    rounding. With mu > 1 TRL recomputes the old log-probabilities by a forward pass.
  - TRL's own tool path (GRPOTrainer(tools=[...]) or environment_factory) cannot run calc-v0 on
    the project's base: with text or chat prompts alike it stops at once with "ValueError: The
    provided chat template does not support tool calling. The template must be able to render a
    full tool-calling conversation (user -> assistant with tool_calls -> tool)." The base has no
    chat template, and TRL's calls are the JSON tool calls a chat template renders and the
    tokenizer's response schema parses, not <calc>...</calc> in the model's own text. The
    trl:grpo_agent_lm.py row therefore trains TRL's loss on our rollouts (rollout_func, above).
  - No BOS token: the base's tokenizer has none, so TRL adds none (checked in the test).
  - Logging: TRL's own metrics are not written; only the rows above.
"""

import csv
import dataclasses
import json
import os
import sys
import tempfile
import time
import typing
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `python benchmark/trl_baseline.py` puts benchmark/ first on the path, whose datasets.py would hide
# Hugging Face's datasets (which TRL imports): the root instead
sys.path = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmark"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmark.runs import load_script, parse_baseline_args, print_baseline_end  # noqa: E402
from canonrl.lm import find, load_task, task_path  # noqa: E402

TRL_VERSION = "1.16.0"
SAME = {
    "grpo_lm.py": "GRPOTrainer or RLOOTrainer",
    "grpo_agent_lm.py": "GRPOTrainer with rollout_func",
    "dpo_lm.py": "DPOTrainer",
}
LOSS_TYPES = {"grpo": "grpo", "token": "dapo", "dr_grpo": "dr_grpo"}
DIFFERENCES = {
    "grpo_lm.py": "TRL samples with transformers' generate and walks a seeded permutation of "
    "the train prompts (ours: fresh prompts each update); with mu 1 its ratio is to the policy "
    "itself (ours: to the sampling log-probabilities, the same up to rounding)",
    "dynamic_sampling": "TRL has no dynamic sampling: every group is trained on, all-equal "
    "ones included (ours refills the batch with groups whose rewards differ)",
    "rloo": "TRL's RLOOTrainer clips a per-sequence ratio and sums the completion's token "
    "log-probabilities (gradient A per token; ours A / |o|, --loss-type grpo); no per-group "
    "std scaling; KL (beta > 0) as a k1 reward penalty (ours: k3 in the loss)",
    "grpo_agent_lm.py": "TRL's GRPOTrainer trains on trajectories that our rollout samples (its "
    "rollout_func: the model's tokens and the calculator's interleaved, the calculator's masked by "
    "env_mask): its own tool path refuses the base ('ValueError: The provided chat template does "
    "not support tool calling'); it walks a seeded permutation of the train prompts (ours: fresh "
    "prompts each update)",
    "dpo_lm.py": "TRL shuffles the pairs each epoch and drops each epoch's last partial batch "
    "(49 of 7,409 pairs); ours walks each epoch's permutation across epoch boundaries",
}


# ---- the command line: our script's flags in tyro's spelling ------------------------------------


def typed(ours, args_cls, given: list[str]):
    """Convert the flags given for fields whose default is None (e.g. --clip-eps-high 0.28, kept as
    a string by parse_baseline_args) to their annotated type."""
    hints = typing.get_type_hints(args_cls)
    for flag in given:
        name = flag.removeprefix("--").replace("-", "_")
        value = getattr(ours, name, None)
        if not isinstance(value, str):
            continue
        kinds = [t for t in typing.get_args(hints.get(name)) if t is not type(None)]
        for kind in kinds:
            if kind is str:
                break
            try:
                setattr(ours, name, kind(value))
                break
            except (TypeError, ValueError):
                continue
    return ours


def parse(argv=None):
    """(parser, the run's flags, our script's Args with the flags given)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p, a, ours = parse_baseline_args(__doc__, SAME, "trl", argv)
    return p, a, typed(ours, type(ours), [t for t in argv if t.startswith("--")])


# ---- our script's Args -> TRL's config ----------------------------------------------------------


def common(a, ours, out_dir: str) -> dict:
    """The TrainingArguments that every row shares: Adam at a constant rate, CPU, float32, no
    checkpoints, no logging of TRL's own (our callback writes metrics.csv)."""
    return dict(
        output_dir=out_dir,
        learning_rate=ours.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        optim="adamw_torch",
        max_grad_norm=ours.max_grad_norm,
        gradient_accumulation_steps=1,
        seed=a.seed,
        data_seed=a.seed,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def grpo_config(a, ours, max_new_tokens: int, out_dir: str = "/tmp/trl-out"):
    """grpo_lm.py's Args -> (trainer class name, TRL config): GRPOConfig, or RLOOConfig for
    --baseline rloo."""
    updates = a.total_timesteps // ours.num_prompts
    batch = ours.num_prompts * ours.group_size
    shared = dict(
        **common(a, ours, out_dir),
        per_device_train_batch_size=batch // ours.num_minibatches,
        steps_per_generation=ours.num_minibatches,
        num_generations=ours.group_size,
        num_iterations=ours.update_epochs,
        max_steps=updates * ours.update_epochs * ours.num_minibatches,
        beta=ours.beta,
        epsilon=ours.clip_eps,
        epsilon_high=ours.clip_eps_high if ours.clip_eps_high is not None else ours.clip_eps,
        temperature=ours.temperature,
        top_p=1.0,
        top_k=0,
        max_completion_length=max_new_tokens,
        mask_truncated_completions=getattr(ours, "mask_truncated", False),
        shuffle_dataset=True,
        log_completions=False,
    )
    if ours.baseline == "rloo":
        from trl import RLOOConfig

        return "RLOOTrainer", RLOOConfig(**shared, normalize_advantages=False)
    from trl import GRPOConfig

    return "GRPOTrainer", GRPOConfig(
        **shared,
        loss_type=LOSS_TYPES[ours.loss_type],
        scale_rewards="group" if ours.scale_rewards else "none",
    )


def dpo_config(a, ours, out_dir: str = "/tmp/trl-out"):
    """dpo_lm.py's Args -> ("DPOTrainer", DPOConfig)."""
    from trl import DPOConfig

    return "DPOTrainer", DPOConfig(
        **common(a, ours, out_dir),
        per_device_train_batch_size=ours.batch_size,
        max_steps=a.total_timesteps // ours.batch_size,
        beta=ours.beta,
        loss_type=["sigmoid"],
        label_smoothing=0.0,
        max_length=None,
        precompute_ref_log_probs=False,
        dataloader_drop_last=True,
    )


def differences(same_as: str, ours) -> list[str]:
    """The DIFFERENCES that apply to this row's flags."""
    out = [DIFFERENCES[same_as]]
    if same_as == "grpo_lm.py" and ours.dynamic_sampling:
        out.append(DIFFERENCES["dynamic_sampling"])
    if same_as == "grpo_lm.py" and ours.baseline == "rloo":
        out.append(DIFFERENCES["rloo"])
    return out


CONFIG_KEYS = (
    "learning_rate lr_scheduler_type warmup_steps weight_decay optim max_grad_norm seed "
    "per_device_train_batch_size gradient_accumulation_steps steps_per_generation "
    "generation_batch_size num_generations num_iterations max_steps beta epsilon epsilon_high "
    "temperature top_p top_k max_completion_length loss_type scale_rewards "
    "mask_truncated_completions normalize_advantages label_smoothing max_length "
    "dataloader_drop_last"
).split()


def config_summary(config) -> dict:
    """The TRL config's values that the mapping sets (config.json's trl_config)."""
    return {k: getattr(config, k) for k in CONFIG_KEYS if hasattr(config, k)}


# ---- the run ------------------------------------------------------------------------------------


class Recorder:
    """metrics.csv (global_step, wall_time, name, value) and the training clock, which stops
    during evaluations."""

    def __init__(self, run_dir: Path):
        self.file = open(run_dir / "metrics.csv", "w", newline="")
        self.csv = csv.writer(self.file, lineterminator="\n")
        self.csv.writerow(["global_step", "wall_time", "name", "value"])
        self.start, self.eval_seconds, self.last_update = None, 0.0, None

    def log(self, step: int, metrics: dict):
        for name, value in metrics.items():
            self.csv.writerow([step, f"{time.time():.3f}", name, repr(float(value))])
        self.file.flush()

    def train_seconds(self) -> float:
        return 0.0 if self.start is None else time.time() - self.start - self.eval_seconds

    def evaluate(self, step: int, run_eval) -> list[float]:
        """charts/train_seconds, then one eval/episodic_return row per held-out prompt (and one row
        of each statistic run_eval gives beside it, {name: one value per prompt}) and
        eval/accuracy, eval/reward (as our scripts log them)."""
        import numpy as np

        self.log(step, {"charts/train_seconds": self.train_seconds()})
        t = time.time()
        results = run_eval()
        self.eval_seconds += time.time() - t
        if not isinstance(results, dict):
            results = {"eval/episodic_return": results}
        rewards = results["eval/episodic_return"]
        for name, values in results.items():
            for value in values:
                self.log(step, {name: value})
        if rewards:
            self.log(
                step,
                {
                    "eval/accuracy": float(np.mean(np.asarray(rewards) == 1.0)),
                    "eval/reward": float(np.mean(rewards)),
                },
            )
        return rewards


def make_callback(
    rec: Recorder,
    run_eval,
    unit: int,
    steps_per_update: int,
    total_updates: int,
    eval_every: int,
    counters: dict,
):
    """A TrainerCallback: the step-0 evaluation and the clock at the start of training, per update
    the rows above, an evaluation every eval_every steps (prompts or pairs; our scripts' rule) and
    at the end. unit: prompts (pairs) per update."""
    from transformers import TrainerCallback

    class OurRun(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            rec.evaluate(0, run_eval)
            rec.start = rec.last_update = time.time()
            rec.eval_seconds = 0.0
            counters["tokens"] = 0

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % steps_per_update:
                return
            update = state.global_step // steps_per_update
            step = update * unit
            now = time.time()
            seconds = max(rec.train_seconds(), 1e-9)
            metrics = {
                "charts/tokens_per_s": counters["tokens"] / seconds,
                "charts/update_seconds": now - rec.last_update,
            }
            if counters.get("rewards"):
                metrics["train/episodic_return"] = sum(counters["rewards"]) / len(
                    counters["rewards"]
                )
                counters["rewards"] = []
            for name, values in counters.pop("stats", {}).items():  # the agent's trajectories
                metrics[f"charts/{name}"] = sum(values) / len(values)
            rec.log(step, metrics)
            if eval_every and update < total_updates and step % eval_every < unit:
                rec.evaluate(step, run_eval)
            rec.last_update = time.time()

    return OurRun()


def task_reward(lm, tokenizer, task: dict, end_ids, weights, counters: dict):
    """Our reward as a TRL reward function: the text before a completion's first end token scored
    by our script's score() (the task's rewards, weighted as --reward-weights; a completion with no
    end token, truncated, scores 0). It also counts the completion tokens sampled (the end token
    included, as ours) and keeps the rewards of the update for train/episodic_return."""

    def reward(prompts, completions, completion_ids, answer, info, **kwargs):
        import torch

        width = max(len(ids) for ids in completion_ids)  # -1 pads: never an end token
        rows = torch.tensor([list(ids) + [-1] * (width - len(ids)) for ids in completion_ids])
        texts = lm.completion_texts(tokenizer, rows, end_ids)
        targets = [(a, json.loads(i)) for a, i in zip(answer, info, strict=True)]
        out = lm.score(texts, targets, task, weights)["total"]
        counters["tokens"] = counters.get("tokens", 0) + sum(len(ids) for ids in completion_ids)
        counters.setdefault("rewards", []).extend(out)
        return out

    reward.__name__ = "task_reward"
    return reward


def agent_rollout(
    agent, tokenizer, tool, end_ids, max_new_tokens: int, temperature: float, counters
):
    """grpo_agent_lm.py's multi-turn rollout as TRL's rollout_func: one trajectory per prompt it is
    given (TRL's sampler repeats each prompt num_generations times), sampled by our rollout from
    the trainer's model; prompt_ids, completion_ids (the model's tokens and the calculator's, up to
    the trajectory's last), the sampling log-probabilities (0 for the calculator's tokens) and
    env_mask (1 for the model's tokens: TRL's loss reads only those), and for the reward each
    trajectory's answer (None: it earns nothing)."""

    def rollout_func(prompts, trainer):
        model = trainer.accelerator.unwrap_model(trainer.model)
        policy = agent.Policy(model, tokenizer.pad_token_id, end_ids)
        ids, mask = agent.encode_prompts(tokenizer, prompts, model.device)
        tokens, c_mask, own, logp, info = agent.rollout(
            policy, tokenizer, tool, ids, mask, max_new_tokens, temperature=temperature
        )
        keep = c_mask.bool()
        counters["tokens"] = counters.get("tokens", 0) + int(c_mask.sum())
        for name, values in agent.trajectory_stats(info, c_mask, own).items():
            counters.setdefault("stats", {}).setdefault(name, []).extend(values)
        return {
            "prompt_ids": [row[m.bool()].tolist() for row, m in zip(ids, mask)],
            "completion_ids": [row[k].tolist() for row, k in zip(tokens, keep)],
            "logprobs": [row[k].tolist() for row, k in zip(logp, keep)],
            "env_mask": [row[k].tolist() for row, k in zip(own, keep)],
            "trajectory_answer": info["answer"],
        }

    return rollout_func


def agent_reward(agent, task: dict, weights, counters: dict):
    """grpo_agent_lm.py's reward as a TRL reward function: score() of each trajectory's answer
    (the text after the tool's last result; None for a malformed call, a call past the limit or a
    trajectory out of tokens: 0)."""

    def reward(prompts, completions, answer, info, trajectory_answer, **kwargs):
        targets = [(a, json.loads(i)) for a, i in zip(answer, info, strict=True)]
        out = agent.score(list(trajectory_answer), targets, task, weights)["total"]
        counters.setdefault("rewards", []).extend(out)
        return out

    reward.__name__ = "task_reward"
    return reward


def main(argv=None) -> int:
    p, a, ours = parse(argv)
    ours.env_id = a.env_id  # the task's name: checked against the task file below
    import numpy as np
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func: said in the docstring
    from datasets import Dataset
    from transformers import set_seed
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    # TRL 1.16 reads transformers' old names of gradient checkpointing: a warning on every run
    # that is not ours to act on
    warnings.filterwarnings(
        "ignore", r"`(is_)?gradient_checkpointing` is deprecated", FutureWarning
    )
    hf_logging.disable_progress_bar()
    import datasets

    datasets.disable_progress_bars()
    # the same greedy evaluation as ours (the agent's: its multi-turn rollouts with the tool)
    lm = load_script("grpo_agent_lm.py" if a.same_as == "grpo_agent_lm.py" else "grpo_lm.py")
    # our script's checks of every flag, the model folder (loaded with trust_remote_code=False: a
    # model folder is data, its code never runs), the task and the preferences: one error line
    run = {"total_timesteps": a.total_timesteps, "seed": a.seed, "eval_every": a.eval_every}
    load_script(a.same_as).check_args(dataclasses.replace(ours, **run))
    model_dir = find(ours.model)
    task = load_task(task_path(ours))
    if task["name"] != ours.env_id:
        p.error(f"the task of {model_dir} is {task['name']}, not {ours.env_id}")
    max_new_tokens = ours.max_new_tokens or task["max_new_tokens"]
    heldout = task["heldout"][: ours.eval_prompts]
    set_seed(a.seed)
    policy, tokenizer = lm.load_policy(model_dir)
    model = policy.lm
    out_dir = tempfile.mkdtemp(prefix="trl-out-")
    counters: dict = {}
    tool = lm.task_tool(task, ours.max_calls) if a.same_as == "grpo_agent_lm.py" else None
    if a.same_as in ("grpo_lm.py", "grpo_agent_lm.py"):
        trainer_name, config = grpo_config(a, ours, max_new_tokens, out_dir)
        unit, steps_per_update = ours.num_prompts, ours.update_epochs * ours.num_minibatches
        targets = lm.problem_targets(task["train"])
        data = Dataset.from_dict(
            {
                "prompt": [x[0] for x in task["train"]],
                "answer": [a for a, _ in targets],
                "info": [json.dumps(i) for _, i in targets],  # (a column of one type)
            }
        )
    else:
        dpo = load_script("dpo_lm.py")
        pairs = dpo.load_preferences(dpo.preferences_path(ours))["pairs"]
        trainer_name, config = dpo_config(a, ours, out_dir)
        unit, steps_per_update = ours.batch_size, 1
        # the end token is appended here (TRL would too): chosen/rejected = text + <eos>
        data = Dataset.from_dict(
            {
                "prompt": [q for q, _, _ in pairs],
                "chosen": [c + tokenizer.eos_token for _, c, _ in pairs],
                "rejected": [r + tokenizer.eos_token for _, _, r in pairs],
            }
        )
    total_updates = config.max_steps // steps_per_update

    policy = lm.Policy(model, policy.pad_id, policy.end_ids)

    def run_eval() -> list[float] | dict:
        was_training = model.training
        model.eval()
        rewards = []
        if heldout and tool is not None:  # the agent: the trajectories' statistics too
            rewards = lm.evaluate(policy, tokenizer, tool, heldout, task, max_new_tokens)
        elif heldout:
            results = lm.evaluate(policy, tokenizer, heldout, task, max_new_tokens)
            rewards = results["eval/episodic_return"]
        model.train(was_training)
        return rewards

    a.run_dir.mkdir(parents=True)
    import trl

    (a.run_dir / "config.json").write_text(
        json.dumps(
            {
                "script": f"trl:{a.same_as}",
                "trl_version": trl.__version__,
                "trl_trainer": trainer_name,
                "trl_config": config_summary(config),
                "difference": "; ".join(differences(a.same_as, ours)),
                "args": {
                    **dataclasses.asdict(ours),
                    "env_id": a.env_id,
                    "total_timesteps": a.total_timesteps,
                    "seed": a.seed,
                    "eval_every": a.eval_every,
                    "run_dir": str(a.run_dir),
                },
            },
            indent=2,
            default=str,
        )
    )
    rec = Recorder(a.run_dir)
    callback = make_callback(
        rec, run_eval, unit, steps_per_update, total_updates, a.eval_every, counters
    )
    if a.same_as == "grpo_agent_lm.py":
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=agent_reward(lm, task, ours.reward_weights, counters),
            args=config,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[callback],
            rollout_func=agent_rollout(
                lm, tokenizer, tool, policy.end_ids, max_new_tokens, ours.temperature, counters
            ),
        )
    elif a.same_as == "grpo_lm.py":
        trainer_cls = getattr(trl, trainer_name)
        trainer = trainer_cls(
            model=model,
            reward_funcs=task_reward(
                lm, tokenizer, task, policy.end_ids, ours.reward_weights, counters
            ),
            args=config,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[callback],
        )
    else:
        trainer = trl.DPOTrainer(
            model=model,
            args=config,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[callback],
        )
        collate = trainer.data_collator

        def counting_collator(features):  # ours' count: prompt + completion, both sides
            counters["tokens"] = counters.get("tokens", 0) + sum(
                2 * len(f["prompt_ids"]) + len(f["chosen_ids"]) + len(f["rejected_ids"])
                for f in features
            )
            return collate(features)

        trainer.data_collator = counting_collator
    trainer.train()
    step = total_updates * unit
    returns = rec.evaluate(step, run_eval)
    rec.file.close()
    print(f"train seconds {rec.train_seconds():.1f}, {total_updates} updates")
    what = f"TRL {trainer_name} with {a.same_as}'s hyperparameters"
    if returns:
        accuracy = np.mean(np.asarray(returns) == 1.0)
        print(f"eval/accuracy: {accuracy:.3f} over {len(returns)} held-out prompts ({what})")
    print_baseline_end([], a.run_dir, what)
    return 0


if __name__ == "__main__":
    sys.exit(main())
