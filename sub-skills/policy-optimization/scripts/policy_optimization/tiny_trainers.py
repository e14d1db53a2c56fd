"""Each trainer of palm-rlhf-pytorch with the smoke's settings, built in about a second on the probe
kit's tiny PaLM and reward model (``probe_kit``): what the smoke, the learning check, the canaries
and the probes train. In a probe (references/probes.md), from any copy of the skill tree with
only the library installed::

    import sys
    sys.path.insert(0, "<skill root>/scripts")
    import probe_kit                                    # the tiny PaLM; adds the tree's import roots
    from policy_optimization import tiny_trainers
    trainer = tiny_trainers.tiny_trainer("grpo")        # the smoke's GRPO: group 4, minibatch 4
    trainer.train(num_episodes=1, max_timesteps=2, update_timesteps=2, max_seq_len=tiny_trainers.max_seq_len(trainer))

This module is the one home of the smoke's trainer settings (minibatch, group, extra arguments,
new tokens). Nothing here imports torch until a function is called.
"""
from __future__ import annotations

from typing import Any

import probe_kit
from skill_runtime import placement
from policy_optimization import trainers

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


def trainer_kwargs(name: str, group_size: int | None = None, palm_dim: int = probe_kit.TINY_PALM["dim"],
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
    palm = (palm if palm is not None else probe_kit.tiny_palm()).to(where)
    reward_model = (reward_model if reward_model is not None else probe_kit.tiny_reward_model()).to(where)
    prompt_args = {k: overrides.pop(k) for k in ("prompts", "prompts_path", "tokenizer") if k in overrides}
    if prompt_token_ids is not _UNSET:
        prompt_args["prompt_token_ids"] = prompt_token_ids
    elif not prompt_args:
        prompt_args["prompt_token_ids"] = probe_kit.tiny_prompt_ids(0).to(where)
    kwargs = trainer_kwargs(name, group_size, getattr(palm, "dim", probe_kit.TINY_PALM["dim"]), **overrides)
    return trainers.construct_trainer(spec, palm, reward_model, prompt_args,
                                      {**device_kwargs, **(accelerate_kwargs or {})}, where, **kwargs)


def max_seq_len(trainer, new_tokens: int = NEW_TOKENS) -> int:
    """``train(max_seq_len=...)`` for ``new_tokens`` sampled tokens after the trainer's longest
    prompt (``trainer.prompt_token_ids.shape[-1]`` + ``new_tokens``), as the smoke runs it."""
    return int(trainer.prompt_token_ids.shape[-1]) + new_tokens
