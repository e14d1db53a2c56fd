"""Knowledge round 2 (commit b7444de): the facts that commit added to the references, each checked
against the installed palm-rlhf-pytorch; a test fails naming the doc file and section when the
library stops behaving as the section says.

Tiny CPU models (canary.tiny_palm, canary.make: the probe kit's sizes); each test runs in its own
directory (canary.canary_env), so checkpoints and TPO's replay buffer land there. No canary is
registered here: the troubleshooting sections touched have their canaries elsewhere; these tests
check what round 2 added to them.
"""
from __future__ import annotations

import contextlib
import inspect
import io
import warnings

import pytest
import torch

from palm_rlhf_pytorch import PaLM

import probe_kit
from canary import actor_palm, canary_env, make, module_of, reseed, tiny_palm, touch  # noqa: F401
from policy_optimization import tiny_trainers, trainers

PO = "sub-skills/policy-optimization/references/"
SETUP_TRAPS, WEIGHT_TRAPS, ROLLOUT_TRAPS = PO + "traps-setup.md", PO + "traps-weights.md", PO + "traps-rollouts.md"
SEL = PO + "trainer-selection.md"
REWARD_API = "sub-skills/reward-modeling/references/reward-api.md"
ALL = tuple(trainers.TRAINERS)
ADOPT = tuple(n for n, spec in trainers.TRAINERS.items() if spec.optimizer == "AdoptAtan2")  # PPO, GRPO, FlowRL


def run(trainer, rollouts: int, max_seq_len: int = 8, **train_kw) -> None:
    """``rollouts`` rollouts and one ``learn()``, the library's output swallowed."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer.train(num_episodes=1, max_timesteps=rollouts, update_timesteps=rollouts,
                      max_seq_len=max_seq_len, **train_kw)


def moved_per_step(trainer) -> list[int]:
    """Wrap the trainer's actor optimizer: after each ``step()``, how many actor LoRA tensors moved."""
    palm, history = actor_palm(trainer), []
    step = trainer.actor_optim.step

    def spied(*args, **kwargs):
        before = [p.detach().clone() for p in palm.finetune_parameters("actor")]
        step(*args, **kwargs)
        history.append(sum(not torch.equal(b, p) for b, p in zip(before, palm.finetune_parameters("actor"))))
    trainer.actor_optim.step = spied
    return history


# 1: LoRA first-step counts from a fresh LoRA, after trainer.load(), after accelerate.load_state ------------
@pytest.mark.parametrize("name", ALL)
def test_first_steps_after_load(name):
    doc = f"{SETUP_TRAPS}#optimizer-first-steps and {SEL}#decision-table"
    adopt = trainers.TRAINERS[name].optimizer == "AdoptAtan2"
    minibatch = 1 if name in ("ppo", "tpo") else 2  # 3 optimizer steps per learn() of 3 rollouts
    trainer = make(name, minibatch_size=minibatch)
    total = len(list(actor_palm(trainer).finetune_parameters("actor")))
    fresh = moved_per_step(trainer)
    run(trainer, 3)
    half = total // 2  # the B of each LoRA first, then A
    assert fresh == ([0, half, total] if adopt else [half, total, total]), f"{doc}: {name} from a fresh LoRA {fresh}"
    trainer.save("ckpt.pt")
    trainer.accelerate.save_state("state")

    reseed(1)
    loaded = make(name, palm=tiny_palm(), minibatch_size=minibatch)
    loaded.load("ckpt.pt")
    assert not loaded.actor_optim.state_dict()["state"], f"{doc}: {name} trainer.load() restores optimizer state now"
    after_load = moved_per_step(loaded)
    run(loaded, 3)
    expected = [0, total, total] if adopt else [total, total, total]
    assert after_load == expected, f"{doc}: {name} after trainer.load() every LoRA tensor moved per step {after_load}"

    reseed(1)
    resumed = make(name, palm=tiny_palm(), minibatch_size=minibatch)
    with contextlib.redirect_stdout(io.StringIO()):
        resumed.accelerate.load_state("state")
    assert resumed.actor_optim.state_dict()["state"], f"{doc}: {name} accelerate.load_state no longer restores the optimizer"
    after_state = moved_per_step(resumed)
    run(resumed, 3)
    assert after_state == [total] * 3, f"{doc}: {name} after accelerate.load_state moved per step {after_state}"


