"""Canaries: one test per trap in sub-skills/policy-optimization/references/traps-*.md.

Each reproduces the upstream behaviour on the installed palm-rlhf-pytorch and asserts it. When
upstream fixes or changes a trap, its canary fails with a message naming the doc section
(``traps-<topic>.md#anchor``) and the SKILL.md one-liner to update. Tiny sizes, CPU, temp dirs.
The silent-failure canaries are in test_silent_failures.py; the shared helpers in canary.py.
"""
from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import palm_rlhf_pytorch.flowrl as flowrl
import palm_rlhf_pytorch.grpo as grpo
from palm_rlhf_pytorch import ActorCritic

from canary import (COVERED, INDEX, SKILL, VOCAB, Rollout, canary_env, capture_memories,  # noqa: F401
                    capture_state, covers, doc, make, module_of, reseed, tiny_palm, touch, trap_raises,
                    trap_sections, update)
from conftest import REPO
from policy_optimization import trainers

ALL = tuple(trainers.TRAINERS)


@covers("ppo-max-norm", *ALL)
def test_ppo_max_norm(name, capsys, ddp_cases):
    trainer = make(name, max_norm=1.0)
    if name == "ppo":
        with trap_raises("ppo-max-norm", AttributeError, "no attribute 'accelerator'"):
            trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=6)
        trainer.accelerator = trainer.accelerate  # the documented workaround clips fine
        trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=6)
        assert "critic_loss" in capsys.readouterr().out, update("ppo-max-norm", "workaround failed")
        # under DDP the alias alone fails one line further; exposing the wrapped methods trains
        alias, exposed = ddp_cases["ppo max_norm alias"], ddp_cases["ppo max_norm exposed"]
        assert alias == "AttributeError: 'DistributedDataParallel' object has no attribute 'actor_parameters'" \
            and exposed == "ok DistributedDataParallel", update("ppo-max-norm", f"DDP: alias {alias!r}, exposed {exposed!r}")
    else:
        trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=6)
        assert "loss" in capsys.readouterr().out, update("ppo-max-norm", f"{name} learn() printed no loss")


@covers("optimizer-first-steps", *ALL)
def test_optimizer_first_steps():
    from adam_atan2_pytorch import AdamAtan2, AdoptAtan2
    from palm_rlhf_pytorch.lora import LoRA

    expected = {"ppo": "AdoptAtan2", "grpo": "AdoptAtan2", "tpo": "AdamAtan2", "flowrl": "AdoptAtan2"}
    for name in trainers.TRAINERS:
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


@covers("pad-value-strips-ids", *ALL)
def test_pad_value_strips_ids(name):
    trainer = make(name, prompt_token_ids=torch.tensor([[5, 0, 7, 0, 9]]))
    state = capture_state(trainer, name)
    assert state[0].tolist() == [5, 7, 9], update("pad-value-strips-ids", f"{name} rollout got {state[0].tolist()}")
    trainer = make(name, pad_value=-1, prompt_token_ids=torch.tensor([[5, 0, 7, 0, 9, -1]]))
    state = capture_state(trainer, name)  # a pad id outside the vocabulary keeps every real id
    assert state[0].tolist() == [5, 0, 7, 0, 9], update("pad-value-strips-ids", f"{name} pad -1 gave {state[0].tolist()}")
    trainer = make(name, prompt_token_ids=torch.tensor([[5, 7, 9, 3, 3]]))  # a tokenizer padding with 3
    state = capture_state(trainer, name)
    assert state[0].tolist() == [5, 7, 9, 3, 3], update("pad-value-strips-ids", f"{name} other pad gave {state[0].tolist()}")


@covers("prompts-path-trailing-newline", *ALL)
def test_prompts_path_trailing_newline(name, tmp_path, monkeypatch):
    """Each trainer's own reader: the tokenizer gets a last prompt '', the rollout that draws it
    gets an empty state, and sampling from it fails."""
    (tmp_path / "prompts.txt").write_text("ab\ncd\n")
    seen = []

    def tokenizer(prompts):
        seen.extend(prompts)
        rows = [torch.tensor([ord(c) - 90 for c in p] or [0]) for p in prompts]
        return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)

    build = lambda: make(name, prompt_token_ids=None, prompts_path="prompts.txt", tokenizer=tokenizer)
    trainer = build()
    assert seen == ["ab", "cd", ""], update("prompts-path-trailing-newline", f"{name} tokenizer got {seen}")
    monkeypatch.setattr(module_of(name), "randrange", lambda *args: 2)  # draw the empty prompt
    state = capture_state(trainer, name)
    assert state.numel() == 0, update("prompts-path-trailing-newline", f"{name} rollout state {state.tolist()}")
    with trap_raises("prompts-path-trailing-newline", RuntimeError, "0 elements"):
        build().train(num_episodes=1, max_timesteps=1, max_seq_len=6)


@covers("prompt-source-assertions", *ALL)
def test_prompt_source_assertions(name):
    for kwargs in (dict(prompt_token_ids=None),
                   dict(prompt_token_ids=torch.ones(2, 3, dtype=torch.long), prompts=["a"])):
        with trap_raises("prompt-source-assertions", AssertionError, "^$"):
            make(name, **kwargs)
    trainer = make(name, prompt_token_ids=torch.tensor([5, 6, 7]))
    assert trainer.num_prompts == 3, update("prompt-source-assertions", "1-D prompt_token_ids")
    state = capture_state(trainer, name)
    assert state.shape[-1] == 1, update("prompt-source-assertions", f"1-D prompts give state {tuple(state.shape)}")


