"""dpo_lm.py: its loss against the formula, the pairs' tokens and log-probabilities against one
unpadded forward pass per completion, no gradient through prompt or padding tokens, the order of
the pairs across epochs, the committed preference file, its bad input, and a run that leaves the
run contract, resumes and saves a from_pretrained directory."""

import json
import math
import shutil

import pytest
import torch
from conftest import SMOKE, changed_json, one_error_line

from benchmark.runs import ALGOS, load_script, read_metrics, read_rows, run_script
from canonrl.lm import load_task
from canonrl.run import sha256

BASE = ALGOS.parent / "benchmark" / "policies" / "lm-addition-base"
PAIRS = [["321+654=", "975", "976"], ["1+2=", "3", "12"], ["99+1=", "001", "1"]]


@pytest.fixture(scope="module")
def dpo():
    torch.set_num_threads(1)
    return load_script("dpo_lm.py")


@pytest.fixture(scope="module")
def base(dpo):
    return dpo.load_policy(str(BASE))


def test_dpo_loss_is_the_formula(dpo):
    gen = torch.Generator().manual_seed(3)
    chosen, rejected, ref_c, ref_r = (
        -torch.rand(6, generator=gen, dtype=torch.float64) * 5 for _ in range(4)
    )
    beta = 0.7
    loss, stats = dpo.dpo_loss(chosen, rejected, ref_c, ref_r, beta)
    margins = [
        beta * ((c - rc) - (r - rr))
        for c, r, rc, rr in zip(chosen.tolist(), rejected.tolist(), ref_c.tolist(), ref_r.tolist())
    ]
    expected = sum(-math.log(1 / (1 + math.exp(-m))) for m in margins) / len(margins)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert stats["reward_margin"].item() == pytest.approx(sum(margins) / 6)
    assert stats["reward_accuracy"].item() == pytest.approx(sum(m > 0 for m in margins) / 6)
    assert stats["chosen_reward"].item() == pytest.approx(beta * (chosen - ref_c).mean().item())
    equal, _ = dpo.dpo_loss(chosen, rejected, chosen, rejected, beta)
    assert equal.item() == pytest.approx(math.log(2)), "the policy at the reference: log 2"


def test_pair_log_probs_equal_one_unpadded_pass_per_completion(dpo, base):
    policy, tokenizer = base
    ids, mask, n_prompt = dpo.encode_pairs(policy, tokenizer, PAIRS, 5, "cpu")
    assert ids.shape == (6, n_prompt + 5)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    completions = [c for _, c, _ in PAIRS] + [r for _, _, r in PAIRS]
    for row, text in zip(ids[:, n_prompt:].tolist(), completions):
        tokens = tokenizer.encode(text, add_special_tokens=False) + [eos]
        assert row == tokens + [pad] * (5 - len(tokens))
    logp, _, _ = policy.token_logprobs(ids, mask, n_prompt)
    summed = (logp * mask[:, n_prompt:]).sum(1)
    prompts = [p for p, _, _ in PAIRS] * 2
    for i, (prompt, text) in enumerate(zip(prompts, completions)):
        p = tokenizer.encode(prompt, add_special_tokens=False)
        c = tokenizer.encode(text, add_special_tokens=False) + [eos]
        alone = torch.tensor([p + c])
        logits = policy.lm(input_ids=alone).logits[0, len(p) - 1 : -1].log_softmax(-1)
        expected = logits.gather(-1, torch.tensor(c)[:, None]).sum()
        assert summed[i].item() == pytest.approx(expected.item(), abs=1e-4)


def test_prompt_and_padding_tokens_get_no_gradient(dpo, base):
    policy, tokenizer = base
    policy = dpo.copy.deepcopy(policy)
    ids, mask, n_prompt = dpo.encode_pairs(policy, tokenizer, PAIRS, 5, "cpu")
    states = {}

    def keep(module, inputs, output):  # the last layer's states, which the output layer reads
        output.retain_grad()
        states["last"] = output

    hook = policy.lm.get_decoder().norm.register_forward_hook(keep)
    logp, _, _ = policy.token_logprobs(ids, mask, n_prompt)
    hook.remove()
    c_mask = mask[:, n_prompt:]
    seq = (logp * c_mask).sum(1)
    loss, _ = dpo.dpo_loss(seq[:3], seq[3:], seq[:3].detach() + 1, seq[3:].detach(), 0.5)
    loss.backward()
    grad = states["last"].grad.abs().sum(-1)
    scored = torch.zeros_like(grad, dtype=torch.bool)
    scored[:, n_prompt - 1 : -1] = c_mask.bool()  # position t predicts token t + 1
    assert (grad[~scored] == 0).all(), "a prompt or padding position received gradient"
    assert (grad[scored] > 0).all()


