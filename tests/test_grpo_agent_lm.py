"""grpo_agent_lm.py: the calculator's grammar against an evaluation written apart from it, the turn
reader, multi-turn rollouts of a scripted policy (the tool's result fed in after a call, calls
counted, malformed calls, calls past the limit and unclosed calls scored 0 and counted), the tool's
tokens getting exactly no gradient, the log-probabilities of sampling and of the loss equal to a
forward pass over the whole interleaved sequence, and its bad input."""

import random
from types import SimpleNamespace

import pytest
import torch
from conftest import changed_json, one_error_line

from benchmark.runs import ALGOS, load_script
from canonrl.lm import load_task

BASE = ALGOS.parent / "benchmark" / "policies" / "lm-calc-base"


@pytest.fixture(scope="module")
def agent():
    torch.set_num_threads(1)
    return load_script("grpo_agent_lm.py")


@pytest.fixture(scope="module")
def base(agent):
    policy, tokenizer = agent.load_policy(str(BASE))
    task = load_task(BASE / "task.json")
    return policy, tokenizer, task, agent.task_tool(task)


def expected_value(numbers: list[int], ops: list[str]) -> int:
    """The value by the usual precedence, worked out apart from calculate: the products first, in
    a list of signed terms, then their sum."""
    terms, signs = [numbers[0]], [1]
    for op, n in zip(ops, numbers[1:]):
        if op == "*":
            terms[-1] *= n
        else:
            terms.append(n)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms))


def test_calculate_follows_the_grammar_and_refuses_everything_else(agent):
    rng = random.Random(0)
    for _ in range(2000):
        k = rng.randint(1, 8)
        numbers = [rng.randint(0, 10 ** rng.randint(1, 6)) for _ in range(k)]
        ops = [rng.choice("+-*") for _ in range(k - 1)]
        text = str(numbers[0]) + "".join(o + str(n) for o, n in zip(ops, numbers[1:]))
        assert agent.calculate(text) == expected_value(numbers, ops), text
    assert agent.calculate("12*34") == 408 and agent.calculate(" 1 + 2 * 3 ") == 7
    assert agent.calculate("2-3*4") == -10 and agent.calculate("007") == 7
    for bad in (
        "",
        "+1",
        "1+",
        "1**2",
        "2*(3)",
        "1/2",
        "1.5",
        "1e3",
        "0x10",
        "9" * 13,
        "+".join(["1"] * 9),
        "__import__('os').system('echo hi')",
        "-1",
    ):
        assert agent.calculate(bad) is None, bad


def test_read_turn(agent):
    tool = agent.Tool(("<calc>", "</calc>"), ("<r>", "</r>"), 2)
    assert tool.read_turn("40") == ("text", None)
    assert tool.read_turn("<calc>12*3") == ("open", None)
    assert tool.read_turn("<calc>12*34</calc>") == ("call", 408)
    assert tool.read_turn("9<calc>1+1</calc>") == ("call", 2)
    assert tool.read_turn("<calc>12**34</calc>") == ("malformed", None)
    assert tool.read_turn("12</calc>") == ("malformed", None)
    assert tool.result_text(408) == "<r>408</r>"


class Scripted(torch.nn.Module):
    """A policy that writes a fixed token sequence per row, one token a step whatever it is fed:
    where the tool's tokens are fed in, the script's tokens at those steps are ignored, so a
    script leaves room for them ("=" per token of the result)."""

    def __init__(self, tokenizer, texts: list[str]):
        super().__init__()
        eos = tokenizer.eos_token_id
        self.rows = [tokenizer.encode(t, add_special_tokens=False) + [eos] for t in texts]
        self.vocab, self.step = len(tokenizer), 0
        self.pad_id, self.end_ids = tokenizer.pad_token_id, [eos]

    def forward(self, ids, mask, past_key_values=None, positions=None):
        logits = torch.full((len(ids), 1, self.vocab), -1e9)
        for i, row in enumerate(self.rows):
            logits[i, 0, row[min(self.step, len(row) - 1)]] = 0.0
        self.step += 1
        return SimpleNamespace(logits=logits)


