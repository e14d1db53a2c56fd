"""The reference sections of issue 21's eight gaps, and the statements it found wrong: each test
fails, naming the doc file and section, when palm-rlhf-pytorch stops behaving as the section says.

Tiny CPU models (canary.tiny_palm); the two trap sections (traps-*.md) are canaries
(``covers``), registered when test_canaries imports this module. Each test runs in its own
directory (canary.canary_env), so TPO's replay buffer lands there.
"""
from __future__ import annotations

import contextlib
import copy
import io

import pytest
import torch

from palm_rlhf_pytorch import ActorCritic, ImplicitPRM, PaLM, RewardModel
from palm_rlhf_pytorch.utils import masked_mean

import probe_kit
from conftest import fresh_accelerate
from canary import canary_env, check, covers, tiny_palm, touch  # noqa: F401

PO = "sub-skills/policy-optimization/references/"
ROLLOUT_TRAPS, DI, AR, SEL = PO + "traps-rollouts.md", PO + "distributed.md", PO + "api-reference.md", PO + "trainer-selection.md"
PM = "sub-skills/palm-modeling/references/"
PA, LS = PM + "palm-api.md", PM + "lora-scopes.md"
GROUPS = {"ppo": {}, "grpo": dict(grpo_num_times_sample_rewards=3), "tpo": dict(num_times_sample_rewards=3),
          "flowrl": dict(flowrl_num_times_sample=3, partition_function_hidden_dim=32)}
ROLLOUTS = {"ppo": 4, "grpo": 2, "tpo": 2, "flowrl": 2}  # one learn() with at least one full minibatch


def trainer_of(name: str, palm: PaLM | None = None, reward_model=None, **kw):
    """A tiny trainer ``name`` (group of 4) on CPU, its prints dropped; returns (trainer, palm)."""
    palm = tiny_palm() if palm is None else palm
    reward_model = RewardModel(tiny_palm(1), num_binned_output=0) if reward_model is None else reward_model
    args = dict(palm=palm, reward_model=reward_model, prompt_token_ids=torch.randint(1, 64, (4, 5)),
                minibatch_size=4, accelerate_kwargs=dict(cpu=True), **GROUPS[name])
    trainer = touch(name)(**{**args, **kw})
    trainer.print = lambda *a: None
    return trainer, palm


