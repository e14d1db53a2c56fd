"""Checkpoints through ``accelerate.save_state`` and an exact resume.

A checkpoint is ``DIR/checkpoints/round-NNNNNN/``: what ``trainer.accelerate.save_state`` writes
(every model and optimizer the trainer prepared: the policy with its LoRA, PPO's critic and value
head, FlowRL's partition function, the reward model; the optimizers' state; the RNG states of
``random``, numpy and torch, per process) plus ``run_state.json`` (the round, the resolved config,
the rotary cache lengths, the run's counters). It is written into a temporary folder next to it
and renamed into place once complete, so a kill during a checkpoint leaves the previous one valid;
``run_state.json`` is written last, and a folder without it is not a checkpoint. Old checkpoints
are renamed out of the way (``.round-NNNNNN.removing``) before they are deleted, so a kill while
pruning leaves no half checkpoint under a checkpoint's name; ``remove_leftovers`` clears what a
kill left (partial, removing, or a round folder without run_state.json) at the next start.

A checkpoint vouches for itself: run_state.json records the run's id, the size and SHA-256 of
every file Accelerate wrote (``files``), and the metrics rows since the checkpoint before it
(``rows``, with the SHA-256 of the rows up to that one). ``load`` refuses (one line, exit 2) a
checkpoint of another run, a damaged or replaced weight or optimizer file, and, unless the resume
allows it, one whose random states are damaged, another run's, or not restored (Accelerate only
logs "Could not load random states" and goes on): a resume that cannot be exact is never called
exact.

Exact resume: the library's ``train()`` draws prompts with ``random.randrange`` and samples with
torch's generator, both restored by ``load_state``. One more state lives outside every state dict:
each PaLM block's rotary/xpos table (palm_rlhf_pytorch/palm.py ``get_rotary_embedding``, a
non-persistent buffer grown to the longest sequence the block has seen), and logits computed with
a longer table differ by about 1e-7; ``load`` rebuilds each table at the length it had, so the
resumed run computes bitwise what the uninterrupted one does (tests/test_run_kit.py).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterator

from policy_optimization.run import rundir
from skill_runtime import exits, streams

STATE_FILE = "run_state.json"
NAME = re.compile(r"round-(\d{6})")
LEFTOVER = re.compile(r"\.round-\d{6}\.(partial|removing)")  # a checkpoint being written, or being pruned
RNG_FILE = re.compile(r"random_states_\d+\.pkl")  # Accelerate's RNG states, one file per process
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
    """Complete checkpoints (a folder, not a link, holding run_state.json), oldest first."""
    if not run.checkpoints.is_dir() or run.checkpoints.is_symlink():
        return []
    found = [p for p in run.checkpoints.iterdir() if NAME.fullmatch(p.name) and not p.is_symlink()
             and (p / STATE_FILE).is_file() and not (p / STATE_FILE).is_symlink()]
    return sorted(found, key=lambda p: p.name)


def latest(run: rundir.RunDir) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = checkpoints(run)
    return found[-1] if found else None


def round_of(checkpoint: Path) -> int:
    """The round of a checkpoint folder, from its name."""
    return int(NAME.fullmatch(checkpoint.name).group(1))


def remove(folder: Path) -> None:
    """Remove a checkpoint folder without leaving a half one under a checkpoint's name: renamed to
    ``.round-NNNNNN.removing`` first (atomic), then deleted (a link: the link alone)."""
    if folder.is_symlink():
        folder.unlink()
        return
    doomed = folder.with_name(f".{folder.name}.removing")
    shutil.rmtree(doomed, ignore_errors=True)
    folder.rename(doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_leftovers(run: rundir.RunDir) -> list[str]:
    """What a killed checkpoint or prune left in ``DIR/checkpoints/`` (the writer's, under the
    lock, before anything is read): ``.round-N.partial`` and ``.round-N.removing`` folders, and
    ``round-N`` folders without run_state.json (a prune killed before its rename, by an older
    version). Returns the names removed; a link is unlinked, never followed."""
    if not run.checkpoints.is_dir() or run.checkpoints.is_symlink():
        return []
    gone = []
    for entry in sorted(run.checkpoints.iterdir()):
        if LEFTOVER.fullmatch(entry.name) or (NAME.fullmatch(entry.name) and entry not in checkpoints(run)):
            if entry.is_symlink() or not entry.is_dir():
                entry.unlink()
            else:
                shutil.rmtree(entry, ignore_errors=True)
            gone.append(entry.name)
    return gone


def sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {bytes, sha256}}`` of every file under ``folder`` but run_state.json."""
    return {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != STATE_FILE}


def rows_digest(rows: list[dict[str, Any]]) -> str:
    """SHA-256 of metrics rows, each written with sorted keys and without its null values and
    empty lists (so a row that an older version wrote without a key it did not know, read back
    with that key null, has the same digest)."""
    digest = hashlib.sha256()
    for row in rows:
        kept = {k: v for k, v in row.items() if v is not None and v != []}
        digest.update(json.dumps(kept, sort_keys=True, allow_nan=True).encode() + b"\n")
    return digest.hexdigest()


