"""grpo_lm.py: its maths against brute force (group advantages, the clipped objective and its three
normalisations, k3 KL, the leave-one-out baseline), no gradient through prompt or padding tokens,
log-probabilities at sampling equal to a forward pass, its own bad input, and a run of the DAPO
flags that leaves the run contract, resumes and saves a from_pretrained directory."""

import json
import math
import shutil
import statistics

import pytest
import torch
from conftest import SMOKE, one_error_line

from benchmark.runs import ALGOS, load_script, read_metrics, read_rows, run_script
from canonrl.lm import load_task

BASE = ALGOS.parent / "benchmark" / "policies" / "lm-addition-base"


@pytest.fixture(scope="module")
def grpo():
    torch.set_num_threads(1)
    return load_script("grpo_lm.py")


@pytest.fixture(scope="module")
def base(grpo):
    return grpo.load_policy(str(BASE))


def test_group_advantages_by_brute_force(grpo):
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.5, 1.0, 0.0, 0.25]])
    got = grpo.group_advantages(rewards)
    got_unscaled = grpo.group_advantages(rewards, scale=False)
    got_rloo = grpo.group_advantages(rewards, scale=False, baseline="rloo")
    for p, row in enumerate(rewards.tolist()):
        mean, std = statistics.mean(row), statistics.stdev(row)
        for i, r in enumerate(row):
            assert got[p, i].item() == pytest.approx((r - mean) / (std + 1e-4), abs=1e-5)
            assert got_unscaled[p, i].item() == pytest.approx(r - mean, abs=1e-6)
            others = row[:i] + row[i + 1 :]
            assert got_rloo[p, i].item() == pytest.approx(r - sum(others) / len(others), abs=1e-6)
    assert torch.equal(got[1], torch.zeros(4)), "a group of equal rewards has no advantage"


def test_k3_kl_is_the_estimator_and_estimates_kl(grpo):
    for logp, ref in ((-1.0, -2.0), (-0.3, -0.1), (-2.0, -2.0)):
        expected = math.exp(ref - logp) - (ref - logp) - 1
        as64 = {"dtype": torch.float64}
        kl = grpo.k3_kl(torch.tensor(logp, **as64), torch.tensor(ref, **as64))
        assert kl.item() == pytest.approx(expected)
    p = torch.tensor([0.6, 0.3, 0.1])
    q = torch.tensor([0.2, 0.5, 0.3])
    gen = torch.Generator().manual_seed(0)
    x = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    estimate = grpo.k3_kl(p.log()[x], q.log()[x]).mean().item()
    assert estimate == pytest.approx(float((p * (p / q).log()).sum()), rel=0.02)


def loop_loss(logp, old, adv, mask, low, high, loss_type, max_new, ref, beta):
    """The objective token by token in Python."""
    rows = []
    for b in range(len(logp)):
        terms = []
        for t in range(len(logp[b])):
            if not mask[b][t]:
                continue
            ratio = math.exp(logp[b][t] - old[b][t])
            clipped = min(max(ratio, 1 - low), 1 + high)
            term = -min(ratio * adv[b], clipped * adv[b])
            d = ref[b][t] - logp[b][t]
            terms.append(term + beta * (math.exp(d) - d - 1))
        rows.append(terms)
    if loss_type == "grpo":
        return statistics.mean(sum(r) / max(len(r), 1) for r in rows)
    total = sum(sum(r) for r in rows)
    if loss_type == "token":
        return total / sum(len(r) for r in rows)
    return total / (len(rows) * max_new)


