"""Rule-based (programmatic, verifiable) rewards for the palm-rlhf-pytorch trainers.

The four trainers (PPO ``RLHFTrainer``, ``grpo.RLHFTrainer``, ``tpo.RLHFTrainer``,
``flowrl.FlowRLTrainer``) take ``reward_model: RewardModel``; PPO checks that type with beartype.
``RuleReward`` is the smallest subclass that satisfies them with a program instead of a network:
it skips ``RewardModel.__init__`` (no deep copy of a PaLM, no parameters), so the trainer holds no
reward tensors. Accelerate's ``prepare`` only moves it in one process and on GPUs (no
``DistributedDataParallel`` for a module without parameters that require grad); under
multi-process CPU (``MULTI_CPU``) Accelerate wraps every model and DDP refuses this one: the
trainer's constructor raises ``RuntimeError: DistributedDataParallel is not needed ...``
(workaround: policy-optimization/references/traps-devices.md#rule-reward-multi-cpu).

What ``forward`` receives (palm-rlhf-pytorch 0.8.0; documented and tested in
references/reward-api.md, "Rule-based rewards"):
    x            (b, n) int64, prompt + response ids on the trainer's device; b = 1 (PPO train),
                 the group size (GRPO, TPO, FlowRL train) or num_samples (trainer.generate)
    prompt_mask  (b, n) bool, True on prompt positions (always given)
    mask         (b, n) bool, False after an ``eos_token``; None from ``trainer.generate``
                 without ``eos_token``
What it must return: shape (b,), float32, on ``x.device`` (TPO asserts the shape; per-token
(b, n) rewards make the other trainers raise inside ``train()``).

Usage (import by path; torch and palm-rlhf-pytorch are imported when this module is):
    sys.path.insert(0, "<skill root>/sub-skills/reward-modeling/scripts")
    from rule_reward import RuleReward, token_fraction
    reward_model = RuleReward(token_fraction({3}))          # fraction of response tokens == 3
    reward_model = RuleReward(lambda x, response: ...)      # any rule: (b, n), (b, n) -> (b,)
"""
from __future__ import annotations

import sys
from typing import Callable, Iterable, Sequence

if __name__ == "__main__":  # run by path: say what it is (one line, exit 2), do nothing else
    sys.stderr.write("rule_reward.py: error: a module, not a command: import RuleReward from it (its docstring shows how); tiny-rlhf-smoke --learn uses it\n")
    sys.exit(2)

import torch
from torch import Tensor
from torch.nn import Module
from palm_rlhf_pytorch import RewardModel

# score(x (b, n) int64, response_mask (b, n) bool) -> (b,) tensor or a sequence of b numbers
Score = Callable[[Tensor, Tensor], "Tensor | Sequence[float]"]


class RuleReward(RewardModel):
    """A ``RewardModel`` whose score is a program.

    ``score(x, response_mask)`` gets the ids ``x`` (b, n) int64 and ``response_mask`` (b, n) bool,
    True on the response tokens that count (not prompt, not after an eos), and returns one number
    per sequence: a tensor of shape (b,) or a sequence of b numbers. ``forward`` returns it as a
    float32 tensor of shape (b,) on ``x.device``; any other shape raises ValueError naming it.

    ``RewardModel``'s own methods that use its PaLM copy (``load``, ``finetune_parameters``) do not
    apply; the trainers call only ``eval()``, ``forward`` and Accelerate's ``prepare``/``unwrap_model``.
    """

    def __init__(self, score: Score):
        Module.__init__(self)  # not RewardModel.__init__: no PaLM copy, no parameters
        self.score = score

    def forward(self, x: Tensor, mask: Tensor | None = None, prompt_mask: Tensor | None = None,
                prompt_lengths: Tensor | None = None) -> Tensor:
        """Score ``x`` (b, n) int64. ``mask`` (b, n) bool or None (every position counts);
        ``prompt_mask`` (b, n) bool or ``prompt_lengths`` (b,) int (not both, as in
        ``RewardModel.forward``; neither: every position is response). Returns (b,) float32."""
        if prompt_mask is not None and prompt_lengths is not None:
            raise ValueError("pass prompt_mask or prompt_lengths, not both")
        if prompt_lengths is not None:
            prompt_mask = torch.arange(x.shape[1], device=x.device) < prompt_lengths[:, None]
        response = torch.ones_like(x, dtype=torch.bool) if prompt_mask is None else ~prompt_mask
        if mask is not None:
            response = response & mask
        scores = torch.as_tensor(self.score(x, response), dtype=torch.float32, device=x.device)
        if scores.shape != (x.shape[0],):
            raise ValueError(f"rule reward must give one score per sequence, shape ({x.shape[0]},); "
                             f"got {tuple(scores.shape)}")
        return scores


def token_fraction(target_ids: Iterable[int]) -> Score:
    """A rule: the fraction of response tokens whose id is in ``target_ids``, in [0, 1].

    Returns ``score(x, response_mask) -> (b,) float32``; a sequence without response tokens scores
    0. With n_resp response tokens every score is a multiple of 1 / n_resp, exact in float32 when
    n_resp is a power of two (then a group of equal scores has a mean exactly equal to each, and
    GRPO's and FlowRL's ``(r - mean) / std`` is exactly 0 for it).
    """
    targets = sorted({int(t) for t in target_ids})
    if not targets:
        raise ValueError("token_fraction needs at least one target id")

    def score(x: Tensor, response: Tensor) -> Tensor:
        hits = torch.isin(x, torch.tensor(targets, device=x.device)) & response
        return hits.sum(dim=1).float() / response.sum(dim=1).clamp(min=1).float()

    return score