def save(trainer, run: rundir.RunDir, round_: int, state: dict[str, Any]) -> Path:
    """Write the checkpoint of ``round_`` on every process (each saves its own RNG state; the main
    process the models), then, on the main process, ``run_state.json`` (``state`` plus the round,
    the rotary lengths and the manifest of the files, ``manifest``) and the rename into place;
    older checkpoints beyond KEEP are removed (``remove``). ``state`` holds the run's ``run_id``,
    ``trainer`` and ``rows`` (this checkpoint's rows, ``rows_digest`` of those before).
    The library's messages (safetensors' "Removed shared tensor ... while saving": the tied
    embedding, restored on load) are captured. Raises what the writers raise (OSError; safetensors'
    SafetensorError or torch's RuntimeError on a full disk) after removing the partial folder:
    the previous checkpoint stays the latest."""
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
            full = {**state, "round": round_, "rotary": rotary_lengths(trainer), "files": manifest(partial)}
            rundir.write_atomic(partial / STATE_FILE, json.dumps(full, indent=1, default=str, allow_nan=True))
            if final.exists() or final.is_symlink():
                remove(final)
            partial.rename(final)
            for old in checkpoints(run)[:-KEEP]:
                remove(old)
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
    and the value); run-directory.md#files says so."""
    logger = logging.getLogger("accelerate.utils.other")
    note = _DropTiedNote()
    logger.addFilter(note)
    try:
        yield
    finally:
        logger.removeFilter(note)


def read_state(checkpoint: Path) -> dict[str, Any]:
    """``run_state.json`` of a checkpoint (read without following a link), checked: an object whose
    ``round`` is the folder's and whose ``rotary`` lengths are positive integers. Raises
    SkillError(2) naming it otherwise (damaged or edited)."""
    where = checkpoint / STATE_FILE
    state = rundir.read_json(where)
    wrong = None
    if not isinstance(state, dict):
        wrong = f"a JSON {type(state).__name__}, not an object"
    elif state.get("round") != round_of(checkpoint) or type(state.get("round")) is not int:
        wrong = f"round {state.get('round')!r:.20} in the folder of round {round_of(checkpoint)}"
    elif not isinstance(state.get("rotary", {}), dict) or not all(
            isinstance(k, str) and type(v) is int and v > 0 for k, v in state.get("rotary", {}).items()):
        wrong = "its rotary lengths are not positive integers"
    elif not isinstance(state.get("files", {}), dict) or not isinstance(state.get("rows", []), list):
        wrong = "its files or rows are not an object and a list"
    if wrong:
        raise exits.SkillError(f"{where}: not a checkpoint's run state ({wrong}): damaged or edited; "
                               f"{previous_hint(checkpoint)}")
    return state


def previous_hint(checkpoint: Path) -> str:
    """The fix for a checkpoint that cannot be used: remove it, resuming from the one before it."""
    older = [c for c in checkpoints(rundir.RunDir(checkpoint.parents[1])) if c.name < checkpoint.name]
    return (f"remove {checkpoint} to resume from {older[-1].name}" if older else
            f"remove {checkpoint} to resume from the start, or start over with --force")


def problems(checkpoint: Path, state: dict[str, Any], run_id: str | None, trainer: str) -> tuple[list[str], list[str]]:
    """Why ``checkpoint`` cannot be resumed from (``damaged``: another run's, or a weight or
    optimizer file missing, replaced or damaged) and why it cannot be resumed exactly
    (``inexact``: a random-states file missing, damaged or another run's), each a list of phrases.
    Every file of its manifest is compared by size and SHA-256 (a checkpoint of an older version
    has no manifest: only what ``rng_problems`` finds after loading). ``run_id`` and ``trainer``:
    this run's (None: a run of an older version, whose checkpoints carry no id)."""
    damaged, inexact = [], []
    theirs = state.get("run_id")
    if run_id and theirs != run_id:
        damaged.append(f"it belongs to another run (run id {theirs!r:.40}, this run's {run_id})")
    if state.get("trainer") not in (None, trainer):
        damaged.append(f"it holds a {state.get('trainer')!r:.20} trainer, this run trains {trainer}")
    for name, want in (state.get("files") or {}).items():
        path = checkpoint / name
        if not isinstance(want, dict) or Path(name).is_absolute() or ".." in Path(name).parts:
            damaged.append(f"its manifest names {name!r:.60}, not a file of the checkpoint")
            continue
        if path.is_symlink() or not path.is_file():
            why = f"{name} is missing" if not os.path.lexists(path) else f"{name} is not a plain file"
        elif path.stat().st_size != want.get("bytes"):
            why = f"{name} holds {path.stat().st_size:,} bytes, not the {want.get('bytes')!r:.20} written (truncated?)"
        elif sha256(path) != want.get("sha256"):
            why = f"{name} is not the file written there (damaged, or another run's)"
        else:
            continue
        (inexact if RNG_FILE.fullmatch(name) else damaged).append(why)
    return damaged, inexact


