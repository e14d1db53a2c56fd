"""The models every kind of run builds from its config: a PaLM of [palm]'s arguments with [palm]
checkpoint loaded (``palm``), a RewardModel on a PaLM with a checkpoint loaded (``reward_model``),
and a state dict read into a module, checked to be that module's (``load_weights``).

Torch-free at import; each function imports torch and the library when called.
"""
from __future__ import annotations

from typing import Any

from skill_runtime import exits


def palm(kwargs: dict[str, Any], checkpoint: str | None, key: str = "[palm] checkpoint"):
    """``PaLM(**kwargs)`` (the checked [palm] arguments) on the CPU, with the state dict of
    ``checkpoint`` loaded when given (``load_weights``, errors naming ``key``)."""
    from palm_rlhf_pytorch import PaLM
    model = PaLM(**kwargs)
    if checkpoint:
        load_weights(model, checkpoint, key)
    return model


def reward_model(palm, kwargs: dict[str, Any], checkpoint: str | None, key: str = "[reward] checkpoint"):
    """``RewardModel(palm, **kwargs)`` (it deep-copies ``palm``; ``kwargs``: the checked
    [reward_model] arguments), with the state dict of ``checkpoint`` loaded when given
    (``load_weights``, errors naming ``key``)."""
    from palm_rlhf_pytorch import RewardModel
    model = RewardModel(palm, **kwargs)
    if checkpoint:
        load_weights(model, checkpoint, key)
    return model


def load_weights(module, path: str, key: str) -> None:
    """``module.load_state_dict(torch.load(path))`` (what ``PaLM.load`` and ``RewardModel.load``
    do: palm.py:333, reward.py:69), read onto the CPU with ``weights_only``. Raises SkillError(2)
    naming ``key`` and the file when it cannot be read or does not match the module."""
    import torch
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - unreadable or not a state dict: one line
        raise exits.SkillError(f"config {key}: {path}: {exits.one_line(exc)}") from None
    if not isinstance(state, dict):
        raise exits.SkillError(f"config {key}: {path}: holds a {type(state).__name__}, not a state dict")
    own = module.state_dict()
    missing, unexpected = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
    if missing or unexpected:  # another model's weights (a policy.pt given as an rm.pt, say)
        raise exits.SkillError(f"config {key}: {path}: not the weights of a {type(module).__name__}: "
                               f"{len(missing)} of its {len(own)} keys missing (e.g. {', '.join(missing[:2]) or '-'}), "
                               f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:2]) or '-'})")
    try:
        module.load_state_dict(state)
    except Exception as exc:  # noqa: BLE001 - the same keys at other shapes: one line
        raise exits.SkillError(f"config {key}: {path}: {exits.one_line(exc)}") from None
