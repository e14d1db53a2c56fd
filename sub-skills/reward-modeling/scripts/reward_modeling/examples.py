"""The reward model's data: preference pairs or ratings read by ``data_kit`` (JSONL, JSON, CSV,
Parquet, a datasets folder; pairs in any of the field's layouts), checked row by row, tokenized,
fitted to [data] max_length, split into a training and a held-out set, and cut into batches.

- pairs: ``{"prompt": str, "chosen": str, "rejected": str}`` once read (an implicit prompt taken,
  a conversation rendered: ``data_kit.layouts``), chosen and rejected different and not empty
  (the prompt may be empty);
- ratings: ``{"prompt": str, "response": str, "rating": number}``; with a binned model
  (``num_binned_output`` = K > 1) the rating is a bin index, an integer in [0, K).

A sequence is the prompt's ids followed by the response's (the tokenizer's pad id 0 stripped from
each), exactly what the trainers hand a reward model: ``x`` (b, n) int64 with ``prompt_mask`` True
on the prompt and ``mask`` True on the sequence (palm_rlhf_pytorch/grpo.py:642-654). Torch-free at
import.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from data_kit import layouts, sizes
from skill_runtime import exits

PAD_ID = 0
KEYS = {"pairs": ("prompt", "chosen", "rejected"), "ratings": ("prompt", "response", "rating")}


@dataclass
class Examples:
    """Tokenized rows. ``prompts[i]``: the prompt's ids; pairs: ``first[i]`` chosen and
    ``second[i]`` rejected response ids; ratings: ``first[i]`` the response ids and ``ratings[i]``
    its rating (``second`` empty); ``places[i]`` where the row is (``config [data] pairs: FILE line
    3``)."""
    kind: str
    prompts: list[list[int]] = field(default_factory=list)
    first: list[list[int]] = field(default_factory=list)
    second: list[list[int]] = field(default_factory=list)
    ratings: list[float] = field(default_factory=list)
    places: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.prompts)

    def subset(self, indices: list[int]) -> "Examples":
        pick = lambda values: [values[i] for i in indices] if values else []  # noqa: E731
        return Examples(self.kind, pick(self.prompts), pick(self.first), pick(self.second), pick(self.ratings),
                        pick(self.places))

    def lengths(self) -> list[int]:
        """Each row's longest sequence (prompt + its longer response), in tokens."""
        return [len(p) + max(len(a), len(b)) for p, a, b in zip(self.prompts, self.first, self.second or self.first)]

    def ids(self) -> set[int]:
        """Every token id the rows contain (prompts and responses)."""
        return {i for rows in (self.prompts, self.first, self.second) for row in rows for i in row}

    def longest(self) -> int:
        """The longest sequence (prompt + response) of the rows, in tokens."""
        return max(self.lengths(), default=1)


def read_rows(path: str, kind: str, where: str, bins: int, data: dict[str, Any] | None = None,
              held_out: bool = False) -> list[dict[str, Any]]:
    """The rows of ``path`` (any file or folder ``data_kit.tables`` reads; pairs in any layout of
    ``data_kit.layouts``, ``data`` the [data] table that says how), each checked: pairs
    ``{"prompt", "chosen", "rejected"}`` texts, chosen and rejected different and not empty;
    ratings ``{"prompt", "response", "rating"}``, a response not empty, a rating a finite number
    (with ``bins`` > 1 an integer bin index in [0, bins)). Each row also holds ``place`` (``FILE
    line 3``) and ``group``. ``held_out``: the [data] held_out file (its split is [data]
    held_out_split, default ``test``). Raises SkillError(2) naming ``where`` (the config key),
    the file and the row."""
    data = data or {}
    options = layouts.options_from(data, "config [data]")
    split, split_key = (data.get("held_out_split"), "[data] held_out_split") if held_out else \
        (data.get("split"), "[data] split")
    prefer = "test" if held_out else "train"
    if kind == "pairs":
        pairs, _ = layouts.read_pairs(path, where, options, split, split_key, prefer)
        return [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected, "group": p.group, "place": p.place}
                for p in pairs]
    return [{**check_row(row, kind, at, bins), "place": at}
            for row, at in layouts.read_ratings(path, where, options, split, split_key, prefer)]


def check_row(row: Any, kind: str, at: str, bins: int) -> dict[str, Any]:
    """One row of ``kind`` checked (``read_rows``); returns it. Raises SkillError(2) at ``at``."""
    import math
    keys = KEYS[kind]
    if not isinstance(row, dict):
        raise exits.SkillError(f"{at}: a JSON object with {', '.join(keys)} expected, got {type(row).__name__}")
    missing = [k for k in keys if k not in row]
    if missing:
        raise exits.SkillError(f"{at}: missing key {missing[0]!r} (a row has {', '.join(keys)})")
    for key in keys[:-1] if kind == "ratings" else keys:
        if not isinstance(row[key], str):
            raise exits.SkillError(f"{at}: {key} must be a string, got {type(row[key]).__name__}")
    responses = ("chosen", "rejected") if kind == "pairs" else ("response",)
    for key in responses:
        if not row[key]:
            raise exits.SkillError(f"{at}: {key} is empty (a response the reward model scores has at least one token)")
    if kind == "pairs" and row["chosen"] == row["rejected"]:
        raise exits.SkillError(f"{at}: chosen and rejected are the same text: the pair prefers nothing")
    if kind == "ratings":
        rating = row["rating"]
        if isinstance(rating, bool) or not isinstance(rating, (int, float)) or not math.isfinite(rating):
            raise exits.SkillError(f"{at}: rating must be a finite number, got {rating!r}")
        if bins > 1 and (not isinstance(rating, int) or not 0 <= rating < bins):
            raise exits.SkillError(f"{at}: rating {rating!r}: with num_binned_output = {bins} a rating is a bin index, "
                                   f"an integer from 0 to {bins - 1}")
    return row