@covers("tpo-replay-buffer-dir", "tpo")
def test_tpo_replay_buffer_dir(tmp_path):
    make("tpo").train(num_episodes=1, max_timesteps=1, update_timesteps=3, max_seq_len=6)
    folder = tmp_path / "tpo_memmap_replay_buffer"
    assert folder.is_dir(), update("tpo-replay-buffer-dir", "no ./tpo_memmap_replay_buffer after train()")
    # preallocated: max_episodes 4 x update_timesteps 3 x group 2 x (prompt 4 + max_seq_len 6)
    cells = 4 * 3 * 2 * (4 + 6)
    sizes = {name: (folder / f"{name}.data.npy").stat().st_size for name in ("sequence", "mask", "prompt_mask")}
    assert 0 <= sizes["sequence"] - 4 * cells < 4096 and all(0 <= sizes[m] - cells < 4096 for m in ("mask", "prompt_mask")), \
        update("tpo-replay-buffer-dir", f"buffer file sizes {sizes} for {cells} cells")
    import numpy as np
    anchor, lens = "tpo-replay-buffer-dir", []
    trainer = make("tpo")  # only episode 0 is ever filled
    learn = trainer.learn
    trainer.learn = lambda buffer: (lens.append(buffer.episode_lens.tolist()), learn(buffer))
    trainer.train(num_episodes=1, max_timesteps=4, update_timesteps=2, max_seq_len=6)
    assert lens == [[2, 0, 0, 0]] * 2, update(anchor, f"episode_lens at learn() {lens}")
    make("tpo").train(num_episodes=1, max_timesteps=2, update_timesteps=2, max_seq_len=6, max_episodes=1)
    trainer = make("tpo")  # the first store fills one whole episode on disk, of max_episodes (4)
    trainer.learn = lambda buffer: None
    trainer.train(num_episodes=1, max_timesteps=2, update_timesteps=4000, max_seq_len=6)
    stat = (folder / "sequence.data.npy").stat()
    assert stat.st_blocks * 512 < stat.st_size / 4 + 65536, update(anchor, f"{stat.st_blocks * 512} B on disk of {stat.st_size}")
    assert np.load(folder / "sequence.data.npy", mmap_mode="r").any()
    trainer, started = make("tpo"), []
    def stop(*args, **kwargs):  # a second train() in the folder: overwrite=True has wiped it
        started.append(np.load(folder / "sequence.data.npy", mmap_mode="r").any())
        raise Rollout
    trainer.actor.generate = stop
    with pytest.raises(Rollout):
        trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=4000, max_seq_len=6)
    assert started == [False], update(anchor, "a second train() kept the first one's data")


@covers("flowrl-partition-dim", "flowrl")
def test_flowrl_partition_dim():
    default = inspect.signature(flowrl.FlowRLTrainer).parameters["partition_function_hidden_dim"].default
    assert default == 768, update("flowrl-partition-dim", f"default is {default}")
    trainer = make("flowrl", partition_function_hidden_dim=768)  # constructs fine with dim 32
    with trap_raises("flowrl-partition-dim", RuntimeError, "cannot be multiplied"):
        trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=6)


@covers("generate-seq-len", "PaLM")
def test_generate_seq_len():
    palm, prompt = tiny_palm(), torch.randint(1, VOCAB, (2, 6))
    shapes = [tuple(palm.generate(n, prompt=prompt).shape) for n in (10, 6, 3)]
    assert shapes == [(2, 4), (2, 1), (2, 1)], update("generate-seq-len", f"shapes {shapes}")


@covers("actor-scope-reused-palm", *ALL)
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
    plain = tiny_palm(attn_dropout=0.1)  # actor_lora=False: dropout set, no scope added
    make(name, palm=plain, actor_lora=False)
    ps = {m.p for m in plain.modules() if isinstance(m, torch.nn.Dropout)}
    assert not plain.finetune_modules and ps == {0.0}, update(
        "actor-scope-reused-palm", f"{name} actor_lora=False: scopes {list(plain.finetune_modules)}, dropout {ps}")


@covers("prompts-num-prompts", *ALL)
def test_prompts_num_prompts(name):
    anchor, ids = "prompts-num-prompts", torch.randint(1, VOCAB, (3, 4))
    trainer = make(name, prompt_token_ids=ids)
    assert trainer.num_prompts == 3, update(anchor, f"{name} num_prompts {trainer.num_prompts}")
    trainer.prompt_token_ids = ids[1:2]
    reseed()
    with trap_raises(anchor, IndexError, "out of bounds for dimension 0 with size 1"):
        trainer.train(num_episodes=1, max_timesteps=20, update_timesteps=100, max_seq_len=6)
    trainer.num_prompts = 1  # the documented fix
    assert torch.equal(capture_state(trainer, name).reshape(-1, 4)[0], ids[1]), update(anchor, f"{name} drew another prompt")


