"""The exclusive lock of the one process that writes a run directory (``DIR/train.lock``) and
who holds it; ``watch`` asks whether a run is alive through it. Torch-free."""
from __future__ import annotations

import errno
import os
import socket
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

from run_kit.rundir import LOCK, NO_FOLLOW, not_plain, read_file, unlink_quietly
from skill_runtime import exits

if TYPE_CHECKING:
    from run_kit.rundir import RunDir

try:
    import fcntl  # POSIX; Windows has none: no lock there (RunLock)
except ImportError:  # pragma: no cover - exercised by monkeypatching fcntl to None
    fcntl = None


class RunLock:
    """The exclusive lock of the one process that writes a run directory: ``fcntl.flock(LOCK_EX |
    LOCK_NB)`` on ``DIR/train.lock``, which holds the holder's pid, host and start time. The OS
    drops the lock when the process ends, however it ends (a crash, SIGKILL): never a stale lock,
    at most a stale file, which the next holder locks and rewrites. The file is opened inside DIR
    without following a symbolic link, and written only once it is locked and found to be a plain
    file with no other name (a link to a file of yours, symbolic or hard, is refused untouched).
    ``release`` removes the file, then unlocks. Where Python has no ``fcntl`` (Windows) ``acquire``
    returns None: no lock, and nothing refuses a second ``train`` on the same directory there."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd, self.pid = path, fd, os.getpid()

    @classmethod
    def acquire(cls, run: "RunDir", flag: str) -> "RunLock | None":
        """Lock ``run`` for this process (None without fcntl). Raises SkillError(2) when another
        process holds it, naming ``flag`` (``--resume DIR``), the directory and the holder; when the
        lock file cannot be created; or when ``train.lock`` is a link or not a plain file."""
        if fcntl is None:
            return None
        path = run.path / LOCK
        for _ in range(5):  # a holder that released (removed the file) between our open and our lock: again
            try:
                folder = os.open(run.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | NO_FOLLOW)
                try:
                    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | NO_FOLLOW | getattr(os, "O_NONBLOCK", 0), 0o666,
                                 dir_fd=folder)
                finally:
                    os.close(folder)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise exits.SkillError(f"{flag}: its lock {path}: {not_plain(path, err)}") from None
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
            held = os.fstat(fd)
            try:
                same = os.path.samestat(held, os.stat(path, follow_symlinks=False))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            if not stat.S_ISREG(held.st_mode) or held.st_nlink != 1:
                os.close(fd)
                kind = "not a plain file" if not stat.S_ISREG(held.st_mode) else \
                    f"a file with {held.st_nlink} names (a hard link to a file elsewhere?)"
                raise exits.SkillError(f"{flag}: its lock {path} is {kind}: train creates its own; remove it")
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}\n".encode())
            return cls(path, fd)
        raise exits.SkillError(f"{flag}: could not lock {path}: another process keeps replacing it")

    @staticmethod
    def probe(run: "RunDir", flag: str) -> None:
        """Raise as ``acquire`` would when another process holds ``run``'s lock; creates nothing,
        keeps nothing (``train --nproc``'s launcher, before it starts the ranks)."""
        if fcntl is None or not os.path.lexists(run.path / LOCK):
            return
        RunLock.acquire(run, flag).release()

    @staticmethod
    def held(run: "RunDir") -> bool | None:
        """Whether a process holds ``run``'s lock right now (``watch``: is the run alive?), asked
        without taking it for more than an instant (a shared lock, tried and dropped) and without
        creating or writing anything; None where Python has no fcntl (unknown). A ``train.lock``
        that is missing, a link or not a plain file is held by no train."""
        if fcntl is None:
            return None
        try:
            fd = os.open(run.path / LOCK, os.O_RDONLY | NO_FOLLOW | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            return False
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as err:
                return True if err.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK) else None
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

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
    """Who holds the lock at ``path``, as its holder wrote it (``pid N on HOST, since ...``; at most
    200 characters of it, read without following a link)."""
    try:
        text = (read_file(path, 4096) or b"").decode("utf-8", errors="replace").strip()[:200]
    except exits.SkillError:
        text = ""
    return f"{text}; lock {path}" if text else f"a process that has just started; lock {path}"
