"""A helper's process: ``run_cli`` turns SkillError, signals and a stdout that went away into one
line and a documented exit code; ``emit`` writes the report, the one place every helper does."""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from skill_runtime import exits, streams


def emit(report: dict[str, Any], as_json: bool, summary: Callable[[dict[str, Any]], str],
         exit_code: int) -> int:
    """Write the report on stdout, the one place every helper does: one JSON object with ``--json``,
    else ``summary(report)``, whose last line is the verdict. Progress and errors go to stderr, so
    ``helper > report.txt`` keeps the report. Returns ``exit_code``, the report's exit code: from
    here on a Ctrl-C ends the process at once with it (``run_cli``), whatever is still running
    (a barrier between ranks, Python's shutdown)."""
    global _exit_code
    text = json.dumps(report, indent=2, default=str) if as_json else summary(report)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    _exit_code = exit_code
    if threading.current_thread() is threading.main_thread():
        import signal
        signal.signal(signal.SIGINT, _exit_now)
    return exit_code


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM so context managers (the private temp dir) clean up;
    a BaseException, like KeyboardInterrupt, so no `except Exception` swallows it."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def _stdout_to_devnull() -> None:
    """Point file descriptor 1 at /dev/null, so Python's final flush of what stdout still buffers
    cannot fail a second time (with 'Exception ignored' and exit code 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no file descriptor behind sys.stdout (captured in tests)
        pass


def _stdout_gone() -> int:
    """The reader of stdout went away (``| head -1``, ``| true``): stop quietly and return 141
    (128 + SIGPIPE, what a shell reports for a program that SIGPIPE ended, the usual convention)."""
    _stdout_to_devnull()
    return exits.EXIT_PIPE_CLOSED


class StdoutUnwritable(BaseException):
    """Writing to stdout failed for another reason than a reader that went away: a full disk
    (``> /dev/full``), a quota, an I/O error. A BaseException, so no ``except Exception`` on the
    way swallows it; ``run_cli`` reports it as an environment error (exit 2)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(exits.one_line(error))


class _GuardedStdout:
    """``sys.stdout`` while ``run_cli`` runs: every writer (``emit``, ``print``, ``sys.stdout.write``)
    goes through it, and an OSError from writing or flushing becomes StdoutUnwritable, except
    BrokenPipeError (EPIPE: the reader went away), which stays as it is. Anything else is the
    wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as err:
            raise StdoutUnwritable(err) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            raise StdoutUnwritable(err) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def starting_child() -> Iterator[None]:
    """SIGINT and SIGTERM held back while the block starts a child process, so that one arriving
    between the fork and ``Popen``'s return (the child already runs, but the caller holds no
    ``proc`` to stop yet) is raised as the block ends, where the caller's ``try`` already holds
    ``proc``::

        proc = None
        try:
            with runner.starting_child():
                proc = subprocess.Popen(argv)
            ...  # wait for it
        except BaseException:
            if proc is not None:
                runner.stop_child(proc, grace_s)
            raise

    Held at Python's level: for the block, the two handlers only note the signal; afterwards the
    handlers are restored and the first noted signal is raised again for them. (A signal mask would
    not do: a process-directed signal goes to any thread that does not block it, tqdm's monitor
    thread for one, and Python then runs the handler in the main thread inside ``Popen``.) The
    child starts with the dispositions an ``exec`` gives: the default for a handled signal.
    Outside the main thread (no signal handlers there) it holds nothing."""
    import signal
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    previous = {signum: signal.signal(signum, lambda received, frame: noted.append(received))
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if noted:
            signal.raise_signal(noted[0])


def stop_child(proc: Any, grace_s: float) -> tuple[Any, Any]:
    """Stop a child process (``subprocess.Popen``) that this one started: SIGTERM, on which the
    helpers remove their private directory and torchrun stops its ranks, then SIGKILL after
    ``grace_s`` seconds; the child is waited for (reaped). Called when this process is interrupted
    or terminated while a child runs (a signal sent to this process alone, as ``timeout`` and
    ``kill`` send it, never reaches the child), so no child is left running with PPID 1.
    Returns ``proc.communicate()``'s (stdout, stderr), None for a stream that is not a pipe."""
    proc.terminate()
    try:
        return proc.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


