"""The helpers' working directories: a private temporary one for the library's relative paths,
and a watch on the caller's directory that proves a run left nothing there."""
from __future__ import annotations

import atexit
import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def private_workdir(prefix: str = "palm-rlhf-skill-") -> Iterator[Path]:
    """chdir into a fresh temporary directory and remove it afterwards, whatever happens.

    The library writes relative paths (TPO's ``./tpo_memmap_replay_buffer``, ``./checkpoint.pt``);
    this keeps them out of the caller's working directory.
    """
    caller = os.getcwd()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(caller)


# The audit events (PEP 578) through which Python code creates, writes, renames or removes a path.
WRITE_EVENTS = {"open", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.symlink", "os.link",
                "shutil.rmtree"}


WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


WATCH_ENV = "PALM_RLHF_SKILL_WATCH"  # "<watched dir>\n<log file>": child processes log into it


_hook_busy = False


def _watches() -> list["DirectoryWatch"]:
    """The process's active watches. Kept on ``sys`` with the one audit hook (hooks cannot be
    removed), so every copy of this file loaded in the process shares them."""
    watches = getattr(sys, "_palm_rlhf_skill_watches", None)
    if watches is None:
        watches = sys._palm_rlhf_skill_watches = []
        sys.addaudithook(_audit)
    return watches


def _written_paths(event: str, args: tuple) -> list[Any]:
    """Paths an audit event creates, writes, renames or removes (an empty list for reads and for
    paths relative to a directory descriptor, which the enclosing call's own event covers)."""
    def plain(fd: Any) -> bool:  # no dir_fd: the events report None or -1
        return fd is None or fd < 0

    if event == "open":
        path, mode, flags = args
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & WRITE_FLAGS)
        return [path] if writes else []
    if event in ("os.rename", "os.link"):
        return [a for a, fd in ((args[0], args[2]), (args[1], args[3])) if plain(fd)]
    if event == "os.symlink":
        return [args[1]] if plain(args[2]) else []
    return [args[0]] if plain(args[-1]) else []  # mkdir, remove, rmdir, rmtree: (path, ..., dir_fd)


def _audit(event: str, args: tuple) -> None:
    """The audit hook: record the top-level names below each watched directory that this process
    touches. Never raises (an exception here would fail the audited call)."""
    global _hook_busy
    watches = getattr(sys, "_palm_rlhf_skill_watches", None)
    if event not in WRITE_EVENTS or not watches or _hook_busy:
        return
    _hook_busy = True
    try:
        for path in _written_paths(event, args):
            if isinstance(path, int):
                continue
            full = os.path.abspath(os.fsdecode(os.fspath(path)))
            for watch in watches:
                watch.record(full)
    except Exception:  # noqa: BLE001 - a path we cannot read is not ours to judge
        pass
    finally:
        _hook_busy = False


class DirectoryWatch:
    """What this process, and any child process that imports this runtime, added to or removed
    from the top level of a directory while the watch runs.

    Sees every write Python code makes (its audit events: ``open`` for writing, ``os.mkdir``,
    ``os.rename``/``os.replace``, ``os.remove``, ``os.rmdir``, ``os.symlink``, ``os.link``,
    ``shutil.rmtree``; numpy's memmap and tempfile go through them), so files other programs add
    or remove meanwhile are not blamed on the run. Writes made below Python (a C library's own
    ``fopen``, torch.save's C++ writer) are not seen. Children learn the directory and a log file
    through the ``PALM_RLHF_SKILL_WATCH`` environment variable while the watch runs.
    """

    def __init__(self, path: str | Path, log: str | None = None) -> None:
        self.path = os.path.realpath(path)
        self.before = set(os.listdir(self.path)) if log is None else set()
        self.touched: set[str] = set()
        self.log = log  # a child's: where to append the names it touches
        self._env: tuple[str | None, str] | None = None

    def record(self, full: str) -> None:
        """Note ``full`` (an absolute path) when it lies in the watched directory."""
        relative = os.path.relpath(full, self.path)
        if relative == "." or relative.startswith(".." + os.sep) or relative == "..":
            return
        name = relative.split(os.sep, 1)[0]
        if name in self.touched:
            return
        self.touched.add(name)
        if self.log is not None:
            with open(self.log, "a", encoding="utf-8") as log:  # small O_APPEND writes do not interleave
                log.write(name + "\n")

    def start(self) -> "DirectoryWatch":
        if self.log is None:  # the parent: children append the names they touch to this file
            fd, child_log = tempfile.mkstemp(prefix=".palm-rlhf-skill-watch-")
            os.close(fd)
            self._env = (os.environ.get(WATCH_ENV), child_log)
            os.environ[WATCH_ENV] = f"{self.path}\n{child_log}"
            atexit.register(self.stop)  # the log goes even when the run ends in an exception
        _watches().append(self)
        return self

    def stop(self) -> None:
        """End the watch; fold in what child processes logged."""
        if self in _watches():
            _watches().remove(self)
        if self._env is not None:
            previous, child_log = self._env
            self._env = None
            if previous is None:
                os.environ.pop(WATCH_ENV, None)
            else:
                os.environ[WATCH_ENV] = previous
            try:
                with open(child_log, encoding="utf-8") as log:
                    self.touched.update(line.strip() for line in log if line.strip())
                os.unlink(child_log)
            except OSError:
                pass


def watch_directory(path: str | Path) -> DirectoryWatch:
    """Start watching what this run adds to or removes from ``path`` (the caller's directory);
    pass the result to ``caller_directory_check`` afterwards."""
    return DirectoryWatch(path).start()


def caller_directory_check(caller: str | Path, watch: DirectoryWatch) -> dict[str, Any]:
    """The ``caller_directory_untouched`` check: ends ``watch`` (from ``watch_directory(caller)``)
    and passes when no name this run touched was added to or removed from ``caller``'s listing.
    Names other programs added or removed meanwhile are not this run's doing and are ignored."""
    watch.stop()
    after = set(os.listdir(caller))
    added = sorted(n for n in watch.touched if n in after and n not in watch.before)
    removed = sorted(n for n in watch.touched if n in watch.before and n not in after)
    parts = [f"{label}: {names}" for label, names in (("added", added), ("removed", removed)) if names]
    return {"name": "caller_directory_untouched", "passed": not parts,
            "detail": "; ".join(parts) or "this run added and removed nothing here"}


if WATCH_ENV in os.environ:  # a child of a watched run (a torchrun rank): log what it touches
    _dir, _, _log = os.environ[WATCH_ENV].partition("\n")
    if _dir and _log:
        DirectoryWatch(_dir, log=_log).start()