@covers("update-timesteps-default", *ALL)
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
    # 5 rollouts, update_timesteps 2: two learn() calls of 2 rollouts each, the 5th never learned
    rollouts = []
    trainer = make(name)
    trainer.learn = lambda got: rollouts.append(got.timestep_index if name == "tpo" else len(got) // (1 if name == "ppo" else 2))
    trainer.train(num_episodes=1, max_timesteps=5, update_timesteps=2, max_seq_len=6)
    assert rollouts == [2, 2], update("update-timesteps-default", f"{name} learn() got rollouts {rollouts}")


TQDM_SCRIPT = """
import os, sys
if sys.argv[1] == 'late':
    import torch
    os.environ['TQDM_DISABLE'] = '1'
import torch
sys.path.insert(0, sys.argv[2])
import probe_kit  # torch-free until a function runs: the import order above is the library's
from policy_optimization import tiny_trainers
import palm_rlhf_pytorch
palm = probe_kit.tiny_palm(0)
trainer = tiny_trainers.tiny_trainer("ppo", palm=palm, reward_model=probe_kit.tiny_reward_model(palm),
                                 prompt_token_ids=torch.randint(1, probe_kit.TINY_PALM["num_tokens"], (3, 4)))
trainer.train(num_episodes=1, max_timesteps=1, max_seq_len=7)
"""


def bar_kinds(stderr: str) -> tuple[bool, bool]:
    """(an episodes bar, another bar: generate's) among the tqdm lines of ``stderr``."""
    lines = [ln for ln in re.split(r"[\r\n]", stderr) if "|" in ln and "it/s" in ln]
    return any(ln.startswith("episodes") for ln in lines), any(not ln.startswith("episodes") for ln in lines)


@covers("tqdm-disable", *ALL)
def test_tqdm_disable(tmp_path, monkeypatch, capsys):
    import palm_rlhf_pytorch.palm as palm_module
    assert palm_module.tqdm.__module__ == "tqdm.std", update("tqdm-disable", f"palm.py tqdm {palm_module.tqdm}")
    for name in ALL:  # the episodes bar is accelerate's in every trainer; the run below is PPO's
        assert module_of(name).tqdm.__module__ == "accelerate.utils.tqdm", update("tqdm-disable", f"{name} tqdm")
        assert inspect.getsource(module_of(name)).count("use_tqdm = True") == 1, update("tqdm-disable", f"{name} generate no longer asks for the bar")
    def bars(mode, env):  # TQDM_DISABLE is read when tqdm is imported: a fresh interpreter per mode
        env = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_")} | env | {"CUDA_VISIBLE_DEVICES": ""}
        proc = subprocess.run([sys.executable, "-c", TQDM_SCRIPT, mode, str(REPO / "scripts")], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return bar_kinds(proc.stderr)

    episodes, generate = bars("early", {"TQDM_DISABLE": "1"})
    assert episodes and not generate, update("tqdm-disable", f"early: episodes bar {episodes}, generate bar {generate}")
    episodes, generate = bars("late", {})
    assert episodes and generate, update("tqdm-disable", f"late: episodes bar {episodes}, generate bar {generate}")
    # the notebook fix: both names rebound in a process that has imported the library (this one:
    # no environment read at import is involved), after a run here that shows both bars
    import probe_kit
    from policy_optimization import tiny_trainers
    def bars_here():
        palm = probe_kit.tiny_palm(0)
        trainer = tiny_trainers.tiny_trainer("ppo", palm=palm, reward_model=probe_kit.tiny_reward_model(palm),
                                         prompt_token_ids=torch.randint(1, probe_kit.TINY_PALM["num_tokens"], (3, 4)))
        capsys.readouterr()
        trainer.train(num_episodes=1, max_timesteps=1, max_seq_len=7)
        return bar_kinds(capsys.readouterr().err)
    monkeypatch.chdir(tmp_path)
    episodes, generate = bars_here()
    assert episodes and generate, update("tqdm-disable", f"before the rebinding: episodes bar {episodes}, generate bar {generate}")
    for module in (palm_module, module_of("ppo")):
        monkeypatch.setattr(module, "tqdm", lambda it, *a, **k: it)
    episodes, generate = bars_here()
    assert not episodes and not generate, update("tqdm-disable", f"rebound: episodes bar {episodes}, generate bar {generate}")


@covers("flowrl-probabilities", "flowrl")
def test_flowrl_probabilities():
    values = torch.cat([m.action_log_prob.flatten() for m in capture_memories(make("flowrl"))])
    assert (values >= 0).all() and (values <= 1).all() and (values > 0).any(), \
        update("flowrl-probabilities", f"action_log_prob range {values.min():.3f}..{values.max():.3f}")
    src = inspect.getsource(flowrl.FlowRLTrainer.learn)
    assert "einx.get_at('b n [l], b n -> b n', action_probs, sequences)" in src, \
        update("flowrl-probabilities", "learn() no longer gathers from softmax probabilities")


@covers("generate-one-prompt", *ALL)
def test_generate_one_prompt(name):
    trainer = make(name)
    with trap_raises("generate-one-prompt", AssertionError, "only one prompt allowed at a time for now"):
        trainer.generate(8, prompt=torch.randint(1, VOCAB, (2, 4)))
    prompt = torch.tensor([5, 6, 7, 8])
    best = trainer.generate(8, prompt=prompt, num_samples=2)
    assert best.shape == (8,) and best.dtype == torch.int64 and best[:4].tolist() == [5, 6, 7, 8], \
        update("generate-one-prompt", f"{name} returned {tuple(best.shape)} {best.dtype}")


@covers("prints-to-stdout", *ALL)
@pytest.mark.parametrize("name,plain", [("ppo", True), ("grpo", False), ("tpo", False), ("flowrl", True)])
def test_prints_to_stdout(name, plain, capsys):
    make(name).train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=6)
    out = capsys.readouterr().out
    assert "loss: " in out and "complete" in out, update("prints-to-stdout", f"{name} stdout {out!r}")
    src = inspect.getsource(touch(name).train)
    last = [ln.strip() for ln in src.splitlines() if "complete" in ln][-1]
    assert last.startswith("print(") is plain, update("prints-to-stdout", f"{name} ends with {last}")
    trainer, lines = make(name), []
    trainer.print = lines.append  # every loss line goes through trainer.print
    trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=6)
    out = capsys.readouterr().out
    assert any("loss: " in ln for ln in lines) and "loss: " not in out, update("prints-to-stdout", f"{name} {lines}")


