#!/usr/bin/env python3
"""Write the worked example's data: ``pairs.jsonl`` (preference pairs rated by ``rater.py``),
``prompts.txt`` (the policy's training prompts) and ``held_out.txt`` (its held-out prompts).

Usage:
    python make_pairs.py                 # rewrite the shipped files beside this script
    python make_pairs.py --out DIR       # write them into DIR instead

Deterministic: the same seed writes the same bytes (tests/test_train_reward.py compares the shipped
files with a fresh run). Prompts are 2 to 4 words; each response is 4 to 12 characters of lowercase
letters, digits and spaces, its share of digits drawn uniformly per response, so pairs range from
easy to close calls. Exit codes: 0 written; 2 usage error or a folder it cannot write.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import rater

HERE = Path(__file__).resolve().parent
SEED = 30            # issue 30
PAIRS = 3000
TRAIN_PROMPTS, HELD_OUT_PROMPTS = 24, 8
WORDS = ("apple river stone cloud green small quick table seven house light paper window garden music dream "
         "count sum price total number year score page").split()
LETTERS, DIGITS = "abcdefghijklmnopqrstuvwxyz ", "0123456789"


def phrase(rng: random.Random) -> str:
    """A prompt: 2 to 4 words of WORDS."""
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 4)))


def response(rng: random.Random) -> str:
    """4 to 12 characters, each a digit with one probability drawn for the whole response."""
    share = rng.random()
    return "".join(rng.choice(DIGITS) if rng.random() < share else rng.choice(LETTERS)
                   for _ in range(rng.randint(4, 12))).strip() or rng.choice(DIGITS)


def pairs(rng: random.Random, count: int) -> list[dict[str, str]]:
    """``count`` rated pairs ``{"prompt", "chosen", "rejected"}`` (ties under the rule skipped)."""
    out = []
    while len(out) < count:
        prompt = phrase(rng)
        rated = rater.rate(prompt, response(rng), response(rng), rng)
        if rated is not None:
            out.append({"prompt": prompt, "chosen": rated[0], "rejected": rated[1]})
    return out


def prompts(rng: random.Random, count: int, taken: set[str]) -> list[str]:
    """``count`` distinct prompts not in ``taken`` (added to it)."""
    out = []
    while len(out) < count:
        text = phrase(rng)
        if text not in taken:
            taken.add(text)
            out.append(text)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="exit codes: 0 written; 2 usage error or a folder it cannot write",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE, metavar="DIR", help="where to write (default: beside this script)")
    args = parser.parse_args(argv)
    rng = random.Random(SEED)
    rows = pairs(rng, PAIRS)
    taken: set[str] = set()
    train, held_out = prompts(rng, TRAIN_PROMPTS, taken), prompts(rng, HELD_OUT_PROMPTS, taken)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        (args.out / "prompts.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
        (args.out / "held_out.txt").write_text("\n".join(held_out) + "\n", encoding="utf-8")
    except OSError as err:
        sys.stderr.write(f"make_pairs.py: error: --out {args.out}: {err.strerror or err}\n")
        return 2
    print(f"wrote {len(rows)} pairs, {len(train)} training and {len(held_out)} held-out prompts to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
