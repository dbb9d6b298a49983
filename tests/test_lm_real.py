"""The LM scripts on a model and task shaped like real ones: a randomly initialised small Qwen2 with
a byte-level BPE tokenizer that has no pad token, two end tokens (<|im_end|>, <|endoftext|>) and a
chat template with a system turn (benchmark/lm_task.py's make_tiny_qwen, built here), prompts that
are conversations, answers stated in a chain of thought ("#### 82"), several rewards; token
log-probabilities in chunks equal to the full log-softmax; micro-batches that take the same step."""

import json

import numpy as np
import pytest
import torch
import torch.nn as nn
from conftest import one_error_line

from benchmark.lm_task import make_tiny_qwen
from benchmark.runs import load_script, read_metrics, run_script


@pytest.fixture(scope="module")
def grpo():
    torch.set_num_threads(1)
    return load_script("grpo_lm.py")


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen") / "tiny-qwen2"
    make_tiny_qwen(path, seed=0)
    return path


def conversation_task(n_train=32, n_heldout=8, **extra):
    """Sums asked in a conversation with a system turn; the answer is stated after ####."""
    rng = np.random.default_rng(0)

    def pair():
        a = int(rng.integers(10, 99))
        b = int(rng.integers(10, 99))
        system = {"role": "system", "content": "Think, then give the answer as #### N."}
        return [[system, {"role": "user", "content": f"{a}+{b}"}], str(a + b)]

    task = {
        "name": "sums-chat",
        "max_new_tokens": 12,
        "train": [pair() for _ in range(n_train)],
        "heldout": [pair() for _ in range(n_heldout)],
        "rewards": ["final_answer", "format"],
        "format": r".*#### \d+",
    }
    return {**task, **extra}


def test_a_chain_of_thought_with_the_right_final_answer_scores_1(grpo):
    gsm8k = "Natalia sold 48 clips, then 34 more: 48 + 34 = 82.\n#### 82"
    assert grpo.reward_final_answer(gsm8k, "82", {}) == 1.0
    assert grpo.reward_exact(gsm8k, "82", {}) == 0.0, "exact match scores the whole completion"
    assert grpo.reward_final_answer("so \\boxed{\\frac{1}{2}}.", "0.5", {}) == 1.0
    assert grpo.reward_final_answer("<answer> 1,000 </answer>", "1000", {}) == 1.0
    assert grpo.reward_final_answer("#### 3, no: #### 4", "4", {}) == 1.0, "the last one stated"
    assert grpo.reward_final_answer("\\boxed{x^{2}} then #### 5", "x^2", {}) == 0.0
    assert grpo.reward_final_answer("48 + 34 = 82", "82", {}) == 0.0, "no answer stated"
    assert grpo.reward_final_answer("#### 81", "82", {}) == 0.0
    assert grpo.final_answer("\\boxed{\\frac{1}{2}") is None, "an unclosed box states nothing"
    task = {"rewards": ["final_answer", "format"], "format": r".*#### \d+"}
    texts = [gsm8k, "#### 81", "\\boxed{82}", None]
    scores = grpo.score(texts, [("82", None)] * 4, task, [1.0, 0.5])
    assert scores["final_answer"] == [1.0, 0.0, 1.0, 0.0]
    assert scores["format"] == [1.0, 1.0, 0.0, 0.0], "None (no end token): 0 under every reward"
    assert scores["total"] == [1.5, 0.5, 1.0, 0.0]


def test_no_pad_token_and_two_end_tokens(grpo, qwen_dir):
    policy, tokenizer = grpo.load_policy(str(qwen_dir))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert policy.pad_id == tokenizer.eos_token_id, "padding with the end token"
    assert policy.end_ids == sorted([im_end, tokenizer.eos_token_id])
    # an output layer that always says <|im_end|>: every completion ends at its first token
    head = nn.Linear(64, policy.lm.config.vocab_size)
    nn.init.zeros_(head.weight)
    nn.init.constant_(head.bias, -10.0)
    head.bias.data[im_end] = 10.0
    policy.lm.lm_head = head
    ids, mask = grpo.encode_prompts(tokenizer, conversation_task()["heldout"][0][:1] * 3, "cpu")
    completions, c_mask, _ = policy.generate(ids, mask, 6)
    assert (completions[:, 0] == im_end).all() and c_mask.sum(1).tolist() == [1, 1, 1]
    assert grpo.completion_texts(tokenizer, completions, policy.end_ids) == [""] * 3
    eos_only = grpo.completion_texts(tokenizer, completions, [tokenizer.eos_token_id])
    assert eos_only == ["<|im_end|>"] * 3, "with <|endoftext|> alone: read as the answer's text"


