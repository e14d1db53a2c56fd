"""Facts that sub-skills/policy-optimization/references/api-reference.md states in words (its code
blocks run in test_doc_code_blocks.py): TPO's ``tpo_eta``, GRPO's entropy bonus and score
centering, PPO's ``value_clip`` units, arguments accepted and ignored, the trainers' ``generate``
arguments. Each failure names the section to update. Tiny CPU models.
"""
from __future__ import annotations

import inspect
import re

import pytest
import torch

import palm_rlhf_pytorch.grpo as grpo
import palm_rlhf_pytorch.ppo as ppo
from palm_rlhf_pytorch import ActorCritic, ImplicitPRM, RewardModel
from canary import VOCAB, ConstantReward, LastTokenReward, make, reseed, tiny_palm
from policy_optimization import trainers

DOC = "sub-skills/policy-optimization/references/api-reference.md"


@pytest.fixture(autouse=True)
def private_dir(tmp_path, monkeypatch):
    """TPO writes ./tpo_memmap_replay_buffer: each test in its own directory, seeded."""
    monkeypatch.chdir(tmp_path)
    reseed()


def fix(section: str, what: str) -> str:
    return f"upstream palm-rlhf-pytorch changed: {what}. Update {DOC}#{section}, then this test."


def test_tpo_eta_barely_changes_the_move_actor_lr_does():
    def lora_move(eta, lr=1e-4):  # how far 3 updates move the LoRA weights
        palm = tiny_palm()
        trainer = make("tpo", palm=palm, reward_model=RewardModel(palm, num_binned_output=0), num_times_sample_rewards=3,
                       minibatch_size=1, tpo_eta=eta, actor_lr=lr)
        trainer.print = lambda *a: None
        before = [p.detach().clone() for p in palm.finetune_parameters("actor")]
        torch.manual_seed(1)
        trainer.train(num_episodes=3, max_timesteps=1, update_timesteps=1, max_seq_len=8)
        return sum((p - b).norm() for p, b in zip(palm.finetune_parameters("actor"), before)).item()

    sharp, flat, fast = lora_move(0.1), lora_move(10.), lora_move(1., lr=1e-3)
    assert 0.5 < sharp / flat < 2 and fast > 5 * sharp, \
        fix("tpo-rlhftrainer", f"LoRA moved {sharp:.4f} (eta 0.1), {flat:.4f} (eta 10), {fast:.4f} (lr 1e-3)")


@pytest.mark.parametrize("reward, equal", [(0, True), (1, False)])
def test_grpo_entropy_bonus_is_capped_by_the_advantage(monkeypatch, reward, equal):
    """add_entropy_to_advantage adds scale * entropy, at most |advantage| / kappa: nothing to a
    group whose rewards are all equal (advantage 0)."""
    seen = []
    add = grpo.add

    def spy(pattern, advantages, bonus):
        out = add(pattern, advantages, bonus)
        seen.append((advantages.detach().clone(), (out - advantages[:, None]).detach()))
        return out

    monkeypatch.setattr(grpo, "add", spy)
    palm = tiny_palm()
    model = ConstantReward(palm, 1) if equal else LastTokenReward(palm, 1.)
    trainer = make("grpo", palm=palm, reward_model=model, grpo_num_times_sample_rewards=3, minibatch_size=4,
                   kl_div_loss_weight=0., add_entropy_to_advantage=True)
    trainer.print = lambda *a: None
    trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=8)
    (advantages, bonus), = seen
    kappa = trainer.entropy_to_advantage_kappa
    capped = bool((bonus <= advantages.abs()[:, None] / kappa + 1e-6).all() and (bonus >= 0).all())
    assert capped and (bonus.abs().sum() == 0) == equal, \
        fix("grpo-tpo-flowrl", f"advantages {advantages.tolist()}, bonus sum {bonus.sum():.4f}")


def test_grpo_score_centering_combines_with_the_entropy_bonus():
    trainer = make("grpo", use_score_centering=True, add_entropy_to_advantage=True)
    trainer.print = lambda *a: None
    trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=8)
    src = inspect.getsource(grpo)
    assert "cancels systematic drift caused by training-inference mismatch" in src, \
        fix("grpo-tpo-flowrl", "score centering's stated purpose")


def test_ppo_value_clip_is_in_reward_units():
    """learn() decodes the critic's bins to a scalar, clips the change by value_clip, then the
    HL-Gauss loss reads the clipped scalar."""
    src = inspect.getsource(ppo.RLHFTrainer.learn)
    decode = src.index("transform_from_logits")
    clip = src.index(".clamp(-self.value_clip, self.value_clip)")
    assert decode < clip, fix("actorcritic-and-ppo", "value_clip no longer clips the decoded value")


def test_reward_model_needs_a_2d_prompt_mask():
    """The best-of-n recipe's (b, n) prompt mask: a 1-D one raises EinopsError."""
    from einops import EinopsError
    model, seq = RewardModel(tiny_palm(), num_binned_output=0), torch.randint(1, VOCAB, (3, 10))
    with pytest.raises(EinopsError):
        model(seq, prompt_mask=torch.arange(10) < 4)
    assert model(seq, prompt_mask=(torch.arange(10) < 4).expand(3, -1)).shape == (3,)