@covers("critic-parameters-flag", "ppo")
def test_critic_parameters_flag():
    ac = ActorCritic(tiny_palm(), actor_lora=False, critic_lora=True)
    expected = len(list(ac.critic.parameters())) + len(list(ac.value_head.parameters()))
    assert len(ac.critic_parameters()) == expected, update("critic-parameters-flag", "actor_lora=False")
    ac = ActorCritic(tiny_palm(), actor_lora=True, critic_lora=False)
    with trap_raises("critic-parameters-flag", AssertionError, "scope None not found"):
        ac.critic_parameters()
    with trap_raises("critic-parameters-flag", AssertionError, "scope None not found"):
        make("ppo", critic_lora=False)


@covers("flowrl-save-omits-partition", "flowrl")
def test_flowrl_save_omits_partition(tmp_path):
    anchor = "flowrl-save-omits-partition"
    trainer = make("flowrl", minibatch_size=2)
    trainer.train(num_episodes=1, max_timesteps=3, update_timesteps=3, max_seq_len=6)  # 3 optimizer steps
    trainer.save(str(tmp_path / "ckpt.pt"))
    keys = torch.load(tmp_path / "ckpt.pt").keys()
    assert keys and not any("partition" in k for k in keys), update(anchor, "saved keys")
    # the documented resume: save() plus the partition function and both optimizers' state dicts
    torch.save({"partition_function": trainer.partition_function.state_dict(),
                "actor_optim": trainer.actor_optim.state_dict(),
                "partition_function_optim": trainer.partition_function_optim.state_dict()}, tmp_path / "extra.pt")
    resumed = make("flowrl", palm=tiny_palm(seed=1), minibatch_size=2)
    resumed.load(str(tmp_path / "ckpt.pt"))
    fresh_z = not all(torch.equal(a, b) for a, b in zip(trainer.partition_function.parameters(),
                                                          resumed.partition_function.parameters()))
    extra = torch.load(tmp_path / "extra.pt")  # weights_only=True (torch's default) reads them
    for attr, state in extra.items():
        getattr(resumed, attr).load_state_dict(state)
    same = all(torch.equal(t, getattr(resumed, m).state_dict()[k]) for m in ("actor", "partition_function")
               for k, t in getattr(trainer, m).state_dict().items())
    steps = {int(v["steps"]) for v in resumed.actor_optim.state_dict()["state"].values()}
    assert fresh_z and same and steps == {3}, update(anchor, f"fresh Z {fresh_z}, restored {same}, steps {steps}")
    src = inspect.getsource(flowrl.FlowRLTrainer.train)  # rollouts since the last learn() live in train()
    assert "memories = deque([])" in src and "time = 0" in src, update(anchor, "train() keeps its state elsewhere")


@covers("group-size-per-rollout", "grpo", "tpo", "flowrl")
def test_group_size_per_rollout(monkeypatch):
    got = {name: len(capture_memories(make(name, **{kw: 2})))
           for name, kw in [("grpo", "grpo_num_times_sample_rewards"), ("flowrl", "flowrl_num_times_sample")]}
    assert got == {"grpo": 3, "flowrl": 3}, update("group-size-per-rollout", f"items per rollout {got}")
    defaults = (inspect.signature(grpo.RLHFTrainer).parameters["grpo_num_times_sample_rewards"].default,
                inspect.signature(flowrl.FlowRLTrainer).parameters["flowrl_num_times_sample"].default)
    assert defaults == (10, 8), update("group-size-per-rollout", f"defaults {defaults}")
    stored = []  # TPO: one replay-buffer timestep per rollout, holding the whole group
    store = module_of("tpo").ReplayBuffer.store
    monkeypatch.setattr(module_of("tpo").ReplayBuffer, "store",
                        lambda self, **data: (stored.append(tuple(data["sequence"].shape)), store(self, **data))[1])
    trainer = make("tpo", num_times_sample_rewards=2)
    trainer.learn = lambda buffer: None
    trainer.train(num_episodes=1, max_timesteps=2, update_timesteps=2, max_seq_len=7)
    assert stored == [(3, 4 + 7)] * 2, update("group-size-per-rollout", f"TPO stored {stored}")


@covers("grpo-incompatible-after-lora", "grpo")
def test_grpo_incompatible_after_lora():
    palm = tiny_palm()
    with trap_raises("grpo-incompatible-after-lora", AssertionError, "cannot use both Dr. GRPO and MaxRL"):
        make("grpo", palm=palm, use_dr_grpo=True, use_max_rl=True)
    assert "actor" in palm.finetune_modules, update("grpo-incompatible-after-lora", "no scope left behind")


@covers("implicit-prm-negative-ids", "ImplicitPRM")
def test_implicit_prm_negative_ids():
    from palm_rlhf_pytorch import ImplicitPRM
    prm = ImplicitPRM(tiny_palm())
    seq = torch.randint(1, VOCAB, (2, 6))
    seq[:, -1] = -1
    with trap_raises("implicit-prm-negative-ids", RuntimeError, "out of bounds"):
        prm(seq)
    seq[:, 3] = -1                                  # an input id too: the embedding fails first
    with trap_raises("implicit-prm-negative-ids", IndexError, "out of range"):
        prm(seq)


