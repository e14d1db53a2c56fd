"""The run directory: its files, and writing them so that a crash or a kill never leaves a half file.

``DIR/metrics.jsonl``  one JSON object per round (metrics.ROW_KEYS), appended and flushed per round
``DIR/checkpoints/``   ``round-NNNNNN/`` folders (checkpoint.py), each complete or absent
``DIR/trackers/``      the trackers' own files (tensorboard events, wandb offline runs, ...)
``DIR/policy.pt``      a policy run's trained policy, a standalone PaLM state dict (policy_optimization/run/export.py)
``DIR/rm.pt``          a reward-model run's trained reward model, a state dict (reward_modeling/artifacts.py)
``DIR/rm_config.json`` ... and what builds it: ``RewardModel(PaLM(**c["palm"]), **c["reward_model"])``
``DIR/summary.json``   the run's summary, written at its end
``DIR/train.lock``     while a ``train`` or ``train-reward`` process writes the run: its exclusive lock (``RunLock``)
Torch-free.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from skill_runtime import exits

try:
    import fcntl  # POSIX; Windows has none: no lock there (RunLock)
except ImportError:  # pragma: no cover - exercised by monkeypatching fcntl to None
    fcntl = None

METRICS, CHECKPOINTS, TRACKERS, POLICY, SUMMARY = "metrics.jsonl", "checkpoints", "trackers", "policy.pt", "summary.json"
RM, RM_CONFIG = "rm.pt", "rm_config.json"
RUN_FILES = (METRICS, CHECKPOINTS, TRACKERS, POLICY, RM, RM_CONFIG, SUMMARY)  # what --force removes, nothing else
LOCK = "train.lock"


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
        except FileNotFoundError:  # already removed (``discard``): on to its parent
            pass
        except OSError:  # not empty
            return
        if path == created:
            return
        path = path.parent


class RunLock:
    """The exclusive lock of the one process that writes a run directory: ``fcntl.flock(LOCK_EX |
    LOCK_NB)`` on ``DIR/train.lock``, which holds the holder's pid, host and start time. The OS
    drops the lock when the process ends, however it ends (a crash, SIGKILL): never a stale lock,
    at most a stale file, which the next holder locks and rewrites. ``release`` removes the file,
    then unlocks. Where Python has no ``fcntl`` (Windows) ``acquire`` returns None: no lock, and
    nothing refuses a second ``train`` on the same directory there."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd, self.pid = path, fd, os.getpid()

    @classmethod
    def acquire(cls, run: "RunDir", flag: str) -> "RunLock | None":
        """Lock ``run`` for this process (None without fcntl). Raises SkillError(2) when another
        process holds it, naming ``flag`` (``--resume DIR``), the directory and the holder, or
        when the lock file cannot be created."""
        if fcntl is None:
            return None
        path = run.path / LOCK
        for _ in range(5):  # a holder that released (removed the file) between our open and our lock: again
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as err:
                raise exits.SkillError(f"{flag}: cannot create its lock {path} ({exits.one_line(err)})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                os.close(fd)
                if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):  # ENOLCK: a file system without locks
                    raise exits.SkillError(f"{flag}: cannot lock {path} ({exits.one_line(err)}): put the run on a "
                                           "local disk") from None
                raise exits.SkillError(f"{flag}: another train is running in {run.path} ({holder(path)}): wait for it "
                                       "to end or stop it, then resume; watch reads it meanwhile") from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since "
                             f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}\n".encode())
                return cls(path, fd)
            os.close(fd)
        raise exits.SkillError(f"{flag}: could not lock {path}: another process keeps replacing it")

    @staticmethod
    def probe(run: "RunDir", flag: str) -> None:
        """Raise as ``acquire`` would when another process holds ``run``'s lock; creates nothing,
        keeps nothing (``train --nproc``'s launcher, before it starts the ranks)."""
        path = run.path / LOCK
        if fcntl is None or not path.is_file():
            return
        RunLock.acquire(run, flag).release()

    def release(self) -> None:
        """Remove the lock file and unlock (this process only: a forked child keeps its hands off)."""
        if self.fd is None or os.getpid() != self.pid:
            return
        unlink_quietly(self.path)
        os.close(self.fd)
        self.fd = None

    def __del__(self) -> None:  # the Run dropped without finish(): unlock now, not at exit
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the OS unlocks at exit anyway
            pass