def scripted_rollout(agent, base, texts, max_calls=2, budget=24):
    _, tokenizer, _, _ = base
    tool = agent.Tool(("<calc>", "</calc>"), ("<r>", "</r>"), max_calls)
    ids, mask = agent.encode_prompts(tokenizer, ["12*34="] * len(texts), "cpu")
    policy = Scripted(tokenizer, texts)
    return tokenizer, agent.rollout(policy, tokenizer, tool, ids, mask, budget, greedy=True)


def test_rollouts_feed_the_result_count_calls_and_score_failures_zero(agent, base):
    texts = [
        "<calc>12*34</calc>=====408",  # a call (its result: 5 tokens), then the answer
        "408",  # a direct answer
        "<calc>12**34</calc>",  # a call that does not parse
        "12</calc>",  # a close with no call opened
        "<calc>12*3",  # the end token inside a call
        "<calc>" + "1" * 30,  # a call never closed: out of tokens
        "<calc>1+1</calc>===<calc>2+2</calc>===<calc>3+3</calc>===6",  # a third call, past 2
        "<calc>1+1</calc>===<calc>2+2</calc>===4",  # two calls: within the limit
    ]
    tokenizer, (tokens, mask, own, logp, info) = scripted_rollout(agent, base, texts)
    assert info["answer"] == ["408", "408", None, None, None, None, None, "4"]
    assert info["calls"] == [1, 0, 0, 0, 0, 0, 2, 2]
    assert info["malformed"] == [0, 0, 1, 1, 1, 1, 0, 0]
    assert info["over_limit"] == [0, 0, 0, 0, 0, 0, 1, 0]
    assert info["truncated"] == [0, 0, 0, 0, 0, 1, 0, 0]
    assert info["turns"] == [2, 1, 1, 1, 1, 1, 3, 3]
    # the trajectories as the model reads them: the tool's results in place of the "=" steps
    text = [tokenizer.decode(t[m.bool()]) for t, m in zip(tokens, mask)]
    assert text[0] == "<calc>12*34</calc><r>408</r>408<eos>"
    assert text[2] == "<calc>12**34</calc>"  # it ends where the malformed call closed
    assert text[7] == "<calc>1+1</calc><r>2</r><calc>2+2</calc><r>4</r>4<eos>"
    # the tool's tokens: in the trajectory, not the model's, log-probability 0
    tool_tokens = (mask - own).bool()
    assert tokenizer.decode(tokens[0][tool_tokens[0]]) == "<r>408</r>"
    assert int(tool_tokens[1].sum()) == 0 and (logp[tool_tokens] == 0).all()
    assert (own <= mask).all() and int(mask[5].sum()) == 24
    scores = agent.score(info["answer"], [("408", None)] * 7 + [("5", None)], {})
    assert scores["total"] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    stats = agent.trajectory_stats(info, mask, own)
    assert stats["tool_call"] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    assert stats["masked_tokens"][0] == 5.0 and stats["masked_tokens"][7] == 6.0
    assert stats["generated_tokens"][0] == float(mask[0].sum() - 5)


def sampled_batch(agent, base, n_prompts=8, group=8, seed=3):
    policy, tokenizer, task, tool = base
    torch.manual_seed(seed)
    prompts = [x[0] for x in task["heldout"][:n_prompts] for _ in range(group)]
    ids, mask = agent.encode_prompts(tokenizer, prompts, "cpu")
    tokens, c_mask, own, logp, info = agent.rollout(
        policy, tokenizer, tool, ids, mask, task["max_new_tokens"]
    )
    full_ids = torch.cat([ids, tokens], 1)
    full_mask = torch.cat([mask, c_mask], 1)
    return policy, full_ids, full_mask, ids.shape[1], own, logp, info


