"""Canaries of the silent failures: conditions under which a trainer runs without an exception
but trains wrongly or not at all (troubleshooting.md#silent-failures, one section each).

Each reproduces the behaviour on the installed palm-rlhf-pytorch (tiny CPU models, a temp dir) and
fails naming its doc section when upstream changes. Helpers and the registry are in canary.py.
"""
from __future__ import annotations

import functools
import inspect
import math
import re
import traceback
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from palm_rlhf_pytorch import PaLM, RewardModel

import doc_tables
import probe_kit
from conftest import REPO
from canary import (CANARY_GROUP, VOCAB, ConstantReward, LastTokenReward, actor_palm, canary_env,  # noqa: F401
                    capture_memories, check, covers, lora, make, module_of, printed, reseed, tiny_palm, touch,
                    trap_raises)
from policy_optimization import tiny_trainers, trainers
from skill_check import api as skill_api, derived
from skill_runtime import version_gate

ALL = tuple(trainers.TRAINERS)
V = VOCAB  # vocabulary of the tiny PaLM (the probe kit's)
TOP_K = math.ceil((1 - 0.9) * V)  # tokens PaLM.generate's default top_k filter keeps


def run(trainer, rollouts: int, max_seq_len: int = 8, **train_kw) -> str:
    """``rollouts`` rollouts and one learn(); returns what the library printed."""
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        trainer.train(num_episodes=1, max_timesteps=rollouts, update_timesteps=rollouts,
                      max_seq_len=max_seq_len, **train_kw)
    return out.getvalue()


def group(name: str, size: int) -> dict:
    return {trainers.TRAINERS[name].group_kwarg: size - 1}


def normalized_rewards(trainer, name: str, monkeypatch) -> torch.Tensor:
    """The per-sequence advantage (GRPO), normalized reward (FlowRL) or z-score (TPO) of one rollout."""
    if name != "tpo":
        return torch.stack([m[-1] for m in capture_memories(trainer)])
    seen = []
    z_score = module_of("tpo").z_score
    monkeypatch.setattr(module_of("tpo"), "z_score", lambda r: seen.append(z_score(r)) or seen[-1])
    trainer.learn = lambda buffer: None
    run(trainer, 1)
    return seen[0] if seen else torch.zeros(trainer.num_times_sample_rewards + 1)  # std 0: zeros


class RatioSpy(TorchFunctionMode):
    """Records FlowRL's trajectory ratios: the tensor learn() clamps to [1 - eps_clip, 1 + eps_clip]."""

    def __init__(self):
        super().__init__()
        self.ratios = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.clamp and len(args) == 3:
            self.ratios.append(args[0].detach().clone())
        return func(*args, **(kwargs or {}))


def flowrl_ratios(trainer, rollouts: int, **train_kw) -> torch.Tensor:
    spy, learn = RatioSpy(), trainer.learn

    def spied(memories):
        with spy:
            learn(memories)
    trainer.learn = spied
    run(trainer, rollouts, **train_kw)
    return torch.cat(spy.ratios)


def alternate(name: str, monkeypatch) -> None:
    """Make train() draw prompt 0, 1, 0, 1, ..."""
    draws = iter(range(10_000))
    monkeypatch.setattr(module_of(name), "randrange", lambda *args: next(draws) % 2)


@covers("equal-rewards-group", "grpo", "flowrl", "tpo")
def test_equal_rewards_group(name, monkeypatch):
    anchor = "equal-rewards-group"

    def build(value, size=11, **kw):
        reseed()
        palm = tiny_palm()
        return make(name, palm, ConstantReward(palm, value), **group(name, size), **kw)

    def trained(value):
        """GRPO or TPO, 3 rollouts of a group of 11 and 3 optimizer steps: (the first group's
        normalized rewards, whether the LoRA moved, the LoRA)."""
        extra = dict(kl_div_loss_weight=0., minibatch_size=11) if name == "grpo" else dict(minibatch_size=1)
        trainer, seen = build(value, beta_s=0., actor_lr=1e-2, **extra), []
        if name == "grpo":
            learn = trainer.learn
            trainer.learn = lambda memories: (seen.extend(m[-1] for m in memories), learn(memories))
        else:
            z_score = module_of(name).z_score
            monkeypatch.setattr(module_of(name), "z_score", lambda r: seen.append(z_score(r)) or seen[-1])
        before = lora(trainer)
        reseed(1)
        run(trainer, 3)
        first = torch.stack(seen[:11]) if name == "grpo" else (seen[0] if seen else torch.zeros(11))
        return first, not torch.equal(before, lora(trainer)), lora(trainer)

    if name == "flowrl":
        residue, exact = (normalized_rewards(build(v), name, monkeypatch) for v in (0.1, 1.0))
    else:
        runs = {v: trained(v) for v in (0.1, 1.0)}
        residue, exact = runs[0.1][0], runs[1.0][0]
    check(residue.abs().min() > 0.9, anchor, f"{name}: equal rewards 0.1, group 11 normalize to {residue.tolist()}")
    check(torch.equal(exact, torch.zeros_like(exact)), anchor, f"{name}: equal rewards 1.0 give {exact.tolist()}")
    four = normalized_rewards(build(0.1, size=4), name, monkeypatch)
    check(torch.equal(four, torch.zeros_like(four)), anchor, f"{name}: 0.1 in a group of 4 gives {four.tolist()}")
    if name == "grpo":  # the residue moves the policy, an exact 0 does not; the documented fix
        check((runs[0.1][1], runs[1.0][1]) == (True, False), anchor, f"GRPO LoRA moved {runs[0.1][1], runs[1.0][1]}")
        dr = normalized_rewards(build(0.1, use_dr_grpo=True), name, monkeypatch)
        check(dr.abs().max() < 1e-6, anchor, f"Dr. GRPO gives {dr.tolist()}")
    if name == "grpo":  # the section's table: chance that a group of G mixes pass and fail, 1 - p^G - (1-p)^G
        from canary import trap_sections
        text = trap_sections()[anchor][1]
        sizes = [int(g) for g in re.findall(r"\| G = (\d+)", text)]
        rows = re.findall(r"^\| (0\.\d+) \|((?: [\d.]+ \|)+)$", text, re.M)
        check(len(sizes) == 3 and len(rows) == 2, anchor, f"table header {sizes}, rows {rows}")
        for p, cells in rows:
            got = [float(c) for c in cells.split("|") if c.strip()]
            want = [round(1 - float(p) ** g - (1 - float(p)) ** g, 2) for g in sizes]
            check(got == want, anchor, f"p = {p}: table {got}, formula {want}")
    if name == "tpo":  # a shift shared by the group cancels in TPO's softmax target
        check(torch.equal(runs[0.1][2], runs[1.0][2]), anchor, "TPO: rewards 0.1 and 1.0 now train differently")


