"""The run directory: its files, and writing them so that a crash or a kill never leaves a half file.

``DIR/metrics.jsonl``  one JSON object per round (metrics.ROW_KEYS), appended and flushed per round
``DIR/checkpoints/``   ``round-NNNNNN/`` folders (checkpoint.py), each complete or absent
``DIR/trackers/``      the trackers' own files (tensorboard events, wandb offline runs, ...)
``DIR/policy.pt``      the trained policy, a standalone PaLM state dict (export.py)
``DIR/summary.json``   the run's summary, written at its end
Torch-free.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skill_runtime import exits

METRICS, CHECKPOINTS, TRACKERS, POLICY, SUMMARY = "metrics.jsonl", "checkpoints", "trackers", "policy.pt", "summary.json"
RUN_FILES = (METRICS, CHECKPOINTS, TRACKERS, POLICY, SUMMARY)  # what --force removes, nothing else


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def trackers(self) -> Path:
        return self.path / TRACKERS

    @property
    def policy(self) -> Path:
        return self.path / POLICY

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY

    def read_summary(self) -> dict[str, Any] | None:
        """The run's summary.json (written as the run ends: ``status`` finished, paused, stopped,
        interrupted or failed), or None while there is none yet (a running run) or it is unreadable."""
        try:
            summary = json.loads(self.summary.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return summary if isinstance(summary, dict) else None

    def holds_a_run(self) -> list[str]:
        """The run files already here (metrics.jsonl, checkpoints/, ...): another run's."""
        return [name for name in RUN_FILES if (self.path / name).exists()]


def first_missing(path: Path) -> Path | None:
    """The topmost directory of ``path`` (itself or an ancestor) that does not exist yet: what
    ``prepare`` creates; None when ``path`` exists."""
    path = path.expanduser().resolve()
    missing = None
    while not path.exists():
        missing, path = path, path.parent
    return missing


def remove_empty(path: Path, created: Path | None) -> None:
    """Remove ``path`` and its ancestors up to ``created`` (what ``first_missing`` found) while they
    are empty directories: a refused run leaves nothing behind."""
    if created is None:
        return
    path = path.expanduser().resolve()
    while True:
        try:
            path.rmdir()
        except OSError:  # not empty, or gone
            return
        if path == created:
            return
        path = path.parent


def prepare(path: str | Path, resume: bool, force: bool) -> RunDir:
    """The run directory for a new run (created if missing), or for ``--resume``.

    Raises SkillError(2): the path is a file or cannot be created or written; it holds another
    run's files and neither ``resume`` nor ``force`` is given; ``resume`` finds no run there.
    ``force`` removes the files of ``RUN_FILES`` it finds (never anything else) and starts over."""
    run = RunDir(Path(path).expanduser().resolve())
    if run.path.exists() and not run.path.is_dir():
        raise exits.SkillError(f"--run-dir {path}: is a file, not a directory: name a directory for the run")
    try:
        run.path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run.path, prefix=".write-test-"):
            pass
    except OSError as err:
        raise exits.SkillError(f"--run-dir {path}: cannot write there ({exits.one_line(err)}): choose a writable "
                               "directory") from None
    found = run.holds_a_run()
    if resume and not found:
        raise exits.SkillError(f"--resume {path}: no run to resume there (no {METRICS}, no {CHECKPOINTS}/): start one "
                               "with --config FILE --run-dir DIR")
    if found and not resume and not force:
        raise exits.SkillError(f"--run-dir {path}: holds another run ({', '.join(found)}): --resume continues it, "
                               "--force starts over (removes those files only), or choose another directory")
    if force and not resume:  # every rank of a world does this: another may have removed a file first
        for name in found:
            target = run.path / name
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
    return run


def append_row(run: RunDir, row: dict[str, Any]) -> None:
    """Append one metrics row as a JSON line and flush it: a reader (``watch``) sees it as soon as
    the round ends, and a kill of the process afterwards cannot lose it (the checkpoints, not the
    rows, are fsynced: a machine that loses power may lose the rows after the last checkpoint,
    which a resume recomputes anyway)."""
    with open(run.metrics, "a", encoding="utf-8") as stream:
        stream.write(json.dumps(row, allow_nan=True) + "\n")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics file, in order. A last line without its newline (the writer was
    killed mid-write) is left out; a corrupt line elsewhere raises SkillError(2) naming it."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    complete, partial = lines[:-1], lines[-1]
    rows = []
    for number, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise exits.SkillError(f"{path}: line {number} is not a metrics row ({err.msg}): the file was edited "
                                   "or damaged") from None
    del partial  # written without its newline: the round it belongs to never finished writing
    return rows


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename:
    readers see the old file or the new one, never a half-written one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes it 0600; a run's files are plain files
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise


def current_umask() -> int:
    """The process's umask (read by setting and restoring it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def unlink_quietly(path: str | Path) -> None:
    """Remove ``path`` if it is there (a temporary file left by a failed write)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def keep_rows_through(run: RunDir, last_round: int) -> list[dict[str, Any]]:
    """Rewrite metrics.jsonl with only the rows of rounds 0..``last_round`` (atomically) and return
    them: on resume, rows written after the last checkpoint are replaced by the rerun, not doubled."""
    rows = [row for row in read_rows(run.metrics) if row["round"] <= last_round]
    write_atomic(run.metrics, "".join(json.dumps(row, allow_nan=True) + "\n" for row in rows))
    return rows
