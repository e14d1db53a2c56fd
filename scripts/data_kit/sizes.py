"""Sizes checked before a tensor is made: the longest row against a length limit (named with its
place, its length in tokens, the limit and the option that changes it), and the memory a batch of
sequences of that length needs against what the machine has.

The memory estimate is a lower bound of what palm-rlhf-pytorch's attention allocates (the
non-flash path every CPU run takes, palm_rlhf_pytorch/attention.py:70-76,128-149): the causal mask
(``n x n`` bool, kept as a buffer), and per layer the ``(b, heads, n, n)`` float32 similarity
and its softmax; a forward with gradients keeps each layer's softmax for the backward pass, so
``depth`` of them plus the one being computed, a forward without (scoring) two at a time. The
weights, the rest of the activations and the optimizer come on top, so a size refused here
cannot fit, and one allowed may still not. Torch-free at import.
"""
from __future__ import annotations

from typing import Any

from skill_runtime import exits

MIB = 2**20
FLOAT32 = 4


def longest(lengths: list[int]) -> int:
    """The index of the longest row (the first of the longest)."""
    return max(range(len(lengths)), key=lengths.__getitem__)


def check_length(lengths: list[int], places: list[str], limit: int, where: str, fix: str) -> None:
    """Refuse when a row is longer than ``limit`` tokens: one line naming the longest row's place,
    its length, the limit, how many rows are over it, and ``fix`` (the option that changes it);
    ``where`` (may be empty) goes before the place. Raises SkillError(2)."""
    if not lengths:
        return
    i = longest(lengths)
    if lengths[i] <= limit:
        return
    over = sum(n > limit for n in lengths)
    raise exits.SkillError(f"{where + ': ' if where else ''}{places[i]}: {lengths[i]:,} tokens, above the limit of {limit:,} "
                           f"({over} of {len(lengths)} rows are over it): {fix}")


def attention_bytes(sequences: int, length: int, heads: int, depth: int, grad: bool) -> int:
    """The bytes the attention of ``sequences`` sequences of ``length`` tokens takes at least
    (the module's docstring): ``n**2`` for the mask plus ``(depth + 1 if grad else 2)`` tensors of
    ``sequences * heads * n**2`` float32."""
    scores = sequences * heads * length * length * FLOAT32
    return length * length + (depth + 1 if grad else 2) * scores


def available_bytes(device: Any = None) -> int:
    """Memory a new allocation can take now: the CUDA device's free memory (``torch.cuda.mem_get_info``)
    for a CUDA ``device``, else the host RAM available (``placement.available_memory_mib``)."""
    if device is not None and getattr(device, "type", str(device)) == "cuda":
        import torch
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    from skill_runtime import placement
    return placement.available_memory_mib() * MIB


def check_memory(need: int, available: int, where: str, what: str, fix: str) -> None:
    """Refuse (SkillError 2) when ``need`` bytes exceed ``available``: one line with both in MiB,
    ``what`` needs them, and ``fix``."""
    if need > available:
        raise exits.SkillError(f"{where}: {what} needs at least {need / MIB:,.0f} MiB for attention alone, "
                               f"{available / MIB:,.0f} MiB are available: not started; {fix}")
