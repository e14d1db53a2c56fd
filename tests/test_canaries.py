"""Canaries: one test per trap in sub-skills/policy-optimization/references/troubleshooting.md.

Each reproduces the upstream behaviour on the installed palm-rlhf-pytorch and asserts it. When
upstream fixes or changes a trap, its canary fails with a message naming the doc section
(``troubleshooting.md#anchor``) and the SKILL.md one-liner to update. Tiny sizes, CPU, temp dirs.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import re
import subprocess
import sys

import pytest
import torch

import palm_rlhf_pytorch.flowrl as flowrl
import palm_rlhf_pytorch.grpo as grpo
import palm_rlhf_pytorch.ppo as ppo
import palm_rlhf_pytorch.tpo as tpo
from palm_rlhf_pytorch import ActorCritic, PaLM, RewardModel

from conftest import REPO

DOC = "sub-skills/policy-optimization/references/troubleshooting.md"
SKILL = "sub-skills/policy-optimization/SKILL.md"
TINY = dict(num_tokens=64, dim=32, depth=1, heads=2, dim_head=8)
# trainer class, kwargs keeping it tiny, attribute holding the rollout function
TRAINERS = {
    "ppo": (ppo.RLHFTrainer, {}, "actor_critic_generate"),
    "grpo": (grpo.RLHFTrainer, dict(grpo_num_times_sample_rewards=1), "actor_generate"),
    "tpo": (tpo.RLHFTrainer, dict(num_times_sample_rewards=1), None),
    "flowrl": (flowrl.FlowRLTrainer, dict(flowrl_num_times_sample=1, partition_function_hidden_dim=32),
               "actor_generate"),
}
COVERED: dict[str, str] = {}  # anchor -> canary test name


def covers(anchor: str):
    """Register a canary for ``troubleshooting.md#anchor``."""
    def mark(fn):
        COVERED[anchor] = fn.__name__
        fn.anchor = anchor
        return fn
    return mark


def update(anchor: str, what: str) -> str:
    return (f"upstream palm-rlhf-pytorch changed: {what}. Update {DOC}#{anchor} "
            f"(and its one-liner in {SKILL} if it has one), then this canary.")


def tiny_palm(seed: int = 0, **kw) -> PaLM:
    torch.manual_seed(seed)
    return PaLM(**TINY, **kw)


def make(name: str, palm: PaLM | None = None, **kw):
    cls, extra, _ = TRAINERS[name]
    palm = palm or tiny_palm()
    kw = {**extra, **kw}
    kw.setdefault("prompt_token_ids", torch.randint(1, 64, (3, 4)))
    return cls(palm=palm, reward_model=RewardModel(palm), accelerate_kwargs=dict(cpu=True), **kw)


@contextlib.contextmanager
def trap_raises(anchor: str, exc: type[BaseException], match: str):
    """Like pytest.raises, but a missing or different error fails naming the doc section."""
    try:
        yield
    except exc as err:
        assert re.search(match, str(err)), update(anchor, f"{exc.__name__} now says {str(err)!r}")
    else:
        pytest.fail(update(anchor, f"no {exc.__name__} ({match!r}) any more"))


class Rollout(Exception):
    """Raised by a stand-in rollout function to hand the state it got back to the test."""


def capture_state(trainer, name: str) -> torch.Tensor:
    """The prompt tensor the trainer's ``train()`` passes to its first rollout."""
    def fake(state, *args, **kwargs):
        raise Rollout(state)
    attr = TRAINERS[name][2]
    if attr:
        setattr(trainer, attr, fake)
    else:  # TPO calls self.actor.generate directly
        trainer.actor.generate = fake
    with pytest.raises(Rollout) as info:
        trainer.train(num_episodes=1, max_timesteps=1, max_seq_len=8)
    return info.value.args[0]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # TPO's replay buffer, checkpoints
    torch.manual_seed(0)


@covers("ppo-max-norm")
@pytest.mark.parametrize("name", list(TRAINERS))
def test_ppo_max_norm(name, capsys):
    trainer = make(name, max_norm=1.0)
    if name == "ppo":
        with trap_raises("ppo-max-norm", AttributeError, "no attribute 'accelerator'"):
            trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=6)
        trainer.accelerator = trainer.accelerate  # the documented workaround clips fine
        trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=6)
        assert "critic_loss" in capsys.readouterr().out, update("ppo-max-norm", "workaround failed")
    else:
        trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=6)
        assert "loss" in capsys.readouterr().out, update("ppo-max-norm", f"{name} learn() printed no loss")


