"""The rule-based reward helper (reward-modeling/scripts/rule_reward.py) against all four trainers:
what forward receives (documented in reward-api.md "Rule-based rewards"), what it returns, that PPO's
beartype check accepts it, that each trainer trains and generates with it, and the float facts the
page states. palm_rlhf_pytorch 0.8.0: ppo.py, grpo.py, tpo.py, flowrl.py, reward.py."""
from __future__ import annotations

import contextlib
import inspect
import io

import pytest

import probe_kit
from conftest import REPO, load_script
from skill_runtime import placement
from policy_optimization import tiny_trainers, trainers

RULE_REWARD = REPO / "sub-skills" / "reward-modeling" / "scripts" / "rule_reward.py"
REWARD_API = REPO / "sub-skills" / "reward-modeling" / "references" / "reward-api.md"
TRAINERS = list(trainers.TRAINERS)
VOCAB = probe_kit.LEARN_PALM["num_tokens"]  # the learning check's 16 ids
PROMPT_LEN, MAX_SEQ_LEN, GROUP, SAMPLES, EOS = 4, 12, 4, 3, 3


@pytest.fixture(autouse=True)
def one_torch_thread(smoke):
    """One intra-op thread, as the helpers run: tiny models on a shared CPU are slower with more."""
    with placement.torch_threads(1):
        yield


@pytest.fixture(scope="module")
def rules():
    return load_script(RULE_REWARD, "rule_reward")


def build(smoke, name, reward_model):
    """Trainer ``name`` from the probe kit on the learning check's 16-id PaLM, groups of GROUP."""
    import torch
    group = GROUP if trainers.TRAINERS[name].group_kwarg else None
    return tiny_trainers.tiny_trainer(name, palm=probe_kit.tiny_palm(**probe_kit.LEARN_PALM), reward_model=reward_model,
                                  prompt_token_ids=torch.randint(1, VOCAB, (4, PROMPT_LEN)), group_size=group,
                                  minibatch_size=4)


def record_calls(module):
    """Forward hook recording (x, mask, prompt_mask, output) of every call."""
    calls = []
    module.register_forward_hook(
        lambda _m, args, kwargs, out: calls.append((args[0], kwargs.get("mask"), kwargs.get("prompt_mask"), out)),
        with_kwargs=True)
    return calls


@pytest.mark.parametrize("eos", [None, EOS], ids=["no-eos", "eos"])
@pytest.mark.parametrize("name", TRAINERS)
def test_forward_inputs_and_output_in_each_trainer(smoke, rules, name, eos, tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)  # TPO writes ./tpo_memmap_replay_buffer
    torch.manual_seed(0)
    reward_model = rules.RuleReward(rules.token_fraction({EOS}))
    calls = record_calls(reward_model)
    trainer = build(smoke, name, reward_model)
    assert trainer.reward_model is reward_model  # Accelerate only moved it: no DDP or other wrapper
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer.train(num_episodes=1, max_timesteps=2, update_timesteps=2, max_seq_len=MAX_SEQ_LEN, eos_token=eos)
        train_calls = list(calls)
        best = trainer.generate(MAX_SEQ_LEN, prompt=torch.randint(1, VOCAB, (PROMPT_LEN,)),
                                num_samples=SAMPLES, eos_token=eos)
    assert len(train_calls) == 2 and len(calls) == 3
    rows = 1 if name == "ppo" else GROUP
    for (x, mask, prompt_mask, out), b, in_train in [*((c, rows, True) for c in train_calls),
                                                     (calls[-1], SAMPLES, False)]:
        assert x.dtype == torch.int64 and x.shape[0] == b and x.shape[1] <= MAX_SEQ_LEN
        assert prompt_mask.dtype == torch.bool and prompt_mask.shape == x.shape
        assert prompt_mask[:, :PROMPT_LEN].all() and not prompt_mask[:, PROMPT_LEN:].any()
        assert out.shape == (b,) and out.dtype == torch.float32 and out.device == x.device
        if in_train:  # train() always passes a mask: all True without eos
            assert mask.dtype == torch.bool and mask.shape == x.shape
            assert eos is not None or (x.shape[1] == MAX_SEQ_LEN and mask.all())
        if mask is not None and eos is not None:  # False after each row's first eos, the eos itself
            for row, keep in zip(x, mask):        # True, counted from the start: prompt included
                hits = (row == eos).nonzero()
                stop = int(hits[0]) + 1 if len(hits) else x.shape[1]
                assert keep[:stop].all() and not keep[stop:].any()
    generate_mask = calls[-1][1]
    assert (generate_mask is None) == (eos is None)  # trainer.generate passes mask=None without eos
    assert best.ndim == 1 and best.dtype == torch.int64