def test_conversations_go_through_the_chat_template_padded_per_batch(grpo, qwen_dir):
    policy, tokenizer = grpo.load_policy(str(qwen_dir))
    short = [{"role": "user", "content": "1+2"}]
    long = [{"role": "system", "content": "Think, then answer."}, *short]
    ids, mask = grpo.encode_prompts(tokenizer, [short, long], "cpu")
    text = tokenizer.decode(ids[1][mask[1].bool()])
    assert text == (
        "<|im_start|>system\nThink, then answer.<|im_end|>\n<|im_start|>user\n1+2<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert mask[0, 0] == 0 and mask[1].all(), "padded on the left to the longer of the two"
    alone, _ = grpo.encode_prompts(tokenizer, [short], "cpu")
    assert alone.shape[1] == int(mask[0].sum()), "a batch is as wide as its own longest prompt"


def test_log_probs_in_chunks_equal_the_full_log_softmax(grpo, qwen_dir, monkeypatch):
    policy, tokenizer = grpo.load_policy(str(qwen_dir))
    prompts = [p for p, _ in conversation_task()["train"][:4]]
    ids, mask = grpo.encode_prompts(tokenizer, prompts, "cpu")
    torch.manual_seed(0)
    completions, c_mask, sampled = policy.generate(ids, mask, 12)
    full = torch.cat([ids, completions], 1)
    full_mask = torch.cat([mask, c_mask], 1)
    n = ids.shape[1]
    vocab = policy.lm.config.vocab_size
    sizes = []
    hook = policy.lm.lm_head.register_forward_hook(lambda m, i, o: sizes.append(o.numel()))
    monkeypatch.setattr(grpo, "LOGIT_CHUNK", 4 * 3 * vocab)  # 3 positions of 4 rows at a time
    logp, entropy, _ = policy.token_logprobs(full, full_mask, n)
    logp.sum().backward()
    hook.remove()
    assert max(sizes) == 4 * 3 * vocab, "no (B, T, V) logits: 3 positions at a time"
    chunked = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    logits = policy.lm(input_ids=full, attention_mask=full_mask, position_ids=positions).logits
    log_softmax = logits[:, n - 1 : -1].log_softmax(-1)
    expected = log_softmax.gather(-1, full[:, n:, None]).squeeze(-1)
    expected.sum().backward()
    assert torch.allclose(logp, expected, atol=1e-5)
    assert torch.allclose(logp * c_mask, sampled, atol=1e-5), "equal to the sampling's"
    assert not entropy.requires_grad, "the entropy is a statistic"
    assert torch.allclose(entropy, -(log_softmax.exp() * log_softmax).sum(-1).detach(), atol=1e-5)
    for a, b in zip(chunked, (p.grad for p in policy.parameters())):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("loss_type", ["grpo", "token", "dr_grpo"])
def test_micro_batches_sum_to_the_minibatch_loss(grpo, loss_type):
    torch.manual_seed(3)
    logp = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    old = logp.detach() + 0.1 * torch.randn(6, 5, dtype=torch.float64)
    ref = logp.detach() + 0.1 * torch.randn(6, 5, dtype=torch.float64)
    adv = torch.randn(6, dtype=torch.float64)
    mask = (torch.rand(6, 5) > 0.3).long()
    mask[:, 0] = 1
    args = (0.2, 0.3, loss_type, 5)
    whole, whole_stats = grpo.clipped_loss(logp, old, adv, mask, *args, ref, 0.1)
    (grad,) = torch.autograd.grad(whole, logp)
    counts = (6, mask.sum())
    total = 0.0
    stats = {}
    for rows in torch.arange(6).tensor_split(4):
        part, part_stats = grpo.clipped_loss(
            logp[rows], old[rows], adv[rows], mask[rows], *args, ref[rows], 0.1, counts
        )
        total = total + part
        stats = {k: stats.get(k, 0.0) + v for k, v in part_stats.items()}
    (summed,) = torch.autograd.grad(total, logp)
    assert total.item() == pytest.approx(whole.item(), rel=1e-12)
    assert torch.allclose(summed, grad, atol=1e-14)
    assert all(
        stats[k].item() == pytest.approx(v.item(), abs=1e-12) for k, v in whole_stats.items()
    )


def write_task(tmp_path, **extra):
    path = tmp_path / "task.json"
    path.write_text(json.dumps(conversation_task(**extra)))
    return path


def test_grpo_trains_on_conversations_with_two_rewards(qwen_dir, tmp_path):
    run_dir = tmp_path / "run"
    flags = ["--model", str(qwen_dir), "--task", str(write_task(tmp_path)), "--env-id", "sums-chat"]
    flags += ["--num-prompts", "4", "--group-size", "4", "--total-timesteps", "8"]
    flags += ["--reward-weights", "1", "0.5", "--gradient-accumulation-steps", "2"]
    flags += ["--gradient-checkpointing", "--eval-every", "4", "--save-model"]
    out = run_script("grpo_lm.py", flags, run_dir, fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = read_metrics(run_dir)
    for name in ("train/reward_final_answer", "train/reward_format", "eval/reward_format"):
        assert name in metrics, name
    assert "losses/kl" not in metrics, "--beta 0: no reference pass, no KL"
    steps, accuracy = metrics["eval/accuracy"]
    assert steps.tolist() == [0, 4, 8]
    final = metrics["eval/reward_final_answer"][1][-8:]
    assert accuracy[-1] == pytest.approx(float(np.mean(final == 1.0)))
    totals = metrics["eval/episodic_return"][1][-8:]
    fmt = metrics["eval/reward_format"][1][-8:]
    assert np.allclose(totals, final + 0.5 * fmt), "the weighted sum"
    assert (run_dir / "model" / "task.json").is_file()


@pytest.mark.parametrize(
    "extra,flags,expected",
    [
        ({"rewards": "length"}, [], "names reward 'length'"),
        ({"rewards": ["format"], "format": "(("}, [], 'no "format" expression'),
        ({}, ["--reward-weights", "1"], "gives 1 weights for the 2 rewards"),
    ],
)
def test_bad_rewards_are_one_line(qwen_dir, tmp_path, extra, flags, expected):
    task = write_task(tmp_path, **extra)
    base = ["--model", str(qwen_dir), "--task", str(task), "--env-id", "sums-chat"]
    assert expected in one_error_line("grpo_lm.py", base + flags, tmp_path / "run")


def test_conversations_need_a_chat_template(qwen_dir, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    for f in qwen_dir.iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    flags = ["--model", str(model), "--task", str(write_task(tmp_path)), "--env-id", "sums-chat"]
    assert "no chat template" in one_error_line("grpo_lm.py", flags, tmp_path / "run")


@pytest.mark.parametrize(
    "script,flags",
    [
        ("grpo_lm.py", ["--num-prompts", "4", "--group-size", "4", "--total-timesteps", "4"]),
        ("ppo_lm.py", ["--num-prompts", "8", "--num-minibatches", "1", "--total-timesteps", "8"]),
        ("dpo_lm.py", ["--batch-size", "8", "--total-timesteps", "8"]),
    ],
)
def test_micro_batches_take_the_same_step(script, flags, tmp_path):
    """One update in 4 micro-batches against one in a single pass, from the same samples: the
    parameters after it agree within float tolerance (Adam's first step is lr * sign(gradient),
    so a gradient of rounding size may flip: at most a few in 10^4 parameters)."""
    flags = flags + ["--env-id", "addition-v0", "--eval-prompts", "0", "--save-model"]
    weights = []
    for steps in (1, 4):
        run_dir = tmp_path / f"gas{steps}"
        accumulate = ["--gradient-accumulation-steps", str(steps)]
        out = run_script(script, flags + accumulate, run_dir, fork=True)
        assert out.returncode == 0, out.stderr[-2000:]
        weights.append(torch.load(run_dir / "model.pt", weights_only=True)["policy"])
    one, four = weights
    diffs = torch.cat([(one[k] - four[k]).abs().flatten() for k in one])
    assert (diffs > 1e-6).float().mean() < 1e-3, f"max difference {diffs.max():.2e}"
    base = load_script(script).load_policy(
        str(load_script(script).find("benchmark/policies/lm-addition-base"))
    )[0]
    moved = torch.cat([(one[k] - v).abs().flatten() for k, v in base.state_dict().items()])
    assert (moved > 1e-5).float().mean() > 0.5, "the update moved the weights"


BASE = load_script("grpo_lm.py").find("benchmark/policies/lm-addition-base")


def test_lora_trains_the_adapters_only_and_saves_an_adapter_peft_loads(grpo, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "run"
    flags = ["--env-id", "addition-v0", "--total-timesteps", "32", "--num-prompts", "8"]
    flags += ["--group-size", "4", "--eval-prompts", "20", "--lora-r", "8", "--beta", "0.04"]
    flags += ["--learning-rate", "3e-3", "--save-model"]
    out = run_script("grpo_lm.py", flags, run_dir, fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = read_metrics(run_dir)
    # the reference is the policy with its adapters off: at the first update (adapters 0) the same
    assert metrics["losses/kl"][1][0] == pytest.approx(0.0, abs=1e-7)
    assert metrics["losses/kl"][1][-1] > 0
    assert not (run_dir / "model" / "model.safetensors").exists(), "an adapter, not the weights"
    base = AutoModelForCausalLM.from_pretrained(BASE)
    original = {k: v.clone() for k, v in base.state_dict().items()}
    saved = torch.load(run_dir / "model.pt", weights_only=True)["policy"]
    adapters = {k: v for k, v in saved.items() if "lora_" in k}
    assert adapters and any(v.abs().sum() > 0 for k, v in adapters.items() if "lora_B" in k)
    for key, value in saved.items():
        if key not in adapters:  # every weight of the base as it was
            name = key.removeprefix("lm.base_model.model.").replace(".base_layer", "")
            assert torch.equal(value, original[name]), key
    model = PeftModel.from_pretrained(base, run_dir / "model")
    _, tokenizer = grpo.load_policy(BASE)
    policy = grpo.Policy(model, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    task = json.loads((run_dir / "model" / "task.json").read_text())
    final = metrics["eval/episodic_return"][1][-20:].tolist()
    results = grpo.evaluate(policy, tokenizer, task["heldout"][:20], task, 5)
    assert results == {"eval/episodic_return": final}, "the adapter's accuracy is the run's"
    assert 0 < np.mean(final) < 1


def test_lora_target_modules_the_model_lacks_is_one_line(tmp_path):
    flags = ["--lora-r", "4", "--lora-target-modules", "c_attn"]
    line = one_error_line("grpo_lm.py", flags, tmp_path / "run")
    assert line.startswith("error: --lora-target-modules c_attn:"), line


def test_gradient_checkpointing_samples_as_without(grpo):
    """In train mode, transformers' gradient checkpointing turns the KV cache off; generate()
    samples in eval mode, so that the evaluation after an update is the same with it or not."""
    policy, tokenizer = grpo.load_policy(BASE)
    ids, mask = grpo.encode_prompts(tokenizer, ["321+654=", "12+5="], "cpu")
    plain, _, _ = policy.generate(ids, mask, 5, greedy=True)
    policy.lm.gradient_checkpointing_enable({"use_reentrant": False})
    policy.train()
    checkpointed, _, _ = policy.generate(ids, mask, 5, greedy=True)
    assert torch.equal(plain, checkpointed) and policy.training
