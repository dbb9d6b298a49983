"""grpo_lm.py's peak memory and seconds per update beside TRL's GRPOTrainer, in one run, with the
same hyperparameters, on the project's base (addition-v0) and on a small Qwen2 made here
(lm_task.make_tiny_qwen: byte-level BPE, two layers 64 wide, an output layer as wide as
--vocab-size, prompts "a+b=" with the exact reward, 128- and 256-token completions; a random
model never ends early, so every completion is as long as the budget).

    python benchmark/lm_speed_memory.py --out benchmark/reports/lm-speed-memory
    python benchmark/lm_speed_memory.py --before /tmp/old --out ...  # also the code at /tmp/old

Peak memory is each process's peak resident set (/usr/bin/time's %M: weights, optimiser state,
activations and the Python runtime together, one process per row). Seconds per update: the median
over a run's updates of the training seconds between two updates (sampling and the update; no
evaluation), ours from its charts/tokens_per_s and completion lengths, TRL's from the
charts/update_seconds that benchmark/trl_baseline.py logs. A projection for Qwen2.5-0.5B follows
the table: the weights, gradients and Adam's state of its 494M parameters, plus what a micro-batch
holds, scaled from the rows measured here.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmark.lm_task import make_tiny_qwen  # noqa: E402
from benchmark.runs import OneLineParser, read_rows  # noqa: E402


def tiny_model(folder: Path, vocab_size: int) -> Path:
    """The small Qwen2 with its tokenizer's pad token set to its end token (TRL and the code
    before the tokenizer work need one) and a task of sums beside it."""
    from transformers import AutoTokenizer

    model = folder / f"tiny-qwen2-v{vocab_size}"
    make_tiny_qwen(model, seed=0, vocab_size=vocab_size)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.save_pretrained(model)
    rng = random.Random(0)
    pairs = [(rng.randint(10, 999), rng.randint(10, 999)) for _ in range(300)]
    task = {
        "name": "sums-v0",
        "max_new_tokens": 256,
        "train": [[f"{a}+{b}=", str(a + b)] for a, b in pairs[:256]],
        "heldout": [[f"{a}+{b}=", str(a + b)] for a, b in pairs[256:]],
    }
    (model / "task.json").write_text(json.dumps(task))
    return model


def run(cmd: list[str], run_dir: Path, env: dict) -> dict:
    """Run one training process under /usr/bin/time: its peak memory (MB) and its rows."""
    timed = ["/usr/bin/time", "-f", "PEAK_KB %M", *cmd, "--run-dir", str(run_dir)]
    out = subprocess.run(timed, capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    peak = next(line for line in out.stderr.splitlines() if line.startswith("PEAK_KB"))
    return {"peak_mb": int(peak.split()[1]) / 1024, "rows": read_rows(run_dir)}


def ours_seconds(rows: list[dict], completions: int) -> list[float]:
    """Seconds of each update from the cumulative charts/tokens_per_s and completion lengths."""
    by_step: dict = {}
    for r in rows:
        by_step.setdefault(r["global_step"], {})[r["name"]] = r["value"]
    tokens = 0.0
    cumulative = []
    for step in sorted(s for s in by_step if "charts/tokens_per_s" in by_step[s]):
        tokens += by_step[step]["train/episodic_length"] * completions
        cumulative.append(tokens / by_step[step]["charts/tokens_per_s"])
    return [b - a for a, b in zip([0.0] + cumulative, cumulative)]


def trl_seconds(rows: list[dict]) -> list[float]:
    return [r["value"] for r in rows if r["name"] == "charts/update_seconds"]


def measure(case: dict, root: Path, side: str, workdir: Path, env: dict) -> dict:
    flags = case["flags"]
    if side == "trl":
        cmd = [sys.executable, "benchmark/trl_baseline.py", "--same-as", "grpo_lm.py", *flags]
    else:
        cmd = [sys.executable, str(root / "algos" / "grpo_lm.py"), *flags]
    run_dir = workdir / f"{case['name']}-{side}-{time.time_ns()}"
    side_env = {**env, "PYTHONPATH": str(root)} if side == "before" else env
    result = run(cmd, run_dir, side_env)
    completions = 16 * 8  # prompts x completions per update
    seconds = (
        trl_seconds(result["rows"]) if side == "trl" else ours_seconds(result["rows"], completions)
    )
    steady = seconds[1:] or seconds  # the first update includes warming up
    return {
        "peak_mb": result["peak_mb"],
        "s_update": statistics.median(steady),
        "updates": len(seconds),
    }


QWEN_05B = dict(  # Qwen2.5-0.5B's config.json: 494M parameters, the embedding tied
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
)

ONE_STEP = """
import resource, sys, torch
sys.path.insert(0, {root!r})
from transformers import Qwen2Config, Qwen2ForCausalLM
from benchmark.runs import load_script
torch.set_num_threads(1)
torch.manual_seed(0)
lm = Qwen2ForCausalLM(Qwen2Config(**{config!r}))
if {checkpointing!r}:
    lm.gradient_checkpointing_enable({{"use_reentrant": False}})