_exit_code: int | None = None  # the report's exit code, once it is written (emit) or main returned


_quiet_at_exit = False          # _quiet_interrupts_at_exit is registered


def _exit_now(signum=None, frame=None) -> None:
    """SIGINT after the report: flush what is buffered and end the process at once with the run's
    exit code (no atexit handlers, no traceback from a library's exit handler)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError, StdoutUnwritable):
            pass
    os._exit(_exit_code if _exit_code is not None else exits.EXIT_INTERRUPTED)


def _quiet_interrupts_at_exit() -> None:
    """An exit handler, registered after the work is done so that it runs before the libraries'
    own (atexit runs last-registered first): from here on Ctrl-C ends the process at once with
    the run's exit code, instead of raising KeyboardInterrupt inside a library's exit handler
    (torch's weakref finalizers print 'Exception ignored in atexit callback' and a traceback)."""
    import signal
    signal.signal(signal.SIGINT, _exit_now)


def program_name() -> str:
    """The name this process's messages give the program: the last part of ``sys.argv[0]``
    (``palm-rlhf-skill plan`` as a console script, ``plan_run.py`` by path). Its one-line errors
    (``run_cli``) and a helper's progress lines use it alike."""
    return Path(sys.argv[0]).name


def run_cli(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Run ``main`` and turn SkillError into one stderr line plus its exit code (no traceback).

    SIGINT exits 130 and SIGTERM 143, each with one line, after the private working directory is
    removed (its ``finally`` runs because both arrive as exceptions). Once the report is written
    (``emit``), a Ctrl-C ends the process at once with the report's exit code instead, also during
    Python's shutdown. stdout: a closed one (the helper started with ``>&-``) is refused before
    any work, and a write that fails (``> /dev/full``) ends the run, each with one line and exit 2
    (an environment error); a reader that went away exits 141 quietly, also when argparse's
    ``--help`` met it. An allocation that fails (``out_of_memory``) is one line and exit 2.
    """
    import signal
    global _exit_code, _quiet_at_exit
    from skill_runtime import reporting
    prog = program_name()

    def say(line: str) -> None:  # a message may quote a file it read (a run directory's): escaped
        streams.write_stderr(f"{prog}: {reporting.terminal_text(line)}\n")

    if sys.stdout is None:  # file descriptor 1 was closed when Python started
        say("error: stdout is closed: give the report somewhere to go (> report.txt, or > /dev/null)")
        return exits.EXIT_USAGE
    guarded = not isinstance(sys.stdout, _GuardedStdout)  # the outermost run_cli of the process
    if guarded:
        sys.stdout = _GuardedStdout(sys.stdout)
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        code = main(argv)
        sys.stdout.flush()  # a reader that went away shows here, not in Python's final flush
    except Terminated:
        say("terminated")
        code = exits.EXIT_TERMINATED
    except exits.SkillError as err:
        say(f"error: {err}")
        code = err.exit_code
    except KeyboardInterrupt:
        say("interrupted")
        code = exits.EXIT_INTERRUPTED
    except BrokenPipeError:
        code = _stdout_gone()
    except StdoutUnwritable as err:
        _stdout_to_devnull()
        say(f"error: cannot write the report to stdout: {err}: free space there or send stdout elsewhere")
        code = exits.EXIT_USAGE
    except SystemExit:  # argparse: --help or --version on stdout, or a usage error
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            raise SystemExit(_stdout_gone()) from None
        except StdoutUnwritable as err:
            _stdout_to_devnull()
            say(f"error: cannot write to stdout: {err}")
            raise SystemExit(exits.EXIT_USAGE) from None
        raise
    except Exception as exc:  # noqa: BLE001 - only a failed allocation is turned into one line
        if not exits.out_of_memory(exc):
            raise
        say(f"error: ran out of memory: {exits.one_line(exc)}: these sizes need more memory than this process "
            "may use; choose smaller ones")
        code = exits.EXIT_USAGE
    finally:
        signal.signal(signal.SIGTERM, previous)
        if guarded and isinstance(sys.stdout, _GuardedStdout):
            sys.stdout = sys.stdout._stream
    if not _quiet_at_exit:
        atexit.register(_quiet_interrupts_at_exit)
        _quiet_at_exit = True
    _exit_code = code
    return code