@covers("optimizer-first-steps")
def test_optimizer_first_steps():
    from adam_atan2_pytorch import AdamAtan2, AdoptAtan2
    from palm_rlhf_pytorch.lora import LoRA

    expected = {"ppo": "AdoptAtan2", "grpo": "AdoptAtan2", "tpo": "AdamAtan2", "flowrl": "AdoptAtan2"}
    for name in TRAINERS:
        optim = make(name).actor_optim
        got = type(getattr(optim, "optimizer", optim)).__name__
        assert got == expected[name], update("optimizer-first-steps", f"{name} actor optimizer is {got}")

    def moved_per_step(optim_cls, steps):
        torch.manual_seed(0)
        lora = LoRA(8, 8, r=2)
        opt = optim_cls(lora.parameters(), lr=1e-2)
        x, target = torch.randn(4, 8), torch.randn(4, 8)
        history = []
        for _ in range(steps):
            before = {n: p.detach().clone() for n, p in lora.named_parameters()}
            (lora(x) - target).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            history.append(sorted(n for n, p in lora.named_parameters() if not torch.equal(before[n], p)))
        return history

    adopt = moved_per_step(AdoptAtan2, 3)
    assert adopt == [[], ["B"], ["A", "B"]], update("optimizer-first-steps", f"AdoptAtan2 moved {adopt}")
    adam = moved_per_step(AdamAtan2, 2)
    assert adam == [["B"], ["A", "B"]], update("optimizer-first-steps", f"AdamAtan2 moved {adam}")


@covers("pad-value-strips-ids")
@pytest.mark.parametrize("name", list(TRAINERS))
def test_pad_value_strips_ids(name):
    trainer = make(name, prompt_token_ids=torch.tensor([[5, 0, 7, 0, 9]]))
    state = capture_state(trainer, name)
    assert state[0].tolist() == [5, 7, 9], update("pad-value-strips-ids", f"{name} rollout got {state[0].tolist()}")


@covers("prompts-path-trailing-newline")
def test_prompts_path_trailing_newline(tmp_path, monkeypatch):
    (tmp_path / "prompts.txt").write_text("ab\ncd\n")
    seen = []

    def tokenizer(prompts):
        seen.extend(prompts)
        rows = [torch.tensor([ord(c) - 90 for c in p] or [0]) for p in prompts]
        return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)

    trainer = make("ppo", prompt_token_ids=None, prompts_path="prompts.txt", tokenizer=tokenizer)
    assert seen == ["ab", "cd", ""], update("prompts-path-trailing-newline", f"tokenizer got {seen}")
    monkeypatch.setattr(ppo, "randrange", lambda *args: 2)  # draw the empty prompt
    with trap_raises("prompts-path-trailing-newline", RuntimeError, "0 elements"):
        trainer.train(num_episodes=1, max_timesteps=1, max_seq_len=6)


@covers("prompt-source-assertions")
@pytest.mark.parametrize("name", list(TRAINERS))
def test_prompt_source_assertions(name):
    for kwargs in (dict(prompt_token_ids=None),
                   dict(prompt_token_ids=torch.ones(2, 3, dtype=torch.long), prompts=["a"])):
        with trap_raises("prompt-source-assertions", AssertionError, "^$"):
            make(name, **kwargs)
    trainer = make(name, prompt_token_ids=torch.tensor([5, 6, 7]))
    assert trainer.num_prompts == 3, update("prompt-source-assertions", "1-D prompt_token_ids")
    state = capture_state(trainer, name)
    assert state.shape[-1] == 1, update("prompt-source-assertions", f"1-D prompts give state {tuple(state.shape)}")


@covers("tpo-replay-buffer-dir")
def test_tpo_replay_buffer_dir(tmp_path):
    make("tpo").train(num_episodes=1, max_timesteps=1, update_timesteps=3, max_seq_len=6)
    folder = tmp_path / "tpo_memmap_replay_buffer"
    assert folder.is_dir(), update("tpo-replay-buffer-dir", "no ./tpo_memmap_replay_buffer after train()")
    # preallocated: max_episodes 4 x update_timesteps 3 x group 2 x (prompt 4 + max_seq_len 6)
    cells = 4 * 3 * 2 * (4 + 6)
    sizes = {name: (folder / f"{name}.data.npy").stat().st_size for name in ("sequence", "mask", "prompt_mask")}
    assert 0 <= sizes["sequence"] - 4 * cells < 4096 and all(0 <= sizes[m] - cells < 4096 for m in ("mask", "prompt_mask")), \
        update("tpo-replay-buffer-dir", f"buffer file sizes {sizes} for {cells} cells")


@covers("flowrl-partition-dim")
def test_flowrl_partition_dim():
    default = inspect.signature(flowrl.FlowRLTrainer).parameters["partition_function_hidden_dim"].default
    assert default == 768, update("flowrl-partition-dim", f"default is {default}")
    trainer = make("flowrl", partition_function_hidden_dim=768)  # constructs fine with dim 32
    with trap_raises("flowrl-partition-dim", RuntimeError, "cannot be multiplied"):
        trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=6)


