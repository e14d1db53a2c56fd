"""A Hugging Face ``tokenizers`` file (``tokenizer.json``) as the run's tokenizer: ``[tokenizer]
file`` in the policy's run config and in the reward model's, read by ``train-reward``, ``train``,
``evaluate`` and ``watch`` alike (the byte tokenizer stays the default).

Ids: the file's id t is the kit's id t + 1, so id 0 stays the pad id every run strips
(``skill_runtime.byte_tokenizer``'s convention: 256 bytes + the pad = 257). A PaLM for it needs
``[palm] num_tokens >= vocab_size`` (the file's vocabulary + 1). Texts are encoded without the
file's special tokens (``add_special_tokens=False``: no BOS/EOS/CLS appended to a prompt by its
post-processor); ``[tokenizer] eos`` names the token that ends a response, and its kit id becomes
the run's ``eos_token``. The ``tokenizers`` package is in the ``[hf]`` extra; without it one line
names the extra. Torch-free at import.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from data_kit import tables
from skill_runtime import byte_tokenizer, exits

PAD_ID = byte_tokenizer.PAD_ID  # the kit's pad id: the file's ids are shifted up by one past it


class TokenizerFile:
    """``tokenizer.json`` at ``path`` (``tokenizers.Tokenizer.from_file``). ``__call__(texts:
    list[str]) -> (n, len) int64`` right-padded with PAD_ID, the file's ids + 1, whitespace-only
    texts dropped (counted in ``dropped_empty``, as the byte tokenizer does); ``decode(ids) -> str``
    its inverse (PAD_ID and ids beyond the vocabulary skipped); ``vocab_size``: the file's
    vocabulary + 1; ``sha256``: the file's digest (the policy and its reward model must share it);
    ``eos_id(token)``: a token's kit id. Raises SkillError(2) naming ``where``: no such file, no
    ``tokenizers`` installed (the [hf] extra), or a file it cannot read."""

    def __init__(self, path: str, where: str) -> None:
        file = Path(path)
        if not file.is_file():
            raise exits.SkillError(f"{where}: {path}: no such file (a tokenizer.json of Hugging Face tokenizers)")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise exits.SkillError(f"{where}: {path}: reading it needs tokenizers: {tables.HF_EXTRA}") from None
        data = file.read_bytes()
        try:
            self.tokenizer = Tokenizer.from_str(data.decode("utf-8-sig"))
        except Exception as exc:  # noqa: BLE001 - a bad encoding, or tokenizers' own Exception
            raise exits.SkillError(f"{where}: {path}: not a tokenizer.json that Hugging Face tokenizers reads "
                                   f"({exits.one_line(exc)[:160]}): save one with Tokenizer.save(path)") from None
        self.path, self.where = str(file), where
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True) + 1
        self.dropped_empty = 0

    def __call__(self, texts: list[str]):
        encoded = self.tokenizer.encode_batch(byte_tokenizer.non_empty(self, texts), add_special_tokens=False)
        return byte_tokenizer.padded([[i + 1 for i in e.ids] for e in encoded])

    def decode(self, ids) -> str:
        """The text of kit ids (any iterable of ints, a 1-D tensor included)."""
        ids = [int(i) - 1 for i in ids if PAD_ID < int(i) < self.vocab_size]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def eos_id(self, token: str, key: str) -> int:
        """The kit id of ``token`` ([tokenizer] eos). Raises SkillError(2) naming ``key`` when the
        file has no such token."""
        found = self.tokenizer.token_to_id(token)
        if found is None:
            raise exits.SkillError(f"{key} = {token!r}: {self.path} has no such token (its special tokens: "
                                   f"{', '.join(repr(t) for t in self.special_tokens()) or 'none'})")
        return found + 1

    def special_tokens(self) -> list[str]:
        """The file's added special tokens' strings."""
        return [t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special]


def check_vocabulary(tokenizer: TokenizerFile, num_tokens: int, key: str) -> None:
    """Refuse a PaLM whose ``num_tokens`` cannot embed every id of ``tokenizer``. Raises
    SkillError(2) naming both numbers and ``key`` ([palm] num_tokens)."""
    if num_tokens < tokenizer.vocab_size:
        raise exits.SkillError(f"{key} = {num_tokens}: below the {tokenizer.vocab_size} ids of [tokenizer] file "
                               f"{tokenizer.path} ({tokenizer.vocab_size - 1} tokens + the pad id 0): set "
                               f"num_tokens = {tokenizer.vocab_size} or more")


def check_table(table: dict | None, program_key: str | None) -> None:
    """A [tokenizer] table, before anything is read: it names its file, and it is the run's one
    tokenizer (``program_key``: the config's ``file.py:callable`` tokenizer key when it has one
    too). Torch-free. Raises SkillError(2)."""
    if table is None:
        return
    if "file" not in table:
        raise exits.SkillError('config [tokenizer] file: missing (file = "tokenizer.json")')
    if program_key:
        raise exits.SkillError(f"config {program_key}: give one tokenizer, [tokenizer] file or {program_key}")


def load(table: dict | None, where: str, num_tokens: int, num_key: str) -> TokenizerFile | None:
    """The [tokenizer] table's file (``table``: the config's [tokenizer], paths absolute), checked
    against ``num_tokens`` (``check_vocabulary``), or None without the table."""
    if table is None:
        return None
    tokenizer = TokenizerFile(table["file"], f"{where} file")
    check_vocabulary(tokenizer, num_tokens, num_key)
    return tokenizer


def record(tokenizer: TokenizerFile | None, program: bool) -> dict:
    """What a reward model was trained with, for rm_config.json: ``{"kind": "file", "file",
    "sha256"}``, ``{"kind": "program"}`` (a ``file.py:callable``: not comparable) or
    ``{"kind": "bytes"}`` (the byte tokenizer)."""
    if tokenizer is not None:
        return {"kind": "file", "file": tokenizer.path, "sha256": tokenizer.sha256}
    return {"kind": "program" if program else "bytes"}


def check_shared(policy: TokenizerFile | None, program: bool, trained: dict | None, where: str) -> None:
    """The policy's tokenizer (``policy``; ``program``: a [prompts] tokenizer program) against the
    reward model's ``trained`` record (``record``; None: an rm_config.json of an older version,
    not compared, as is a program on either side). Raises SkillError(2) naming both."""
    if trained is None or program or trained.get("kind") == "program":
        return
    mine = record(policy, False)
    if mine.get("sha256") != trained.get("sha256"):
        def said(r: dict) -> str:
            return f"tokenizer.json {r['file']} (sha256 {r['sha256'][:12]})" if r["kind"] == "file" else "the byte tokenizer"
        raise exits.SkillError(f"{where}: the reward model was trained with {said(trained)}, the policy reads "
                               f"{said(mine)}: the policy and its reward model must share one tokenizer ([tokenizer] "
                               "file in both configs)")
