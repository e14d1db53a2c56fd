"""The raters' rule behind the worked example's preference pairs (``pairs.jsonl``).

The raters prefer answers made of digits: of two responses to one prompt, the one with the larger
share of ASCII digits is chosen, except that a rater picks the other one with probability
``1 - AGREEMENT`` (rater noise), so a perfect reward model ranks about ``AGREEMENT`` of held-out
pairs right. ``digit_share`` is the rule itself, usable as a gold metric
``(prompt: str, response: str) -> float`` (what ``[reward] text_program`` and ``[eval]`` metrics
take): the score the preference data stands for, beside the learned reward model's.
"""
from __future__ import annotations

import random

DIGITS = frozenset("0123456789")
AGREEMENT = 0.95  # the probability that a rater's label follows the rule


def digit_share(prompt: str, response: str) -> float:
    """The share of ``response``'s characters that are ASCII digits, in [0, 1] (0.0 for an empty
    response); ``prompt`` is not used."""
    return sum(c in DIGITS for c in response) / len(response) if response else 0.0


def rate(prompt: str, first: str, second: str, rng: random.Random) -> tuple[str, str] | None:
    """One rater's label of two responses to ``prompt``: (chosen, rejected), the rule's choice with
    probability AGREEMENT, else the other order; None when the rule scores them equal (a tie,
    not asked)."""
    a, b = digit_share(prompt, first), digit_share(prompt, second)
    if a == b:
        return None
    chosen, rejected = (first, second) if a > b else (second, first)
    return (chosen, rejected) if rng.random() < AGREEMENT else (rejected, chosen)
