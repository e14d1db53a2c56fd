"""Checkpoints through ``accelerate.save_state`` and an exact resume.

A checkpoint is ``DIR/checkpoints/round-NNNNNN/``: what ``trainer.accelerate.save_state`` writes
(every model and optimizer the trainer prepared: the policy with its LoRA, PPO's critic and value
head, FlowRL's partition function, the reward model; the optimizers' state; the RNG states of
``random``, numpy and torch, per process) plus ``run_state.json`` (the round, the resolved config,
the rotary cache lengths, the run's counters). It is written into a temporary folder next to it
and renamed into place once complete, so a kill during a checkpoint leaves the previous one valid;
``run_state.json`` is written last, and a folder without it is not a checkpoint.

Exact resume: the library's ``train()`` draws prompts with ``random.randrange`` and samples with
torch's generator, both restored by ``load_state``. One more state lives outside every state dict:
each PaLM block's rotary/xpos table (palm_rlhf_pytorch/palm.py ``get_rotary_embedding``, a
non-persistent buffer grown to the longest sequence the block has seen), and logits computed with
a longer table differ by about 1e-7; ``load`` rebuilds each table at the length it had, so the
resumed run computes bitwise what the uninterrupted one does (tests/test_run_kit.py).
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any, Iterator

from run_kit import rundir
from skill_runtime import exits, streams

STATE_FILE = "run_state.json"
NAME = re.compile(r"round-(\d{6})")
KEEP = 2  # checkpoints kept: the newest and the one before it


def rotary_lengths(trainer) -> dict[str, int]:
    """``{module name: cached rotary length}`` of every PaLM block of the trainer (policy, PPO's
    critic copy, the reward model's copy) that has a cached table."""
    return {name: int(module.pos_emb.shape[-2]) for name, module in trainer.named_modules()
            if type(module).__name__ == "ParallelTransformerBlock" and getattr(module, "pos_emb", None) is not None}


def prime_rotary(trainer, lengths: dict[str, int]) -> None:
    """Rebuild each block's rotary table at the length it had when the checkpoint was written
    (``rotary_lengths``), through the library's own ``get_rotary_embedding``."""
    modules = dict(trainer.named_modules())
    for name, length in lengths.items():
        block = modules.get(name)
        if block is not None:
            block.get_rotary_embedding(length, next(block.parameters()).device)


def prime_rotary_to(trainer, length: int) -> None:
    """Build every PaLM block's rotary table at ``length`` (the run's longest sequence) right after
    the trainer is built, in every process, fresh or resumed: no forward then grows a table, so
    every logit of the run comes from one table whatever ran before it."""
    for module in trainer.modules():
        if type(module).__name__ == "ParallelTransformerBlock":
            module.get_rotary_embedding(length, next(module.parameters()).device)


def checkpoints(run: rundir.RunDir) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not run.checkpoints.is_dir():
        return []
    found = [p for p in run.checkpoints.iterdir() if NAME.fullmatch(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: p.name)


def latest(run: rundir.RunDir) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = checkpoints(run)
    return found[-1] if found else None


def save(trainer, run: rundir.RunDir, round_: int, state: dict[str, Any]) -> Path:
    """Write the checkpoint of ``round_`` on every process (each saves its own RNG state; the main
    process the models), then, on the main process, ``run_state.json`` (``state`` plus the round
    and the rotary lengths) and the rename into place; older checkpoints beyond KEEP are removed.
    The library's messages (safetensors' "Removed shared tensor ... while saving": the tied
    embedding, restored on load) are captured. Raises OSError (a full disk) after removing the
    partial folder: the previous checkpoint stays the latest."""
    accelerate = trainer.accelerate
    final = run.checkpoints / f"round-{round_:06d}"
    partial = run.checkpoints / f".round-{round_:06d}.partial"
    if accelerate.is_main_process:
        run.checkpoints.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
    accelerate.wait_for_everyone()
    try:
        with streams.capture_library_output(), tied_embedding_note_silenced():
            accelerate.save_state(str(partial))
        accelerate.wait_for_everyone()
        if accelerate.is_main_process:
            full = {**state, "round": round_, "rotary": rotary_lengths(trainer)}
            rundir.write_atomic(partial / STATE_FILE, json.dumps(full, indent=1, default=str))
            shutil.rmtree(final, ignore_errors=True)
            partial.rename(final)
            for old in checkpoints(run)[:-KEEP]:
                shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        if accelerate.is_main_process:
            shutil.rmtree(partial, ignore_errors=True)
        raise
    accelerate.wait_for_everyone()
    return final


class _DropTiedNote(logging.Filter):
    """Drops Accelerate's "Removed shared tensor {...to_logits.weight} while saving" warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Removed shared tensor" not in record.getMessage()


@contextlib.contextmanager
def tied_embedding_note_silenced() -> Iterator[None]:
    """While saving: Accelerate logs "Removed shared tensor {'actor_palm.to_logits.weight'} while
    saving" (accelerate/utils/other.py ``save``) because every PaLM ties ``to_logits.weight`` to
    ``token_emb.weight`` (palm.py) and safetensors stores a shared tensor once. It is harmless:
    loading restores the tie (tests/test_run_kit.py checks ``to_logits.weight is token_emb.weight``
    and the value); training-run.md#checkpoints says so."""
    logger = logging.getLogger("accelerate.utils.other")
    note = _DropTiedNote()
    logger.addFilter(note)
    try:
        yield
    finally:
        logger.removeFilter(note)


def read_state(checkpoint: Path) -> dict[str, Any]:
    """``run_state.json`` of a checkpoint. Raises SkillError(2) when it cannot be read."""
    try:
        return json.loads((checkpoint / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise exits.SkillError(f"{checkpoint / STATE_FILE}: unreadable ({exits.one_line(err)}): the checkpoint is "
                               "damaged; remove that folder to resume from the one before it") from None


def load(trainer, checkpoint: Path) -> dict[str, Any]:
    """Restore ``checkpoint`` into an identically built trainer (``accelerate.load_state``: models,
    optimizers, RNG states), rebuild the rotary tables, and return its run state."""
    state = read_state(checkpoint)
    with streams.capture_library_output():
        trainer.accelerate.load_state(str(checkpoint))
    prime_rotary(trainer, state.get("rotary", {}))
    return state