@covers("ppo-per-token-values", "ppo")
def test_ppo_per_token_values(name):
    anchor = "ppo-per-token-values"
    with trap_raises(anchor, RuntimeError, "Can't detach views in-place"):
        make(name, critic_pooled_values=False, minibatch_size=2).train(
            num_episodes=1, max_timesteps=2, update_timesteps=2, max_seq_len=8)
    # patched or not, the per-token advantage subtracts each row's mean: a reward per row cancels
    normalize, values = module_of(name).masked_normalize, torch.randn(4, 6)
    adv = [normalize(r[:, None] - values, dim=-1, mask=torch.ones(4, 6, dtype=torch.bool))
           for r in (torch.zeros(4), torch.tensor([5., -3., 1., 30.]))]
    assert torch.allclose(*adv, atol=1e-5), update(anchor, "per-token advantages now depend on the reward")
    # the pooled value: the critic's embeddings shifted by one, averaged over the response positions
    ac = ActorCritic(tiny_palm(), pooled_values=True)
    x, mask = torch.randint(1, VOCAB, (2, 8)), torch.arange(8).expand(2, 8) >= 4
    _, values = ac(x, mask=mask)
    emb = ac.critic(x, return_only_embedding=True, finetune_scope="critic")
    emb = torch.cat([torch.zeros_like(emb[:, :1]), emb[:, :-1]], dim=1)
    expected = ac.value_head((emb * mask[..., None]).sum(1) / mask.sum(1, keepdim=True))
    assert torch.allclose(values, expected, atol=1e-5), update(anchor, "the pooled value reads other positions")


@covers("implicit-prm-critic", "ppo")
def test_implicit_prm_critic(name, capsys):
    anchor = "implicit-prm-critic"
    from palm_rlhf_pytorch import ImplicitPRM
    trainer = make(name, critic=ImplicitPRM(tiny_palm(1)), minibatch_size=2)  # constructs
    assert trainer.actor_critic.critic_is_prm and not trainer.actor_critic.critic_lora
    with trap_raises(anchor, RuntimeError, r"size of tensor a \(7\) must match the size of tensor b \(6\)"):
        trainer.train(num_episodes=1, max_timesteps=2, update_timesteps=2, max_seq_len=8)
    # max_seq_len - 1 == critic_num_pred_bins: the (b, n - 1) rewards pass as 6 bin logits, no error
    make(name, critic=ImplicitPRM(tiny_palm(1)), minibatch_size=2).train(
        num_episodes=1, max_timesteps=2, update_timesteps=2, max_seq_len=7)
    assert "critic_loss" in capsys.readouterr().out, update(anchor, "max_seq_len 7 no longer trains silently")


@covers("no-module-attribute", *ALL)
def test_no_module_attribute(name):
    anchor = "no-module-attribute"
    src = inspect.getsource(module_of(name))
    assert not re.search(r"\.module\b", src), update(anchor, f"{name} now reads .module")
    assert "self.accelerate.unwrap_model(" in src, update(anchor, f"{name} no longer unwraps")
    if name == "ppo":  # the rollout's generate is bound to the plain ActorCritic before prepare()
        assert src.index("self.actor_critic_generate = actor_critic.generate") < src.index("self.accelerate.prepare("), \
            update(anchor, "PPO binds its rollout generate after prepare()")


@covers("prompt-ids-device", *ALL)
def test_prompt_ids_device(name):
    """Accelerate moves only what the trainer prepares; the prompt ids are the trainer's own buffer
    (and PPO builds its ActorCritic and HL-Gauss loss on the PaLM's device). Checked on CPU only."""
    anchor = "prompt-ids-device"
    trainer = make(name)
    prepared = trainer.accelerate._models
    assert all(not any(b is trainer.prompt_token_ids for b in m.buffers()) for m in prepared), \
        update(anchor, f"{name} prepares its prompt ids")
    src = inspect.getsource(type(trainer).train)
    assert "state = self.prompt_token_ids[" in src and ".to(" not in src.split("state = self.prompt_token_ids[")[1].split("\n")[0], \
        update(anchor, f"{name} train() reads the prompt ids differently")
    from accelerate import PartialState  # a bare .cuda() before this ran lands on cuda:0 on every rank
    assert "device_module.set_device(self.device)" in inspect.getsource(PartialState.set_device), \
        update(anchor, "Accelerate no longer sets each rank's current device")
    if name == "ppo":
        init = inspect.getsource(type(trainer).__init__)
        assert init.count(".to(palm.device)") == 2 and not any(m is trainer.critic_hl_gauss_loss for m in prepared), \
            update(anchor, "PPO no longer places its ActorCritic and HL-Gauss loss on the PaLM's device")


