"""Shared helpers of the canaries (tests/test_canaries.py, tests/test_silent_failures.py).

A canary reproduces one trap of ``sub-skills/policy-optimization/references/traps-*.md`` (one file
per topic; ``troubleshooting.md`` indexes them) on the installed palm-rlhf-pytorch and asserts it.
When upstream fixes or changes the trap, the canary fails with a message naming the doc section
(``traps-<topic>.md#anchor``) to update.

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

from palm_rlhf_pytorch import PaLM, RewardModel

import probe_kit
from conftest import REPO
from policy_optimization import tiny_trainers, trainers

INDEX = "sub-skills/policy-optimization/references/troubleshooting.md"  # the symptom index, the silent-failure table
SKILL = "sub-skills/policy-optimization/SKILL.md"
VOCAB = probe_kit.TINY_PALM["num_tokens"]  # the probe kit's tiny PaLM: one config for smokes, probes and canaries
CANARY_GROUP = 2  # completions per prompt of a grouped trainer: the smallest group that has a spread, and fast


@dataclass(frozen=True)
class Canary:
    test: str
    subjects: frozenset[str]


COVERED: dict[str, Canary] = {}  # anchor -> its canary
TOUCHED: set[str] = set()        # trainers the running test built or read


def covers(anchor: str, *subjects: str):
    """Register the canary for ``traps-<topic>.md#anchor``; ``subjects`` are what its section's
    ``Applies to:`` line names. A test with a ``name`` argument and no parametrization of its own
    is parametrized over the trainers among ``subjects``; one with its own must use exactly those."""
    names = [s for s in subjects if s in trainers.TRAINERS]

    def mark(fn):
        assert anchor not in COVERED, f"two canaries for {anchor}"
        COVERED[anchor] = Canary(fn.__name__, frozenset(subjects))
        fn.anchor, fn.subjects = anchor, frozenset(subjects)
        own = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"
               and "name" in re.split(r"\s*,\s*", m.args[0])]
        if own:
            position = re.split(r"\s*,\s*", own[0].args[0]).index("name")
            runs = {v if isinstance(v, str) else v[position] for v in own[0].args[1]}
            assert runs == set(names), f"{fn.__name__} runs {runs}, declares {names}"
        elif names and "name" in fn.__code__.co_varnames[:fn.__code__.co_argcount]:
            fn = pytest.mark.parametrize("name", names)(fn)
        return fn
    return mark


def trap_sections() -> dict[str, tuple[str, str]]:
    """``{anchor: (file, section text)}`` of every trap: the sections of the ``traps-*.md`` files
    beside ``INDEX``, each up to the next anchor, the file as a path from the repository root."""
    found: dict[str, tuple[str, str]] = {}
    for path in sorted((REPO / INDEX).parent.glob("traps-*.md")):
        parts = re.split(r'<a id="([^"]+)"></a>\n', path.read_text(encoding="utf-8"))[1:]
        for anchor, text in zip(parts[0::2], parts[1::2]):
            assert anchor not in found, f"{anchor}: two sections (in {found[anchor][0]} and {path.name})"
            found[anchor] = (path.relative_to(REPO).as_posix(), text)
    return found


def doc(anchor: str) -> str:
    """``file#anchor`` of the trap's section (``INDEX`` for an anchor no traps file holds)."""
    return f"{trap_sections().get(anchor, (INDEX,))[0]}#{anchor}"


def update(anchor: str, what: str) -> str:
    return (f"upstream palm-rlhf-pytorch changed: {what}. Update {doc(anchor)} "
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
    return trainers.TRAINERS[name].load()


def module_of(name: str):
    """The upstream module of trainer ``name`` (``palm_rlhf_pytorch.ppo`` ...)."""
    return sys.modules[touch(name).__module__]


def tiny_palm(seed: int = 0, **kw) -> PaLM:
    """The probe kit's tiny PaLM, seeded (``kw``: PaLM arguments)."""
    return probe_kit.tiny_palm(seed, **kw)


def make(name: str, palm: PaLM | None = None, reward_model=None, **kw):
    """A tiny trainer ``name`` on CPU from the probe kit (``tiny_trainers.tiny_trainer``: the smoke's
    minibatch), in groups of CANARY_GROUP, prompts of 4 ids unless given, a reward model that copies
    the policy's PaLM unless given; ``kw``: constructor arguments."""
    touch(name)
    palm = palm or tiny_palm()
    kw.setdefault("prompt_token_ids", torch.randint(1, VOCAB, (3, 4)))
    group = CANARY_GROUP if trainers.TRAINERS[name].group_kwarg else None
    return tiny_trainers.tiny_trainer(name, palm=palm, reward_model=reward_model or probe_kit.tiny_reward_model(palm),
                                  group_size=group, **kw)


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
    attr = trainers.TRAINERS[name].rollout_attr
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
    """Reward ``sign * last token id / VOCAB``: two opposite preferences over the same samples."""

    def __init__(self, palm, sign):
        super().__init__(palm, num_binned_output=0)
        self.sign = sign

    def forward(self, x, *args, **kwargs):
        return self.sign * x[:, -1].float() / VOCAB


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
    assert not missing, (f"{request.function.__name__} covers {doc(request.function.anchor)}, whose "
                         f"'Applies to' names {sorted(missing)}, but never built or read them")


def unexercised(fn, params: dict) -> set[str]:
    """Trainers a finished canary ``fn`` declares (its ``name`` parameter, else every trainer among
    its subjects) but never built or read; empty for a test that is not a canary."""
    subjects = getattr(fn, "subjects", None)
    if subjects is None:
        return set()
    want = {params["name"]} if "name" in params else subjects & set(trainers.TRAINERS)
    return want - TOUCHED
