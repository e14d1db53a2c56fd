"""The reference statements added after knowledge round 3 (issue 21 item 6): each test fails, naming
the doc file and section, when palm-rlhf-pytorch stops behaving as the section says.

Tiny CPU models from the probe kit (canary.tiny_palm, canary.make); each test in its own directory
(canary.canary_env).
"""
from __future__ import annotations

import inspect

import pytest
import torch

from palm_rlhf_pytorch import PaLM, RewardModel

import probe_kit
from policy_optimization import tiny_trainers
from conftest import fresh_accelerate
from canary import canary_env, capture_memories, make, tiny_palm  # noqa: F401

PO = "sub-skills/policy-optimization/references/"
REWARD_TRAPS, DI, AR = PO + "traps-rewards.md", PO + "distributed.md", PO + "api-reference.md"
PA = "sub-skills/palm-modeling/references/palm-api.md"
LS = "sub-skills/palm-modeling/references/lora-scopes.md"
RA = "sub-skills/reward-modeling/references/reward-api.md"


def test_filter_thres_one_samples_id_zero():
    doc = f"{PA}#generate"
    palm = tiny_palm().eval()
    x = torch.randint(1, 200, (2, 4))
    out = palm.generate(8, prompt=x, filter_thres=1.0)
    assert out.shape == (2, 4) and (out == 0).all(), f"{doc}: filter_thres=1.0 no longer samples only id 0: {out}"
    one = 1 - 1 / probe_kit.TINY_PALM["num_tokens"]  # (1 - thres) * V == 1: top_k keeps one logit
    greedy = palm.generate(8, prompt=x, temperature=0.)
    assert all(torch.equal(palm.generate(8, prompt=x, filter_thres=one), greedy) for _ in range(2)), \
        f"{doc}: keeping one logit is no longer greedy"


def test_lora_alpha_is_not_an_argument_and_scale_sets_it():
    doc = f"{LS}#lora-scopes-palm-rlhf-pytorch-080"
    from palm_rlhf_pytorch.lora import LoRA
    assert "alpha" not in inspect.signature(PaLM.add_finetune_params).parameters, f"{doc}: alpha is an argument now"
    palm = tiny_palm()
    palm.add_finetune_params("probe")
    modules = [m for m in palm.finetune_modules["probe"].modules() if isinstance(m, LoRA)]
    assert modules and all(m.scale == 1.0 for m in modules), f"{doc}: a scope's LoRA scale is not alpha / r = 1"
    m = modules[0]
    with torch.no_grad():
        m.B.normal_()
    before = m.weight.clone()
    m.scale = 2.0
    assert torch.allclose(m.weight, 2 * before), f"{doc}: LoRA.weight no longer reads .scale at every call"


def test_reward_model_labels_and_negative_padding():
    doc = f"{RA}#forward"
    palm = tiny_palm()
    x = torch.randint(1, 100, (2, 6))
    scalar = RewardModel(palm, num_binned_output=1).eval()  # no dropout
    ratings = torch.tensor([0.3, 0.7])
    with torch.no_grad():
        assert torch.allclose(scalar(x, labels=ratings), torch.nn.functional.mse_loss(scalar(x), ratings)), \
            f"{doc}: num_binned_output=1 is no longer MSE regression"
    binned = RewardModel(palm, num_binned_output=5)
    with pytest.raises(RuntimeError, match="expected target dtype to be Long"):
        binned(x, labels=torch.tensor([0., 1.]))
    with pytest.raises(IndexError, match="Target 5 is out of bounds"):
        binned(x, labels=torch.tensor([5, 1]))
    encoder = RewardModel(tiny_palm(causal=False), num_binned_output=0).eval()
    padded, plain = torch.tensor([[5, 6, 7, -1, -1]]), torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        pooled_pads, masked, unpadded = encoder(padded), encoder(padded, mask=padded >= 0), encoder(plain)
    assert not torch.allclose(pooled_pads, unpadded), f"{doc}: negative-id padding is masked without mask= now"
    assert torch.allclose(masked, unpadded, atol=1e-5), f"{doc}: mask = x >= 0 no longer equals the unpadded reward"


def test_set_seed_device_specific_before_any_accelerator(tmp_path, monkeypatch):
    doc = f"{DI}#seeding"
    from accelerate.utils import set_seed
    lines = []
    with fresh_accelerate(monkeypatch):  # no accelerator yet, as in a fresh process
        try:
            set_seed(0, device_specific=True)
        except ValueError as err:
            lines.append(f"ValueError {str(err)[:60]}")
        monkeypatch.chdir(tmp_path)
        try:
            tiny_trainers.tiny_trainer("grpo")
            lines.append("built")
        except AttributeError as err:
            lines.append(f"AttributeError {err}")
    assert lines == ["ValueError Please make sure to properly initialize your accelerator via",
                     "AttributeError 'AcceleratorState' object has no attribute 'mixed_precision'"], \
        f"{doc}: set_seed(device_specific=True) before a trainer: {lines}"


