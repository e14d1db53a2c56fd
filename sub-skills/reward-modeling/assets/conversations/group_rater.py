"""The raters' rule behind the second worked example's pairs (``pairs.jsonl``, HH-RLHF layout):
a preference that depends on the prompt.

A prompt asks either to count something (its group ``count``) or to spell a word (``spell``).
For a ``count`` prompt the raters prefer the answer with the larger share of ASCII digits, for a
``spell`` prompt the one with the larger share of lowercase letters; a rater picks the other one
with probability ``1 - AGREEMENT``. ``wanted_share`` is the rule itself, usable as a gold metric
``(prompt: str, response: str) -> float`` (``[eval] text_metric``): a policy that writes digits
everywhere rises on one group and falls on the other.
"""
from __future__ import annotations

import random

DIGITS, LETTERS = frozenset("0123456789"), frozenset("abcdefghijklmnopqrstuvwxyz")
AGREEMENT = 0.95  # the probability that a rater's label follows the rule


def group(prompt: str) -> str:
    """``count`` when the last human turn of ``prompt`` asks to count, else ``spell``."""
    return "count" if "count" in prompt.rpartition("Human:")[2] else "spell"


def wanted_share(prompt: str, response: str) -> float:
    """The share of ``response``'s characters the prompt's group wants (digits for ``count``,
    lowercase letters for ``spell``), in [0, 1]; 0.0 for an empty response."""
    wanted = DIGITS if group(prompt) == "count" else LETTERS
    return sum(c in wanted for c in response) / len(response) if response else 0.0


def rate(prompt: str, first: str, second: str, rng: random.Random) -> tuple[str, str] | None:
    """One rater's label: (chosen, rejected), the rule's order with probability AGREEMENT, else the
    other; None on a tie (not asked)."""
    a, b = wanted_share(prompt, first), wanted_share(prompt, second)
    if a == b:
        return None
    chosen, rejected = (first, second) if a > b else (second, first)
    return (chosen, rejected) if rng.random() < AGREEMENT else (rejected, chosen)
