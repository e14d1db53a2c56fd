"""Shared helpers of the canaries (tests/test_canaries.py, tests/test_silent_failures.py).

A canary reproduces one trap of ``sub-skills/policy-optimization/references/troubleshooting.md`` on
the installed palm-rlhf-pytorch and asserts it. When upstream fixes or changes the trap, the canary
fails with a message naming the doc section (``troubleshooting.md#anchor``) to update.

``covers(anchor, *subjects)`` registers a canary with the subjects its section's ``Applies to:``
line names (trainers ``ppo``, ``grpo``, ``tpo``, ``flowrl``, or classes such as ``RewardModel``).
A canary taking a ``name`` argument runs once per trainer it names; every canary must build (or
read the source of) each trainer it names, which the autouse fixture ``canary_env`` checks after
the test, so a section cannot claim a trainer its canary never exercises.
"""
from __future__ import annotations

import contextlib
import random
import re
import sys
from dataclasses import dataclass

import pytest
import torch

import palm_rlhf_pytorch.flowrl as flowrl
import palm_rlhf_pytorch.grpo as grpo
import palm_rlhf_pytorch.ppo as ppo
import palm_rlhf_pytorch.tpo as tpo
from palm_rlhf_pytorch import PaLM, RewardModel

from conftest import REPO

DOC = "sub-skills/policy-optimization/references/troubleshooting.md"
SKILL = "sub-skills/policy-optimization/SKILL.md"
TINY = dict(num_tokens=64, dim=32, depth=1, heads=2, dim_head=8)
# trainer class, kwargs keeping it tiny (group of 2), attribute holding the rollout function
TRAINERS = {
    "ppo": (ppo.RLHFTrainer, {}, "actor_critic_generate"),
    "grpo": (grpo.RLHFTrainer, dict(grpo_num_times_sample_rewards=1), "actor_generate"),
    "tpo": (tpo.RLHFTrainer, dict(num_times_sample_rewards=1), None),
    "flowrl": (flowrl.FlowRLTrainer, dict(flowrl_num_times_sample=1, partition_function_hidden_dim=32),
               "actor_generate"),
}
GROUP_KWARG = {"grpo": "grpo_num_times_sample_rewards", "tpo": "num_times_sample_rewards",
               "flowrl": "flowrl_num_times_sample"}
DOC_NAMES = {"PPO": "ppo", "GRPO": "grpo", "TPO": "tpo", "FlowRL": "flowrl"}


@dataclass(frozen=True)
class Canary:
    test: str
    subjects: frozenset[str]


COVERED: dict[str, Canary] = {}  # anchor -> its canary
TOUCHED: set[str] = set()        # trainers the running test built or read


def covers(anchor: str, *subjects: str):
    """Register the canary for ``troubleshooting.md#anchor``; ``subjects`` are what its section's
    ``Applies to:`` line names. A test with a ``name`` argument and no parametrization of its own
    is parametrized over the trainers among ``subjects``; one with its own must use exactly those."""
    trainers = [s for s in subjects if s in TRAINERS]

    def mark(fn):
        assert anchor not in COVERED, f"two canaries for {anchor}"
        COVERED[anchor] = Canary(fn.__name__, frozenset(subjects))
        fn.anchor, fn.subjects = anchor, frozenset(subjects)
        own = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"
               and "name" in re.split(r"\s*,\s*", m.args[0])]
        if own:
            position = re.split(r"\s*,\s*", own[0].args[0]).index("name")
            names = {v if isinstance(v, str) else v[position] for v in own[0].args[1]}
            assert names == set(trainers), f"{fn.__name__} runs {names}, declares {trainers}"
        elif trainers and "name" in fn.__code__.co_varnames[:fn.__code__.co_argcount]:
            fn = pytest.mark.parametrize("name", trainers)(fn)
        return fn
    return mark


def update(anchor: str, what: str) -> str:
    return (f"upstream palm-rlhf-pytorch changed: {what}. Update {DOC}#{anchor} "
            f"(and its one-liner in {SKILL} if it has one), then this canary.")


def check(condition: bool, anchor: str, what: str) -> None:
    """``assert condition``, failing with the message that names the doc section."""
    if not condition:
        pytest.fail(update(anchor, what))


