"""ppo_lm.py: the per-token rewards, token-level GAE and the clipped policy and value losses against
Python loops, advantage whitening, values read where each token is predicted, no gradient through
prompt or padding tokens, its bad input, and a run that leaves the run contract, resumes and saves
a from_pretrained directory."""

import math

import pytest
import torch
from conftest import SMOKE, one_error_line

from benchmark.runs import ALGOS, load_script, read_metrics, read_rows, run_script
from canonrl.lm import load_task

BASE = ALGOS.parent / "benchmark" / "policies" / "lm-addition-base"


@pytest.fixture(scope="module")
def ppo():
    torch.set_num_threads(1)
    return load_script("ppo_lm.py")


def batch(seed=2):
    gen = torch.Generator().manual_seed(seed)
    lengths = [5, 2, 1, 4]
    mask = torch.tensor([[1.0] * n + [0.0] * (5 - n) for n in lengths], dtype=torch.float64)
    rand = [torch.randn(4, 5, generator=gen, dtype=torch.float64) for _ in range(4)]
    return mask, *rand


def test_token_rewards_are_the_kl_penalty_and_the_score_at_the_end(ppo):
    mask, logp, ref, _, _ = batch()
    score = torch.tensor([1.0, 0.0, 1.0, 0.5], dtype=torch.float64)
    got = ppo.token_rewards(score, logp, ref, mask, 0.05)
    for b in range(4):
        last = int(mask[b].sum()) - 1
        for t in range(5):
            expected = -0.05 * (logp[b, t] - ref[b, t]).item() if mask[b, t] else 0.0
            expected += score[b].item() if t == last else 0.0
            assert got[b, t].item() == pytest.approx(expected, abs=1e-12)


def test_token_gae_by_brute_force(ppo):
    mask, rewards, values, _, _ = batch()
    rewards, values = rewards * mask, values * mask
    gamma, lam = 0.9, 0.8
    advantages, returns = ppo.token_gae(rewards, values, mask, gamma, lam)
    for b in range(4):
        n = int(mask[b].sum())
        v = values[b].tolist()[:n] + [0.0]  # no value after the last token
        deltas = [rewards[b, t].item() + gamma * v[t + 1] - v[t] for t in range(n)]
        for t in range(5):
            expected = (
                sum((gamma * lam) ** (k - t) * deltas[k] for k in range(t, n)) if t < n else 0.0
            )
            assert advantages[b, t].item() == pytest.approx(expected, abs=1e-12)
            assert returns[b, t].item() == pytest.approx(expected + values[b, t].item())
    one, _ = ppo.token_gae(rewards, values, mask, 1.0, 1.0)
    for b in range(4):  # gamma = lambda = 1: the sum of the rewards to come minus the value
        n = int(mask[b].sum())
        for t in range(n):
            expected = rewards[b, t:n].sum().item() - values[b, t].item()
            assert one[b, t].item() == pytest.approx(expected, abs=1e-12)


def test_ppo_loss_against_a_token_loop(ppo):
    mask, logp, old, adv, returns = batch(5)
    old = logp + 0.3 * old  # ratios about 0.7-1.4
    values, old_values = returns + 0.5, returns - 0.1
    for clip_vloss in (True, False):
        pl, vl, stats = ppo.ppo_loss(
            logp, old, adv, values, old_values, returns, mask, 0.2, clip_vloss
        )
        p_terms, v_terms, clipped = [], [], []
        for b in range(4):
            for t in range(5):
                if not mask[b, t]:
                    continue
                r = math.exp(logp[b, t].item() - old[b, t].item())
                a = adv[b, t].item()
                p_terms.append(max(-a * r, -a * min(max(r, 0.8), 1.2)))
                clipped.append(abs(r - 1) > 0.2)
                v, ov, ret = values[b, t].item(), old_values[b, t].item(), returns[b, t].item()
                term = (v - ret) ** 2
                if clip_vloss:
                    term = max(term, (ov + min(max(v - ov, -0.2), 0.2) - ret) ** 2)
                v_terms.append(term)
        assert pl.item() == pytest.approx(sum(p_terms) / len(p_terms), rel=1e-12)
        assert vl.item() == pytest.approx(0.5 * sum(v_terms) / len(v_terms), rel=1e-12)
        assert stats["clipfrac"].item() == pytest.approx(sum(clipped) / len(clipped))


