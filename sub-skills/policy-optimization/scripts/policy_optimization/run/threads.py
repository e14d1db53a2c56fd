"""``train --cpu-threads auto`` (the default): on the CPU, time the first round at one torch thread
and at torch's default count, and keep the faster for the rest of the run.

Tiny and small models gain little from intra-op threads, and on a CPU shared with other work the
threads wait for each other: the issue that asked for this measured 39 s at torch's default
against 1.8 s at one thread for 5 updates on a busy 2-core machine. Which count wins depends on
the machine and its load at that moment, so it is measured, not guessed.

The trial: a checkpoint of the state before round 1 (``checkpoint.save`` into a temporary
folder), round 1 as a plain ``train()`` at one thread (its result discarded: the checkpoint is
loaded back, weights, optimizers and RNG states), then the real round 1 at the default count
(whose row is kept; it pays no warm-up, the trial did). The thread count changes how float sums
are split, so results can differ in the last bits between counts: the chosen count is recorded in
every checkpoint (``run_state.json``) and summary.json, and a resume uses it, so a resumed run is
still bitwise the uninterrupted one. Torch-free at import.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from policy_optimization.run import checkpoint, rundir
from skill_runtime import streams

AUTO = "auto"


def parse(text: str) -> str | int:
    """``--cpu-threads``: ``auto`` or a count of at least 1. Raises ValueError otherwise."""
    if text == AUTO:
        return AUTO
    count = int(text)
    if count < 1:
        raise ValueError(text)
    return count


def start(option: str | int | None, recorded: dict[str, Any] | None, cpu: bool, processes: int,
          fresh: bool = True) -> dict[str, Any]:
    """Set torch's thread count for a run and return its record: ``mode`` (``auto``, ``given``,
    ``resumed``, or ``default`` where auto does not apply: not the CPU, several processes, a
    default of one thread, or a resume of a run that recorded no count, ``fresh`` False: it
    trained at torch's default), ``chosen`` (the count the rounds after the first use),
    ``default`` (torch's), ``timed_s`` (the trial's seconds per count, filled by ``trial``) and
    ``trial`` (True while round 1 is still to be timed). ``recorded``: the record of the
    checkpoint a resume starts from, whose count it keeps unless ``option`` is a count."""
    import torch
    default = torch.get_num_threads()
    if isinstance(option, int):
        record = {"mode": "given", "chosen": option}
    elif recorded:
        record = {**recorded, "mode": "resumed", "trial": False}
    elif option == AUTO and cpu and processes == 1 and default > 1 and fresh:
        record = {"mode": AUTO, "chosen": default, "trial": True}
    else:
        record = {"mode": "default", "chosen": default}
    record = {"default": default, "timed_s": None, "trial": False, **record}
    torch.set_num_threads(record["chosen"])
    return record


def trial(run, real_round: Callable[[], dict[str, Any]], say: Callable[[str], None]) -> dict[str, Any]:
    """Round 1 of an ``auto`` run (``run``: a ``loop.Run`` whose ``threads`` record ``start``
    made): ``train()`` at one thread on a copy of the state, timed and discarded (a checkpoint
    saved before and loaded after it), then ``real_round()`` (the observed round, whose ``wall_s``
    times the library's ``train()`` alone) at the default count; the faster count is kept for the
    rest of the run (the record updated, torch set, one line said). Returns the real round's row."""
    import torch
    record = run.threads
    with tempfile.TemporaryDirectory(prefix="cpu-threads-") as tmp:
        saved = checkpoint.save(run.trainer, rundir.RunDir(Path(tmp)), 0, {"run_id": run.run_id, "trainer": run.name})
        torch.set_num_threads(1)
        t0 = time.perf_counter()
        with streams.capture_library_output():
            run.trainer.train(**run.train_kwargs())
        one = time.perf_counter() - t0
        checkpoint.load(run.trainer, saved, run.run_id, run.name, run.rotary_cap())
    torch.set_num_threads(record["default"])
    row = real_round()
    many = row["wall_s"]
    chosen = 1 if one < many else record["default"]
    record.update(chosen=chosen, trial=False, timed_s={"1": round(one, 4), str(record["default"]): many})
    torch.set_num_threads(chosen)
    say(f"cpu threads: round 1 took {one:.2f} s at 1 thread and {many:.2f} s at {record['default']} (torch's "
        f"default): the run keeps {chosen} (--cpu-threads N to choose)")
    return row