def reseed(seed: int = 0) -> None:
    """Seed torch and ``random`` (train() draws its prompts with ``random.randrange``)."""
    torch.manual_seed(seed)
    random.seed(seed)


def touch(name: str):
    """The trainer class ``name``, recorded as exercised by the running canary."""
    TOUCHED.add(name)
    return TRAINERS[name][0]


def module_of(name: str):
    """The upstream module of trainer ``name`` (``palm_rlhf_pytorch.ppo`` ...)."""
    return sys.modules[touch(name).__module__]


def tiny_palm(seed: int = 0, **kw) -> PaLM:
    torch.manual_seed(seed)
    return PaLM(**TINY, **kw)


def make(name: str, palm: PaLM | None = None, reward_model=None, **kw):
    """A tiny trainer ``name`` on CPU (group of 2, prompts of 4 ids unless given)."""
    cls, extra, _ = TRAINERS[name]
    touch(name)
    palm = palm or tiny_palm()
    kw = {**extra, **kw}
    kw.setdefault("prompt_token_ids", torch.randint(1, 64, (3, 4)))
    accelerate_kwargs = {"cpu": True, **kw.pop("accelerate_kwargs", {})}
    return cls(palm=palm, reward_model=reward_model or RewardModel(palm), accelerate_kwargs=accelerate_kwargs, **kw)


def actor_palm(trainer) -> PaLM:
    """The actor PaLM of any trainer (PPO keeps it in its ActorCritic)."""
    return trainer.actor_critic.actor_palm if hasattr(trainer, "actor_critic") else trainer.actor.actor_palm


def lora(trainer) -> torch.Tensor:
    """Every actor LoRA weight of ``trainer``, flattened into one detached copy."""
    return torch.cat([p.detach().flatten().clone() for p in actor_palm(trainer).finetune_parameters("actor")])


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


def capture_memories(trainer, rollouts: int = 1, **train_kw) -> list:
    """The items ``train()`` hands to ``learn()`` after ``rollouts`` rollouts (learn not run)."""
    got = []
    trainer.learn = lambda memories: got.extend(memories)
    trainer.train(num_episodes=1, max_timesteps=rollouts, update_timesteps=rollouts,
                  **{"max_seq_len": 7, **train_kw})
    return got


def printed(out: str, key: str) -> list[float]:
    """Values of ``key: value`` in the library's printed lines, in order ([nan] when none, so a
    canary's check fails naming its section rather than with an IndexError)."""
    return [float(v) for v in re.findall(rf"{key}: (-?(?:[\d.]+|inf)|nan)", out)] or [float("nan")]


class ConstantReward(RewardModel):
    """A RewardModel returning ``value`` for every sequence (a verifier that passes or fails a whole group)."""

    def __init__(self, palm, value):
        super().__init__(palm, num_binned_output=0)
        self.value = value

    def forward(self, x, *args, **kwargs):
        return torch.full((x.shape[0],), float(self.value))


class LastTokenReward(RewardModel):
    """Reward ``sign * last token id / 64``: two opposite preferences over the same samples."""

    def __init__(self, palm, sign):
        super().__init__(palm, num_binned_output=0)
        self.sign = sign

    def forward(self, x, *args, **kwargs):
        return self.sign * x[:, -1].float() / 64


@pytest.fixture(autouse=True)
def canary_env(request, tmp_path, monkeypatch):
    """Each canary in its own directory (TPO's replay buffer, checkpoints), seeded; afterwards,
    check it built or read every trainer its section names."""
    monkeypatch.chdir(tmp_path)
    reseed()
    TOUCHED.clear()
    yield
    callspec = getattr(request.node, "callspec", None)
    missing = unexercised(request.function, callspec.params if callspec else {})
    assert not missing, (f"{request.function.__name__} covers {DOC}#{request.function.anchor}, whose "
                         f"'Applies to' names {sorted(missing)}, but never built or read them")


def unexercised(fn, params: dict) -> set[str]:
    """Trainers a finished canary ``fn`` declares (its ``name`` parameter, else every trainer among
    its subjects) but never built or read; empty for a test that is not a canary."""
    subjects = getattr(fn, "subjects", None)
    if subjects is None:
        return set()
    want = {params["name"]} if "name" in params else subjects & set(TRAINERS)
    return want - TOUCHED