@covers("group-of-one", "grpo", "tpo", "flowrl")
@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning")  # the NaN this section is about
def test_group_of_one(name, monkeypatch):
    anchor = "group-of-one"
    if name == "grpo":
        with trap_raises(anchor, AssertionError, "^$"):
            run(make(name, **group(name, 1)), 1)
        for variant in ("use_dr_grpo", "use_max_rl"):
            adv = torch.stack([m[-1] for m in capture_memories(make(name, **group(name, 1), **{variant: True}))])
            check(torch.equal(adv, torch.zeros(1)), anchor, f"{variant} group of 1 gives {adv.tolist()}")
        two = torch.stack([m[-1] for m in capture_memories(make(name, **group(name, 2)), rollouts=3)])
        check(torch.allclose(two.abs(), torch.full_like(two, 2 ** -0.5), atol=1e-4), anchor, f"group of 2: {two.tolist()}")
    elif name == "tpo":  # the target is the single sequence itself: opposite rewards, same update
        after = []
        for sign in (1., -1.):
            reseed()
            palm = tiny_palm()
            trainer = make(name, palm, LastTokenReward(palm, sign), **group(name, 1), actor_lr=1e-2)
            run(trainer, 3)
            after.append(lora(trainer))
        check(torch.equal(*after), anchor, "TPO group of 1 learned from the reward")
    else:
        trainer = make(name, **group(name, 1), minibatch_size=2)
        rewards = torch.stack([m[-1] for m in capture_memories(make(name, **group(name, 1)))])
        check(rewards.isnan().all(), anchor, f"FlowRL group of 1 normalized rewards {rewards.tolist()}")
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()):  # 3 learn() calls of one optimizer step each
            trainer.train(num_episodes=1, max_timesteps=6, update_timesteps=2, max_seq_len=8)
        nan = [p.isnan().any().item() for p in actor_palm(trainer).finetune_parameters("actor")]
        nan_z = [p.isnan().any().item() for p in trainer.partition_function.parameters()]
        check(all(nan) and all(nan_z), anchor, f"FlowRL NaN tensors: actor {nan}, partition function {nan_z}")


@covers("ppo-minibatch-one", "ppo", "grpo")
def test_ppo_minibatch_one(name, monkeypatch):
    anchor = "ppo-minibatch-one"
    after, moved = [], []
    for sign in (1., -1.):
        reseed()
        palm = tiny_palm()
        trainer = make(name, palm, LastTokenReward(palm, sign), minibatch_size=1, actor_lr=1e-2)
        before = lora(trainer)
        reseed(1)
        run(trainer, 4)
        after.append(lora(trainer))
        moved.append(not torch.equal(before, after[-1]))
    if name == "grpo":  # advantages normalized per group at rollout: a minibatch of one still learns
        check(not torch.equal(*after) and all(moved), anchor, "GRPO minibatch_size=1: opposite rewards train alike now")
        return
    check(torch.equal(*after) and all(moved), anchor,
          f"minibatch_size=1: opposite rewards give equal LoRA {torch.equal(*after)}, LoRA moved {moved}")
    ppo = module_of(name)
    check(ppo.masked_normalize(torch.tensor([3.7])).tolist() == [0.0], anchor, "masked_normalize of one value")
    batches = []
    normalize = ppo.masked_normalize
    monkeypatch.setattr(ppo, "masked_normalize", lambda t, **kw: batches.append(normalize(t, **kw)) or batches[-1])
    run(make(name, minibatch_size=2), 5)
    sizes = sorted((b.numel(), bool((b == 0).all())) for b in batches)
    check(sizes == [(1, True), (2, False), (2, False)], anchor, f"5 rollouts, minibatch 2: advantages {batches}")
    check(all(torch.allclose(b.abs(), torch.ones(2)) for b in batches if b.numel() == 2), anchor,
          f"minibatch of 2 advantages {batches}")


@covers("sampler-mismatch", "ppo", "grpo", "flowrl")
def test_sampler_mismatch(name):
    anchor = "sampler-mismatch"
    trainer = make(name)
    memories = capture_memories(trainer, rollouts=3, max_seq_len=8, temperature=0.5)
    seqs = torch.stack([m.sequence for m in memories])
    actions = ~torch.stack([m.prompt_mask for m in memories])
    stored = torch.stack([m.action_prob for m in memories])
    with torch.no_grad():
        logits = F.pad(actor_palm(trainer)(seqs, finetune_scope="actor"), (0, 0, 1, -1))  # t predicts token t
    check(torch.allclose(stored[actions], logits.softmax(-1)[actions], atol=1e-5), anchor,
          f"{name} stores other than the unfiltered temperature-1 softmax")
    rank = (logits > logits.gather(-1, seqs[..., None])).sum(-1)
    check(bool((rank[actions] < TOP_K).all()), anchor, f"{name} sampled outside the top {TOP_K}")
    kept = stored[actions].topk(TOP_K, dim=-1).values.sum(-1)
    check(bool((kept < 0.5).all()), anchor, f"{name}: stored mass on the sampler's support {kept.tolist()}")
    palm = actor_palm(trainer)  # the documented fix: no filter (and temperature 1)
    palm.generate = functools.partial(palm.generate, filter_logits_fn=None)
    memories = capture_memories(trainer, rollouts=3, max_seq_len=8)
    seqs = torch.stack([m.sequence for m in memories])
    with torch.no_grad():
        logits = F.pad(palm(seqs, finetune_scope="actor"), (0, 0, 1, -1))
    rank = (logits > logits.gather(-1, seqs[..., None])).sum(-1)
    check(bool((rank[actions] >= TOP_K).any()), anchor, f"{name}: filter_logits_fn=None still samples the top {TOP_K}")


