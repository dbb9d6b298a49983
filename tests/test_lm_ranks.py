"""grpo_lm.py, ppo_lm.py and dpo_lm.py under torchrun: 2 gloo processes on the CPU take, at every
optimiser step, the step one process takes on the whole batch (the same gradient, after clipping,
and the same parameters after it, within float tolerance), log the same metrics, and rank 0 alone
writes the run directory.

How the two runs see the same batch: the scripts run unchanged through a launcher (written below)
that records, on each rank, the gradient before and the parameters after every optimiser step
(torch's global optimiser step hooks), and that replaces the policy's sampling by the same sampling
done one completion at a time, each from a seed of its own (its prompt's tokens, the how-many-th
completion of that prompt it is, the call): then a completion does not depend on which process
drew it or on what else was in its batch, and one process and two ranks sample the same
completions. Everything else (the prompts drawn, the rewards, the advantages, the reference, the
normalisations, the gradient accumulation, the all-reduce) is the scripts' own. dpo_lm.py samples
nothing to train. The losses are chosen so that the ranks' parts differ in size (DAPO's token-level
normalisation, the KL penalty): a rank normalising by its own counts, or averaging where it should
sum, fails. Times on 2 shared CPU cores: about 20 s per torchrun run (most of it two torch imports).
"""

import json
import subprocess
import sys

import pytest
import torch

from benchmark.runs import ALGOS, ROOT, read_rows, run_env

LAUNCHER = """import importlib.util, os, sys, zlib
import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

record = os.path.join(os.environ["RECORD"], f"rank{os.environ.get('RANK', '0')}.pt")
steps = []


def params(optimizer):
    return [p for group in optimizer.param_groups for p in group["params"]]


def before(optimizer, args, kwargs):
    steps.append({"grad": torch.cat([p.grad.flatten() for p in params(optimizer)]).clone()})


def after(optimizer, args, kwargs):
    steps[-1]["params"] = torch.cat([p.detach().flatten() for p in params(optimizer)]).clone()
    torch.save(steps, record)


register_optimizer_step_pre_hook(before)
register_optimizer_step_post_hook(after)
sys.argv[0] = os.environ["SCRIPT_PATH"]
spec = importlib.util.spec_from_file_location("script", sys.argv[0])
script = importlib.util.module_from_spec(spec)
sys.modules["script"] = script
spec.loader.exec_module(script)  # the script's definitions (its main() not yet run)
sample = script.Policy.generate
calls = [0]


def generate(self, prompt_ids, prompt_mask, max_new_tokens, greedy=False, temperature=1.0):
    if greedy:  # evaluation (rank 0 only)
        return sample(self, prompt_ids, prompt_mask, max_new_tokens, greedy, temperature)
    calls[0] += 1
    state, seen, rows = torch.get_rng_state(), {}, []
    for ids, mask in zip(prompt_ids, prompt_mask):
        prompt = ids[mask.bool()][None]  # without the batch's padding
        key = tuple(prompt[0].tolist())
        seen[key] = seen.get(key, -1) + 1
        torch.manual_seed(zlib.crc32(repr((key, seen[key], calls[0])).encode()))
        ones = torch.ones_like(prompt)
        rows.append(sample(self, prompt, ones, max_new_tokens, False, temperature))
    torch.set_rng_state(state)  # the script's own random stream goes on as it would
    return tuple(torch.cat(part) for part in zip(*rows))


script.Policy.generate = generate
with script.Ranks().said_by_rank_0():
    args = script.tyro.cli(script.Args)
script.main(args)
"""

