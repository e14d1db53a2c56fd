"""The train smoke's prompts (``--prompt-style``): random token ids, the shipped prompts file as
``prompts=`` or as ``prompts_path=``, and the check that no prompt holds ``--eos-token``.
Torch-free at import."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import probe_kit
from skill_runtime import byte_tokenizer, exits

PROMPTS_FILE = Path(__file__).resolve().parents[3] / "assets" / "first-run" / "prompts.txt"
STYLES = ("token-ids", "text", "file")


def prompt_kwargs(style: str, seed: int, prompt_len: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Trainer prompt arguments for a style, plus a description for the report.

    token-ids: ``probe_kit.tiny_prompt_ids(seed)`` (4 prompts of random lengths 3-6, or each
    ``prompt_len`` ids); text and file: the shipped prompts file with the byte tokenizer.
    Raises SkillError (exit 2) when the shipped prompts file is missing, not UTF-8 or has no
    non-empty line: a damaged skill tree, reported before any model is built.
    """
    if style == "token-ids":
        lengths = (prompt_len, prompt_len) if prompt_len else probe_kit.PROMPT_LENGTHS
        ids = probe_kit.tiny_prompt_ids(seed, lengths=lengths)
        return {"prompt_token_ids": ids}, {"style": style, "count": ids.shape[0], "max_len": ids.shape[1]}
    try:
        prompts = PROMPTS_FILE.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise exits.SkillError(f"prompts file unreadable: {PROMPTS_FILE}: {exits.one_line(exc)} "
                            "(reinstall the skill tree)") from None
    if not any(p.strip() for p in prompts):
        raise exits.SkillError(f"prompts file has no non-empty line: {PROMPTS_FILE} (reinstall the skill tree)")
    tokenizer = byte_tokenizer.ByteTokenizer()
    if style == "text":
        return {"prompts": prompts, "tokenizer": tokenizer}, {"style": style, "tokenizer": tokenizer}
    return ({"prompts_path": str(PROMPTS_FILE), "tokenizer": tokenizer},
            {"style": style, "tokenizer": tokenizer, "path": PROMPTS_FILE.name})


def eos_in_prompts(args) -> list[int]:
    """Indices of the prompts --prompt-style would give the trainers that contain --eos-token. palm.py
    ``generate`` tests the whole sequence, prompt included, for eos: such a rollout stops after
    one sampled token, replaced by the pad id."""
    prompt_args, _ = prompt_kwargs(args.prompt_style, args.seed, args.prompt_len)
    ids = prompt_args.get("prompt_token_ids")
    if ids is None:
        ids = prompt_args["tokenizer"](prompt_args.get("prompts") or PROMPTS_FILE.read_text(encoding="utf-8").split("\n"))
    return [i for i, row in enumerate(ids.tolist()) if args.eos_token in row]