# 2: the atan2 step ignores a constant gradient scale, not a varying one ------------------------------------
def test_atan2_ignores_only_a_constant_gradient_scale():
    doc = f"{SETUP_TRAPS}#optimizer-settings"
    from adam_atan2_pytorch import AdamAtan2, AdoptAtan2
    direction = torch.tensor([1., -2., 0.5, 3.])

    def weights_after(optim_cls, scales) -> torch.Tensor:
        torch.manual_seed(0)
        weight = torch.nn.Parameter(torch.randn(4))
        start = weight.detach().clone()
        optim = optim_cls([weight], lr=1e-2)
        for scale in scales:
            weight.grad = direction * scale
            optim.step()
        return weight.detach() - start

    for cls in (AdoptAtan2, AdamAtan2):
        small, large = weights_after(cls, [1e-6] * 4), weights_after(cls, [1e6] * 4)
        assert small.abs().min() > 1e-3, f"{doc}: {cls.__name__} moved {small.tolist()} in 4 steps"
        assert torch.allclose(small, large, rtol=1e-5, atol=1e-9), \
            f"{doc}: {cls.__name__} gradients all 1e-6 vs all 1e6 moved {small.tolist()} vs {large.tolist()}"
        steady = weights_after(cls, [1.] * 21) - weights_after(cls, [1.] * 20)  # the last step's move
        jump = weights_after(cls, [1.] * 20 + [1e3]) - weights_after(cls, [1.] * 20)
        ratio = round((jump / steady).mean().item(), 1)  # far from 1000: the scale changes the step a little
        assert ratio == {"AdoptAtan2": 1.1, "AdamAtan2": 0.6}[cls.__name__], \
            f"{doc}: {cls.__name__} after 20 steady steps a gradient 1000 times larger: {ratio} times the step"


# 3: every nn.Dropout of the PaLM set to actor_dropout; flash attention's dropout not ----------------------
@pytest.mark.parametrize("name", ALL)
def test_actor_dropout_misses_flash_attention(name):
    doc = f"{WEIGHT_TRAPS}#actor-scope-reused-palm and {ROLLOUT_TRAPS}#actor-dropout-ratio"
    palm = tiny_palm(flash_attn=True, attn_dropout=0.5, ff_dropout=0.5)
    make(name, palm=palm, actor_dropout=0.2)
    ps = {m.p for m in palm.modules() if isinstance(m, torch.nn.Dropout)}
    flash = {m.dropout for m in palm.modules() if hasattr(m, "use_flash_attn")}
    assert ps == {0.2}, f"{doc}: {name} actor_dropout=0.2 left the nn.Dropout at {ps}"
    assert flash == {0.5}, f"{doc}: {name} flash attention's dropout is {flash} after actor_dropout=0.2"
    x = torch.randint(1, probe_kit.TINY_PALM["num_tokens"], (2, 8))
    for flash_attn in (True, False):  # actor_dropout=0 (the fix): flash attention still drops
        reseed()
        palm = tiny_palm(flash_attn=flash_attn, attn_dropout=0.5)
        make(name, palm=palm, actor_dropout=0.)
        palm.train()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.backends.cuda.sdp_kernel
            same = torch.equal(palm(x), palm(x))
        assert same != flash_attn, f"{doc}: {name} flash_attn={flash_attn}, attn_dropout=0.5, actor_dropout=0: " \
                                   f"two train-mode forwards {'equal' if same else 'differ'}"