MODEL = str(ROOT / "benchmark" / "policies" / "lm-addition-base")
# 2 updates of small batches, each rank's part in 2 micro-batches, one minibatch per pass (with
# several, each is made of every rank's own random part: the same size, another random split)
FLAGS = {
    "grpo_lm.py": "--num-prompts 4 --group-size 4 --total-timesteps 8 --update-epochs 2 "
    "--gradient-accumulation-steps 2 --loss-type token --beta 0.04",
    "ppo_lm.py": "--num-prompts 8 --total-timesteps 16 --update-epochs 2 --num-minibatches 1 "
    "--gradient-accumulation-steps 2 --kl-coef 0.05",
    "dpo_lm.py": "--batch-size 8 --total-timesteps 16 --gradient-accumulation-steps 2",
}
TIMING = ("charts/sps", "charts/train_seconds")


def launch(tmp_path, script: str, nproc: int, name: str):
    """The script through the launcher, one process or torchrun with nproc; returns (its folder,
    the steps recorded on each rank)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "launcher.py").write_text(LAUNCHER)
    program = [str(folder / "launcher.py")]
    if nproc > 1:
        program = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        program.append(str(folder / "launcher.py"))
    flags = [*FLAGS[script].split(), "--model", MODEL, "--eval-prompts", "8", "--run-dir", "run"]
    out = subprocess.run(
        [sys.executable, *program, *flags],
        cwd=folder,
        env=run_env(RECORD=str(folder), SCRIPT_PATH=str(ALGOS / script)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    records = [torch.load(folder / f"rank{r}.pt", weights_only=True) for r in range(nproc)]
    return folder, records


def metrics(run_dir) -> dict:
    """{(step, name): [values]} of a run's metrics.csv, the clock aside."""
    rows = {}
    for r in read_rows(run_dir):
        if r["name"] not in TIMING and "tokens_per_s" not in r["name"]:
            rows.setdefault((r["global_step"], r["name"]), []).append(float(r["value"]))
    return rows


@pytest.mark.parametrize("script", sorted(FLAGS))
def test_two_ranks_take_the_step_of_one_process(tmp_path, script):
    one, (alone,) = launch(tmp_path, script, 1, "one")
    two, (rank0, rank1) = launch(tmp_path, script, 2, "two")
    assert len(alone) == len(rank0) == len(rank1) >= 2  # every step was taken on every rank
    lr = json.loads((one / "run" / "config.json").read_text())["args"]["learning_rate"]
    for step, (a, r0, r1) in enumerate(zip(alone, rank0, rank1)):
        assert torch.equal(r0["params"], r1["params"]), f"step {step}: the ranks differ"
        # the gradients, up to float error (each rank pads its prompts to its own longest): a
        # rank normalising by its own counts is off by percents
        error = float((r0["grad"] - a["grad"]).norm() / a["grad"].norm())
        assert error < 1e-4, f"step {step}: the gradient is off by {error:.2%}"
        # the parameters: the same, but where a gradient is at float error's level, Adam's step
        # (about lr * its sign) may go either way: at most 2 lr per step, in few parameters
        diff = (r0["params"] - a["params"]).abs()
        assert float(diff.max()) <= 2 * lr * (step + 1) + 1e-6
        assert float((diff > 1e-6).float().mean()) < 1e-4, f"step {step}: params differ"
    # rank 0 alone wrote the run: the same files, each metric once per step, the same values
    files = [sorted(p.name.split(".out.")[0] for p in (x / "run").iterdir()) for x in (one, two)]
    assert files[0] == files[1]  # (TensorBoard's events file: one, its name the clock's)
    alone_rows, ranks_rows = metrics(one / "run"), metrics(two / "run")
    assert alone_rows.keys() == ranks_rows.keys()
    for key, values in alone_rows.items():
        # approx_kl, about half the mean squared log-ratio (a difference of near-equal
        # log-probabilities), carries their float error magnified: 1.5e-4 relative on one x86 CPU
        # where the gradients agree to 1e-4; a rank normalising by its own counts is off by percents
        rel = 1e-3 if key[1] == "losses/approx_kl" else 1e-4
        assert ranks_rows[key] == pytest.approx(values, rel=rel, abs=1e-6), key