DDP_CASES = textwrap.dedent("""
    import contextlib, io, json, os, sys, tempfile, warnings
    warnings.filterwarnings("ignore")
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, sys.argv[1])  # the skill root's scripts/: probe_kit adds the tree's other roots
    import probe_kit
    from policy_optimization import tiny_trainers
    from ddp_fixes import apply_ddp_fixes, expose_wrapped_attributes
    from rule_reward import RuleReward, token_fraction
    from accelerate.utils import DistributedDataParallelKwargs
    os.chdir(tempfile.mkdtemp())
    MINIBATCH = {"ppo": 2, "grpo": 2, "tpo": 1, "flowrl": 2}  # one group of 2 per step (TPO: a group is one item)

    class AnchoredRuleReward(RuleReward):  # the documented workaround
        def __init__(self, score):
            super().__init__(score)
            self.ddp_anchor = torch.nn.Parameter(torch.zeros(()))

    def case(name, freeze=None, fixes=True, unused=False, scope=False, reward=None, train=True, clip=None):
        kw = {"max_norm": 1.0} if clip else {}
        torch.manual_seed(0)
        palm = probe_kit.tiny_palm()
        if freeze == "before":
            palm.requires_grad_(False)
        if scope:
            palm.add_finetune_params("other")
        handlers = [DistributedDataParallelKwargs(find_unused_parameters=True)] if unused else []
        try:
            trainer = tiny_trainers.tiny_trainer(
                name, palm=palm, reward_model=reward, group_size=None if name == "ppo" else 2,
                minibatch_size=MINIBATCH[name], prompt_token_ids=torch.randint(1, probe_kit.TINY_PALM["num_tokens"], (4, 4)),
                accelerate_kwargs=dict(kwargs_handlers=handlers), **kw)
            if fixes:
                apply_ddp_fixes(trainer)
            if clip:  # PPO max_norm: the alias, then (clip == "exposed") the wrapper's attributes too
                trainer.accelerator = trainer.accelerate
                if clip == "exposed":
                    expose_wrapped_attributes(trainer.actor_critic, ["actor_parameters", "critic_parameters"])
            if freeze == "after":
                models = [palm] + ([trainer.accelerate.unwrap_model(trainer.actor_critic).critic] if name == "ppo" else [])
                for model in models:
                    for n, p in model.named_parameters():
                        p.requires_grad_(n.startswith("finetune_modules."))
            if train:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    trainer.train(num_episodes=2, max_timesteps=2, update_timesteps=2, max_seq_len=8)
            return "ok " + type(trainer.actor_critic if name == "ppo" else trainer.actor).__name__
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}".splitlines()[0]

    out = {}
    for name in tiny_trainers.SMOKE_MINIBATCH:
        out[f"{name} frozen after"] = case(name, "after")
        out[f"{name} frozen before"] = case(name, "before")
        out[f"{name} rule reward"] = case(name, reward=RuleReward(token_fraction({3})), train=False)
        if name == "ppo":
            out["ppo frozen after, no fixes"] = case(name, "after", fixes=False)
        else:
            out[f"{name} frozen after, find_unused_parameters"] = case(name, "after", unused=True)
    out["grpo extra scope"] = case("grpo", scope=True)
    out["ppo max_norm alias"] = case("ppo", clip="alias")
    out["ppo max_norm exposed"] = case("ppo", clip="exposed")
    out["grpo anchored rule reward"] = case("grpo", reward=AnchoredRuleReward(token_fraction({3})))

    def saved_keys():  # trainer.save() under DDP, then the documented prefix stripping
        try:
            torch.manual_seed(0)
            trainer = tiny_trainers.tiny_trainer("grpo", palm=probe_kit.tiny_palm(), group_size=2, minibatch_size=2)
            trainer.save("ckpt.pt")
            state = torch.load("ckpt.pt")
            policy = probe_kit.tiny_palm(finetune_scopes=("actor",))
            policy.load_state_dict({k.removeprefix("module.").removeprefix("actor_palm."): v for k, v in state.items()})
            return " ".join(sorted({".".join(k.split(".")[:2]) for k in state})) + " loaded"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}".splitlines()[0]
    out["grpo save keys"] = saved_keys()
    print("DDP-CASES " + json.dumps(out), flush=True)
""")


@pytest.fixture(scope="module")
def ddp_cases(tmp_path_factory):
    """DDP_CASES under ``torchrun --nproc_per_node 1`` over gloo: Accelerate wraps the models in
    DistributedDataParallel with one process too. {case: "ok <wrapper class>" or "Type: message"}."""
    from conftest import run
    from run_kit import launch
    cwd = tmp_path_factory.mktemp("ddp-cases")
    (cwd / "cases.py").write_text(DDP_CASES)
    proc = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_addr",
                "127.0.0.1", "--master_port", str(launch.free_port()), str(cwd / "cases.py"), str(REPO / "scripts")],
               cwd, env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"},
               timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("DDP-CASES ")]
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[0].split(" ", 1)[1])


def test_ddp_saved_policy_keys(ddp_cases):
    """Knowledge round 2: a file trainer.save() wrote under DDP has module.actor_palm. keys; stripping
    module. and actor_palm. loads it into a PaLM with the actor scope."""
    doc = "sub-skills/policy-optimization/references/trainer-selection.md#trained-policy"
    got = ddp_cases["grpo save keys"]
    assert got == "module.actor_palm loaded", f"{doc}: GRPO's save() under DDP: {got}"


REDUCTION = "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one."


@covers("ddp-unused-parameters", *ALL)
def test_ddp_unused_parameters(name, ddp_cases):
    anchor = "ddp-unused-parameters"
    touch(name)
    got = {k.split(" ", 1)[1]: v for k, v in ddp_cases.items() if k.startswith(f"{name} ") and "rule reward" not in k}
    assert got["frozen before"] == f"ok {'DistributedDataParallel'}", update(anchor, f"{name} frozen before: {got}")
    if name == "ppo":  # fix_ppo turns DDP's own gradient sync off, so its reducer expects nothing
        assert got["frozen after"].startswith("ok") and got["frozen after, no fixes"].startswith(REDUCTION), \
            update(anchor, f"PPO: {got}")
    else:
        assert got["frozen after"].startswith(REDUCTION) and got["frozen after, find_unused_parameters"].startswith("ok"), \
            update(anchor, f"{name}: {got}")
    if name == "grpo":
        assert got["extra scope"].startswith(REDUCTION), update(anchor, f"GRPO extra LoRA scope: {got}")