def tokenize(rows: list[dict[str, Any]], kind: str, tokenizer: Callable, num_tokens: int, where: str) -> Examples:
    """``rows`` through ``tokenizer`` (``texts: list[str] -> (n, len) int64`` padded with 0: the
    skill's ``ByteTokenizer`` or [data] tokenizer), each distinct text once, pad ids stripped.
    Raises SkillError(2) naming ``where`` when the tokenizer fails, returns another number of rows,
    ids beyond ``num_tokens``, or no id for a response."""
    from config_kit import programs
    texts = sorted({row[k] for row in rows for k in KEYS[kind][:3] if isinstance(row[k], str) and row[k]})
    ids = programs.tokenize(tokenizer, texts, where, num_tokens)
    if ids.shape[0] != len(texts):
        raise exits.SkillError(f"{where}: the tokenizer returned {ids.shape[0]} rows for {len(texts)} texts")
    table = {text: [i for i in row.tolist() if i != PAD_ID] for text, row in zip(texts, ids)}
    table[""] = []
    out = Examples(kind)
    for row in rows:
        out.places.append(row.get("place", where))
        out.prompts.append(table[row["prompt"]])
        if kind == "pairs":
            out.first.append(table[row["chosen"]])
            out.second.append(table[row["rejected"]])
        else:
            out.first.append(table[row["response"]])
            out.ratings.append(row["rating"])
    if any(not response for response in out.first + out.second):
        raise exits.SkillError(f"{where}: the tokenizer gave a response no ids (all pad)")
    return out


def fit(examples: Examples, max_length: int, truncate: bool, key: str) -> int:
    """Every row within ``max_length`` tokens (prompt + its longer response). Over it: with
    ``truncate`` the prompt loses its first ids (the end, nearest the response, is kept), then
    the responses their last ids, until the row fits; without (the default) SkillError(2) naming
    the longest row, its length, the limit and the options (``data_kit.sizes.check_length``).
    Returns how many rows were truncated. ``key``: the config key of the file, for the message."""
    lengths = examples.lengths()
    if not truncate:
        sizes.check_length(lengths, examples.places, max_length, "" if examples.places else key,
                           f"raise [data] max_length, or set [data] truncate = true (the prompt's start goes first, "
                           f"then the responses' end)")
        return 0
    cut = 0
    for i, length in enumerate(lengths):
        if length <= max_length:
            continue
        cut += 1
        keep = max(0, max_length - max(len(examples.first[i]), len(examples.second[i]) if examples.second else 0))
        examples.prompts[i] = examples.prompts[i][len(examples.prompts[i]) - keep:] if keep else []
        room = max_length - len(examples.prompts[i])
        examples.first[i] = examples.first[i][:room]
        if examples.second:
            examples.second[i] = examples.second[i][:room]
    return cut


def split(examples: Examples, fraction: float, seed: int) -> tuple[Examples, Examples]:
    """(training, held-out): a seeded shuffle (``random.Random(seed)``) of the rows, the first
    ``round(len * fraction)`` of it (at least one) held out. Raises SkillError(2) when nothing is
    left to train on."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    count = max(1, round(len(order) * fraction))
    if count >= len(order):
        raise exits.SkillError(f"config [data]: {len(order)} rows: too few to hold out {fraction:g} of them and "
                               "train on the rest: more rows, or a held_out file")
    return examples.subset(sorted(order[count:])), examples.subset(sorted(order[:count]))


def batches(count: int, batch_size: int, world: int) -> list[tuple[int, int]]:
    """The (start, end) slices of one epoch's order: ``batch_size`` rows each, the last one
    shorter; a last slice of fewer than ``world`` rows (one for each process) joins the one
    before it."""
    starts = list(range(0, count, batch_size))
    if len(starts) > 1 and count - starts[-1] < world:
        starts.pop()
    return [(a, b) for a, b in zip(starts, starts[1:] + [count])]


def epoch_order(count: int, seed: int, epoch: int) -> list[int]:
    """Epoch ``epoch``'s order of ``count`` training rows: a shuffle seeded by (seed, epoch) alone,
    so a resumed run draws the same batches without any data-loader state."""
    order = list(range(count))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def collate(prompts: list[list[int]], responses: list[list[int]], device) -> tuple[Any, Any, Any]:
    """Sequences prompt + response, right-padded with PAD_ID: ``x`` (b, n) int64, ``mask`` (b, n)
    bool (True on every prompt and response token: the trainers pool both, grpo.py:648) and
    ``prompt_lengths`` (b,) int64, on ``device``."""
    import torch
    rows = [p + r for p, r in zip(prompts, responses)]
    x = torch.full((len(rows), max(map(len, rows))), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        x[i, :len(row)] = torch.tensor(row, dtype=torch.long)
    lengths = torch.tensor([len(row) for row in rows])
    mask = torch.arange(x.shape[1]) < lengths[:, None]
    return x.to(device), mask.to(device), torch.tensor([len(p) for p in prompts]).to(device)
