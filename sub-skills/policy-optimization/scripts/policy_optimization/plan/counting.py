"""Counting a run before it starts (no memory at any size): what ``train()`` does with its
rollouts (``run_counts``) and the trainer's parameters, weights, optimizer state and gradients,
counted on a trainer built on torch's meta device (``parameter_report``; ``builder.build(meta=True)``).

Torch-free at import.
"""
from __future__ import annotations

import math
from typing import Any


def run_counts(rollouts: int, update_timesteps: int, items_per_rollout: int, minibatch_size: int,
               epochs: int, rounds: int = 1) -> dict[str, int]:
    """What ``rounds`` calls of ``train()`` do with ``rollouts`` rollouts each
    (``num_episodes * max_timesteps``; a [run] round is one call with num_episodes 1).

    learn() runs when the rollout counter is a multiple of ``update_timesteps`` (ppo.py train(),
    same loop in grpo.py, tpo.py, flowrl.py); the counter starts again at each call, and the
    rollouts after its last multiple are dropped when the call returns. One learn() makes
    ``epochs * ceil(items / minibatch_size)`` optimizer steps (DataLoader, last partial batch
    kept). Returns integer counts for all the calls together (``rounds``: how many).
    """
    learn_calls = rollouts // update_timesteps
    items_per_learn = update_timesteps * items_per_rollout
    steps_per_learn = epochs * math.ceil(items_per_learn / minibatch_size)
    leftover = rollouts - learn_calls * update_timesteps
    last_minibatch = items_per_learn % minibatch_size or min(minibatch_size, items_per_learn)
    learn_calls, leftover, rollouts = rounds * learn_calls, rounds * leftover, rounds * rollouts
    return {"rounds": rounds, "rollouts": rollouts, "learn_calls": learn_calls, "items_per_rollout": items_per_rollout,
            "items_per_learn": items_per_learn, "minibatches_per_epoch": math.ceil(items_per_learn / minibatch_size),
            "last_minibatch_items": last_minibatch, "optimizer_steps_per_learn": steps_per_learn,
            "optimizer_steps": learn_calls * steps_per_learn, "leftover_rollouts_dropped": leftover,
            "leftover_items_dropped": leftover * items_per_rollout,
            "max_items_held": items_per_learn if learn_calls else rollouts // rounds * items_per_rollout}



def optimizers(trainer) -> list:
    """The trainer's optimizers (Accelerate's wrappers unwrapped), found among its attributes."""
    import torch
    found = [getattr(v, "optimizer", v) for v in vars(trainer).values()]
    return [opt for opt in found if isinstance(opt, torch.optim.Optimizer)]


def optimizer_state_tensors(optimizer_class) -> int:
    """How many parameter-sized state tensors ``optimizer_class`` keeps per parameter after a step,
    read from the installed optimizer (AdoptAtan2 and AdamAtan2 of adam_atan2_pytorch: 2)."""
    import torch
    param = torch.nn.Parameter(torch.zeros(3))
    opt = optimizer_class([param])
    param.grad = torch.ones(3)
    opt.step()
    return sum(torch.is_tensor(v) and v.shape == param.shape for v in opt.state[param].values())


def parameter_report(trainer) -> dict[str, Any]:
    """Parameter counts and bytes of a (meta-built) trainer, per component.

    Components are the trainer's top-level modules (``palm`` is the policy with its LoRA scopes;
    ``reward_model`` holds its own deep copy of the PaLM; PPO's ``actor_critic.critic`` is a deep copy
    of the PaLM and ``actor_critic.value_head`` the value head; FlowRL's ``partition_function``).
    Shared tensors are counted once (the tied embedding and the policy PaLM reached twice).
    Trainable: the parameters the trainer's optimizers step. Bytes: numel * element size.
    """
    components: dict[str, dict[str, int]] = {}
    trainable = {id(p) for opt in optimizers(trainer) for group in opt.param_groups for p in group["params"]}
    for is_param, named in ((True, trainer.named_parameters()), (False, trainer.named_buffers())):
        for name, tensor in named:
            if name == "prompt_token_ids":
                continue
            parts = name.split(".")
            key = ".".join(parts[:2]) if parts[0] == "actor_critic" else parts[0]
            entry = components.setdefault(key, {"numel": 0, "bytes": 0, "trainable_numel": 0, "trainable_bytes": 0})
            size = tensor.numel() * tensor.element_size()
            entry["bytes"] += size
            if is_param:
                entry["numel"] += tensor.numel()
            if id(tensor) in trainable:
                entry["trainable_numel"] += tensor.numel()
                entry["trainable_bytes"] += size
    opts = optimizers(trainer)
    state_tensors = {type(o).__name__: optimizer_state_tensors(type(o)) for o in opts}
    trainable_bytes = sum(c["trainable_bytes"] for c in components.values())
    per_param = max(state_tensors.values(), default=0)
    return {"components": components,
            "total_numel": sum(c["numel"] for c in components.values()),
            "trainable_numel": sum(c["trainable_numel"] for c in components.values()),
            "weights_bytes": sum(c["bytes"] for c in components.values()),
            "trainable_bytes": trainable_bytes,
            "optimizers": [type(o).__name__ for o in opts],
            "optimizer_state_tensors_per_parameter": state_tensors,
            "optimizer_state_bytes": per_param * trainable_bytes,
            "gradient_bytes": trainable_bytes}