@covers("rule-reward-multi-cpu", *ALL)
def test_rule_reward_multi_cpu(name, ddp_cases):
    anchor = "rule-reward-multi-cpu"
    touch(name)
    assert ddp_cases[f"{name} rule reward"].startswith(
        "RuntimeError: DistributedDataParallel is not needed when a module doesn't have any parameter that requires a gradient"), \
        update(anchor, f"{name}: {ddp_cases[f'{name} rule reward']}")
    if name == "grpo":
        assert ddp_cases["grpo anchored rule reward"] == "ok DistributedDataParallel", \
            update(anchor, f"the workaround: {ddp_cases['grpo anchored rule reward']}")
    # on GPUs Accelerate skips the wrap for a module without trainable parameters (MULTI_CPU does not)
    from accelerate import Accelerator
    src = inspect.getsource(Accelerator.prepare_model)
    gpu, cpu = src.split("elif self.distributed_type == DistributedType.MULTI_CPU:")
    assert "if any(p.requires_grad for p in model.parameters()):" in gpu.split("if self.multi_device")[-1] \
        and "requires_grad" not in cpu.split("elif")[0], update(anchor, "Accelerate's prepare_model changed")


# --- the doc and the canaries cover each other -----------------------------------------------------

import test_silent_failures  # noqa: E402,F401  (registers the silent-failure canaries in COVERED)
import test_reference_gaps  # noqa: E402,F401  (registers the canaries of issue 21's troubleshooting sections)

INDEXES = {"symptom-index", "silent-failures"}  # navigation sections: no canary of their own


def doc_sections() -> dict[str, str]:
    """``{anchor: section text}`` of the index (troubleshooting.md) and of every traps file, each up
    to the next anchor."""
    parts = re.split(r'<a id="([^"]+)"></a>\n', (REPO / INDEX).read_text(encoding="utf-8"))[1:]
    index = dict(zip(parts[0::2], parts[1::2]))
    assert set(index) == INDEXES, f"{INDEX}: sections {sorted(index)}; the traps go in a traps-*.md"
    return {**index, **{anchor: text for anchor, (_, text) in trap_sections().items()}}


def index_links(section: str) -> list[tuple[str, str]]:
    """``(file, anchor)`` of each link of an index section to a traps file (``traps-x.md#anchor``)."""
    return re.findall(r"\]\((traps-[\w-]+\.md)#([\w-]+)\)", section)


def applies_to(section: str) -> tuple[set[str], set[str]]:
    """The section's ``Applies to:`` line as (affected, checked unaffected); trainers by key."""
    line = re.search(r"^Applies to: (.+)$", section, re.M)
    assert line, "no 'Applies to:' line"
    affected, _, unaffected = line.group(1).rstrip(".").partition("; not ")
    names = lambda part: {trainers.BY_DISPLAY.get(n, n) for n in re.split(r",\s*", part) if n}
    return names(affected), names(unaffected)


def test_every_trap_has_a_canary_and_back():
    anchors = set(doc_sections()) - INDEXES
    assert anchors == set(COVERED), (f"sections without canary: {anchors - set(COVERED)}; "
                                     f"canaries without section: {set(COVERED) - anchors}")


def test_sections_apply_to_what_their_canaries_cover():
    """Each section's 'Applies to' names exactly what its canary runs (canary.canary_env checks
    that a canary really builds or reads each trainer it declares)."""
    for anchor, section in doc_sections().items():
        if anchor in INDEXES:
            continue
        affected, unaffected = applies_to(section)
        assert affected and not affected & unaffected, anchor
        assert affected | unaffected == COVERED[anchor].subjects, (
            f"{doc(anchor)} applies to {sorted(affected | unaffected)}, its canary "
            f"{COVERED[anchor].test} covers {sorted(COVERED[anchor].subjects)}")


def test_silent_failure_table_rows():
    """Each row links one section; its Trainers are among those the section says it affects; the
    table covers all four trainers."""
    sections = doc_sections()
    rows = [line for line in sections["silent-failures"].splitlines() if line.startswith("| [")]
    assert len(rows) >= 20
    seen = set()
    for row in rows:
        condition, named_cell = [c.strip() for c in row.strip("|").split(" | ")[:2]]
        ((file, anchor),) = index_links(condition)
        assert doc(anchor).endswith(f"/{file}#{anchor}"), f"row {condition}: {file} holds no #{anchor}"
        named = {trainers.BY_DISPLAY[n] for n in named_cell.split(", ")}
        assert named <= applies_to(sections[anchor])[0], f"row {condition}: {sorted(named)}"
        seen |= named
    assert seen == set(trainers.TRAINERS)


def test_symptom_index_links_resolve():
    """Each link of the index to a traps file names the file that holds the section; its links
    within the page name its own sections."""
    index = doc_sections()["symptom-index"]
    targets = index_links(index)
    assert len(targets) >= 40
    folder = Path(INDEX).parent.as_posix()
    wrong = [f"{file}#{anchor}" for file, anchor in targets if doc(anchor) != f"{folder}/{file}#{anchor}"]
    assert not wrong, f"{INDEX}#symptom-index links a section its file does not hold: {wrong}"
    assert set(re.findall(r"\]\(#([\w-]+)\)", index)) <= INDEXES