@covers("printed-losses", "ppo", "grpo", "flowrl")
def test_printed_losses(name):
    anchor = "printed-losses"
    first = []
    for sign in (1., -1.):
        reseed()
        palm = tiny_palm()
        out = run(make(name, palm, LastTokenReward(palm, sign), minibatch_size=64), 3)
        first.append(printed(out, "flowrl_loss" if name == "flowrl" else "policy_loss")[0])
    if name == "flowrl":  # the reward term alone, beta**2 * (G - 1) / G: the references' derived fact
        start = derived.values(derived.defaults_of(skill_api.installed_api(version_gate.load_api_record())))
        assert CANARY_GROUP == 2, "flowrl_start_g2 (scripts/skill_check/derived.py) is for a group of 2"
        check(all(abs(v - start["flowrl_start_g2"]) < 5 for v in first), anchor,
              f"FlowRL first losses {first}, not beta**2 / 2 = {start['flowrl_start_g2']} at the installed default beta")
        return
    # a minibatch holding whole groups (or PPO's, normalized per minibatch): -beta_s * entropy, the
    # entropy of a fresh policy about ln(vocabulary), the same for opposite rewards
    check(first[0] == first[1] and abs(first[0] + 0.01 * math.log(V)) < 0.005, anchor,
          f"{name} first policy_loss {first} for opposite rewards")
    if name == "grpo":
        cut = []  # shuffled minibatches of 4 cut groups of 3: their advantages do not average 0
        for sign in (1., -1.):
            reseed()
            palm = tiny_palm()
            cut.append(printed(run(make(name, palm, LastTokenReward(palm, sign), minibatch_size=4,
                                        **group(name, 3)), 3), "policy_loss")[0])
        check(cut[0] != cut[1] and abs(cut[0] + 0.01 * math.log(V)) > 0.01, anchor, f"GRPO cut groups print {cut}")
        # a collapsed sampler: near-deterministic policy, every group's samples (and rewards) equal
        reseed()  # 64 ids, not the tiny 257: PaLM.generate's top-k keeps 7 candidates, so scaled
        palm = tiny_palm(num_tokens=64)  # logits collapse every group (with 26, one group kept a spread)
        with torch.no_grad():
            palm.token_emb.weight.mul_(200.)
        trainer = make(name, palm, LastTokenReward(palm, 1.), minibatch_size=4, **group(name, 3),
                       prompt_token_ids=torch.randint(1, 64, (3, 4)))
        stored = []
        learn = trainer.learn
        trainer.learn = lambda memories: (stored.extend(memories), learn(memories))
        losses = printed(run(trainer, 3), "policy_loss")
        advantages = torch.stack([m.group_relative_normalized_reward for m in stored])
        check(losses and all(v == 0 for v in losses) and not advantages.any(), anchor,
              f"collapsed sampler prints {losses}, advantages {advantages.tolist()}")


@covers("stored-probabilities-memory", "ppo", "grpo", "flowrl", "tpo")
def test_stored_probabilities_memory(name, monkeypatch):
    anchor = "stored-probabilities-memory"
    if name == "tpo":
        stored = []
        store = module_of(name).ReplayBuffer.store
        monkeypatch.setattr(module_of(name).ReplayBuffer, "store",
                            lambda self, **data: stored.append({k: tuple(v.shape) for k, v in data.items()})
                            or store(self, **data))
        trainer = make(name)
        trainer.learn = lambda buffer: None
        run(trainer, 1)
        check(stored == [{"sequence": (2, 12), "prompt_mask": (2, 12), "mask": (2, 12), "target_q": (2,)}],
              anchor, f"TPO stores {stored}")
        return
    # device side: a rollout runs the actor on (G, n, V) logits, learn() on (minibatch, n, V); the
    # stored items wait on the host and each minibatch moves to the device
    size = 1 if name == "ppo" else 3
    trainer = make(name, minibatch_size=2, **({} if name == "ppo" else group(name, size)))
    phase, shapes = ["rollout"], {"rollout": set(), "learn": set()}
    actor_palm(trainer).register_forward_hook(lambda _m, _i, out: shapes[phase[0]].add(tuple(out.shape)))
    learn = trainer.learn
    trainer.learn = lambda memories: (phase.__setitem__(0, "learn"), learn(memories))
    run(trainer, 2)
    logits = {k: max((s for s in v if s[-1] == V), key=lambda s: s[0] * s[1]) for k, v in shapes.items()}
    check(logits == {"rollout": (size, 8, V), "learn": (2, 8, V)}, anchor, f"{name} largest logits {logits}")
    src = inspect.getsource(module_of(name))
    check("t.detach().cpu()" in src and "t[ind].to(self.device)" in src, anchor, f"{name} stores on the device")
    item = capture_memories(make(name), max_seq_len=8)[0]
    sizes = {f: getattr(item, f).nbytes for f in item._fields}
    check(tuple(item.action_prob.shape) == (8, V) and item.action_prob.dtype == torch.float32
          and sizes["action_prob"] > 0.9 * sum(sizes.values()), anchor, f"{name} item bytes {sizes}")
    if name == "flowrl":  # stored, unpacked, never read
        src = inspect.getsource(module_of(name).FlowRLTrainer.learn)
        check(src.count("old_action_probs") == 1, anchor, "FlowRL learn() now reads old_action_probs")


@covers("tpo-pad-value-vocab", *ALL)
def test_tpo_pad_value_vocab(name):
    anchor = "tpo-pad-value-vocab"
    for pad in (-1, V):
        trainer = make(name, pad_value=pad, prompt_token_ids=torch.tensor([[5, 6, pad, pad], [7, 8, 9, 10]]))
        if name != "tpo":
            run(trainer, 2)
            continue
        with trap_raises(anchor, IndexError, "index out of range"):
            try:
                run(trainer, 2)
            except IndexError as err:
                frames = [f.name for f in traceback.extract_tb(err.__traceback__)]
                check("learn" in frames, anchor, f"TPO pad {pad} raised outside learn(): {frames}")
                raise


@covers("trainer-eval-runs-train", *ALL)
def test_trainer_eval_runs_train(name, tmp_path, capsys):
    anchor = "trainer-eval-runs-train"
    trainer = make(name)
    learned = []
    trainer.learn = lambda *args: learned.append(1)
    policy = trainer.actor_critic if name == "ppo" else trainer.actor
    result = trainer.eval()
    out = capsys.readouterr().out
    check(result is None and "complete" in out and not learned and policy.training, anchor,
          f"{name}.eval() returned {result!r}, printed {out!r}, policy.training {policy.training}")
    check((tmp_path / "tpo_memmap_replay_buffer").is_dir() == (name == "tpo"), anchor, "replay buffer folder")
    # a module holding the trainer: its .train() calls trainer.train(True), an episode of real rollouts
    attr = trainers.TRAINERS[name].rollout_attr

    def rollout(*args, **kwargs):
        raise RuntimeError("rollout started")
    setattr(trainer, attr, rollout) if attr else setattr(trainer.actor, "generate", rollout)
    with trap_raises(anchor, RuntimeError, "rollout started"):
        torch.nn.ModuleList([trainer]).train()


class NotPaLM(torch.nn.Module):
    """Stands in for a Hugging Face (transformers) causal LM: a module that is not a palm_rlhf_pytorch PaLM."""

    def __init__(self):
        super().__init__()
        self.lm_head = torch.nn.Linear(8, V)