def train(trainer, rollouts: int = 2, max_seq_len: int = 8) -> None:
    """One ``learn()`` over ``rollouts`` rollouts, the library's output swallowed."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer.train(num_episodes=1, max_timesteps=rollouts, update_timesteps=rollouts, max_seq_len=max_seq_len)


def moved(before, after) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, after))


def raises(fn, exc: type[BaseException]) -> BaseException | None:
    """The exception ``fn()`` raised if it is an ``exc``, else None (ran, or raised another)."""
    try:
        fn()
    except exc as err:
        return err
    return None


# 1 ---------------------------------------------------------------------------------------------
@covers("freeze-built-trainer", "ppo", "grpo", "tpo", "flowrl")
def test_freeze_built_trainer():
    """Also the statement found wrong: freezing the PaLM after building is not fine in one process."""
    anchor = "freeze-built-trainer"
    for name in ("grpo", "tpo", "flowrl"):
        trainer, palm = trainer_of(name)
        check(len(list(trainer.actor.parameters())) == len(list(palm.finetune_parameters("actor"))), anchor,
              f"{name} Actor.parameters() no longer yields the LoRA alone")
        trainer.actor.requires_grad_(False)
        check(all(p.requires_grad for p in palm.palm_parameters()), anchor, f"{name}: actor.requires_grad_ froze the base")
        lora = [p.clone() for p in palm.finetune_parameters("actor")]
        train(trainer)
        grad = palm.token_emb.weight.grad.clone()
        train(trainer)
        check(not moved(lora, palm.finetune_parameters("actor")), anchor, f"{name}: the frozen LoRA moved")
        check(grad.abs().sum() > 0 and not torch.equal(palm.token_emb.weight.grad, grad), anchor,
              f"{name}: the base .grad no longer accumulates")
    for name, freeze in (("ppo", lambda t, p: t.actor_critic.requires_grad_(False)),
                         *((n, lambda t, p: p.requires_grad_(False)) for n in ("ppo", "grpo", "tpo"))):
        trainer, palm = trainer_of(name)
        freeze(trainer, palm)
        err = raises(lambda: train(trainer, ROLLOUTS[name]), RuntimeError)
        check(err is not None and "does not require grad" in str(err), anchor,
              f"{name} with every policy weight frozen: {err!r}")
    trainer, palm = trainer_of("flowrl")
    palm.requires_grad_(False)
    z = [p.clone() for p in trainer.partition_function.parameters()]
    for _ in range(3):
        train(trainer)
    check(moved(z, trainer.partition_function.parameters()), anchor, "FlowRL's partition function no longer trains")
    for name in GROUPS:                         # pausing: lr 0 on the built optimizer (the constructor refuses 0)
        err = raises(lambda: trainer_of(name, actor_lr=0.), AssertionError)
        check(err is not None and str(err) == "", anchor, f"{name} actor_lr=0: {err!r}")
        trainer, palm = trainer_of(name)
        init = trainer.actor_optim.param_groups[0]["lr"]
        for group in trainer.actor_optim.param_groups:
            group["lr"] = 0.
        lora = [p.clone() for p in palm.finetune_parameters("actor")]
        critic = [p.clone() for p in trainer.actor_critic.critic_parameters()] if name == "ppo" else []
        for _ in range(3):
            train(trainer, ROLLOUTS[name])
        check(not moved(lora, palm.finetune_parameters("actor")), anchor, f"{name} moved at lr 0")
        check(name != "ppo" or moved(critic, trainer.actor_critic.critic_parameters()), anchor, "PPO's critic paused too")
        for group in trainer.actor_optim.param_groups:
            group["lr"] = init
        train(trainer, ROLLOUTS[name])
        check(palm.finetune_modules["actor"][0][0].B.abs().sum() > 0, anchor,
              f"{name}: LoRA B did not move on the first learn() after restoring the lr")
    trainer, palm = trainer_of("grpo")          # the fix: the base alone, after building
    for p in palm.palm_parameters():
        p.requires_grad_(False)
    lora = [p.clone() for p in palm.finetune_parameters("actor")]
    for _ in range(3):
        train(trainer)
    check(moved(lora, palm.finetune_parameters("actor")) and palm.token_emb.weight.grad is None, anchor,
          "freezing palm.palm_parameters() after building no longer keeps the LoRA training")


# 2 ---------------------------------------------------------------------------------------------
def test_bf16_weights(tmp_path, monkeypatch):
    doc = f"{DI}#bf16-weights"
    bf16 = torch.bfloat16
    for name in GROUPS:                         # cast before building: the LoRA is float32
        palm = tiny_palm().to(bf16)
        trainer, _ = trainer_of(name, palm=palm, reward_model=RewardModel(tiny_palm(1).to(bf16), num_binned_output=0))
        assert palm.finetune_modules["actor"][0][0].A.dtype == torch.float32, f"{doc}: {name} LoRA follows the dtype now"
        err = raises(lambda: train(trainer, 1), RuntimeError)
        assert err is not None and "same dtype" in str(err), f"{doc}: {name} cast before building: {err!r}"
    e = torch.randn(1, 3, 4, dtype=bf16)
    assert masked_mean(e, torch.ones(1, 3, dtype=torch.bool), dim=1).dtype == torch.float32, f"{doc}: masked_mean keeps bf16"
    for name in ("grpo", "tpo", "flowrl"):      # everything cast after building: the reward head fails
        rm = RewardModel(tiny_palm(1), num_binned_output=0)
        trainer, _ = trainer_of(name, reward_model=rm)
        trainer.actor.to(bf16)
        rm.to(bf16)
        if name == "flowrl":
            trainer.partition_function.to(bf16)
        err = raises(lambda: train(trainer, 1), RuntimeError)
        assert err is not None and "same dtype" in str(err), f"{doc}: {name} bf16 reward model: {err!r}"
    for name in GROUPS:                         # the policy only, as the table says
        trainer, palm = trainer_of(name)
        (trainer.actor_critic if name == "ppo" else trainer.actor).to(bf16)
        if name == "ppo":
            trainer.actor_critic.value_head.float()
        if name == "flowrl":
            trainer.partition_function.to(bf16)
        lora = [p.clone() for p in palm.finetune_parameters("actor")]
        for _ in range(3):
            train(trainer, ROLLOUTS[name])
        assert moved(lora, palm.finetune_parameters("actor")), f"{doc}: {name}: the bf16 policy recipe no longer trains"
    from palm_rlhf_pytorch import RLHFTrainer
    from palm_rlhf_pytorch.grpo import RLHFTrainer as G
    from palm_rlhf_pytorch.tpo import RLHFTrainer as T
    from palm_rlhf_pytorch.flowrl import FlowRLTrainer as F
    tiny = lambda s: (torch.manual_seed(s), PaLM(**probe_kit.TINY_PALM))[1]
    lines = []
    monkeypatch.chdir(tmp_path)
    with fresh_accelerate(monkeypatch):  # mixed precision is one per process: as in a fresh one
        for cls, kw, n in ((RLHFTrainer, {}, 4), (G, dict(grpo_num_times_sample_rewards=3), 2),
                           (T, dict(num_times_sample_rewards=3), 2),
                           (F, dict(flowrl_num_times_sample=3, partition_function_hidden_dim=32), 2)):
            palm = tiny(0)
            t = cls(palm=palm, reward_model=RewardModel(tiny(1), num_binned_output=0),
                    prompt_token_ids=torch.randint(1, 64, (4, 5)), minibatch_size=4,
                    accelerate_kwargs=dict(cpu=True, mixed_precision="bf16"), **kw)
            t.print = lambda *a: None
            lora = [p.clone() for p in palm.finetune_parameters("actor")]
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                for _ in range(3):
                    t.train(num_episodes=1, max_timesteps=n, update_timesteps=n, max_seq_len=8)
            ok = all(not torch.equal(a, b) for a, b in zip(lora, palm.finetune_parameters("actor")))
            lines.append(f"mp {cls.__module__} {palm.token_emb.weight.dtype} {ok}")
    assert lines == [f"mp palm_rlhf_pytorch.{m} torch.float32 True" for m in ("ppo", "grpo", "tpo", "flowrl")], \
        f"{doc}: mixed_precision='bf16': {lines}"


# 3 ---------------------------------------------------------------------------------------------
def test_rotary_cache_rounding():
    doc = f"{PA}#rotary-cache"
    palm = tiny_palm().eval()
    x = torch.randint(1, 64, (1, 8))
    with torch.no_grad():
        first = palm(x)
        assert torch.equal(first, palm(x)), f"{doc}: a repeated call is not bit-identical"
        palm(torch.randint(1, 64, (1, 48)))
        assert palm.layers[0].fn.pos_emb.shape[0] == 48, f"{doc}: the cache no longer grows to the longest sequence"
        after = palm(x)
        assert not torch.equal(first, after), f"{doc}: logits are bit-identical after a longer sequence now"
        assert (first - after).abs().max() < 1e-5, f"{doc}: more than rounding: {(first - after).abs().max()}"
        for layer in palm.layers:
            layer.fn.pos_emb = layer.fn.pos_emb_scale = None
        assert torch.equal(first, palm(x)), f"{doc}: clearing the caches no longer restores the first logits"
        assert not any("pos_emb" in k for k in palm.state_dict()), f"{doc}: the caches are in the state_dict now"
        encoder = tiny_palm(causal=False).eval()
        a = encoder(x)
        encoder(torch.randint(1, 64, (1, 48)))
        assert torch.equal(a, encoder(x)), f"{doc}: causal=False (no xPos) is no longer bit-identical"


# 4 ---------------------------------------------------------------------------------------------
def test_return_loss_all_ignored_is_nan():
    doc = f"{PA}#return-loss-nan"
    palm = tiny_palm()
    loss = palm(torch.tensor([[5, 0, 0, 0]]), return_loss=True)
    assert torch.isnan(loss), f"{doc}: all-ignored targets give {loss.item()} now"
    loss.backward()
    assert all(p.grad is None or (p.grad == 0).all() for p in palm.parameters()), f"{doc}: the gradient is not zero now"
    assert torch.isnan(palm(torch.tensor([[5]]), return_loss=True)), f"{doc}: a length-1 input no longer gives nan"
    assert torch.isfinite(palm(torch.tensor([[5, 0, 0, 0], [5, 6, 7, 8]]), return_loss=True)), \
        f"{doc}: one all-pad row among real ones is not finite now"
    assert torch.isfinite(tiny_palm(cross_entropy_ignore_index=-100)(torch.tensor([[5, 0, 0, 0]]), return_loss=True)), \
        f"{doc}: cross_entropy_ignore_index=-100 no longer counts id 0"


# 5 ---------------------------------------------------------------------------------------------
@covers("flowrl-printed-balance", "flowrl")
def test_flowrl_printed_numbers():
    anchor = "flowrl-printed-balance"

    class Negated(RewardModel):
        def __init__(self, inner):
            torch.nn.Module.__init__(self)
            self.inner = inner

        def forward(self, x, **kw):
            return -self.inner(x, **kw)

    rm = RewardModel(tiny_palm(1), num_binned_output=0)
    for group, beta, reward in ((4, 15., rm), (4, 15., Negated(rm)), (2, 15., rm), (4, 1., rm)):
        trainer, _ = trainer_of("flowrl", reward_model=reward, flowrl_num_times_sample=group - 1, beta=beta,
                                minibatch_size=64)
        printed, log_z = [], []
        trainer.print = printed.append
        trainer.partition_function.register_forward_hook(lambda m, i, o: log_z.append(o.detach().mean().item()))
        train(trainer, 1)                       # one group, one minibatch
        (line,) = printed
        loss, balance = float(line.split(",")[0].split(":")[1]), float(line.split(":")[-1])
        expected = beta ** 2 * (group - 1) / group
        check(abs(loss - expected) < 0.01 * max(expected, 1), anchor, f"printed loss {loss}, beta²(G-1)/G = {expected}")
        check(abs(balance - log_z[0]) < 1.5e-3, anchor, f"printed trajectory_balance {balance}, mean log Z {log_z[0]}")


# 6 ---------------------------------------------------------------------------------------------
def test_merge_for_export():
    """Also the statements found wrong: "merge, then add a fresh scope" on a trainer's PaLM."""
    doc = f"{LS}#merge-for-export"
    for name in ("grpo", "ppo"):
        trainer, palm = trainer_of(name, actor_lr=1e-2)
        for _ in range(3):
            train(trainer, ROLLOUTS[name])
        x = torch.randint(1, 64, (2, 8))
        with torch.no_grad():
            scoped = palm(x, finetune_scope="actor")
            export = copy.deepcopy(palm)
            export.merge_finetune_params("actor")
            assert (export(x) - scoped).abs().max() < 1e-4, f"{doc}: the merged copy differs from the scoped policy"
        train(trainer, ROLLOUTS[name])         # the trainer is untouched by the copy's merge
        held = {id(p) for g in trainer.actor_optim.param_groups for p in g["params"]}
        palm.merge_finetune_params("actor")
        err = raises(lambda: train(trainer, 1), AssertionError)
        assert err is not None and str(err) == "", f"{doc}: {name} after merging its scope: {err!r}"
        palm.add_finetune_params("actor")       # a fresh scope: never in the old optimizer
        fresh = [p.clone() for p in palm.finetune_parameters("actor")]
        assert not {id(p) for p in palm.finetune_parameters("actor")} & held, f"{doc}: the optimizer took the new scope"
        for _ in range(3):
            train(trainer, ROLLOUTS[name])
        assert not moved(fresh, palm.finetune_parameters("actor")), f"{doc}: {name}: a re-added scope trains now"


