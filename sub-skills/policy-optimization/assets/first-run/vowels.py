"""The worked example's reward: the fraction of response bytes that are vowels.

A rule on ids, as [reward] program takes it: ``x`` (b, n) int64 token ids (the byte tokenizer:
id = byte + 1), ``response_mask`` (b, n) bool, True on the response tokens that count; returns one
score per sequence, shape (b,), in [0, 1].
"""
import torch

VOWELS = torch.tensor([b + 1 for b in b"aeiouAEIOU"])


def vowel_fraction(x, response_mask):
    hits = torch.isin(x, VOWELS.to(x.device)) & response_mask
    return hits.sum(dim=1).float() / response_mask.sum(dim=1).clamp(min=1).float()