def test_temperature_zero_makes_a_group_alike():
    doc = f"{AR}#arguments (temperature) and {REWARD_TRAPS}#equal-rewards-group"
    from canary import CANARY_GROUP
    memories = capture_memories(make("grpo"), 2, max_seq_len=10, temperature=0.)
    groups = [memories[i:i + CANARY_GROUP] for i in range(0, len(memories), CANARY_GROUP)]
    assert len(groups) == 2 and all(len(g) == CANARY_GROUP for g in groups), f"{doc}: {len(memories)} memories"
    assert all(all(torch.equal(m.sequence, g[0].sequence) for m in g) for g in groups), \
        f"{doc}: temperature 0 no longer repeats one completion per group"
    assert all((m.group_relative_normalized_reward == 0).all() for m in memories), f"{doc}: a group of equal rewards got advantages"


def test_score_centering_weight_fn_and_first_minibatch():
    doc = f"{AR}#arguments (use_score_centering)"
    from palm_rlhf_pytorch import grpo
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11, requires_grad=True)
    actions, advantages = torch.randint(0, 11, (2, 3)), torch.tensor([[1.5], [-0.5]])
    samp = logits.softmax(-1).detach()  # the first minibatch: the policy that sampled
    shapes = []

    def weight_fn(ratio):
        shapes.append((tuple(ratio.shape), ratio.requires_grad))
        return torch.full_like(ratio, 0.5)

    for topk in (None, 4):
        shapes.clear()
        loss = grpo.score_centering_loss(logits.log_softmax(-1), samp, actions, advantages, topk=topk,
                                         weight_fn=weight_fn).sum()
        grad, = torch.autograd.grad(loss, logits)
        want = [((2, 3), False), ((2, 3, 11 if topk is None else topk), True)] + ([((2, 3), True)] if topk else [])
        assert shapes == want, f"{doc}: weight_fn gets {shapes}, the doc says {want}"
        logp = logits.log_softmax(-1).gather(-1, actions[..., None])[..., 0]
        plain, = torch.autograd.grad(-(advantages * 0.5 * logp).sum(), logits)
        assert torch.allclose(grad, plain, atol=1e-6), f"{doc}: the first minibatch is not weight_fn(1) x the policy gradient"


def test_value_clip_reencodes_and_stops_the_gradient():
    doc = f"{AR}#arguments (value_clip)"
    hl = make("ppo").critic_hl_gauss_loss
    target, old = torch.tensor([4.0]), torch.tensor([1.0])
    for change, clipped in ((3.0, True), (0.2, False)):
        value = (old + change).requires_grad_()
        value_clipped = old + (value - old).clamp(-0.4, 0.4)
        loss = hl(value_clipped, target, reduction="none")
        reencoded = -(hl.transform_to_probs(target) * hl.transform_to_logprobs(value_clipped)).sum(-1)
        assert torch.allclose(loss, reencoded, atol=1e-4), f"{doc}: the clipped scalar is no longer re-encoded as a histogram"
        grad, = torch.autograd.grad(loss.sum(), value)
        assert (grad == 0).all() == clipped, f"{doc}: clipped={clipped}, gradient {grad}"


def test_xpos_has_no_argument_and_can_be_turned_off():
    doc = f"{PA}#constructor (rotary_xpos_scale_base)"
    assert "use_xpos" not in inspect.signature(PaLM).parameters, f"{doc}: PaLM takes use_xpos now"
    causal, encoder = tiny_palm(), tiny_palm(causal=False)
    assert all(layer.fn.rotary_emb.use_xpos for layer in causal.layers), f"{doc}: xPos off by default"
    assert not any(layer.fn.rotary_emb.use_xpos for layer in encoder.layers), f"{doc}: causal=False keeps xPos"
    x = torch.randint(1, 200, (1, 12))
    with torch.no_grad():
        on = causal.eval()(x)
        off = tiny_palm().eval()
        for layer in off.layers:
            layer.fn.rotary_emb.use_xpos = False
        assert not torch.allclose(on, off(x)), f"{doc}: use_xpos = False no longer changes the logits"
        assert causal(torch.randint(1, 200, (1, 600))).shape[1] == 600, f"{doc}: xPos caps the length now"


def test_implicit_prm_is_zero_only_without_dropout():
    doc = "sub-skills/reward-modeling/references/implicit-prm.md#what-it-computes"
    from palm_rlhf_pytorch import ImplicitPRM
    seq = torch.randint(1, 200, (2, 8))
    prm = ImplicitPRM(tiny_palm(ff_dropout=0.3, attn_dropout=0.3))
    with torch.no_grad():
        assert (prm.eval()(seq) == 0).all(), f"{doc}: a fresh copy in eval mode no longer gives rewards of 0"
        assert (prm.train()(seq) != 0).any(), f"{doc}: dropout in train mode no longer changes the rewards"