# 7 ---------------------------------------------------------------------------------------------
def test_own_actor_critic():
    """Also the statement found wrong: PPO builds its ActorCritic only without actor_critic=."""
    doc = f"{AR}#own-actor-critic"
    actor, other = tiny_palm(), tiny_palm(9)
    ac = ActorCritic(actor, pooled_values=True)
    trainer, _ = trainer_of("ppo", palm=other, actor_critic=ac, actor_lora=False, critic_lora=False, actor_lora_r=2,
                            critic_lora_r=2, critic_pooled_values=False, actor_dropout=0.5, critic_dropout=0.5)
    assert trainer.actor_critic is ac and ac.actor_lora and ac.pooled_values, f"{doc}: trainer arguments reach it now"
    assert ac.actor_palm.finetune_modules["actor"][0][0].A.shape[1] == 8, f"{doc}: actor_lora_r is applied now"
    assert all(m.p == 0. for m in actor.modules() if isinstance(m, torch.nn.Dropout)), f"{doc}: actor_dropout applied"
    assert trainer.palm is other and not other.finetune_modules, f"{doc}: palm= is used as the actor now"
    train(trainer, 4)
    err = raises(lambda: touch("ppo")(reward_model=RewardModel(tiny_palm(1)), actor_critic=ActorCritic(tiny_palm(2)),
                                      prompt_token_ids=torch.randint(1, 64, (4, 5)), accelerate_kwargs=dict(cpu=True)),
                 TypeError)
    assert err is not None and "palm" in str(err), f"{doc}: palm= is optional now: {err!r}"
    assert ActorCritic(tiny_palm(3)).pooled_values is False, f"{doc}: ActorCritic's default pooled_values changed"
    trainer, _ = trainer_of("ppo", palm=tiny_palm(3), actor_critic=ActorCritic(tiny_palm(4)))
    err = raises(lambda: train(trainer, 4), RuntimeError)
    assert err is not None and "detach views in-place" in str(err), f"{doc}: default pooled_values=False: {err!r}"
    trainer, _ = trainer_of("ppo", palm=tiny_palm(3), actor_critic=ActorCritic(tiny_palm(5), pooled_values=True),
                            critic_num_pred_bins=10)
    err = raises(lambda: train(trainer, 4), RuntimeError)
    assert err is not None and "(6) must match the size of tensor b (10)" in str(err), f"{doc}: bins 6 vs 10: {err!r}"