@pytest.mark.parametrize("loss_type", ["grpo", "token", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_clipped_loss_against_a_token_loop(grpo, loss_type, beta):
    gen = torch.Generator().manual_seed(1)
    logp = -torch.rand(5, 6, generator=gen, dtype=torch.float64) * 2
    old = logp + (torch.rand(5, 6, generator=gen, dtype=torch.float64) - 0.5)  # ratios 0.6-1.6
    ref = logp + (torch.rand(5, 6, generator=gen, dtype=torch.float64) - 0.5)
    adv = torch.randn(5, generator=gen, dtype=torch.float64)
    lengths = [6, 3, 1, 4, 0]  # a completion may be all padding (masked out by overlong filtering)
    mask = torch.tensor([[1] * n + [0] * (6 - n) for n in lengths])
    loss, stats = grpo.clipped_loss(logp, old, adv, mask, 0.2, 0.28, loss_type, 6, ref, beta)
    expected = loop_loss(
        logp.tolist(),
        old.tolist(),
        adv.tolist(),
        mask.tolist(),
        0.2,
        0.28,
        loss_type,
        6,
        ref.tolist(),
        beta,
    )
    assert loss.item() == pytest.approx(expected, rel=1e-9)
    clipped = [
        ((r < 0.8 and a < 0) or (r > 1.28 and a > 0))
        for b, a in enumerate(adv.tolist())
        for r, m in zip((logp[b] - old[b]).exp().tolist(), mask[b].tolist())
        if m
    ]
    assert stats["clipfrac"].item() == pytest.approx(sum(clipped) / len(clipped))


def test_the_three_normalisations_differ_as_the_papers_say(grpo):
    """One long and one short completion with the same advantage: per sequence, the short one's
    tokens weigh more; per token (DAPO) all tokens weigh the same; Dr. GRPO: a constant."""
    logp = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    grads = {}
    for loss_type in ("grpo", "token", "dr_grpo"):
        loss, _ = grpo.clipped_loss(
            logp, logp.detach(), torch.ones(2), mask, 0.2, 0.2, loss_type, 4
        )
        (grads[loss_type],) = torch.autograd.grad(loss, logp)
    assert grads["grpo"][0, 0].item() == pytest.approx(-1 / 8)
    assert grads["grpo"][1, 0].item() == pytest.approx(-1 / 2)
    assert torch.allclose(grads["token"][mask.bool()], torch.full((5,), -1 / 5))
    assert torch.allclose(grads["dr_grpo"][mask.bool()], torch.full((5,), -1 / 8))
    assert all((g[~mask.bool()] == 0).all() for g in grads.values())


def left_padded(grpo, tokenizer, prompts):
    return grpo.encode_prompts(tokenizer, prompts, "cpu")


def test_sampling_log_probs_equal_a_forward_pass(grpo, base):
    policy, tokenizer = base
    ids, mask = left_padded(grpo, tokenizer, ["1+2=", "123+456=", "99+1=", "5+5="] * 4)
    torch.manual_seed(0)
    completions, c_mask, sampled = policy.generate(ids, mask, 5, temperature=1.3)
    full = torch.cat([ids, completions], 1)
    recomputed, _, _ = policy.token_logprobs(full, torch.cat([mask, c_mask], 1), ids.shape[1], 1.3)
    assert c_mask.sum() > len(ids) and (c_mask == 0).any(), "some completions end early"
    assert torch.allclose(recomputed * c_mask, sampled, atol=1e-5)
    greedy, _, _ = policy.generate(ids, mask, 5, greedy=True)
    assert torch.equal(greedy[:4], greedy[4:8]), "greedy is deterministic"


def test_prompt_and_padding_tokens_get_no_gradient(grpo, base):
    policy, tokenizer = base
    policy = grpo.copy.deepcopy(policy)
    ids, mask = left_padded(grpo, tokenizer, ["1+2=", "123+456=", "99+1="] * 2)
    torch.manual_seed(1)
    completions, c_mask, old = policy.generate(ids, mask, 5)
    states = {}

    def keep(module, inputs, output):  # the last layer's states, which the output layer reads
        output.retain_grad()
        states["last"] = output

    hook = policy.lm.get_decoder().norm.register_forward_hook(keep)
    full = torch.cat([ids, completions], 1)
    logp, _, _ = policy.token_logprobs(full, torch.cat([mask, c_mask], 1), ids.shape[1])
    hook.remove()
    loss, _ = grpo.clipped_loss(logp, old, torch.randn(len(ids)), c_mask, 0.2, 0.2, "token", 5)
    loss.backward()
    grad = states["last"].grad.abs().sum(-1)  # (B, prompt + completion) positions
    n = ids.shape[1]
    scored = torch.zeros_like(grad, dtype=torch.bool)
    scored[:, n - 1 : -1] = c_mask.bool()  # position t predicts token t + 1
    assert (grad[~scored] == 0).all(), "a prompt or padding position received gradient"
    assert (grad[scored] > 0).all()


def test_keep_groups_drops_groups_and_fills_the_batch(grpo):
    def fake(first):
        rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]) + first
        return {"x": torch.arange(6) + 10 * first, "rewards": rewards}

    rounds = [(fake(0), torch.tensor([False, True, False])), (fake(1), torch.tensor([True] * 3))]
    batch = grpo.keep_groups(rounds, 2, 2)
    assert batch["x"].tolist() == [2, 3, 10, 11]
    assert batch["rewards"].tolist() == [[0.0, 1.0], [2.0, 2.0]]


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--group-size", "1"], "--group-size 1"),
        (["--model", "/nonexistent/model"], "no such folder"),
        (["--max-new-tokens", "30"], "context of 32"),
    ],
)
def test_bad_input_is_one_line(flags, expected, tmp_path):
    assert expected in one_error_line("grpo_lm.py", flags, tmp_path / "run")


