"""The end of a run: the trained policy as a standalone PaLM state dict, LoRA merged.

``export_policy`` merges the actor's LoRA scope into a deep copy of the policy's PaLM
(palm_rlhf_pytorch/palm.py ``merge_finetune_params``, which pops the scope), so the trainer keeps
its own PaLM and scope and could still train; merging the trainer's own PaLM would leave its
optimizer holding LoRA tensors no forward uses (lora-scopes.md). The file loads with
``PaLM(**[palm]).load(path)``.
"""
from __future__ import annotations

import copy
from pathlib import Path

from policy_optimization import trainers
from run_kit import rundir


def merged_policy_state(name: str, trainer) -> dict:
    """The policy's PaLM weights with its LoRA scope merged and no finetune scope left: ``{name:
    tensor}`` on the CPU, the keys of a plain ``PaLM(**config).state_dict()``."""
    import torch
    palm = copy.deepcopy(trainers.actor_palm(name, trainer))
    scope = trainers.actor_scope(name, trainer)
    if scope is not None:
        palm.merge_finetune_params(scope)
    for other in list(palm.finetune_modules):  # scopes the policy never used (yours, added before)
        palm.remove_finetune_params(other)
    with torch.no_grad():
        return {key: value.detach().cpu().clone() for key, value in palm.state_dict().items()}


def export_policy(name: str, trainer, path: Path) -> Path:
    """Write ``merged_policy_state`` to ``path`` with ``torch.save``, atomically
    (``rundir.write_torch_atomic``). Returns ``path``."""
    return rundir.write_torch_atomic(merged_policy_state(name, trainer), path)