def holder(path: Path) -> str:
    """Who holds the lock at ``path``, as its holder wrote it (``pid N on HOST, since ...``)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        text = ""
    return f"{text}; lock {path}" if text else f"a process that has just started; lock {path}"


def prepare(path: str | Path, resume: bool, force: bool, writer: bool = True) -> tuple[RunDir, RunLock | None]:
    """The run directory for a new run (created if missing), or for ``--resume``, and its lock.

    ``writer``: this process writes the run directory (a single process, or rank 0 of a world):
    it takes the lock (``RunLock``, held until ``release``) before it changes anything, and does
    ``force``'s removal; any other rank does neither (the lock is None).
    Raises SkillError(2): the path is a file or cannot be created or written; another process
    holds its lock; it holds another run's files and neither ``resume`` nor ``force`` is given;
    ``resume`` finds no run there. ``force`` removes the files of ``RUN_FILES`` it finds (never
    anything else) and starts over."""
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
    if force and not resume and writer:
        for name in found:
            target = run.path / name
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)


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


@contextlib.contextmanager
def claimed(path: str | Path, resume: bool, force: bool, writer: bool, say: Callable[[str], None]) -> Iterator[Claim]:
    """``prepare`` the run directory at ``path`` (``writer``: this process writes it and takes its
    lock) and yield the ``Claim``; anything raised inside the block (a config refused before a model
    exists) leaves nothing of a directory this invocation created, and releases the lock. Without
    fcntl the writer says so through ``say``. Raises as ``prepare`` does."""
    created, run, lock = first_missing(Path(path)), None, None
    try:
        run, lock = prepare(path, resume, force, writer)
        if writer and lock is None:
            say(f"no lock on {run.path}: this Python has no fcntl (Windows): run one train per directory")
        yield Claim(run, lock, created)
    except BaseException:
        remove_empty(Path(path), created) if run is None else discard(run, created, lock)
        raise


def file_digests(named: list[tuple[str, str]]) -> dict[str, str]:
    """SHA-256 of each file of ``named`` (``(section.key, path)``, the files a config names) that
    exists: a resume with an edited program or data file is a changed run."""
    return {key: hashlib.sha256(Path(path).read_bytes()).hexdigest() for key, path in named if Path(path).is_file()}


def changed_keys(stored: dict[str, Any], now: dict[str, Any], growable: frozenset[str] = frozenset()) -> list[str]:
    """``section.key`` of every value that differs between two loaded configs (``{"config":
    tables, "files": file_digests}``: the run's stored one and the one given on resume), and
    ``section.key (file contents)`` for a named file that changed under the same name; the keys of
    ``growable`` may change (a run can be extended)."""
    def flat(config: dict[str, Any]) -> dict[str, Any]:
        return {f"{s}.{k}": v for s, table in config["config"].items() for k, v in table.items()}
    before, after = flat(stored), flat(now)
    keys = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k) and k not in growable)
    keys += sorted(f"{k} (file contents)" for k in stored["files"].keys() & now["files"].keys()
                   if stored["files"][k] != now["files"][k] and k not in keys)
    return keys


def append_row(run: RunDir, row: dict[str, Any]) -> None:
    """Append one metrics row as a JSON line and flush it: a reader (``watch``) sees it as soon as
    the round ends, and a kill of the process afterwards cannot lose it (the checkpoints, not the
    rows, are fsynced: a machine that loses power may lose the rows after the last checkpoint,
    which a resume recomputes anyway). Raises SkillError(2) when the disk refuses it."""
    try:
        with open(run.metrics, "a", encoding="utf-8") as stream:
            stream.write(json.dumps(row, allow_nan=True) + "\n")
    except OSError as err:
        raise exits.SkillError(f"writing round {row['round']} to {run.metrics} failed ({exits.one_line(err)}): free "
                               "space there, then resume") from None


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


def write_torch_atomic(state: Any, path: Path) -> Path:
    """``torch.save(state, path)`` through a temporary file in the same folder and a rename (a
    policy.pt, an rm.pt): a reader never loads a half-written file. Returns ``path``."""
    import torch
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~current_umask())
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    return path


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
