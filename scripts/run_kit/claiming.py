"""Claiming a run directory for one invocation of a run command: created if missing, locked by the
process that writes it (``lock.RunLock``), its files checked (another run's, links, a resume with
nothing to resume), what a killed run left removed (``checkpoint.remove_leftovers``,
``remove_temporaries``), and on a refused start nothing left of what this invocation created.

Above ``rundir`` (the files), ``lock`` and ``checkpoint``, which read the files through ``rundir``:
so none of them imports this module. Torch-free.
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from run_kit import checkpoint
from run_kit.lock import RunLock
from run_kit.rundir import CHECKPOINTS, CONFIG, METRICS, OLD_CONFIG, POLICY, SUMMARY, RunDir, unlink_quietly
from skill_runtime import exits


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
        except FileNotFoundError:  # already removed (``discard``): on to its parent
            pass
        except OSError:  # not empty
            return
        if path == created:
            return
        path = path.parent


def prepare(path: str | Path, resume: bool, force: bool, writer: bool = True) -> tuple[RunDir, RunLock | None]:
    """The run directory for a new run (created if missing), or for ``--resume``, and its lock.

    ``writer``: this process writes the run directory (a single process, or rank 0 of a world):
    it takes the lock (``RunLock``, held until ``release``) before it changes anything, and does
    ``force``'s removal; any other rank does neither (the lock is None).
    Raises SkillError(2): the path is a file or cannot be created or written; another process
    holds its lock; it holds another run's files and neither ``resume`` nor ``force`` is given;
    ``resume`` finds no run there; a run file is a symbolic link (``force`` removes the link).
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
    lock = RunLock.acquire(run, f"{'--resume' if resume else '--run-dir'} {path}") if writer else None
    try:
        check_run_files(run, path, resume, force, writer)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return run, lock


def check_run_files(run: RunDir, path: str | Path, resume: bool, force: bool, writer: bool) -> None:
    """``prepare``'s checks of the files found, and ``force``'s removal (the writer's)."""
    found = run.holds_a_run()
    if resume and not found:
        raise exits.SkillError(f"--resume {path}: no run to resume there (no {METRICS}, no {CHECKPOINTS}/): start one "
                               "with --config FILE --run-dir DIR")
    if found and not resume and not force:
        raise exits.SkillError(f"--run-dir {path}: holds another run ({', '.join(found)}): --resume continues it, "
                               "--force starts over (removes those files only), or choose another directory")
    linked = run.links()
    if linked and not (force and not resume):
        raise exits.SkillError(f"{'--resume' if resume else '--run-dir'} {path}: {', '.join(linked)}: a symbolic "
                               f"link, never a file train writes (a copied or received directory?): remove it"
                               + ("" if resume else ", or --force"))
    if force and not resume and writer:
        for name in found:
            target = run.path / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
            else:  # a file, or a link (removed, never what it points to)
                target.unlink(missing_ok=True)
        if run.config.is_symlink():
            run.config.unlink()


def remove_temporaries(run: RunDir) -> list[str]:
    """Remove what a killed writer left in ``run`` (the writer's, under the lock): the temporary
    files of ``write_atomic`` and ``export`` (``.NAME.XXXX`` of a run file), ``prepare``'s write
    test; never a folder, never another file. Returns the names removed."""
    prefixes = tuple(f".{name}." for name in (METRICS, SUMMARY, POLICY, CONFIG, OLD_CONFIG)) + (".write-test-",)
    gone = []
    for entry in run.path.iterdir():
        if entry.name.startswith(prefixes) and (entry.is_symlink() or not entry.is_dir()):
            unlink_quietly(entry)
            gone.append(entry.name)
    return sorted(gone)


def discard(run: RunDir, created: Path | None, lock: RunLock | None) -> None:
    """A refused start (before the first round): release ``lock``, and when this invocation created
    the directory (``created``, what ``first_missing`` found) leave nothing of it: the writer
    (``lock`` held) removes the run directory with the files it wrote there unless it holds a
    checkpoint, then every process removes the directories of ``created`` left empty. A
    directory that existed before is never removed; nor a run with a checkpoint."""
    if created is not None and lock is not None and run.path.is_dir() and not any(run.checkpoints.glob("round-*")):
        shutil.rmtree(run.path, ignore_errors=True)  # under the lock: ours alone since we created it
    if lock is not None:
        lock.release()
    remove_empty(run.path, created)


@dataclass
class Claim:
    """A run directory this process may write: the directory, its lock (None on a rank that does
    not write, or without fcntl) and the topmost directory this invocation created (``first_missing``)."""
    run: RunDir
    lock: RunLock | None
    created: Path | None

    def refused(self) -> None:
        """The start is refused: unlock, and remove what this invocation created (``discard``)."""
        discard(self.run, self.created, self.lock)

    def release(self) -> None:
        """Unlock the run directory (a resume that has nothing to do)."""
        if self.lock is not None:
            self.lock.release()


@contextlib.contextmanager
def claimed(path: str | Path, resume: bool, force: bool, writer: bool, say: Callable[[str], None]) -> Iterator[Claim]:
    """``prepare`` the run directory at ``path`` (``writer``: this process writes it and takes its
    lock; it then removes what a killed run left there: ``checkpoint.remove_leftovers``,
    ``remove_temporaries``) and yield the ``Claim``; anything raised inside the block (a config
    refused before a model exists) leaves nothing of a directory this invocation created, and
    releases the lock. Without fcntl the writer says so through ``say``. Raises as ``prepare`` does."""
    created, run, lock = first_missing(Path(path)), None, None
    try:
        run, lock = prepare(path, resume, force, writer)
        if writer and lock is None:
            say(f"no lock on {run.path}: this Python has no fcntl (Windows): run one train per directory")
        if writer:
            gone = checkpoint.remove_leftovers(run) + remove_temporaries(run)
            if gone:
                say(f"removed what an interrupted run left in {run.path}: {', '.join(gone)}")
        yield Claim(run, lock, created)
    except BaseException:  # refused before a model exists: leave no directory of ours behind
        remove_empty(Path(path), created) if run is None else discard(run, created, lock)
        raise
