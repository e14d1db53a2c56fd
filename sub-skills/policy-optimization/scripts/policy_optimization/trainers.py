"""The four trainers of palm-rlhf-pytorch 0.8.0 in one table, and the calls every helper makes on
a built one: construct it, its trainable groups, its policy PaLM and LoRA scope, its optimizers,
and a bounded ``train()`` that makes exactly the ``learn()`` calls asked for.

Facts from the installed source (``palm_rlhf_pytorch/ppo.py``, ``grpo.py``, ``tpo.py``,
``flowrl.py``); torch-free at import.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any

from skill_runtime import exits, streams

# Optimizer steps before every trainable tensor has moved. LoRA B starts at zero, so LoRA A gets a
# nonzero gradient only after B has moved once. AdoptAtan2 (arXiv 2411.02853, Algorithm 3) only
# initialises its second moment on step 1, so it needs 3 steps; AdamAtan2 moves on step 1: 2 steps.
REQUIRED_STEPS = {"AdoptAtan2": 3, "AdamAtan2": 2}


@dataclass(frozen=True)
class TrainerSpec:
    """One trainer: where it lives, how the docs name it, and what its loop stores."""
    name: str                   # ppo | grpo | tpo | flowrl: the helpers' and configs' name
    display: str                # PPO | GRPO | TPO | FlowRL: the docs' name (their "Applies to:" lines)
    module: str
    class_name: str
    optimizer: str              # class of the actor optimizer built in __init__
    group_kwarg: str | None     # constructor argument for the extra samples per prompt (group = it + 1)
    group_is_one_item: bool     # TPO stores a rollout's group as one replay-buffer timestep
    rollout_attr: str | None    # the attribute train() calls for a rollout (TPO: self.actor.generate)

    @property
    def path(self) -> str:
        """``palm_rlhf_pytorch.grpo.RLHFTrainer``: the class's import path."""
        return f"{self.module}.{self.class_name}"

    @property
    def source(self) -> str:
        """``palm_rlhf_pytorch.ppo``: the module of the source file whose ``train()`` and
        ``learn()`` this trainer runs (PPO's class is also exported at the package root)."""
        return f"palm_rlhf_pytorch.{self.name}"

    @property
    def required_steps(self) -> int:
        """Optimizer steps before every LoRA tensor has moved (``REQUIRED_STEPS``)."""
        return REQUIRED_STEPS[self.optimizer]

    def load(self) -> type:
        """The installed trainer class (imports torch and the library)."""
        return getattr(importlib.import_module(self.module), self.class_name)

    def items_per_rollout(self, group_size: int) -> int:
        """Experiences one rollout stores for ``learn()``: the group (GRPO, FlowRL), one (PPO; TPO,
        whose group is one replay-buffer timestep)."""
        return 1 if self.group_kwarg is None or self.group_is_one_item else group_size

    def steps_per_learn(self, rollouts: int, group_size: int, minibatch_size: int, epochs: int = 1) -> int:
        """Optimizer steps of one ``learn()`` over ``rollouts`` rollouts: ``epochs * ceil(items /
        minibatch_size)`` (its DataLoader keeps the last partial minibatch)."""
        return epochs * math.ceil(rollouts * self.items_per_rollout(group_size) / minibatch_size)

    def rollouts_for(self, steps: int, group_size: int, minibatch_size: int, epochs: int = 1) -> int:
        """Rollouts per ``learn()`` so that it makes at least ``steps`` optimizer steps."""
        return math.ceil(steps * minibatch_size / (self.items_per_rollout(group_size) * epochs))


TRAINERS = {
    "ppo": TrainerSpec("ppo", "PPO", "palm_rlhf_pytorch", "RLHFTrainer", "AdoptAtan2", None, False,
                       "actor_critic_generate"),
    "grpo": TrainerSpec("grpo", "GRPO", "palm_rlhf_pytorch.grpo", "RLHFTrainer", "AdoptAtan2",
                        "grpo_num_times_sample_rewards", False, "actor_generate"),
    "tpo": TrainerSpec("tpo", "TPO", "palm_rlhf_pytorch.tpo", "RLHFTrainer", "AdamAtan2",
                       "num_times_sample_rewards", True, None),
    "flowrl": TrainerSpec("flowrl", "FlowRL", "palm_rlhf_pytorch.flowrl", "FlowRLTrainer", "AdoptAtan2",
                          "flowrl_num_times_sample", False, "actor_generate"),
}
BY_DISPLAY = {spec.display: spec.name for spec in TRAINERS.values()}