@pytest.mark.parametrize("name", list(trainers.TRAINERS))
def test_log_with_alone_logs_nothing(name, capsys):
    """#logging-per-update-statistics: a tracker in accelerate_kwargs(log_with=...) is never started
    or called (no init_trackers, no log), though learn() runs and prints its losses; the lines come
    from Accelerator.print (local main process only) of the unreduced loss.item()."""
    import accelerate.state
    from accelerate.tracking import GeneralTracker
    calls = []

    class Recorder(GeneralTracker):
        name, requires_logging_directory, main_process_only = "recorder", False, False

        def __init__(self):
            super().__init__()

        @property
        def tracker(self):
            return self

        def store_init_configuration(self, values):
            calls.append(("config", values))

        def log(self, values, step=None, **kwargs):
            calls.append(("log", values))

    palm = tiny_palm()
    trainer = make(name, palm=palm, reward_model=RewardModel(palm, num_binned_output=0), minibatch_size=2,
                   accelerate_kwargs=dict(log_with=Recorder()))
    trainer.train(num_episodes=1, max_timesteps=2, update_timesteps=2, max_seq_len=8)
    assert "_loss: " in capsys.readouterr().out                        # learn() ran and printed
    assert calls == [] and trainer.accelerate.trackers == [], fix("logging-per-update-statistics", f"{calls}")
    learn = inspect.getsource(type(trainer).learn)
    assert "self.print(f'" in learn and not re.search(r"accelerate\.(gather|reduce)|all_reduce|all_gather", learn), fix(
        "logging-per-update-statistics", "the printed loss is now gathered across ranks")
    assert "is_local_main_process" in inspect.getsource(accelerate.state.PartialState.print)


# --- argument rows (api-reference.md#arguments, palm-api.md, implicit-prm.md) that no other test runs --

PA = "sub-skills/palm-modeling/references/palm-api.md"
IP = "sub-skills/reward-modeling/references/implicit-prm.md"


@pytest.mark.parametrize("name", ["ppo", "grpo", "tpo", "flowrl"])
def test_trainer_generate_extra_arguments_raise(name):
    """#shared-by-the-four-trainers: an extra positional argument lands on max_seq_len again, and
    use_tqdm collides with the actor's own."""
    trainer = make(name)
    prompt = torch.tensor([5, 6, 7, 8])
    with pytest.raises(TypeError, match="max_seq_len"):
        trainer.generate(8, 1.0, prompt=prompt)
    with pytest.raises(TypeError, match="use_tqdm"):
        trainer.generate(8, prompt=prompt, use_tqdm=False)
    assert trainer.generate(8, prompt=prompt, num_samples=2).shape == (8,), fix("shared-by-the-four-trainers", "generate")


def test_prompts_path_takes_a_path_except_in_ppo(tmp_path):
    from beartype.roar import BeartypeCallHintParamViolation
    from pathlib import Path
    path = tmp_path / "prompts.txt"
    path.write_text("ab\ncd")
    tokenize = lambda prompts: torch.randint(1, 64, (len(prompts), 3))  # noqa: E731
    make("grpo", prompt_token_ids=None, prompts_path=Path(path), tokenizer=tokenize)
    with pytest.raises(BeartypeCallHintParamViolation):
        make("ppo", prompt_token_ids=None, prompts_path=Path(path), tokenizer=tokenize)
    make("ppo", prompt_token_ids=None, prompts_path=str(path), tokenizer=tokenize)


def test_critic_palm_is_shared_and_its_dropout_wins():
    palm = tiny_palm()
    ac = ActorCritic(palm, critic=palm, actor_dropout=0.1, critic_dropout=0.3)
    assert ac.critic is palm and {"actor", "critic"} <= set(palm.finetune_modules), fix("actorcritic-and-ppo", "critic=palm")
    assert {m.p for m in palm.modules() if isinstance(m, torch.nn.Dropout)} == {0.3}, fix("actorcritic-and-ppo", "dropout")


def test_palm_argument_rows():
    palm = tiny_palm()
    x = torch.randint(1, 64, (2, 6))
    assert palm(x, return_loss=True, return_only_embedding=True).shape == (2, 5, 32), \
        f"{PA}#forward: return_only_embedding no longer wins over return_loss"
    assert palm(x, return_loss=True, return_logits_with_embedding=True).ndim == 0, \
        f"{PA}#forward: return_logits_with_embedding is no longer ignored with return_loss"
    out = palm.generate(6, prompt=torch.tensor([[5, 7, 9]]), eos_token=7, pad_value=0.5, return_seq_without_prompt=False)
    assert out.dtype == torch.long and out.tolist() == [[5, 7, 0, 0]], f"{PA}#generate: pad_value 0.5 gave {out.tolist()}"


def test_implicit_prm_ref_model_model_freezes_the_policy():
    policy = tiny_palm()
    ImplicitPRM(policy, ref_model=policy)
    assert not any(p.requires_grad for p in policy.parameters()), f"{IP}#what-it-computes: ref_model=model"