def test_cited_source_lines_exist():
    """Every ``package/file.py:N`` cited in the traps files names an installed file that long."""
    import importlib.util
    text = "".join(section for _, section in trap_sections().values())
    cites = re.findall(r"`(\w+)/([\w/]+\.py):([\d,-]+)`", text)
    assert len(cites) >= 40
    for package, path, lines in cites:
        root = Path(importlib.util.find_spec(package).origin).parent
        n = len((root / path).read_text(encoding="utf-8").splitlines())
        last = max(int(x) for x in re.split(r"[,-]", lines))
        assert last <= n, f"{package}/{path}:{lines} beyond its {n} lines"


def test_skill_gotchas_link_a_canary_section():
    """Each 'Key gotchas' bullet of the sub-skill links the troubleshooting section whose canary
    checks it: SKILL.md has the one-liner, the traps file the detail."""
    text = (REPO / SKILL).read_text(encoding="utf-8")
    section = text.split("## Key gotchas", 1)[1].split("\n## ", 1)[0]
    bullets = [b for b in re.split(r"\n(?=- )", section.strip()) if b.startswith("- ")]
    assert bullets
    for bullet in bullets:
        links = re.findall(r"\((references/traps-[\w-]+\.md)#([\w-]+)\)", bullet)
        assert links and all(a in COVERED and doc(a).endswith(f"{f}#{a}") for f, a in links), \
            f"gotcha without a canary section: {bullet!r}"


def test_canary_naming_a_trainer_it_never_builds_fails():
    """The guard behind test_sections_apply_to_what_their_canaries_cover (canary_env runs it after
    every test): a canary declaring PPO and GRPO that built only PPO misses GRPO."""
    from canary import TOUCHED, unexercised

    def demo(name):
        """stands in for a canary registered with covers('demo', 'ppo', 'grpo')"""
    demo.anchor, demo.subjects = "demo", frozenset({"ppo", "grpo"})
    TOUCHED.clear()
    touch("ppo")
    assert unexercised(demo, {"name": "grpo"}) == {"grpo"} and unexercised(demo, {"name": "ppo"}) == set()
    assert unexercised(demo, {}) == {"grpo"}
    assert unexercised(test_canary_naming_a_trainer_it_never_builds_fails, {}) == set()  # not a canary


def test_prompts_path_canary_guards_every_reader(tmp_path):
    """Issue 15 item 8: GRPO's, TPO's or FlowRL's reader changed to splitlines() fails the canary,
    naming the section (before, only PPO's reader was guarded)."""
    from test_check_skill import library_copy
    lib = library_copy(tmp_path, ("grpo.py", "path.read_text().split('\\n')", "path.read_text().splitlines()"))
    for module, old in (("tpo.py", "Path(prompts_path).read_text().split('\\n')"),
                        ("flowrl.py", "path.read_text().split('\\n')")):
        target = lib / "palm_rlhf_pytorch" / module
        assert target.read_text().count(old) == 1
        target.write_text(target.read_text().replace(old, old.replace(".split('\\n')", ".splitlines()")))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                           "tests/test_canaries.py::test_prompts_path_trailing_newline"], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(lib), "CUDA_VISIBLE_DEVICES": ""},
                          capture_output=True, text=True, timeout=600)
    assert "3 failed, 1 passed" in proc.stdout, proc.stdout[-3000:]
    for name in ("grpo", "tpo", "flowrl"):
        assert f"{name} tokenizer got ['ab', 'cd']" in proc.stdout
    assert "traps-setup.md#prompts-path-trailing-newline" in proc.stdout
    # each failure fits in 10 lines (conftest.canary_failure): its line, its section, its message
    failures = proc.stdout.split(" FAILURES ", 1)[1].split(" short test summary info ", 1)[0]
    blocks = re.split(r"^_{3,} test_\S+ _{3,}$", failures, flags=re.M)[1:]
    assert len(blocks) == 3 and all(len(b.strip().splitlines()) <= 10 for b in blocks), failures[-3000:]


FAILING_CANARY = """
from canary import canary_env, covers, make, update  # noqa: F401

@covers("demo-anchor", "grpo")
def test_demo(name):
    trainer = make(name)
    assert trainer.num_prompts == 99, update("demo-anchor", f"{name} num_prompts {trainer.num_prompts}")
"""


def test_a_failing_canary_fits_in_ten_lines(tmp_path):
    """A canary asserting on a trainer's attribute once reported the trainer's whole module tree
    (pytest's assertion introspection, untruncated under CI): now its line, section and message."""
    (tmp_path / "test_demo_canary.py").write_text(FAILING_CANARY)
    roots = [str(REPO / "tests"), str(REPO / "scripts")]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_demo_canary.py")], cwd=tmp_path,
                          env={**os.environ, "CI": "true", "PYTHONPATH": os.pathsep.join(roots), "CUDA_VISIBLE_DEVICES": ""},
                          capture_output=True, text=True, timeout=600)
    assert "1 failed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    block = proc.stdout.split(" FAILURES ", 1)[1].split(" short test summary info ", 1)[0]
    lines = [line for line in block.strip().splitlines() if not line.startswith(("=", "___"))]
    assert 1 < len(lines) <= 10 and "RLHFTrainer(" not in proc.stdout, block
    assert lines[0] == "test_demo_canary.py:7: the canary of " + doc("demo-anchor") + " failed:", lines
    assert "grpo num_prompts 3" in lines[1] and "Update " + doc("demo-anchor") in lines[1]