# 4: loading a saved policy built with another actor_lora_r ------------------------------------------------
def test_saved_policy_with_another_actor_lora_r():
    doc = f"{SEL}#trained-policy"
    palm = tiny_palm()
    default_r = palm.lora_r
    trainer = make("grpo", palm=palm, actor_lora_r=default_r // 2, actor_lr=1e-2)
    run(trainer, 3)
    trainer.save("ckpt.pt")
    state = {k.removeprefix("actor_palm."): v for k, v in torch.load("ckpt.pt").items() if k.startswith("actor_palm.")}
    scoped = tiny_palm(finetune_scopes=("actor",))  # the doc's block: the scope gets the PaLM's own lora_r
    assert scoped.finetune_modules["actor"][0][0].A.shape[1] == default_r, f"{doc}: the scope no longer takes the PaLM's lora_r"
    with pytest.raises(RuntimeError, match="size mismatch"):
        scoped.load_state_dict(state)
    policy = tiny_palm()
    policy.add_finetune_params("actor", lora_r=default_r // 2)  # the doc's fix
    policy.load_state_dict(state)
    x = torch.randint(1, probe_kit.TINY_PALM["num_tokens"], (2, 6))
    with torch.no_grad():
        trained = palm.eval()(x, finetune_scope="actor")
        assert torch.allclose(policy.eval()(x, finetune_scope="actor"), trained, atol=1e-5), \
            f"{doc}: add_finetune_params('actor', lora_r=actor_lora_r) no longer reproduces the trained policy"
        assert not torch.allclose(policy(x), trained), f"{doc}: the trained LoRA did not move"


# 5: freezing a built PPO's base: the actor's and the critic copy's palm_parameters, .grad = None -----------
def test_freeze_built_ppo_base_and_critic_copy():
    doc = f"{WEIGHT_TRAPS}#freeze-built-trainer"
    trainer = make("ppo", minibatch_size=1)
    ac = trainer.actor_critic
    palm, critic = ac.actor_palm, ac.critic
    assert critic is not palm, f"{doc}: PPO's critic is no longer a copy"
    run(trainer, 2)
    assert palm.token_emb.weight.grad is not None and critic.token_emb.weight.grad is not None, \
        f"{doc}: PPO's base weights collect no .grad now"
    for p in palm.palm_parameters():            # the actor's base alone: the critic copy keeps collecting
        p.requires_grad_(False)
        p.grad = None
    critic_grad = critic.token_emb.weight.grad.clone()
    run(trainer, 2)
    assert palm.token_emb.weight.grad is None and not torch.equal(critic.token_emb.weight.grad, critic_grad), \
        f"{doc}: freezing palm.palm_parameters() alone now also stops the critic copy's .grad"
    for p in critic.palm_parameters():          # the documented fix: the critic copy too
        p.requires_grad_(False)
        p.grad = None
    before = {n: p.detach().clone() for n, p in ac.named_parameters()}
    run(trainer, 3)                             # 3 optimizer steps: AdoptAtan2 moves every LoRA tensor
    changed = {n for n, p in ac.named_parameters() if not torch.equal(before[n], p)}
    groups = ("actor_palm.finetune_modules.actor.", "critic.finetune_modules.critic.", "value_head.")
    assert all(any(n.startswith(g) for g in groups) for n in changed), f"{doc}: moved outside LoRA/value head: {changed}"
    assert all(any(n.startswith(g) for n in changed) for g in groups), f"{doc}: not every group moved: {sorted(changed)}"
    left = [n for model in (palm, critic) for n, p in model.named_parameters()
            if not n.startswith("finetune_modules.") and p.grad is not None]
    assert not left, f"{doc}: base weights with a .grad after freezing both: {left[:4]}"


# 6: a reward object needs .eval() ------------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in ALL if n != "ppo"])  # PPO's beartype check refuses a function first
def test_reward_function_without_eval(name):
    doc = f"{REWARD_API}#what-the-trainers-accept"
    cls = touch(name)
    assert "self.reward_model = reward_model.eval()" in inspect.getsource(cls.__init__), \
        f"{doc}: {name} no longer calls reward_model.eval() at construction"

    def reward(x, prompt_mask=None, mask=None):
        return x.float().mean(dim=-1)

    args = dict(palm=tiny_palm(), prompt_token_ids=torch.randint(1, 64, (2, 4)), accelerate_kwargs=dict(cpu=True),
                **tiny_trainers.trainer_kwargs(name))
    with contextlib.redirect_stdout(io.StringIO()):
        with pytest.raises(AttributeError, match="'function' object has no attribute 'eval'"):
            cls(reward_model=reward, **args)
        reward.eval = lambda: reward            # an .eval() is all construction needs
        assert cls(reward_model=reward, **{**args, "palm": tiny_palm()}).reward_model is reward, \
            f"{doc}: {name} a function with .eval() no longer constructs"


# 7: log-probs with eos_token and one prompt length: aligned tokens, a right-padded tail of stored 0s -------
class _EinxSpy:
    """Stands in for FlowRL's ``einx`` module: records each ``get_at`` that carries a gradient
    (learn()'s new ``action_log_probs``; the rollout's and the reference's run without one)."""

    def __init__(self, einx, record):
        self._einx, self._record = einx, record

    def __getattr__(self, attr):
        return getattr(self._einx, attr)

    def get_at(self, *args, **kwargs):
        out = self._einx.get_at(*args, **kwargs)
        if out.requires_grad:
            self._record.append(out.detach())
        return out


def greedy_eos(palm: PaLM, prompts: torch.Tensor, new_tokens: int) -> int:
    """An id that the greedy continuation of prompt 0 samples early and that of prompt 1 never does."""
    with torch.no_grad():
        a, b = (palm.generate(prompts.shape[1] + new_tokens, prompt=p[None], temperature=1e-6, use_tqdm=False)[0].tolist()
                for p in prompts)
    return next(t for j, t in enumerate(a[1:6], 1) if t not in a[:j] and t not in b and t not in prompts.tolist()[0])


@pytest.mark.parametrize("name", ["ppo", "flowrl"])
def test_eos_log_probs_padded_tail(name, monkeypatch):
    doc = f"{ROLLOUT_TRAPS}#log-probs-misaligned"
    module = module_of(name)
    prompts, new_tokens = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]]), 10  # one prompt length
    eos = greedy_eos(tiny_palm(), prompts, new_tokens)
    data, new = [], []
    loader = module.create_dataloader         # learn()'s padded experiences, in order
    monkeypatch.setattr(module, "create_dataloader",
                        lambda d, size, **kw: (data.append(d), loader(d, size, **{**kw, "shuffle": False}))[1])
    if name == "ppo":
        log_prob = module.log_prob
        monkeypatch.setattr(module, "log_prob", lambda p, i: (lambda out: (out.requires_grad and new.append(out.detach()),
                                                                           out)[1])(log_prob(p, i)))
        assert "loss = policy_loss.mean()" in inspect.getsource(module.RLHFTrainer.learn), \
            f"{doc}: PPO's policy loss is no longer an unmasked mean"
    else:
        monkeypatch.setattr(module, "einx", _EinxSpy(module.einx, new))
    reseed()
    trainer = make(name, minibatch_size=64, prompt_token_ids=prompts)
    run(trainer, 4, max_seq_len=prompts.shape[1] + new_tokens, eos_token=eos, temperature=1e-6)
    sequences, prompt_masks, masks, _, stored = data[0][:5]
    recomputed = new[0][:, -stored.shape[-1]:]
    lengths = (masks.sum(-1) - prompt_masks.sum(-1)).tolist()
    assert min(lengths) < new_tokens == max(lengths), f"{doc}: {name} eos {eos} gave response lengths {lengths}"
    for row, k in enumerate(lengths):
        assert torch.allclose(stored[row, :k], recomputed[row, :k], atol=1e-5), \
            f"{doc}: {name} one prompt length with eos: the stored and new log-probs no longer align"
        tail, stored_tail, new_tail = sequences[row, prompts.shape[1] + k:], stored[row, k:], recomputed[row, k:]
        assert (tail == 0).all() and (stored_tail == 0).all(), f"{doc}: {name} padded tail {tail.tolist()} stores {stored_tail.tolist()}"
        if name == "ppo":                       # log pi(pad): ratio exp(new - 0) = pi(pad), far below 1
            assert ((new_tail < 0) & (new_tail.exp() < 0.05)).all(), f"{doc}: PPO padded-tail log-probs {new_tail.tolist()}"
        else:                                   # FlowRL's are probabilities: pi(pad) itself
            assert ((new_tail > 0) & (new_tail < 0.05)).all(), f"{doc}: FlowRL padded-tail values {new_tail.tolist()}"
