"""The held-out reward of a policy: the measure of the learning check (``tiny-rlhf-smoke --learn``)
and of a real run (``palm-rlhf-skill train``'s ``[eval]``), one function for both."""
from __future__ import annotations

from typing import Any


def held_out_reward(palm, scope: str | None, reward_model, prompts, samples: int, max_seq_len: int, seed: int,
                    temperature: float = 1.0, eos_token: int | None = None, pad_value: int = 0) -> float:
    """Mean reward of ``palm`` sampled on held-out ``prompts``, each ``samples`` times, exactly as a
    rollout samples: ``PaLM.generate(max_seq_len, prompt=..., finetune_scope=scope)`` with its
    default top-k filter (palm_rlhf_pytorch/palm.py ``generate``), ``temperature`` and
    ``eos_token``; ``scope`` is the policy's LoRA scope (``trainers.actor_scope``; None trains and
    samples the plain PaLM). Prompts of one length are sampled as one batch, in order of first
    appearance, so a set of equal-length prompts is one ``generate`` call.

    ``prompts``: (p, n) int64 ids right-padded with ``pad_value`` (stripped, as the trainers strip
    it before a rollout), or a list of 1-D int64 tensors. The reward model gets the trainers'
    arguments: ``prompt_mask`` (b, n) bool, and with ``eos_token`` a ``mask`` (b, n) bool, False
    after each row's first eos (palm_rlhf_pytorch/grpo.py ``Actor.generate``). Sampling runs
    inside ``torch.random.fork_rng`` with the generator seeded by ``seed``: training's random
    stream is untouched, and the same noise is drawn before and after training. Returns a float:
    the mean over every prompt and sample (each prompt weighs the same).
    """
    import torch
    import torch.nn.functional as F

    rows = [row[row != pad_value] for row in prompts]
    by_length: dict[int, list[Any]] = {}
    for row in rows:
        by_length.setdefault(int(row.shape[0]), []).append(row)
    device = next(iter(palm.parameters())).device
    total, count = 0.0, 0
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for group in by_length.values():
            batch = torch.stack(group).to(device).repeat_interleave(samples, dim=0)
            response = palm.generate(max_seq_len, prompt=batch, finetune_scope=scope,
                                     temperature=temperature, eos_token=eos_token)
            sequence = torch.cat((batch, response), dim=1)
            prompt_mask = (torch.arange(sequence.shape[1], device=device) < batch.shape[1]).expand_as(sequence)
            kwargs = {}
            if eos_token is not None:
                mask = (sequence == eos_token).cumsum(dim=-1) == 0
                kwargs["mask"] = F.pad(mask, (1, -1), value=True)  # the eos itself counts
            with torch.no_grad():
                rewards = reward_model(sequence, prompt_mask=prompt_mask, **kwargs)
            total += float(rewards.float().sum())
            count += int(rewards.numel())
    return total / count
