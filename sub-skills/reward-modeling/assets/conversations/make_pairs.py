#!/usr/bin/env python3
"""Write the second worked example's data in the Anthropic HH-RLHF layout (implicit prompt: each
row's ``chosen`` and ``rejected`` are whole conversations, ``"\\n\\nHuman: ...\\n\\nAssistant: ..."``,
sharing the prompt), rated by ``group_rater.py``, with a ``group`` column: ``pairs.jsonl`` (the reward
model's training pairs; its prompts are the policy's) and ``held_out.jsonl`` (pairs on prompts
about other things: the reward model's held-out pairs and the policy's held-out prompts).

Usage:
    python make_pairs.py                 # rewrite the shipped files beside this script
    python make_pairs.py --out DIR       # write them into DIR instead

Deterministic (tests/test_train_reward.py compares the shipped files with a fresh run). Each
answer is 4 to 12 characters of lowercase letters and digits, its share of digits drawn per
answer. Exit codes: 0 written; 2 usage error or a folder it cannot write.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import group_rater

HERE = Path(__file__).resolve().parent
SEED = 35  # issue 35
TRAIN_THINGS = "apples stones clouds houses rivers tables windows gardens pages lights papers dreams".split()
HELD_OUT_THINGS = "birds doors trees songs".split()
ASKS = {"count": "count the {}", "spell": "spell {}"}
PAIRS, HELD_OUT_PAIRS = 3000, 200


def answer(rng: random.Random) -> str:
    """4 to 12 characters, each a digit with one probability drawn for the whole answer."""
    share = rng.random()
    return "".join(rng.choice("0123456789") if rng.random() < share else rng.choice("abcdefghijklmnopqrstuvwxyz")
                   for _ in range(rng.randint(4, 12)))


def rows(rng: random.Random, things: list[str], count: int) -> list[dict[str, str]]:
    """``count`` rated rows ``{"chosen", "rejected", "group"}`` on prompts about ``things``."""
    out = []
    while len(out) < count:
        kind = rng.choice(sorted(ASKS))
        prompt = f"\n\nHuman: {ASKS[kind].format(rng.choice(things))}\n\nAssistant:"
        rated = group_rater.rate(prompt, answer(rng), answer(rng), rng)
        if rated is not None:
            out.append({"chosen": f"{prompt} {rated[0]}", "rejected": f"{prompt} {rated[1]}", "group": kind})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(HERE), help="the folder to write into (default: beside this script)")
    out = Path(parser.parse_args(argv).out)
    rng = random.Random(SEED)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, things, count in (("pairs.jsonl", TRAIN_THINGS, PAIRS), ("held_out.jsonl", HELD_OUT_THINGS, HELD_OUT_PAIRS)):
            (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows(rng, things, count)), encoding="utf-8")
    except OSError as exc:
        sys.stderr.write(f"make_pairs.py: error: {out}: {exc.strerror or exc}\n")
        return 2
    print(f"wrote {out / 'pairs.jsonl'} ({PAIRS} pairs) and {out / 'held_out.jsonl'} ({HELD_OUT_PAIRS})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