class ToyLM(torch.nn.Module):
    """A causal LM that is no PaLM (a GRU): ids (b, n) -> hidden states (b, n, 16), logits (b, n, V)."""

    def __init__(self):
        super().__init__()
        self.emb, self.rnn, self.head = torch.nn.Embedding(V, 16), torch.nn.GRU(16, 16, batch_first=True), torch.nn.Linear(16, V)

    def forward(self, x):
        hidden, _ = self.rnn(self.emb(x))
        return hidden, self.head(hidden)


class Wrapped(torch.nn.Module):
    """The interface traps-weights.md#hugging-face-model lists, around ToyLM; a scope's adapter
    is a zero-initialised Linear on the hidden states added to the logits (a LoRA stand-in)."""
    dim = 16

    def __init__(self):
        super().__init__()
        self.lm, self.finetune_modules = ToyLM(), torch.nn.ModuleDict()

    def set_dropout(self, p):
        pass

    def add_finetune_params(self, scope, lora_r=8):
        self.finetune_modules[scope] = torch.nn.Linear(self.dim, V, bias=False)
        torch.nn.init.zeros_(self.finetune_modules[scope].weight)

    def finetune_parameters(self, scope):
        return list(self.finetune_modules[scope].parameters())

    def forward(self, x, finetune_scope=None, return_only_embedding=False):
        hidden, logits = self.lm(x)
        if return_only_embedding:
            return hidden
        return logits + self.finetune_modules[finetune_scope](hidden) if finetune_scope else logits

    @torch.no_grad()
    def generate(self, seq_len, prompt, temperature=1., eos_token=None, finetune_scope=None, use_tqdm=False):
        from palm_rlhf_pytorch.utils import gumbel_sample, top_k
        out = prompt
        for _ in range(max(1, seq_len - prompt.shape[-1])):
            logits = self.forward(out, finetune_scope=finetune_scope)[:, -1]
            out = torch.cat([out, gumbel_sample(top_k(logits), temperature=temperature)[:, None]], dim=-1)
            if eos_token is not None and (out == eos_token).any(-1).all():
                break
        return out[:, prompt.shape[-1]:]


class WrappedPaLM(PaLM):
    """PPO's beartype check wants a PaLM: the same wrapper as a PaLM subclass that skips PaLM.__init__."""
    dim = Wrapped.dim

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.lm, self.finetune_modules = ToyLM(), torch.nn.ModuleDict()


for _method in ("set_dropout", "add_finetune_params", "finetune_parameters", "forward", "generate"):
    setattr(WrappedPaLM, _method, getattr(Wrapped, _method))


@covers("hugging-face-model", *ALL)
def test_hugging_face_model(name):
    anchor = "hugging-face-model"
    cls = touch(name)
    extra = tiny_trainers.trainer_kwargs(name, group_size=CANARY_GROUP if trainers.TRAINERS[name].group_kwarg else None)
    build = lambda: cls(palm=NotPaLM(), reward_model=RewardModel(tiny_palm()), prompt_token_ids=torch.ones(2, 3).long(),
                        accelerate_kwargs=dict(cpu=True), **extra)
    if name == "ppo":
        from beartype.roar import BeartypeCallHintParamViolation
        with trap_raises(anchor, BeartypeCallHintParamViolation, "parameter palm="):
            build()
    else:
        with trap_raises(anchor, AttributeError, "'NotPaLM' object has no attribute 'set_dropout'"):
            build()
    # a wrapper with the documented interface trains (PPO: as a PaLM subclass)
    reseed()
    model = WrappedPaLM() if name == "ppo" else Wrapped()
    kw = dict(partition_function_hidden_dim=Wrapped.dim) if name == "flowrl" else {}
    trainer = make(name, palm=model, reward_model=LastTokenReward(tiny_palm(), 1.), minibatch_size=2, **kw)
    before = [p.detach().clone() for p in model.finetune_parameters("actor")]
    run(trainer, 4, max_seq_len=8)
    moved = [not torch.equal(b, p) for b, p in zip(before, model.finetune_parameters("actor"))]
    check(all(moved) and trainer.generate(8, prompt=torch.tensor([5, 6, 7, 8]), num_samples=2).shape == (8,),
          anchor, f"{name}: the wrapper's adapter moved {moved}")


def base_grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters()
            if p.grad is not None and not n.startswith("finetune_modules.")}


@covers("base-weights-accumulate-grad", *ALL)
def test_base_weights_accumulate_grad(name):
    anchor = "base-weights-accumulate-grad"
    minibatch = 1 if name in ("ppo", "tpo") else 2  # 2 optimizer steps per learn() of 2 rollouts
    trainer = make(name, minibatch_size=minibatch)
    models = {"actor": actor_palm(trainer)} | ({"critic": trainer.actor_critic.critic} if name == "ppo" else {})
    run(trainer, 2)
    first = {k: base_grads(m) for k, m in models.items()}
    run(trainer, 2)
    second = {k: base_grads(m) for k, m in models.items()}
    for key in models:
        emb = "token_emb.weight"
        check(emb in first[key] and second[key][emb].norm() > first[key][emb].norm(), anchor,
              f"{name} {key} base weights with .grad: {sorted(first[key])}")
    # what the optimizers hold: LoRA only (PPO: + critic LoRA and value head; FlowRL: + Z), never the
    # reward model
    optimized = {id(p) for o in (trainer.actor_optim, getattr(trainer, "critic_optim", None),
                                 getattr(trainer, "partition_function_optim", None)) if o
                 for g in o.param_groups for p in g["params"]}
    names = {n for n, p in trainer.named_parameters() if id(p) in optimized}
    allowed = ("finetune_modules.actor.", "finetune_modules.critic.", "value_head.", "partition_function.")
    check(names and all(any(a in n for a in allowed) for n in names) and not any(n.startswith("reward_model") for n in names),
          anchor, f"{name} optimizes {sorted(names)[:6]}")
    # the documented fix: freeze the PaLM before building the trainer; the LoRA added after trains
    palm = tiny_palm()
    palm.requires_grad_(False)
    trainer = make(name, palm, minibatch_size=minibatch)
    before = lora(trainer)
    run(trainer, 2)  # 2 optimizer steps: AdoptAtan2 moves LoRA B on its second
    models = [actor_palm(trainer)] + ([trainer.actor_critic.critic] if name == "ppo" else [])
    check(not torch.equal(before, lora(trainer)) and not any(base_grads(m) for m in models), anchor,
          f"{name}: frozen base, LoRA moved {not torch.equal(before, lora(trainer))}")