# 8 ---------------------------------------------------------------------------------------------
def test_weight_copies():
    """Also the statement found wrong: an ImplicitPRM critic does train when n - 1 equals the bins."""
    doc = f"{SEL}#weight-copies"

    def palms(trainer):
        return {id(m): m for m in trainer.modules() if isinstance(m, PaLM)}

    for name, count in {"ppo": 3, "grpo": 2, "tpo": 2, "flowrl": 2}.items():
        trainer, _ = trainer_of(name)
        found = palms(trainer).values()
        assert len(found) == count, f"{doc}: {name} holds {len(found)} PaLMs"
        assert len({p.token_emb.weight.data_ptr() for p in found}) == count, f"{doc}: {name} PaLMs share storage now"
    trainer, _ = trainer_of("ppo", critic=ImplicitPRM(tiny_palm(3)))
    assert len(palms(trainer)) == 4, f"{doc}: PPO with an ImplicitPRM critic holds {len(palms(trainer))} PaLMs"
    bins = trainer.critic_hl_gauss_loss.num_bins
    train(trainer, 4, max_seq_len=bins + 1)    # n - 1 == bins: no error
    err = raises(lambda: train(trainer, 4, max_seq_len=bins + 2), RuntimeError)
    assert err is not None and "must match the size" in str(err), \
        f"{PO}traps-rewards.md#implicit-prm-critic: ImplicitPRM critic with n - 1 != bins: {err!r}"
    palm = tiny_palm()
    trainer, _ = trainer_of("ppo", palm=palm, critic=ImplicitPRM(palm))
    held = {id(p) for g in trainer.critic_optim.param_groups for p in g["params"]}
    assert id(palm.token_emb.weight) in held, f"{doc}: ImplicitPRM(palm) no longer hands the critic the actor's base"


# statements found wrong elsewhere -----------------------------------------------------------------
def test_flash_attention_dropout_survives_set_dropout():
    """palm-api.md said set_dropout reaches every attention dropout; with flash_attn it does not,
    so traps-rollouts.md#actor-dropout-ratio's fix needs attn_dropout=0. for such a PaLM."""
    doc = f"{PA}#dropout-saving-and-loading and {ROLLOUT_TRAPS}#actor-dropout-ratio"
    palm = tiny_palm(flash_attn=True, attn_dropout=0.5).set_dropout(0.).train()
    assert all(m.p == 0. for m in palm.modules() if isinstance(m, torch.nn.Dropout)), f"{doc}: set_dropout"
    x = torch.randint(1, 64, (2, 8))
    with torch.no_grad(), pytest.warns(FutureWarning):
        a, b = palm(x), palm(x)
    assert not torch.equal(a, b), f"{doc}: flash attention's dropout follows set_dropout now"
    with torch.no_grad():
        plain = tiny_palm(attn_dropout=0.5).set_dropout(0.).train()
        assert torch.equal(plain(x), plain(x)), f"{doc}: set_dropout no longer removes the plain attention dropout"
