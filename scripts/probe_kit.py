"""The probe kit: a tiny PaLM, a scalar reward model and each trainer of palm-rlhf-pytorch, built on
the CPU in about a second, so that a 10-line script checks a behaviour of the installed library
when the tree is silent or a fact is in doubt (references/probes.md has worked probes).

From any copy of the skill tree with only the library installed::

    import sys
    sys.path.insert(0, "<skill root>/scripts")
    import probe_kit
    trainer = probe_kit.tiny_trainer("grpo")            # the smoke's GRPO: group 4, minibatch 4
    trainer.train(num_episodes=1, max_timesteps=2, update_timesteps=2, max_seq_len=probe_kit.max_seq_len(trainer))

This module is the one home of the tiny sizes that the smokes (tiny-rlhf-smoke, tiny-palm-smoke,
tiny-reward-smoke), the learning check, the canaries and the probes build: ``TINY_PALM`` and its
variants derive from it with an override. Nothing here imports torch until a function is called.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from skill_runtime import byte_tokenizer, placement  # noqa: E402  (adds the tree's import roots)
from policy_optimization import trainers  # noqa: E402

# The tiny PaLM: big enough to exercise every code path, small enough for a laptop CPU (about 27k
# weights). 257 token ids are the byte tokenizer's (byte b -> id b + 1, 0 the pad id), so text
# prompts and random ids share one vocabulary.
TINY_PALM = dict(num_tokens=byte_tokenizer.ByteTokenizer.vocab_size, dim=32, depth=1, heads=2, dim_head=16)
# The learning check's toy task (tiny-rlhf-smoke --learn): the same PaLM over 16 ids, so that the
# rule-based reward (half the ids are targets) starts near 0.5 and a few updates move it. PaLM.generate
# keeps the top ceil(0.1 * num_tokens) logits (palm_rlhf_pytorch/utils.py top_k, thres 0.9): 2
# candidates per step here; 10 ids or fewer would leave 1, greedy.
LEARN_PALM = {**TINY_PALM, "num_tokens": 16}

PROMPT_COUNT = 4         # random token-ids prompts of the smoke
PROMPT_LENGTHS = (3, 6)  # their lengths, inclusive; right-padded with the pad id 0
NEW_TOKENS = 8           # tokens sampled after the longest prompt: max_seq_len = longest + NEW_TOKENS
GROUP_SAMPLES = 3        # extra samples per prompt of GRPO, TPO and FlowRL: group size = 3 + 1
# The smoke's minibatch per trainer: with the group above, one learn() over a handful of rollouts
# makes the optimizer steps that move every trainable tensor (workflows.md#optimizer-step-arithmetic).
SMOKE_MINIBATCH = {"ppo": 2, "grpo": 4, "tpo": 1, "flowrl": 4}
# Constructor arguments beyond minibatch and group: PPO's max_norm stays None (a value fails in
# learn(): traps-setup.md#ppo-max-norm). FlowRL's partition function is made as wide as the PaLM
# by ``trainer_kwargs`` (its default 768 fails at the first learn(): traps-setup.md#flowrl-partition-dim).
SMOKE_EXTRA: dict[str, dict[str, Any]] = {"ppo": {"max_norm": None}}

_UNSET: Any = object()  # "not given", distinct from an explicit None (prompt_token_ids=None is a probe too)


def spec_of(name: str) -> trainers.TrainerSpec:
    """The trainer table's row for ``name`` (ppo, grpo, tpo, flowrl); ValueError for another name."""
    if name not in trainers.TRAINERS:
        raise ValueError(f"unknown trainer {name!r}: choose from {', '.join(trainers.TRAINERS)}")
    return trainers.TRAINERS[name]


def tiny_palm(seed: int | None = None, **overrides):
    """``PaLM(**TINY_PALM, **overrides)`` on the CPU (``overrides``: any PaLM argument, e.g. ``dim=64``
    or ``causal=False``); with ``seed``, ``torch.manual_seed(seed)`` first, so two calls build
    identical weights."""
    import torch
    from palm_rlhf_pytorch import PaLM
    if seed is not None:
        torch.manual_seed(seed)
    return PaLM(**{**TINY_PALM, **overrides})


def tiny_reward_model(palm=None, **overrides):
    """A scalar ``RewardModel`` (``num_binned_output=0``; ``overrides``: any RewardModel argument)
    on its own tiny PaLM: a deep copy of ``palm`` (RewardModel copies what it is given), or of a
    fresh ``tiny_palm()``. ``reward_model(seq (b, n) int64, prompt_mask=(b, n) bool) -> (b,) float32``."""
    from palm_rlhf_pytorch import RewardModel
    return RewardModel(palm if palm is not None else tiny_palm(), **{"num_binned_output": 0, **overrides})


