"""The skill's byte-level tokenizer: UTF-8 byte b is id b + 1, id 0 is the library's pad id."""
from __future__ import annotations

from skill_runtime import exits


PAD_ID = 0  # the library's pad id: PaLM's cross_entropy_ignore_index and the trainers' pad_value


class ByteTokenizer:
    """Byte-level tokenizer: UTF-8 byte b -> id b + 1, so id 0 stays the pad id.

    ``__call__(prompts: list[str]) -> LongTensor (num_prompts, max_bytes)``, right-padded with 0.
    Empty strings are dropped (counted in ``dropped_empty``): the trainers split ``prompts_path``
    on '\\n', so a file's trailing newline becomes an empty prompt whose rollout would crash.
    Raises SkillError(exit 2) when nothing is left to tokenize. Vocabulary: 257 ids (pad + 256 bytes).
    ``decode(ids) -> str`` is the inverse: ids 1..256 back to bytes, pad and larger ids skipped,
    bytes that are not UTF-8 replaced (U+FFFD).
    """

    vocab_size = 257

    def __init__(self) -> None:
        self.dropped_empty = 0

    def __call__(self, prompts: list[str]):
        return padded([[b + 1 for b in p.encode("utf-8")] for p in non_empty(self, prompts)])

    def decode(self, ids) -> str:
        """The text of ``ids`` (any iterable of ints, a 1-D tensor included): id i in 1..256 is byte
        i - 1; 0 (pad) and ids beyond 256 (a larger vocabulary's) are skipped."""
        return bytes(int(i) - 1 for i in ids if 1 <= int(i) <= 256).decode("utf-8", errors="replace")


def non_empty(tokenizer, texts: list[str]) -> list[str]:
    """``texts`` without the whitespace-only ones, counted in ``tokenizer.dropped_empty`` (the
    trainers split ``prompts_path`` on '\\n': an empty prompt's rollout would crash). Raises
    SkillError(2) when none is left. Shared by every tokenizer of the tree."""
    kept = [t for t in texts if t.strip()]
    tokenizer.dropped_empty += len(texts) - len(kept)
    if not kept:
        raise exits.SkillError("no non-empty prompts to tokenize")
    return kept


def padded(rows: list[list[int]]):
    """Rows of ids as one (n, longest) int64 tensor, right-padded with PAD_ID."""
    import torch
    out = torch.full((len(rows), max(1, max(map(len, rows)))), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row, dtype=torch.long)
    return out