@covers("flowrl-binned-reward-broadcast", "flowrl", "ppo", "grpo")
def test_flowrl_binned_reward_broadcast(name):
    anchor = "flowrl-binned-reward-broadcast"
    logits_model = lambda palm: RewardModel(palm, num_binned_output=5, sample_from_bins=False)
    if name != "flowrl":
        palm = tiny_palm()
        with trap_raises(anchor, Exception, "."):  # RuntimeError (PPO) or EinopsError (GRPO)
            run(make(name, palm, logits_model(palm), minibatch_size=1), 2)
        return
    for minibatch, rollouts in ((1, 2), (5, 5)):  # 2 items per rollout
        palm = tiny_palm()
        trainer = make(name, palm, logits_model(palm), minibatch_size=minibatch)
        got = []
        learn = trainer.learn
        trainer.learn = lambda memories: (got.extend(memories), learn(memories))
        out = run(trainer, rollouts)
        check(tuple(got[0][-1].shape) == (5,) and not math.isnan(printed(out, "flowrl_loss")[0]), anchor,
              f"minibatch {minibatch}: reward per item {tuple(got[0][-1].shape)}")
    palm = tiny_palm()
    with trap_raises(anchor, RuntimeError, "must match the size"):
        run(make(name, palm, logits_model(palm), minibatch_size=4), 2)


@covers("kl-to-rollout-policy", "ppo", "grpo", "tpo", "flowrl")
def test_kl_to_rollout_policy(name, monkeypatch):
    anchor = "kl-to-rollout-policy"
    module = module_of(name)
    if name in ("tpo", "flowrl"):  # no KL term in learn()
        src = inspect.getsource(touch(name).learn)
        check("kl_div" not in src, anchor, f"{name} learn() now has a KL term")
        return
    kls = []
    kl = module.masked_kl_div
    monkeypatch.setattr(module, "masked_kl_div", lambda *a, **k: kls.append(kl(*a, **k).abs().max().item()) or kl(*a, **k))
    trainer = make(name, minibatch_size=1, actor_lr=1e-2)
    run(trainer, 3 if name == "ppo" else 2)  # 3 or 4 minibatches
    check(kls[:2] == [0.0, 0.0] and min(kls[2:]) > 1e-6, anchor, f"{name} first learn(): KL per minibatch {kls}")
    kls.clear()  # later learn() calls: only the first minibatch still equals the rollout policy
    run(trainer, 3 if name == "ppo" else 2)
    check(kls[0] == 0.0 and min(kls[1:]) > 1e-6, anchor, f"{name} second learn(): KL per minibatch {kls}")
    kls.clear()
    run(make(name, minibatch_size=1, kl_div_loss_weight=0.), 2)
    check(kls == [], anchor, f"{name} kl_div_loss_weight=0 still computes the KL")
    # the anchor is the rollout policy (LoRA on), not the base PaLM
    trainer = make(name)
    with torch.no_grad():
        for p in actor_palm(trainer).finetune_parameters("actor"):
            p.add_(torch.randn_like(p) * 0.5)
    item = capture_memories(trainer, max_seq_len=8)[0]
    seq = item.sequence[None]
    with torch.no_grad():
        lora_on = F.pad(actor_palm(trainer)(seq, finetune_scope="actor"), (0, 0, 1, -1)).softmax(-1)[0]
        lora_off = F.pad(actor_palm(trainer)(seq), (0, 0, 1, -1)).softmax(-1)[0]
    check(torch.allclose(item.action_prob, lora_on, atol=1e-5) and not torch.allclose(item.action_prob, lora_off, atol=1e-3),
          anchor, f"{name} stores other than the rollout policy's probabilities")