def test_every_epoch_trains_on_every_pair_once(dpo):
    n, batch = 10, 4
    stream = [i for first in range(0, 40, batch) for i in dpo.pair_indices(5, first, batch, n)]
    epochs = [stream[e * n : (e + 1) * n] for e in range(4)]
    assert all(sorted(e) == list(range(n)) for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1, "each epoch in its own order"
    assert dpo.pair_indices(5, 12, 6, n) == stream[12:18], "a resumed run continues the stream"


def test_the_committed_pairs_are_the_base_models_and_right(dpo):
    prefs = json.loads((BASE / "preferences.json").read_text())
    task = load_task(BASE / "task.json")
    answers = dict(task["train"])
    assert prefs["task"] == task["name"] and len(prefs["pairs"]) > 5000
    assert all(answers[p] == c and answers[p] != r for p, c, r in prefs["pairs"])
    assert prefs["model_sha256"] == sha256(BASE / "model.safetensors")


@pytest.mark.parametrize(
    "change,expected",
    [
        (lambda p: p.update(task="countdown-v0"), "of task 'countdown-v0'"),
        (lambda p: p["pairs"].append(["111+111=", "222", "2"]), "not train prompts"),
        (lambda p: p.update(pairs=[]), "holds no pairs"),
        (lambda p: p["pairs"].append(["111+111=", 222, 3]), "holds no pairs"),
        (lambda p: p["pairs"][0].__setitem__(2, "123456"), "over --max-new-tokens"),
        (lambda p: p.pop("pairs"), "cannot be read"),
    ],
)
def test_a_wrong_preference_file_is_one_line(change, expected, tmp_path):
    flags = ["--preferences", changed_json(BASE / "preferences.json", tmp_path, change)]
    assert expected in one_error_line("dpo_lm.py", flags, tmp_path / "run")


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--beta", "0"], "--beta 0"),
        (["--batch-size", "32", "--total-timesteps", "16"], "less than one update"),
        (["--preferences", "/nonexistent.json"], "cannot be read"),
    ],
)
def test_bad_input_is_one_line(flags, expected, tmp_path):
    assert expected in one_error_line("dpo_lm.py", flags, tmp_path / "run")


def test_a_model_with_damaged_weights_is_one_line(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(BASE, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100_000])  # a truncated download
    assert "does not load" in one_error_line("dpo_lm.py", ["--model", str(model)], tmp_path / "run")


def test_run_leaves_the_contract_resumes_and_saves(dpo, tmp_path):
    flags = SMOKE["dpo_lm.py"] + ["--eval-every", "32", "--save-model"]
    run_dir = tmp_path / "run"
    out = run_script("dpo_lm.py", flags, run_dir, fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = read_metrics(run_dir)
    for name in (
        "eval/accuracy",
        "eval/reward",
        "eval/episodic_return",
        "train/episodic_length",
        "losses/policy_loss",
        "losses/chosen_reward",
        "losses/rejected_reward",
        "losses/reward_margin",
        "losses/reward_accuracy",
        "losses/entropy",
        "charts/tokens_per_s",
        "charts/sps",
    ):
        assert name in metrics, name
    steps, _ = metrics["eval/accuracy"]
    assert steps.tolist() == [0, 32, 64], "evaluated first, every --eval-every and at the end"
    assert metrics["losses/policy_loss"][1][0] == pytest.approx(math.log(2), abs=1e-5)
    policy, tokenizer = dpo.load_policy(str(run_dir / "model"))
    heldout = load_task(BASE / "task.json")["heldout"][:20]
    final = metrics["eval/episodic_return"][1][-20:].tolist()
    task = load_task(BASE / "task.json")
    assert dpo.evaluate(policy, tokenizer, heldout, task, 5) == {"eval/episodic_return": final}
    out = run_script("dpo_lm.py", ["--resume", str(run_dir), "--total-timesteps", "96"], fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = read_rows(run_dir)
    assert max(r["global_step"] for r in rows) == 96
    assert [r["global_step"] for r in rows] == sorted(r["global_step"] for r in rows)


@pytest.mark.parametrize("case", ["chosen is rejected", "batch over the pairs"])
def test_preferences_that_cannot_train_are_refused(case, tmp_path):
    prefs = json.loads((BASE / "preferences.json").read_text())
    flags = []
    if case == "chosen is rejected":
        prefs["pairs"] = [[p, c, c] for p, c, _ in prefs["pairs"][:100]]
    else:
        flags = ["--batch-size", "100000", "--total-timesteps", "100000"]
    path = tmp_path / "prefs.json"
    path.write_text(json.dumps(prefs))
    line = one_error_line("dpo_lm.py", ["--preferences", str(path), *flags], tmp_path / "run")
    expected = "chosen is its rejected" if case == "chosen is rejected" else "exceeds the 7409"
    assert expected in line, line