def test_the_loss_reads_one_pass_over_the_interleaved_sequence(agent, base):
    """The log-probabilities at sampling (KV cache, the tool's tokens fed in turn by turn) are
    those of one forward pass over the whole trajectory, and so are those the loss reads."""
    policy, full_ids, full_mask, n_prompt, own, logp, info = sampled_batch(agent, base)
    assert sum(info["calls"]) > 0, "the sample must hold calls for the test to mean anything"
    with torch.no_grad():
        loss_logp, _, _ = policy.token_logprobs(full_ids, full_mask, n_prompt)
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
        logits = policy.lm(
            input_ids=full_ids, attention_mask=full_mask, position_ids=positions
        ).logits
        plain = logits[:, n_prompt - 1 : -1].log_softmax(-1)
        plain = plain.gather(-1, full_ids[:, n_prompt:, None]).squeeze(-1)
    mine = own.bool()
    assert torch.allclose(loss_logp[mine], plain[mine], atol=1e-5)
    assert torch.allclose(logp[mine], plain[mine], atol=1e-4)


def test_the_tools_tokens_get_exactly_no_gradient(agent, base):
    policy, full_ids, full_mask, n_prompt, own, logp, info = sampled_batch(agent, base, seed=4)
    tool_tokens = (full_mask[:, n_prompt:] - own).bool()
    assert tool_tokens.any()
    rewards = torch.tensor([float(a is not None) for a in info["answer"]]).view(-1, 8)
    rewards[:, 0] = 1 - rewards[:, 0]  # no group of equal rewards: every row has an advantage
    advantages = agent.group_advantages(rewards).flatten()
    for loss_type in ("grpo", "token", "dr_grpo"):
        new_logp, _, _ = policy.token_logprobs(full_ids, full_mask, n_prompt)
        new_logp.retain_grad()
        loss, _ = agent.clipped_loss(
            new_logp, logp, advantages, own, 0.2, 0.2, loss_type, full_ids.shape[1] - n_prompt
        )
        loss.backward()
        grad = new_logp.grad
        assert (grad[tool_tokens] == 0).all(), loss_type
        assert (grad[own.bool()] != 0).sum() > 0.9 * own.sum(), loss_type
        policy.zero_grad()


@pytest.mark.parametrize(
    "change, flags, expected",
    [
        (lambda t: t.pop("tool"), [], "describes no tool"),
        (
            lambda t: t["tool"].update(call=["[[", "]]"]),
            [],
            "cannot write the tool's syntax",
        ),
        (lambda t: t["tool"].update(max_calls=0), [], "allows max_calls 0"),
        (None, ["--max-calls", "0"], "--max-calls 0"),
    ],
)
def test_bad_tool_input_is_one_line_before_anything_is_written(tmp_path, change, flags, expected):
    if change is not None:
        flags = ["--task", changed_json(BASE / "task.json", tmp_path, change)]
    assert expected in one_error_line("grpo_agent_lm.py", flags, tmp_path / "run")


def test_it_refuses_torchrun_in_one_line(agent, monkeypatch, capsys):
    for name, value in (("WORLD_SIZE", "2"), ("RANK", "0"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as e:
        agent.check_flags(agent.Args())
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and "without torchrun" in lines[0]


def test_the_task_sets_are_disjoint_and_the_base_learns_no_result_tokens():
    from benchmark import agent_task

    train, heldout = agent_task.problem_sets()
    assert (len(train), len(heldout)) == (7113, 500)
    pairs = [{tuple(sorted(map(int, p[:-1].split("*")))) for p, _ in s} for s in (train, heldout)]
    assert not pairs[0] & pairs[1], "no held-out problem in either order among the train ones"
    assert all(int(a) == int(p[:-1].split("*")[0]) * int(p[:-1].split("*")[1]) for p, a in train)
    assert load_task(BASE / "task.json")["heldout"] == heldout  # the committed task is this one
    tokenizer = agent_task.make_tokenizer()
    ids, labels = agent_task.sft_example(tokenizer, "47*63=", "2961", use_tool=True)
    assert tokenizer.decode(ids) == "47*63=<calc>47*63</calc><r>2961</r>2961<eos>"
    learned = tokenizer.decode([t for t, y in zip(ids, labels) if y != -100])
    assert learned == "<calc>47*63</calc>2961<eos>", "no loss on the prompt or the tool's result"


def test_the_task_maker_never_writes_into_a_folder_that_holds_files(tmp_path, capsys):
    from benchmark import agent_task

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as e:
        agent_task.main(["--out", str(tmp_path)])
    assert e.value.code == 2 and "not an empty directory" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "mine"