@pytest.mark.parametrize("name", TRAINERS)
def test_eos_inside_the_prompt_masks_the_whole_response(smoke, rules, name, tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)
    reward_model = rules.RuleReward(lambda x, response: response.sum(dim=1))  # response tokens counted
    calls = record_calls(reward_model)
    trainer = build(smoke, name, reward_model)
    trainer.prompt_token_ids = torch.tensor([[1, EOS, 2, 4]] * 4)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=MAX_SEQ_LEN, eos_token=EOS)
    (x, mask, _, out), = calls
    assert x.shape[1] > PROMPT_LEN and not mask[:, 2:].any() and out.tolist() == [0.0] * x.shape[0]


def test_ppo_beartype_accepts_rule_reward_and_rejects_other_modules(smoke, rules):
    from beartype.roar import BeartypeCallHintParamViolation
    from palm_rlhf_pytorch import RewardModel

    plain = type("PlainModule", (__import__("torch").nn.Module,), {"forward": lambda self, x, **kw: x[:, 0].float()})()
    with pytest.raises(BeartypeCallHintParamViolation):  # the check is live
        build(smoke, "ppo", plain)
    reward_model = rules.RuleReward(rules.token_fraction({1}))
    assert isinstance(reward_model, RewardModel) and list(reward_model.parameters()) == []
    trainer = build(smoke, "ppo", reward_model)
    names = [n for n, _ in trainer.named_parameters()]
    assert names and not any(n.startswith("reward_model.") for n in names)  # no reward tensors held


def test_accelerate_wraps_only_modules_with_trainable_parameters():
    """Why a parameterless reward stays unwrapped on GPUs: Accelerate's prepare_model condition (multi-process
    CPU wraps every model: traps-devices.md#rule-reward-multi-cpu)."""
    from accelerate import Accelerator

    source = inspect.getsource(Accelerator.prepare_model)
    assert "if any(p.requires_grad for p in model.parameters()):" in source
    assert "torch.nn.parallel.DistributedDataParallel(" in source.split("if any(p.requires_grad", 1)[1]


def test_forward_contract(rules):
    import torch

    rule = rules.RuleReward(rules.token_fraction({3}))
    x = torch.tensor([[5, 6, 3, 3, 1, 3], [5, 6, 1, 1, 1, 1]])
    prompt_mask = torch.arange(6).expand(2, 6) < 2
    assert rule(x, prompt_mask=prompt_mask).tolist() == [0.75, 0.0]
    assert torch.equal(rule(x, prompt_lengths=torch.tensor([2, 2])), rule(x, prompt_mask=prompt_mask))
    mask = torch.arange(6).expand(2, 6) < 4  # tokens after position 3 do not count
    assert rule(x, mask=mask, prompt_mask=prompt_mask).tolist() == [1.0, 0.0]
    assert rule(x).tolist() == [0.5, 0.0]  # no prompt mask: every position is response
    assert rule(x[:, :2], prompt_mask=prompt_mask[:, :2]).tolist() == [0.0, 0.0]  # no response tokens
    listed = rules.RuleReward(lambda x, response: [1, 2])(x)  # a list of numbers is accepted
    assert listed.dtype == torch.float32 and listed.tolist() == [1.0, 2.0]
    for wrong in (lambda x, r: torch.zeros(x.shape), lambda x, r: torch.zeros(1), lambda x, r: [1.0]):
        with pytest.raises(ValueError, match=r"one score per sequence, shape \(2,\)"):
            rules.RuleReward(wrong)(x)
    with pytest.raises(ValueError, match="not both"):
        rule(x, prompt_mask=prompt_mask, prompt_lengths=torch.tensor([2, 2]))
    with pytest.raises(ValueError, match="at least one target"):
        rules.token_fraction([])


def test_float_facts_of_the_page():
    """reward-api.md: equal k/8 scores normalise to exactly 0; equal 1/3 scores in a group of 8 to
    about 0.9, in GRPO's/FlowRL's (r - mean) / std.clamp(1e-8) and TPO's z_score alike."""
    import torch
    from palm_rlhf_pytorch.tpo import z_score

    text = " ".join(REWARD_API.read_text(encoding="utf-8").split())
    for value, expected_zero in ((3 / 8, True), (5 / 8, True), (1 / 3, False)):
        rewards = torch.full((8,), value, dtype=torch.float32)
        grpo = (rewards - rewards.mean()) / rewards.std().clamp(min=1e-8)
        tpo = z_score(rewards) if rewards.std() > 0 else torch.zeros_like(rewards)
        for normalized in (grpo, tpo):
            if expected_zero:
                assert normalized.abs().max() == 0
            else:
                assert 0.8 < normalized.abs().max() < 1.0
    assert "advantages of about 0.9" in text and "group of 8 equal scores of 1/3" in text