@covers("generate-seq-len")
def test_generate_seq_len():
    palm, prompt = tiny_palm(), torch.randint(1, 64, (2, 6))
    shapes = [tuple(palm.generate(n, prompt=prompt).shape) for n in (10, 6, 3)]
    assert shapes == [(2, 4), (2, 1), (2, 1)], update("generate-seq-len", f"shapes {shapes}")


@covers("actor-scope-reused-palm")
@pytest.mark.parametrize("name", list(TRAINERS))
def test_actor_scope_reused_palm(name):
    palm = tiny_palm(attn_dropout=0.1, ff_dropout=0.1)
    make(name, palm=palm)
    assert "actor" in palm.finetune_modules, update("actor-scope-reused-palm", f"{name} added no actor scope")
    ps = {m.p for m in palm.modules() if isinstance(m, torch.nn.Dropout)}
    assert ps == {0.0}, update("actor-scope-reused-palm", f"{name} left dropout {ps}")
    with trap_raises("actor-scope-reused-palm", AssertionError, "finetune scope actor already found"):
        make("ppo", palm=palm)
    palm.remove_finetune_params("actor")  # the documented fix for reusing a PaLM
    make("ppo", palm=palm)


@covers("update-timesteps-default")
@pytest.mark.parametrize("name,done", [("ppo", "rlhf training complete"), ("grpo", "grpo rlhf training complete"),
                                       ("tpo", "tpo training complete"), ("flowrl", "FlowRL training complete")])
def test_update_timesteps_default(name, done, capsys):
    trainer = make(name)
    calls = []
    trainer.learn = lambda *args, **kwargs: calls.append(1)
    default = inspect.signature(trainer.train).parameters["update_timesteps"].default
    assert default == 5000, update("update-timesteps-default", f"default is {default}")
    trainer.train(num_episodes=1, max_timesteps=2, max_seq_len=6)
    out = capsys.readouterr().out
    assert calls == [] and done in out, update("update-timesteps-default", f"learn calls {calls}, stdout {out!r}")


TQDM_SCRIPT = """
import os, sys
if sys.argv[1] == 'late':
    import torch
    os.environ['TQDM_DISABLE'] = '1'
import torch
from palm_rlhf_pytorch import PaLM, RewardModel, RLHFTrainer
torch.manual_seed(0)
palm = PaLM(num_tokens=64, dim=32, depth=1, heads=2, dim_head=8)
trainer = RLHFTrainer(palm=palm, reward_model=RewardModel(palm), prompt_token_ids=torch.randint(1, 64, (3, 4)),
                      accelerate_kwargs=dict(cpu=True))
trainer.train(num_episodes=1, max_timesteps=1, max_seq_len=7)
"""


@covers("tqdm-disable")
def test_tqdm_disable(tmp_path):
    def bars(mode, env):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_")} | env | {"CUDA_VISIBLE_DEVICES": ""}
        proc = subprocess.run([sys.executable, "-c", TQDM_SCRIPT, mode], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines = [ln for ln in re.split(r"[\r\n]", proc.stderr) if "|" in ln and "it/s" in ln]
        return any(ln.startswith("episodes") for ln in lines), any(not ln.startswith("episodes") for ln in lines)

    episodes, generate = bars("early", {"TQDM_DISABLE": "1"})
    assert episodes and not generate, update("tqdm-disable", f"early: episodes bar {episodes}, generate bar {generate}")
    episodes, generate = bars("late", {})
    assert episodes and generate, update("tqdm-disable", f"late: episodes bar {episodes}, generate bar {generate}")


def capture_memories(trainer):
    got = []
    trainer.learn = lambda memories: got.extend(memories)
    trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=7)
    return got


@covers("flowrl-probabilities")
def test_flowrl_probabilities():
    values = torch.cat([m.action_log_prob.flatten() for m in capture_memories(make("flowrl"))])
    assert (values >= 0).all() and (values <= 1).all() and (values > 0).any(), \
        update("flowrl-probabilities", f"action_log_prob range {values.min():.3f}..{values.max():.3f}")
    src = inspect.getsource(flowrl.FlowRLTrainer.learn)
    assert "einx.get_at('b n [l], b n -> b n', action_probs, sequences)" in src, \
        update("flowrl-probabilities", "learn() no longer gathers from softmax probabilities")


@covers("generate-one-prompt")
@pytest.mark.parametrize("name", list(TRAINERS))
def test_generate_one_prompt(name):
    trainer = make(name)
    with trap_raises("generate-one-prompt", AssertionError, "only one prompt allowed at a time for now"):
        trainer.generate(8, prompt=torch.randint(1, 64, (2, 4)))
    prompt = torch.tensor([5, 6, 7, 8])
    best = trainer.generate(8, prompt=prompt, num_samples=2)
    assert best.shape == (8,) and best.dtype == torch.int64 and best[:4].tolist() == [5, 6, 7, 8], \
        update("generate-one-prompt", f"{name} returned {tuple(best.shape)} {best.dtype}")