policy = load_script("grpo_lm.py").Policy(lm, 0, [1])
policy.train()
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-6)
ids = torch.randint(0, {vocab}, ({rows}, {length}))
logp, _, _ = policy.token_logprobs(ids, torch.ones_like(ids), {length} - {completion})
logp.mean().backward()
optimizer.step()
print("PEAK_MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def one_step_peak(rows: int, length: int, completion: int, checkpointing: bool, env) -> float:
    """Peak memory (MB) of one process that takes one Adam step of grpo_lm.py's log-probability
    pass on a random model of Qwen2.5-0.5B's shape over `rows` sequences of `length` tokens."""
    code = ONE_STEP.format(
        root=str(ROOT),
        config=QWEN_05B,
        checkpointing=checkpointing,
        vocab=QWEN_05B["vocab_size"],
        rows=rows,
        length=length,
        completion=completion,
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"the one-step measurement failed:\n{out.stderr[-3000:]}")
    return float(out.stdout.split("PEAK_MB")[1])


def projection(env) -> list[str]:
    """Qwen2.5-0.5B at 16 prompts x 8 completions of 512 tokens (prompts of ~150): the peak of one
    step measured here at two micro-batch sizes (float32 on this CPU: bf16 autocast on a GPU keeps
    less), a straight line through them, read at a micro-batch of 128 / N sequences."""
    lines = [
        "",
        "## Qwen2.5-0.5B, 16 x 8 completions of 512 tokens: projected from one step measured here",
        "",
        "One process takes one Adam step of grpo_lm.py's log-probability pass (the chunked output "
        "layer, float32) on a random model of Qwen2.5-0.5B's shape (494M parameters, 151,936-token "
        "vocabulary) over micro-batches of 2 and 4 sequences of 662 tokens (512 completion); the "
        "peak grows by a straight line in the sequences, read off at 128 / N sequences per "
        "micro-batch (N: --gradient-accumulation-steps). No reference model (--beta 0). "
        "Generation's KV cache (128 x 662 tokens x 24 layers x K and V of 2 x 64, bf16: 1.0 GB) is "
        "added.",
        "",
        "| --gradient-checkpointing | peak, 2 seq. (MB) | peak, 4 seq. (MB) | per sequence (MB) "
        "| N = 1 (GB) | N = 8 (GB) | N = 16 (GB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for checkpointing in (False, True):
        two = one_step_peak(2, 662, 512, checkpointing, env)
        four = one_step_peak(4, 662, 512, checkpointing, env)
        per = (four - two) / 2
        fixed = two - 2 * per
        cells = [f"{(fixed + per * 128 / n) / 1024 + 1.0:.1f}" for n in (1, 8, 16)]
        lines.append(
            f"| {'yes' if checkpointing else 'no'} | {two:,.0f} | {four:,.0f} | {per:,.0f} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder of the report (made if new)")
    p.add_argument("--before", type=Path, help="another checkout whose grpo_lm.py is also measured")
    p.add_argument(
        "--vocab-size", type=int, default=8192, help="rows of the small Qwen2's output layer"
    )
    p.add_argument("--updates", type=int, default=4, help="updates per run (the first not counted)")
    p.add_argument(
        "--projection-only", action="store_true", help="only the Qwen2.5-0.5B projection"
    )
    a = p.parse_args(argv)
    if a.out.exists() and not a.out.is_dir():
        p.error(f"--out {a.out} is a file; give a folder")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "TOKENIZERS_PARALLELISM": "false",
    }
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout.strip()
    commit += "-dirty" if changed else ""  # measured on uncommitted changes of that commit
    lines = [
        "# grpo_lm.py beside TRL's GRPOTrainer: peak memory and seconds per update "
        f"(commit {commit})",
        "",
        f"CPU, one torch thread, {time.strftime('%Y-%m-%d %H:%M')} UTC.",
    ]
    results = []
    if not a.projection_only:
        results = measure_rows(a, env)
        lines += table(a, results)
    lines += projection(env)
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"lm-speed-memory-cpu-{time.strftime('%Y-%m-%d-%H%M')}-{commit}.md"
    path.write_text("\n".join(lines) + "\n")
    (path.with_suffix(".json")).write_text(json.dumps(results, indent=1))
    print("\n".join(lines))
    print(f"report: {path}")
    return 0


def measure_rows(a, env) -> list[dict]:
    """Each case's rows: ours, TRL's and (--before) the other checkout's."""
    workdir = Path(tempfile.mkdtemp(prefix="lm-speed-memory-"))
    qwen = tiny_model(workdir, a.vocab_size)
    common = ["--eval-prompts", "0", "--seed", "1", "--total-timesteps", str(16 * a.updates)]
    cases = [{"name": "base 16x8x5", "flags": [*common, "--env-id", "addition-v0"]}]
    for tokens in (128, 256):
        flags = [*common, "--model", str(qwen), "--env-id", "sums-v0"]
        flags += ["--max-new-tokens", str(tokens)]
        cases.append({"name": f"tiny Qwen2 16x8x{tokens}", "flags": flags})
    sides = ["ours", "trl"] + (["before"] if a.before else [])
    results = []
    for case in cases:
        for side in sides:
            print(f"{case['name']}: {side}", flush=True)
            root = a.before if side == "before" else ROOT
            results.append(
                {"case": case["name"], "side": side, **measure(case, root, side, workdir, env)}
            )
    extra = {**cases[-1], "name": "tiny Qwen2 16x8x256, 8 micro-batches"}
    extra["flags"] = [*extra["flags"], "--gradient-accumulation-steps", "8"]
    results.append(
        {"case": extra["name"], "side": "ours", **measure(extra, ROOT, "ours", workdir, env)}
    )
    return results


def table(a, results: list[dict]) -> list[str]:
    lines = [
        "",
        f"The small Qwen2's output layer is {a.vocab_size:,} wide; {a.updates} updates per run, "
        "the first not counted; 16 prompts x 8 completions per update.",
        "",
        "| case | side | peak memory (MB) | s/update |",
        "|---|---|---:|---:|",
    ]
    for r in results:
        lines.append(f"| {r['case']} | {r['side']} | {r['peak_mb']:,.0f} | {r['s_update']:.3f} |")
    lines += ["", "Ours / TRL:", ""]
    for case in dict.fromkeys(r["case"] for r in results if r["side"] == "trl"):
        ours = next(r for r in results if r["case"] == case and r["side"] == "ours")
        trl = next(r for r in results if r["case"] == case and r["side"] == "trl")
        memory = ours["peak_mb"] / trl["peak_mb"]
        speed = ours["s_update"] / trl["s_update"]
        lines.append(f"- {case}: memory {memory:.2f}, s/update {speed:.2f}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
