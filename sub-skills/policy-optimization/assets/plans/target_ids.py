"""The learning check's reward as a [reward] program: the fraction of response tokens whose id is
in 1..8 (half of a 16-token vocabulary), as tiny-rlhf-smoke --learn scores it."""
import torch

TARGETS = torch.arange(1, 9)


def score(x, response_mask):   # (b, n) int64, (b, n) bool -> (b,) float32
    hits = torch.isin(x, TARGETS.to(x.device)) & response_mask
    return hits.sum(dim=1).float() / response_mask.sum(dim=1).clamp(min=1).float()