@covers("prints-to-stdout")
@pytest.mark.parametrize("name,plain", [("ppo", True), ("grpo", False), ("tpo", False), ("flowrl", True)])
def test_prints_to_stdout(name, plain, capsys):
    make(name).train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=6)
    out = capsys.readouterr().out
    assert "loss: " in out and "complete" in out, update("prints-to-stdout", f"{name} stdout {out!r}")
    src = inspect.getsource(TRAINERS[name][0].train)
    last = [ln.strip() for ln in src.splitlines() if "complete" in ln][-1]
    assert last.startswith("print(") is plain, update("prints-to-stdout", f"{name} ends with {last}")


@covers("critic-parameters-flag")
def test_critic_parameters_flag():
    ac = ActorCritic(tiny_palm(), actor_lora=False, critic_lora=True)
    expected = len(list(ac.critic.parameters())) + len(list(ac.value_head.parameters()))
    assert len(ac.critic_parameters()) == expected, update("critic-parameters-flag", "actor_lora=False")
    ac = ActorCritic(tiny_palm(), actor_lora=True, critic_lora=False)
    with trap_raises("critic-parameters-flag", AssertionError, "scope None not found"):
        ac.critic_parameters()
    with trap_raises("critic-parameters-flag", AssertionError, "scope None not found"):
        make("ppo", critic_lora=False)


@covers("flowrl-save-omits-partition")
def test_flowrl_save_omits_partition(tmp_path):
    trainer = make("flowrl")
    trainer.save(str(tmp_path / "ckpt.pt"))
    keys = torch.load(tmp_path / "ckpt.pt").keys()
    assert keys and not any("partition" in k for k in keys), update("flowrl-save-omits-partition", "saved keys")
    assert len(list(trainer.partition_function.parameters())) > 0


@covers("group-size-per-rollout")
def test_group_size_per_rollout():
    got = {name: len(capture_memories(make(name, **{kw: 2})))
           for name, kw in [("grpo", "grpo_num_times_sample_rewards"), ("flowrl", "flowrl_num_times_sample")]}
    assert got == {"grpo": 3, "flowrl": 3}, update("group-size-per-rollout", f"items per rollout {got}")
    defaults = (inspect.signature(grpo.RLHFTrainer).parameters["grpo_num_times_sample_rewards"].default,
                inspect.signature(flowrl.FlowRLTrainer).parameters["flowrl_num_times_sample"].default)
    assert defaults == (10, 8), update("group-size-per-rollout", f"defaults {defaults}")


@covers("grpo-incompatible-after-lora")
def test_grpo_incompatible_after_lora():
    palm = tiny_palm()
    with trap_raises("grpo-incompatible-after-lora", AssertionError, "cannot use both Dr. GRPO and MaxRL"):
        make("grpo", palm=palm, use_dr_grpo=True, use_max_rl=True)
    assert "actor" in palm.finetune_modules, update("grpo-incompatible-after-lora", "no scope left behind")


@covers("implicit-prm-negative-ids")
def test_implicit_prm_negative_ids():
    from palm_rlhf_pytorch import ImplicitPRM
    prm = ImplicitPRM(tiny_palm())
    seq = torch.randint(1, 64, (2, 6))
    seq[:, -1] = -1
    with trap_raises("implicit-prm-negative-ids", RuntimeError, "out of bounds"):
        prm(seq)


# --- the doc and the canaries cover each other -----------------------------------------------------

def doc_anchors() -> list[str]:
    return re.findall(r'<a id="([^"]+)"></a>', (REPO / DOC).read_text(encoding="utf-8"))


def test_every_trap_has_a_canary_and_back():
    anchors = doc_anchors()
    assert len(anchors) == len(set(anchors))
    assert set(anchors) == set(COVERED), (f"sections without canary: {set(anchors) - set(COVERED)}; "
                                          f"canaries without section: {set(COVERED) - set(anchors)}")


def test_skill_gotchas_link_a_canary_section():
    """Each 'Key gotchas' bullet of the sub-skill links the troubleshooting section whose canary
    checks it: SKILL.md has the one-liner, troubleshooting.md the detail."""
    text = (REPO / SKILL).read_text(encoding="utf-8")
    section = text.split("## Key gotchas", 1)[1].split("\n## ", 1)[0]
    bullets = [b for b in re.split(r"\n(?=- )", section.strip()) if b.startswith("- ")]
    assert bullets
    for bullet in bullets:
        links = re.findall(r"references/troubleshooting\.md#([\w-]+)", bullet)
        assert links and all(a in COVERED for a in links), f"gotcha without a canary section: {bullet!r}"