def unwrap(trainer, module):
    """``module`` without Accelerate's wrappers (DDP): ``trainer.accelerate.unwrap_model``."""
    return trainer.accelerate.unwrap_model(module)


def policy_module(name: str, trainer):
    """The module the trainer trains and ``save()`` saves, unwrapped: PPO's ``ActorCritic``, else
    the ``Actor``."""
    return unwrap(trainer, trainer.actor_critic if name == "ppo" else trainer.actor)


def actor_palm(name: str, trainer):
    """The policy's PaLM (the one passed as ``palm=``, with the trainer's LoRA scope added)."""
    return policy_module(name, trainer).actor_palm


def actor_scope(name: str, trainer) -> str | None:
    """The policy's LoRA scope (``'actor'``), or None when the trainer trains all weights
    (``actor_lora=False``): what ``PaLM.generate(finetune_scope=...)`` needs to sample the policy."""
    return policy_module(name, trainer).actor_lora_scope


def trainable_groups(name: str, trainer) -> dict[str, list]:
    """The library's own trainable parameter lists, per group: ``actor_lora`` (the actor's
    ``parameters()``: its LoRA, or every PaLM weight with ``actor_lora=False``); PPO adds
    ``critic_lora`` and ``value_head``, FlowRL ``partition_function``."""
    if name == "ppo":
        ac = unwrap(trainer, trainer.actor_critic)
        critic_lora = list(ac.critic.finetune_parameters(ac.critic_lora_scope))
        return {"actor_lora": list(ac.actor_parameters()), "critic_lora": critic_lora,
                "value_head": list(ac.value_head.parameters())}
    groups = {"actor_lora": list(unwrap(trainer, trainer.actor).parameters())}
    if name == "flowrl":
        groups["partition_function"] = list(unwrap(trainer, trainer.partition_function).parameters())
    return groups


def optimizers(name: str, trainer) -> dict[str, Any]:
    """The trainer's torch optimizers (Accelerate's wrappers unwrapped): ``actor``; PPO's
    ``critic``; FlowRL's ``partition_function``."""
    found = {"actor": trainer.actor_optim}
    if name == "ppo":
        found["critic"] = trainer.critic_optim
    if name == "flowrl":
        found["partition_function"] = trainer.partition_function_optim
    return {k: getattr(opt, "optimizer", opt) for k, opt in found.items()}


def construct_trainer(spec: TrainerSpec, palm, reward_model, prompt_args: dict[str, Any],
                      device_kwargs: dict, device, **kwargs):
    """Build ``spec``'s trainer on ``palm`` and ``reward_model`` with the library's output captured,
    ``accelerate_kwargs=device_kwargs`` and the prompts of ``prompt_args`` (``prompt_token_ids``,
    or ``prompts``/``prompts_path`` with ``tokenizer``); then move its prompt ids (a buffer of its
    own that Accelerate does not prepare: traps-devices.md#prompt-ids-device) to ``device``.
    Raises whatever the library's constructor raises."""
    with streams.capture_library_output():
        trainer = spec.load()(palm=palm, reward_model=reward_model, accelerate_kwargs=device_kwargs,
                              **prompt_args, **kwargs)
    trainer.prompt_token_ids = trainer.prompt_token_ids.to(device)
    return trainer


def bounded_train(trainer, rollouts: int, max_seq_len: int, episodes: int = 1, **train_kwargs) -> tuple[str, str | None]:
    """``episodes`` x (``rollouts`` rollouts, then one ``learn()``): the library's own ``train()``
    with ``max_timesteps = update_timesteps = rollouts``, and ``train_kwargs`` (``eos_token``,
    ``temperature``) passed through. Returns (captured library stdout, None), or (captured,
    ``Type: message``) when the library raised: its failure is the caller's finding, not a crash."""
    try:
        with streams.capture_library_output() as captured:
            trainer.train(num_episodes=episodes, max_timesteps=rollouts, update_timesteps=rollouts,
                          max_seq_len=max_seq_len, **train_kwargs)
        return captured.stdout, None
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return captured.stdout, exits.one_line(exc)