def tiny_prompt_ids(seed: int = 0, count: int = PROMPT_COUNT, lengths: tuple[int, int] = PROMPT_LENGTHS,
                    num_tokens: int = TINY_PALM["num_tokens"]):
    """``(count, max_len)`` int64 prompt ids in [1, num_tokens), lengths drawn from ``lengths``
    (inclusive), right-padded with 0 (the trainers' default ``pad_value``, stripped before a rollout);
    drawn from their own generator seeded with ``seed``, so the global RNG is untouched."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(lengths[0], lengths[1] + 1, (count,), generator=gen)
    ids = torch.randint(1, num_tokens, (count, int(lens.max())), generator=gen)
    keep = torch.arange(ids.shape[1]) < lens[:, None]
    return ids.masked_fill(~keep, byte_tokenizer.PAD_ID)


def trainer_kwargs(name: str, group_size: int | None = None, palm_dim: int = TINY_PALM["dim"],
                   **overrides) -> dict[str, Any]:
    """The smoke's constructor arguments of trainer ``name`` (no models, no prompts): ``minibatch_size``
    (SMOKE_MINIBATCH), ``epochs=1``, FlowRL's ``partition_function_hidden_dim=palm_dim``, SMOKE_EXTRA, and
    for a grouped trainer its group argument (``TrainerSpec.group_kwarg``) = ``group_size - 1``
    (default GROUP_SAMPLES: groups of 4); ``overrides`` win. ValueError for an unknown name, or a
    ``group_size`` other than 1 for PPO (no group) or below 1."""
    spec = spec_of(name)
    kwargs: dict[str, Any] = {"minibatch_size": SMOKE_MINIBATCH[name], "epochs": 1}
    if name == "flowrl":
        kwargs["partition_function_hidden_dim"] = palm_dim
    kwargs.update(SMOKE_EXTRA.get(name, {}))
    if spec.group_kwarg:
        size = GROUP_SAMPLES + 1 if group_size is None else group_size
        if size < 1:
            raise ValueError(f"group_size {size}: a group holds at least one completion")
        kwargs[spec.group_kwarg] = size - 1
    elif group_size not in (None, 1):
        raise ValueError(f"{name} samples one completion per prompt: no group_size {group_size}")
    return {**kwargs, **overrides}


def tiny_trainer(name: str, palm=None, reward_model=None, prompt_token_ids=_UNSET, group_size: int | None = None,
                 device: str = "cpu", accelerate_kwargs: dict | None = None, **overrides):
    """Trainer ``name`` (ppo, grpo, tpo, flowrl) with the smoke's settings, built in about a second.

    - ``palm``: the policy (default ``tiny_palm()``); ``reward_model``: default
      ``tiny_reward_model()`` on its own tiny PaLM; both moved to ``device``.
    - prompts: ``prompt_token_ids`` (default ``tiny_prompt_ids(0)``, shape (4, max_len) int64, on
      ``device``), unless ``overrides`` gives ``prompts`` or ``prompts_path`` (with ``tokenizer``);
      an explicit None is passed on (the library asserts one prompt source).
    - ``accelerate_kwargs``: added to the device's (``{'cpu': True}`` on the CPU).
    - ``group_size`` and ``overrides`` (any constructor argument): ``trainer_kwargs``.
    The library's constructor prints are captured (``trainers.construct_trainer``), and the trainer's
    prompt ids moved to ``device`` (Accelerate does not prepare them). Raises what the constructor
    raises; ValueError for an unknown name or group size.
    """
    spec = spec_of(name)
    device_kwargs, where = placement.resolve_device(device, trainers=False)
    palm = (palm if palm is not None else tiny_palm()).to(where)
    reward_model = (reward_model if reward_model is not None else tiny_reward_model()).to(where)
    prompt_args = {k: overrides.pop(k) for k in ("prompts", "prompts_path", "tokenizer") if k in overrides}
    if prompt_token_ids is not _UNSET:
        prompt_args["prompt_token_ids"] = prompt_token_ids
    elif not prompt_args:
        prompt_args["prompt_token_ids"] = tiny_prompt_ids(0).to(where)
    kwargs = trainer_kwargs(name, group_size, getattr(palm, "dim", TINY_PALM["dim"]), **overrides)
    return trainers.construct_trainer(spec, palm, reward_model, prompt_args,
                                      {**device_kwargs, **(accelerate_kwargs or {})}, where, **kwargs)


def max_seq_len(trainer, new_tokens: int = NEW_TOKENS) -> int:
    """``train(max_seq_len=...)`` for ``new_tokens`` sampled tokens after the trainer's longest
    prompt (``trainer.prompt_token_ids.shape[-1]`` + ``new_tokens``), as the smoke runs it."""
    return int(trainer.prompt_token_ids.shape[-1]) + new_tokens


if __name__ == "__main__":  # run by path: say what it is (one line, exit 2), do nothing else
    sys.stderr.write("probe_kit.py: error: a module, not a command: import it in a probe "
                     "(references/probes.md): sys.path.insert(0, '<skill root>/scripts'); import probe_kit\n")
    sys.exit(2)