@covers("reward-labels-shape", "RewardModel")
def test_reward_labels_shape():
    anchor = "reward-labels-shape"
    reward_model = RewardModel(tiny_palm()).eval()
    x, labels = torch.randint(1, V, (4, 6)), torch.rand(4, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = reward_model(x, labels=labels)
    pred = reward_model(x)
    check(any("target size" in str(w.message) for w in caught), anchor, "no broadcasting warning")
    check(torch.allclose(loss, ((pred[None, :] - labels) ** 2).mean())
          and not torch.allclose(loss, F.mse_loss(pred, labels.squeeze(1))), anchor, "(B, 1) labels loss")


@covers("no-palm-encdec", "PaLM", "RewardModel")
def test_no_palm_encdec():
    anchor = "no-palm-encdec"
    import palm_rlhf_pytorch
    with trap_raises(anchor, ImportError, "PaLMEncDec"):
        exec("from palm_rlhf_pytorch import PaLMEncDec", {})
    check(not hasattr(palm_rlhf_pytorch.palm, "PaLMEncDec"), anchor, "palm.py has PaLMEncDec")
    encoder = tiny_palm(causal=False)
    x = torch.randint(1, V, (2, 6))
    y = x.clone()
    y[:, -1] = (y[:, -1] % (V - 1)) + 1
    first = lambda model, ids: model(ids, return_only_embedding=True)[:, 0]
    check(not torch.allclose(first(encoder, x), first(encoder, y)), anchor, "causal=False is not bidirectional")
    causal = tiny_palm()
    check(torch.allclose(first(causal, x), first(causal, y)), anchor, "causal PaLM sees later tokens")
    scores = RewardModel(encoder).eval()(x, prompt_mask=torch.arange(6).expand(2, 6) < 3)
    check(scores.shape == (2,), anchor, f"bidirectional reward model returns {tuple(scores.shape)}")


@covers("unused-arguments", *ALL)
def test_unused_arguments(name):
    anchor = "unused-arguments"
    cls = touch(name)
    train = inspect.signature(cls.train).parameters
    if name == "tpo":
        check("max_batch_size" not in train and "self.beta_s" in inspect.getsource(cls.learn), anchor, "TPO arguments")
        return
    check("max_batch_size" in train and inspect.getsource(cls.train).count("max_batch_size") == 1, anchor,
          f"{name}.train() now uses max_batch_size")
    if name == "flowrl":  # kl_div_loss_weight and beta_s change nothing
        after = []
        for kw in (dict(kl_div_loss_weight=0., beta_s=0.), dict(kl_div_loss_weight=10., beta_s=1.)):
            reseed()
            trainer = make(name, actor_lr=1e-2, **kw)
            reseed(1)
            run(trainer, 3)
            after.append(lora(trainer))
        check(torch.equal(*after), anchor, "FlowRL kl_div_loss_weight or beta_s now matter")


@covers("optimizer-settings", *ALL)
def test_optimizer_settings(name):
    anchor = "optimizer-settings"
    trainer = make(name, actor_wd=0.1)
    params = list(trainer.actor_optim.optimizer.param_groups[0]["params"])
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    trainer.actor_optim.step()  # a zero gradient: only weight decay acts
    a = next(i for i, b in enumerate(before) if b.abs().sum() > 0)  # a LoRA A (B starts at zero)
    factor = (params[a] / before[a]).mean().item()
    expected = 1 - 1e-4 * 0.1 if name == "tpo" else 1 - 0.1
    check(abs(factor - expected) < 1e-6, anchor, f"{name} actor_wd=0.1 multiplies weights by {factor} per step")
    trainer.actor_optim.optimizer.param_groups[0]["lr"] = 1e-5  # an LR schedule at lr_init / 10
    before = params[a].detach().clone()
    trainer.actor_optim.step()
    factor = (params[a] / before).mean().item()
    expected = 1 - 1e-5 * 0.1 if name == "tpo" else 1 - 0.1 / 10  # the decay follows the schedule
    check(abs(factor - expected) < 1e-6, anchor, f"{name} at lr_init / 10 multiplies weights by {factor}")
    # the update ignores the gradient's scale and moves each weight by at most a * pi / 2 * lr
    cls = type(trainer.actor_optim.optimizer)
    moved = []
    for scale in (1., 1e6, 1e-6):
        w = torch.nn.Parameter(torch.ones(4))
        opt = cls([w], lr=1e-3)
        for _ in range(3):
            w.grad = torch.tensor([1., -2., 3., 0.5]) * scale
            opt.step()
        moved.append(w.detach() - 1)
    check(all(torch.allclose(m, moved[0]) for m in moved) and moved[0].abs().max() <= 3 * 1.27 * math.pi / 2 * 1e-3, anchor,
          f"{cls.__name__} moves {moved}")


@covers("gradient-accumulation-ignored", *ALL)
def test_gradient_accumulation_ignored(name):
    anchor = "gradient-accumulation-ignored"
    trainer = make(name, minibatch_size=1, accelerate_kwargs=dict(gradient_accumulation_steps=4))
    steps = []
    trainer.actor_optim.optimizer.register_step_post_hook(lambda *args: steps.append(1))
    run(trainer, 2, max_seq_len=6)
    items = 2 if name in ("ppo", "tpo") else 4
    check(trainer.accelerate.gradient_accumulation_steps == 4 and len(steps) == items, anchor,
          f"{name}: {len(steps)} optimizer steps for {items} minibatches with gradient_accumulation_steps=4")
    src = inspect.getsource(module_of(name))
    check(not re.search(r"accelerate\.(accumulate|log|save_state|init_trackers|save_model)\b", src), anchor,
          f"{name} now accumulates, logs or saves through Accelerate")


@covers("ppo-critic-reward-range", "ppo")
def test_ppo_critic_reward_range(name):
    anchor = "ppo-critic-reward-range"
    trainer = make(name)
    hl = trainer.critic_hl_gauss_loss
    check((hl.min_value, hl.max_value) == (-0.5, 5.5) and hl.centers.tolist() == [0., 1., 2., 3., 4., 5.]
          and hl.clamp_to_range, anchor, f"support {hl.min_value}..{hl.max_value}, centers {hl.centers.tolist()}")
    probs = hl.transform_to_probs(torch.tensor([10., 5.5, -3.]))
    check(torch.allclose(probs[0], probs[1]), anchor, "a reward of 10 is no longer clamped")
    check(hl.warn_out_of_range and hl.out_of_range_tolerance == 1.0, anchor,  # one bin: sigma_to_bin_ratio 1
          f"loguru warns beyond {hl.out_of_range_tolerance}")
    values = hl.transform_from_probs(probs)
    check(values[0] < 4.7 and values[2] > 0.3, anchor, f"rewards 10 and -3 read back as {values.tolist()}")
    # the warning: checked on each target batch until one warns, then never again in the process
    warn = type(hl).maybe_warn_out_of_range
    (called,) = [c for c in warn.__closure__ if isinstance(c.cell_contents, bool)]
    saved, called.cell_contents = called.cell_contents, False
    try:
        got = [warn(hl, torch.tensor([2.])), warn(hl, torch.tensor([10.])), warn(make(name).critic_hl_gauss_loss,
                                                                            torch.tensor([10.]))]
    finally:
        called.cell_contents = saved
    check(got == [False, True, None], anchor, f"in range, out of range, another critic: {got}")
    # in-range targets read back biased at the edges, and a perfect critic still has a loss (the
    # entropy of the target's own histogram), lower for clamped targets
    edges = hl.transform_from_probs(hl.transform_to_probs(torch.tensor([0., 5.]))).tolist()
    check(abs(edges[0] - 0.55) < 0.01 and abs(edges[1] - 4.45) < 0.01, anchor, f"0 and 5 read back as {edges}")
    targets = torch.tensor([0., 2.5, 5., 10.])
    floor = [hl(hl.transform_to_probs(t[None]).log(), t[None]).item() for t in targets]
    check([round(f, 2) for f in floor] == [0.95, 1.44, 0.95, 0.77], anchor, f"loss floors {floor}")
    # hl_gauss_loss_kwargs replaces the whole default dict: the other keys fall back to hl_gauss's own
    partial_kwargs = make(name, hl_gauss_loss_kwargs=dict(min_value=-10., max_value=30.)).critic_hl_gauss_loss
    ratio = partial_kwargs.sigma / (partial_kwargs.support[1] - partial_kwargs.support[0]).item()
    check(abs(ratio - 2.) < 1e-6 and not partial_kwargs.clamp_to_range
          and partial_kwargs.support[0].item() == -10. and partial_kwargs.support[-1].item() == 30., anchor,
          f"min/max only: sigma/bin {ratio}, clamp {partial_kwargs.clamp_to_range}")
    wide = make(name, hl_gauss_loss_kwargs=dict(min_value=-10., max_value=10., min_max_value_on_bin_center=True,
                                                clamp_to_range=True, sigma_to_bin_ratio=1.), critic_num_pred_bins=21)
    check(abs(wide.critic_hl_gauss_loss.transform_from_probs(wide.critic_hl_gauss_loss.transform_to_probs(
        torch.tensor([-3.]))).item() + 3) < 0.1, anchor, "the documented wider support")


@covers("log-probs-misaligned", "ppo", "flowrl", "grpo")
def test_log_probs_misaligned(name, monkeypatch):
    anchor = "log-probs-misaligned"
    mixed = torch.tensor([[5, 6, 7, 0, 0, 0], [5, 6, 7, 8, 9, 10]])  # 3 and 6 ids after stripping the pad 0
    equal = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    result = {}
    for label, prompts in (("mixed", mixed), ("equal", equal)):
        alternate(name, monkeypatch)
        reseed()
        kw = dict(minibatch_size=64, beta_s=0., prompt_token_ids=prompts)
        if name == "flowrl":
            ratios = flowrl_ratios(make(name, **kw), 4, max_seq_len=12)
            result[label] = bool((ratios != 1).any())  # the first minibatch: new policy == old
        else:
            out = run(make(name, kl_div_loss_weight=0., **kw), 4, max_seq_len=12)
            result[label] = abs(printed(out, "policy_loss")[0]) > 0  # ratio 1, advantages mean 0: loss 0
    expected = {"mixed": name != "grpo", "equal": False}
    check(result == expected, anchor, f"{name}: first-minibatch ratio differs from 1: {result}")
    if name == "ppo":  # equal prompts, but eos stops rollouts at different lengths
        with torch.no_grad():
            likely = tiny_palm()(equal[:1])[0, -1].topk(3).indices.tolist()
        varied = []
        for eos in likely:
            reseed()
            trainer = make(name, kl_div_loss_weight=0., minibatch_size=64, beta_s=0., prompt_token_ids=equal)
            lengths, learn = set(), trainer.learn
            trainer.learn = lambda memories: (lengths.update(m.sequence.shape[0] for m in memories), learn(memories))
            first = printed(run(trainer, 8, max_seq_len=16, eos_token=eos), "policy_loss")[0]
            if len(lengths) > 1:
                varied.append(abs(first) > 0)
        check(varied and all(varied), anchor, f"PPO with eos at varied lengths: first loss off 0 {varied}")


@covers("eos-in-prompt", *ALL)
def test_eos_in_prompt(name):
    anchor = "eos-in-prompt"
    trainer = make(name, prompt_token_ids=torch.tensor([[5, 9, 6, 7]]))
    if name == "tpo":
        seen = []
        generate = trainer.actor.generate
        trainer.actor.generate = lambda *a, **k: seen.append(generate(*a, **k)) or seen[-1]
        trainer.learn = lambda buffer: None
        run(trainer, 1, max_seq_len=10, eos_token=9)
        _, sequence, mask, prompt_mask = seen[0]
        items = [(sequence[0], prompt_mask[0], mask[0])]
    else:
        items = [(m.sequence, m.prompt_mask, m.mask) for m in capture_memories(trainer, max_seq_len=10, eos_token=9)]
    for sequence, prompt_mask, mask in items:
        check(sequence.shape[-1] == 5 and not (~prompt_mask & mask).any(), anchor,
              f"{name}: eos in the prompt gives length {sequence.shape[-1]}, action positions {(~prompt_mask & mask).sum()}")


@covers("actor-dropout-ratio", "ppo", "grpo", "flowrl")
def test_actor_dropout_ratio(name):
    anchor = "actor-dropout-ratio"
    kw = dict(minibatch_size=64, beta_s=0., actor_dropout=0.3)
    if name == "flowrl":
        ratios = flowrl_ratios(make(name, **kw), 3)
        check(bool((ratios != 1).any()), anchor, f"FlowRL first-minibatch ratios {ratios.tolist()}")
    else:
        first = printed(run(make(name, kl_div_loss_weight=0., **kw), 3), "policy_loss")[0]
        check(abs(first) > 0, anchor, f"{name} first policy_loss with actor_dropout 0.3 is {first}")


@covers("grpo-max-rl-mean-zero", "grpo")
def test_grpo_max_rl_mean_zero(name):
    class Opposite(RewardModel):
        def forward(self, x, *args, **kwargs):
            return torch.tensor([-1., 1.])
    palm = tiny_palm()
    adv = torch.stack([m[-1] for m in capture_memories(make(name, palm, Opposite(palm), use_max_rl=True))])
    check(adv.tolist() == [-1e8, 1e8], "grpo-max-rl-mean-zero", f"MaxRL advantages {adv.tolist()}")
    moved = {}  # the atan2 step ignores the scale: the largest LoRA change is that of the default
    for max_rl in (True, False):
        reseed()
        palm = tiny_palm()
        # minibatch 1: each step's loss is one sample's, about 1e8 (a shuffled minibatch of 2 can pair
        # -1e8 with +1e8 in every step and print near 0, as the probe kit's sizes did here)
        trainer = make(name, palm, Opposite(palm), use_max_rl=max_rl, minibatch_size=1)
        before = lora(trainer)
        out = run(trainer, 4)
        moved[max_rl] = ((lora(trainer) - before).abs().max().item(), max(map(abs, printed(out, "policy_loss"))))
    check(abs(moved[True][0] / moved[False][0] - 1) < 0.01 and moved[True][1] > 1e7, "grpo-max-rl-mean-zero",
          f"largest LoRA change and |policy_loss|, MaxRL then default: {moved}")


@covers("flowrl-no-lora-reference", "flowrl")
def test_flowrl_no_lora_reference(name):
    anchor = "flowrl-no-lora-reference"
    trainer = make(name, actor_lora=False, actor_lr=1e-2)
    x = torch.randint(1, V, (2, 6))
    with torch.no_grad():
        before = trainer.palm(x, finetune_scope=None)
        check(torch.equal(before, trainer.actor(x)), anchor, "reference differs from the policy")
    run(trainer, 3)
    with torch.no_grad():
        after = trainer.palm(x, finetune_scope=None)
    check(not torch.equal(before, after) and torch.equal(after, trainer.actor(x)), anchor, "the reference stayed fixed")


@covers("binned-reward-sampled", *ALL)
def test_binned_reward_sampled(name):
    anchor = "binned-reward-sampled"
    palm = tiny_palm()
    binned = RewardModel(palm, num_binned_output=5)
    outputs = []
    forward = binned.forward
    binned.forward = lambda *a, **k: outputs.append(forward(*a, **k)) or outputs[-1]
    trainer = make(name, palm, binned)
    trainer.learn = lambda *args: None
    run(trainer, 2)
    check(outputs and all(o.dtype == torch.int64 for o in outputs), anchor, f"{name} reward dtypes {[o.dtype for o in outputs]}")
    x = torch.randint(1, V, (1, 8)).expand(32, 8)
    check(len(set(binned.eval()(x).tolist())) > 1, anchor, "one sequence scored 32 times gave one bin")


@covers("dr-grpo-constant", "grpo")
def test_dr_grpo_constant(name):
    anchor = "dr-grpo-constant"

    def trained(constant, **kw):
        reseed()  # 64 ids, not the tiny 257: with 257 the float32 rounding of 1000x smaller gradients
        palm = tiny_palm(num_tokens=64)  # left LoRA differences of 9e-6 (still 1/1300 of the KL's effect)
        trainer = make(name, palm, LastTokenReward(palm, 1.), dr_grpo_constant=constant, actor_lr=1e-2,
                       minibatch_size=4, **group(name, 4), prompt_token_ids=torch.randint(1, 64, (3, 4)), **kw)
        check(trainer.use_dr_grpo, anchor, "dr_grpo_constant alone no longer turns Dr. GRPO on")
        reseed(1)
        for _ in range(2):  # 2 learn() calls, 2 optimizer steps each
            run(trainer, 2)
        return lora(trainer)

    # the constant scales every advantage, so without the KL and entropy terms every gradient by
    # one factor, which the atan2 optimizer's step ignores
    plain = (trained(1., kl_div_loss_weight=0., beta_s=0.) - trained(1000., kl_div_loss_weight=0., beta_s=0.)).abs().max()
    weighed = (trained(1.) - trained(1000.)).abs().max()
    check(plain < 1e-6 and weighed > 1e-5, anchor, f"constants 1 vs 1000 differ by {plain} (no KL, entropy), {weighed}")
    with trap_raises(anchor, AssertionError, "cannot use both Dr. GRPO and MaxRL"):
        make(name, dr_grpo_constant=4., use_max_rl=True)
    src = inspect.getsource(module_of(name).RLHFTrainer.learn)  # still a per-sequence token mean
    check("policy_loss = masked_mean(policy_loss, mask = action_masks)" in src, anchor, "the loss reduction changed")


@covers("grpo-nan", "grpo", "ppo")
def test_grpo_nan(name):
    anchor = "grpo-nan"
    if name == "ppo":  # PPO's log-probs are clamped at log(1e-20): its ratio stays below e^46
        low = module_of(name).log_prob(torch.zeros(1, 1, 4), torch.zeros(1, 1, dtype=torch.long)).item()
        check(abs(low - math.log(1e-20)) < 1e-3 and math.isfinite(math.exp(-low)), anchor, f"PPO log-prob floor {low}")
        return

    def overflowed(guard=False, **kw):
        """A learn() in which one sampled token's new log-prob exceeds its stored one by 200 nats."""
        reseed()
        palm = tiny_palm()
        trainer = make(name, palm, LastTokenReward(palm, 1.), minibatch_size=4, **group(name, 4), **kw)
        items = capture_memories(trainer, max_seq_len=8)
        learn = type(trainer).learn.__get__(trainer)
        worst = min(range(len(items)), key=lambda i: items[i].group_relative_normalized_reward.item())
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()):
            learn([m for i, m in enumerate(items) if i != worst])  # ADOPT's first step moves nothing
        m = items[worst]
        items[worst] = m._replace(action_log_prob=torch.where(m.prompt_mask, m.action_log_prob, m.action_log_prob - 200.))
        if guard:  # the documented guard: skip a step whose gradients are not finite
            step = trainer.actor_optim.step

            def finite_step(*args, **kwargs):
                if all(p.grad is None or p.grad.isfinite().all()
                       for g in trainer.actor_optim.param_groups for p in g["params"]):
                    return step(*args, **kwargs)
            trainer.actor_optim.step = finite_step
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            learn(items)
        nan = any(p.isnan().any().item() for p in actor_palm(trainer).finetune_parameters("actor"))
        sample = palm.generate(12, prompt=torch.tensor([[5, 6, 7, 8]]), finetune_scope="actor")[0].tolist()
        return printed(out.getvalue(), "policy_loss"), nan, sample

    losses, nan, sample = overflowed()
    check(math.inf in losses and nan and len(set(sample)) == 1, anchor,
          f"ratio overflow: printed {losses}, NaN LoRA {nan}, sample {sample}")
    losses, nan, _ = overflowed(max_norm=1.)
    check(nan, anchor, f"max_norm=1 now keeps the weights finite ({losses})")
    losses, nan, sample = overflowed(guard=True)
    check(math.inf in losses and not nan and len(set(sample)) > 1, anchor, f"guarded step: NaN {nan}, sample {sample}")