def rng_problem(checkpoint: Path, process: int) -> str | None:
    """After ``load_state``: whether this process's random states really are the ones of its file
    (Accelerate catches any failure to restore them, logs "Could not load random states" and goes
    on, accelerate/checkpointing.py ``load_accelerator_state``). Reads the file as Accelerate does
    (``accelerate.utils.load``, weights only) and compares Python's and torch's CPU state, and the
    CUDA states where CUDA is in use (Accelerate sets numpy's between Python's and torch's, so a
    restored torch state means numpy's was restored too). Returns the phrase of what is wrong, or None."""
    import random

    import torch
    from accelerate.utils import load as accelerate_load
    name = f"random_states_{process}.pkl"
    try:
        states = accelerate_load(checkpoint / name)
        same = (random.getstate() == states["random_state"]
                and torch.equal(torch.get_rng_state(), states["torch_manual_seed"]))
        if same and torch.cuda.is_available() and torch.cuda.is_initialized():
            saved = states.get("torch_cuda_manual_seed")
            same = saved is not None and len(saved) == torch.cuda.device_count() and all(
                torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), saved))
    except Exception as exc:  # noqa: BLE001 - missing, damaged, or of another shape: not restored
        return f"{name} could not be read ({exits.one_line(exc)})"
    return None if same else f"{name} was not restored (Accelerate skipped it)"


def load(trainer, checkpoint: Path, run_id: str | None, name: str, rotary_cap: int,
         allow_inexact: bool = False) -> tuple[dict[str, Any], str | None]:
    """Restore ``checkpoint`` into an identically built trainer (``accelerate.load_state``:
    models, optimizers, RNG states), rebuild the rotary tables, and return (its run state, a note
    when the resume is not exact: ``allow_inexact`` let it go on without its random states).
    Every process decides alike (the main process's checks, then each one's ``rng_problem``,
    gathered). Raises SkillError(2), the checkpoint unchanged: another run's, damaged
    (``problems``), a rotary length above ``rotary_cap`` (the run's longest sequence), a load that
    fails, or random states not restored without ``allow_inexact``."""
    accelerate = trainer.accelerate
    state = read_state(checkpoint)
    bad = [length for length in state.get("rotary", {}).values() if length > rotary_cap]
    damaged, inexact = problems(checkpoint, state, run_id, name) if accelerate.is_main_process else ([], [])
    if bad:
        damaged.append(f"a rotary length {bad[0]:,} above this run's longest sequence ({rotary_cap:,})")
    damaged, inexact = everyone(accelerate, (damaged, inexact), main_only=True)
    where = f"checkpoint {checkpoint}"
    if damaged:
        raise exits.SkillError(f"{where}: {damaged[0]}: it cannot be resumed; {previous_hint(checkpoint)}")
    if inexact and not allow_inexact:
        raise exits.SkillError(inexact_refusal(where, inexact[0], checkpoint))
    try:
        with streams.capture_library_output():
            accelerate.load_state(str(checkpoint))
    except Exception as exc:  # noqa: BLE001 - a damaged file of a checkpoint without a manifest (older versions)
        raise exits.SkillError(f"{where}: cannot be loaded ({exits.one_line(exc)}): damaged; "
                               f"{previous_hint(checkpoint)}") from None
    restored = everyone(accelerate, rng_problem(checkpoint, accelerate.process_index))
    inexact = inexact or [r for r in restored if r]
    if inexact and not allow_inexact:
        raise exits.SkillError(inexact_refusal(where, inexact[0], checkpoint))
    prime_rotary(trainer, state.get("rotary", {}))
    note = None if not inexact else (f"resumed from {checkpoint.name} without its random states ({inexact[0]}; "
                                     "--allow-inexact-resume): the rounds from here differ from an uninterrupted run")
    return state, note


def inexact_refusal(where: str, why: str, checkpoint: Path) -> str:
    """The one line of a resume that would not be exact."""
    return (f"{where}: {why}: the resumed run would not be the uninterrupted one (its sampling and prompt "
            f"draws differ): --allow-inexact-resume resumes anyway, not bitwise; or {previous_hint(checkpoint)}")


def everyone(accelerate, value: Any, main_only: bool = False) -> Any:
    """``value`` of every process (a list, rank order), or with ``main_only`` the main process's, on
    every process; in one process: ``[value]``, or ``value``."""
    if accelerate.num_processes == 1:
        return value if main_only else [value]
    from accelerate.utils import broadcast_object_list, gather_object
    return broadcast_object_list([value])[0] if main_only else gather_object([value])