def test_a_model_that_names_no_end_token_is_refused(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(BASE, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("eos_token")  # (the pad token is also in tokenizer.json's padding settings)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    generation = json.loads((model / "generation_config.json").read_text())
    generation.pop("eos_token_id")
    (model / "generation_config.json").write_text(json.dumps(generation))
    out = run_script("grpo_lm.py", ["--model", str(model)], tmp_path / "run", fork=True)
    assert out.returncode == 2 and "names an end (eos) token" in out.stderr, out.stderr
    assert not (tmp_path / "run").exists()


def test_dapo_run_leaves_the_contract_resumes_and_saves(grpo, tmp_path):
    flags = SMOKE["grpo_lm.py"] + [
        "--clip-eps-high",
        "0.28",
        "--loss-type",
        "token",
        "--dynamic-sampling",
        "--mask-truncated",
        "--beta",
        "0.04",
        "--update-epochs",
        "2",
        "--num-minibatches",
        "2",
        "--eval-every",
        "16",
        "--save-model",
    ]
    run_dir = tmp_path / "run"
    out = run_script("grpo_lm.py", flags, run_dir, fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = read_metrics(run_dir)
    for name in (
        "eval/accuracy",
        "eval/reward",
        "eval/episodic_return",
        "train/episodic_return",
        "train/episodic_length",
        "losses/policy_loss",
        "losses/kl",
        "losses/clipfrac",
        "losses/entropy",
        "charts/tokens_per_s",
        "charts/generation_tokens_per_s",
        "charts/update_tokens_per_s",
        "charts/kept_groups",
        "charts/sps",
    ):
        assert name in metrics, name
    steps, accuracy = metrics["eval/accuracy"]
    assert steps.tolist() == [0, 16, 32], "evaluated first, every --eval-every and at the end"
    policy, tokenizer = grpo.load_policy(str(run_dir / "model"))
    assert (run_dir / "model" / "task.json").read_bytes() == (BASE / "task.json").read_bytes()
    heldout = load_task(BASE / "task.json")["heldout"][:20]
    final = metrics["eval/episodic_return"][1][-20:].tolist()
    task = load_task(BASE / "task.json")
    assert grpo.evaluate(policy, tokenizer, heldout, task, 5) == {"eval/episodic_return": final}
    out = run_script("grpo_lm.py", ["--resume", str(run_dir), "--total-timesteps", "48"], fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = read_rows(run_dir)
    assert max(r["global_step"] for r in rows) == 48
    assert [r["global_step"] for r in rows] == sorted(r["global_step"] for r in rows)


def small_task(**change) -> dict:
    task = json.loads((BASE / "task.json").read_text())
    task = {**task, "train": task["train"][:50], "heldout": task["heldout"][:20]}
    return {**task, **change}


# task files that were read as if they were right, or failed with a traceback after the run folder
# was written: each is now one error line before anything is written
BAD_TASKS = {
    "empty": ({}, "task name"),
    "budget 0": (small_task(max_new_tokens=0), "max_new_tokens 0"),
    "budget -1": (small_task(max_new_tokens=-1), "max_new_tokens -1"),
    "budget 2.5": (small_task(max_new_tokens=2.5), "max_new_tokens 2.5"),
    "no train prompts": (small_task(train=[]), "no train prompts"),
    "no held-out prompts": (small_task(heldout=[]), "no heldout prompts"),
    "answers as numbers": (small_task(train=[["321+654=", 975]]), "the answer a string"),
    "a character the tokenizer lacks": (small_task(train=[["321+654=", "97x"]]), "cannot write"),
}


@pytest.mark.parametrize("case", sorted(BAD_TASKS))
def test_a_bad_task_file_is_one_line_before_anything_is_written(case, tmp_path):
    task, expected = BAD_TASKS[case]
    path = tmp_path / "task.json"
    path.write_text(json.dumps(task))
    line = one_error_line("grpo_lm.py", ["--task", str(path)], tmp_path / "run")
    assert line.startswith(f"error: task file {path}") and expected in line, line


def test_more_evaluation_prompts_than_the_task_holds_is_refused(tmp_path):
    line = one_error_line("grpo_lm.py", ["--eval-prompts", "100000"], tmp_path / "run")
    assert "--eval-prompts 100000 exceeds the 500 held-out prompts" in line


def test_a_hub_id_with_no_copy_here_and_no_hub_is_one_line_in_seconds(tmp_path):
    """transformers retries the hub for about a minute; with HF_HUB_OFFLINE, or a hub that cannot
    be reached (this machine reaches none), the id is refused at once."""
    import time

    start = time.time()
    out = run_script(
        "grpo_lm.py",
        ["--model", "someone/no-such-model"],
        tmp_path / "run",
        fork=True,
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
    )
    assert out.returncode == 2 and out.stderr.startswith("error: --model someone/no-such-model")
    assert "HF_HUB_OFFLINE" in out.stderr and time.time() - start < 60
    assert not (tmp_path / "run").exists()


def test_weights_that_are_not_plain_tensors_are_one_plain_line(tmp_path):
    """A model folder whose pytorch_model.bin pickles an object: transformers reads it with
    torch.load(weights_only=True), which refuses it with a message in terminal bold; the error line
    carries no escape code and nothing of the file runs."""
    import argparse

    model = tmp_path / "model"
    shutil.copytree(BASE, model)
    (model / "model.safetensors").unlink()
    torch.save({"w": argparse.Namespace(a=1)}, model / "pytorch_model.bin")
    line = one_error_line("grpo_lm.py", ["--model", str(model)], tmp_path / "run")
    assert line.startswith(f"error: --model {model} does not load (UnpicklingError"), line
    assert "\x1b" not in line