def test_whitening_uses_the_completion_tokens_only(ppo):
    mask, x, _, _, _ = batch()
    got = ppo.masked_whiten(x, mask)
    real = got[mask.bool()]
    assert real.mean().item() == pytest.approx(0.0, abs=1e-12)
    assert real.std().item() == pytest.approx(1.0, abs=1e-6)
    assert (got[~mask.bool()] == 0).all()


def test_values_are_read_where_each_token_is_predicted_and_prompts_get_no_gradient(ppo):
    policy, tokenizer = ppo.load_policy(str(BASE))
    head = ppo.ValueHead(policy.lm.config.hidden_size)
    torch.nn.init.normal_(head.linear.weight)
    ids, mask = ppo.encode_prompts(tokenizer, ["1+2=", "123+456=", "99+1="], "cpu")
    torch.manual_seed(0)
    completions, c_mask, _ = policy.generate(ids, mask, 5)
    full, full_mask = torch.cat([ids, completions], 1), torch.cat([mask, c_mask], 1)
    n = ids.shape[1]
    logp, _, hidden = policy.token_logprobs(full, full_mask, n)
    values = head(hidden)
    for b in range(3):  # V at token t: the state after the prompt and tokens before t, alone
        for t in range(int(c_mask[b].sum())):
            prefix = full[b][full_mask[b].bool()][: int(mask[b].sum()) + t]
            states = policy.lm(input_ids=prefix[None], output_hidden_states=True).hidden_states
            assert values[b, t].item() == pytest.approx(head(states[-1][0, -1]).item(), abs=1e-4)
    states = {}

    def keep(module, inputs, output):  # the last layer's states, which the output layer reads
        output.retain_grad()
        states["last"] = output

    hook = policy.lm.get_decoder().norm.register_forward_hook(keep)
    logp, _, hidden = policy.token_logprobs(full, full_mask, n)
    hook.remove()
    c = c_mask.double()
    adv = torch.randn(3, 5, dtype=torch.float64)
    pl, vl, _ = ppo.ppo_loss(logp, logp.detach(), adv, head(hidden), 0, 1.0, c, 0.2, False)
    pl.backward()
    grad = states["last"].grad.abs().sum(-1)
    scored = torch.zeros_like(grad, dtype=torch.bool)
    scored[:, n - 1 : -1] = c_mask.bool()
    assert (grad[~scored] == 0).all(), "a prompt or padding position received gradient"


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--num-minibatches", "3"], "does not divide --num-prompts 128"),
        (["--gae-lambda", "1.5"], "--gae-lambda 1.5"),
        (["--num-prompts", "30000", "--total-timesteps", "30000"], "exceeds the 20000 train"),
        (["--model", "/nonexistent/model"], "no such folder"),
    ],
)
def test_bad_input_is_one_line(flags, expected, tmp_path):
    assert expected in one_error_line("ppo_lm.py", flags, tmp_path / "run")


def test_run_leaves_the_contract_resumes_and_saves(ppo, tmp_path):
    flags = SMOKE["ppo_lm.py"] + ["--eval-every", "32", "--save-model"]
    run_dir = tmp_path / "run"
    out = run_script("ppo_lm.py", flags, run_dir, fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = read_metrics(run_dir)
    for name in (
        "eval/accuracy",
        "eval/reward",
        "train/episodic_return",
        "train/episodic_length",
        "losses/policy_loss",
        "losses/value_loss",
        "losses/kl",
        "losses/clipfrac",
        "losses/approx_kl",
        "losses/entropy",
        "charts/tokens_per_s",
        "charts/generation_tokens_per_s",
        "charts/update_tokens_per_s",
        "charts/sps",
    ):
        assert name in metrics, name
    steps, _ = metrics["eval/accuracy"]
    assert steps.tolist() == [0, 32, 64], "evaluated first, every --eval-every and at the end"
    assert metrics["losses/kl"][1][0] == pytest.approx(0.0, abs=1e-6), "the first batch: the base"
    policy, tokenizer = ppo.load_policy(str(run_dir / "model"))
    heldout = load_task(BASE / "task.json")["heldout"][:20]
    final = metrics["eval/episodic_return"][1][-20:].tolist()
    task = load_task(BASE / "task.json")
    assert ppo.evaluate(policy, tokenizer, heldout, task, 5) == {"eval/episodic_return": final}
    out = run_script("ppo_lm.py", ["--resume", str(run_dir), "--total-timesteps", "96"], fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = read_rows(run_dir)
    assert max(r["global_step"] for r in rows) == 96
    assert [r["global_step"] for r in rows] == sorted(r["global_step"] for r in rows)