# --- a NaN reward: what each trainer does with it (training-run.md#non-finite-rewards) -------------

RUN_DOC = REPO / "sub-skills/policy-optimization/references/training-run.md"


@pytest.mark.parametrize("name", ALL)
def test_each_trainer_on_a_nan_reward_does_what_training_run_md_says(name, monkeypatch, tmp_path):
    """training-run.md#non-finite-rewards: GRPO raises safe_div's empty AssertionError; PPO and
    FlowRL train on into NaN weights; TPO trains on with finite weights and all-zero z-scores; the
    run kit's row of PPO, TPO and FlowRL fires non_finite."""
    section = " ".join(doc_tables.section(RUN_DOC, "## A NaN or inf reward").split())
    monkeypatch.chdir(tmp_path)  # TPO's replay buffer folder
    reseed(0)
    reward = probe_kit.tiny_reward_model()
    reward.register_forward_hook(lambda module, args, output: torch.full_like(output, float("nan")))
    trainer = tiny_trainers.tiny_trainer(name, reward_model=reward)
    weights = [p for group in trainers.trainable_groups(name, trainer).values() for p in group]
    before = [p.detach().clone() for p in weights]
    if name == "grpo":
        with pytest.raises(AssertionError) as err:
            run(trainer, 4, tiny_trainers.max_seq_len(trainer))
        assert str(err.value) == "" and "safe_div" in err.traceback[-1].frame.code.name
        assert "GRPO `train()` raises an empty `AssertionError` (`safe_div`" in section
        return
    run(trainer, 4, tiny_trainers.max_seq_len(trainer))
    finite = [bool(torch.isfinite(p).all()) for p in weights]
    changed = sum(not torch.equal(p.detach(), b) for p, b in zip(weights, before))
    if name == "tpo":
        assert all(finite) and changed > 0 and "TPO trains on with finite weights, its z-scored rewards all 0" in section
        assert (normalized_rewards(tiny_trainers.tiny_trainer(name, reward_model=reward), name, monkeypatch) == 0).all()
    else:
        assert not any(finite), f"{name}: {finite.count(True)} of {len(finite)} trainable tensors stayed finite"
        assert "PPO and FlowRL train on and write NaN into every trainable weight" in section
    from policy_optimization.run import cases, loop
    nan = next(c for c in cases.CASES if c.name == "NaN reward")
    config = cases.write(cases.Case("NaN reward", name, None, "", reward=nan.reward, rounds=1), tmp_path / "config")
    run_kit, status, _ = loop.train_to_end(str(config), tmp_path / "run")
    assert status == "finished" and "non_finite" in run_kit.rows[-1]["rules"] and math.isnan(run_kit.rows[-1]["reward_mean"])
    assert "the row's `reward_mean` is NaN and `non_finite` fires" in section
