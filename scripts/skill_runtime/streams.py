"""Output streams: the library's own prints and bars captured (stdout stays clean) and its printed
losses parsed, a user program's prints sent to stderr, stderr written best effort, progress bars
on stderr and stage timers."""
from __future__ import annotations

import contextlib
import io
import math
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator


@dataclass
class CapturedOutput:
    """What the library printed while captured: its stdout prints and its stderr (tqdm bars)."""
    stdout: str = ""
    stderr: str = ""


_REPLACED_STDERR: list[Any] = []  # the sys.stderr each active capture replaced, outermost first


@contextlib.contextmanager
def capture_library_output() -> Iterator[CapturedOutput]:
    """Capture Python-level stdout and stderr (the library's print() and tqdm bars).

    Keeps stdout clean for ``--json``; the captured prints are parsed for losses afterwards. The
    user's programs called inside it print through ``program_output`` instead (to stderr).
    """
    out, err, captured = io.StringIO(), io.StringIO(), CapturedOutput()
    _REPLACED_STDERR.append(sys.stderr)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield captured
    finally:
        _REPLACED_STDERR.pop()
        captured.stdout, captured.stderr = out.getvalue(), err.getvalue()


@contextlib.contextmanager
def program_output() -> Iterator[None]:
    """Run a user's program (a reward program, a tokenizer, their import) with its print()s, on
    stdout or stderr, sent to the process's stderr as it was outside every
    ``capture_library_output`` (so inside a training round too), best effort
    (``BestEffortStream``): stdout keeps only the report, and a user debugging a reward sees their
    prints as they happen (training-run.md#your-prints)."""
    target = BestEffortStream(_REPLACED_STDERR[0] if _REPLACED_STDERR else sys.stderr)
    with contextlib.redirect_stdout(target), contextlib.redirect_stderr(target):
        yield


LOSS_PATTERN = re.compile(r"\b([a-z_]*(?:loss|balance)): ([-+]?(?:nan|inf|\d+\.?\d*(?:e[-+]?\d+)?))",
                          re.IGNORECASE)


def parse_losses(text: str) -> dict[str, list[float]]:
    """Losses the trainers print in ``learn()``, e.g. ``policy_loss: -0.055`` -> {name: [values]}."""
    losses: dict[str, list[float]] = {}
    for name, value in LOSS_PATTERN.findall(text):
        losses.setdefault(name, []).append(float(value))
    return losses


def all_finite(losses: dict[str, list[float]]) -> bool:
    """True when at least one loss was printed and every printed value is finite."""
    values = [v for vs in losses.values() for v in vs]
    return bool(values) and all(math.isfinite(v) for v in values)


class BestEffortStream:
    """A text stream for progress and diagnostics whose ``write`` and ``flush`` never raise.

    The first OSError or ValueError (a full disk: ``2>/dev/full``, ENOSPC; a descriptor closed
    while running, EBADF; a closed file) ends its output: from then on it writes nothing, so a
    progress line can never change a run's report or exit code, and a failing stream costs one
    failed write, not one per redraw. ``None`` (Python found stderr closed at start: ``2>&-``)
    writes nothing. ``failed`` says whether that happened.
    """

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.failed = stream is None

    def write(self, text: str) -> int:
        if not self.failed:
            try:
                self.stream.write(text)
            except (OSError, ValueError):
                self.failed = True
        return len(text)

    def flush(self) -> None:
        if not self.failed:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self.failed = True

    def isatty(self) -> bool:
        try:
            return not self.failed and self.stream.isatty()
        except (AttributeError, OSError, ValueError):
            return False

    @property
    def encoding(self) -> str:  # tqdm reads it to choose unicode or ascii
        return getattr(self.stream, "encoding", None) or "utf-8"

    def __getattr__(self, name: str) -> Any:
        """Anything else (``fileno``, ``buffer``, ``errors``) from the stream itself, for a user's
        program that asks (``program_output``); AttributeError when there is no stream."""
        if name == "stream":  # not yet set (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.stream, name)


def write_stderr(text: str) -> None:
    """Write ``text`` on stderr, best effort (``BestEffortStream``): a stderr that is closed or
    full loses the text, never the run."""
    BestEffortStream(sys.stderr).write(text)


class Progress:
    """Progress on stderr, one line per stage with its elapsed time, and one-line notes such as an
    estimate. Drawn by tqdm: at a terminal a live bar per stage (redrawn every second, also while
    the stage makes no countable progress), left on screen when the stage ends; on anything else
    (a file, a pipe, a log) no redraws and no ``\r``: the stage's finished line only, rendered by
    the same tqdm bar.

    ``enabled`` False (``--json`` without ``--progress``) prints nothing. The stream is bound when
    the object is made, so bars reach the terminal while the library's own output (its tqdm bars
    included) is captured. Best effort (``BestEffortStream``): after the first write that fails
    (stderr full or closed), progress stops and the run goes on. tqdm reads ``TQDM_DISABLE``: set,
    it hides these bars too (the notes stay).
    """

    def __init__(self, prog: str, enabled: bool, stream: Any = None) -> None:
        self.prog, self.enabled = prog, enabled
        self.stream = BestEffortStream(sys.stderr if stream is None else stream)
        self.live = self.stream.isatty()  # a terminal: bars redrawn in place
        self.redraw_s = 1.0

    def note(self, text: str) -> None:
        """One line ``prog: text`` (between bars, or above a running one), its control characters
        escaped (``reporting.terminal_text``: a note may quote a path or a file's text)."""
        if self.enabled:
            from tqdm import tqdm

            from skill_runtime import reporting
            tqdm.write(f"{self.prog}: {reporting.terminal_text(text)}", file=self.stream)

    @contextlib.contextmanager
    def stage(self, label: str, total: int | None = None, unit: str = "", eta: bool = False) -> Iterator[Any]:
        """A bar ``prog: label`` for the ``with`` block; yields it (``update(n)``, ``set_postfix_str``).
        ``total`` counts ``unit``s (rollouts, seeds); without it the bar shows the elapsed time only.
        Not at a terminal, the bar counts and formats but draws into nothing until the stage ends,
        when its one line is written.
        With ``eta`` (and a ``total``) the bar also shows tqdm's estimate of the time left."""
        from tqdm import tqdm
        counted = "{n_fmt}/{total_fmt} " + unit + " " if total is not None else ""
        # disable only when off: passed explicitly, it would override TQDM_DISABLE (tqdm's envwrap)
        bar = tqdm(total=total, desc=f"{self.prog}: {label}", leave=True, miniters=0,
                   file=self.stream if self.live else io.StringIO(),
                   mininterval=self.redraw_s if self.live else math.inf,
                   bar_format="{desc}: " + counted + "[{elapsed}" + ("<{remaining}" if eta else "") + "{postfix}]",
                   **({} if self.enabled else {"disable": True}))
        stop = threading.Event()

        def redraw() -> None:
            while not stop.wait(self.redraw_s):
                bar.refresh()

        ticker = threading.Thread(target=redraw, daemon=True) if self.live and not bar.disable else None
        if ticker:
            ticker.start()
        try:
            yield bar
        finally:
            stop.set()
            if ticker:
                ticker.join()
            line = None if self.live or bar.disable else str(bar)
            bar.close()
            if line is not None:
                tqdm.write(line, file=self.stream)


class Timer:
    """Wall-clock stage timer in seconds (time.perf_counter); with a ``Progress``, each stage is
    also a progress bar labelled ``"{label}: {stage}"``."""

    def __init__(self, progress: Progress | None = None, label: str = "") -> None:
        self.start = time.perf_counter()
        self.stages: dict[str, float | None] = {}
        self.progress, self.label = progress, label

    @contextlib.contextmanager
    def stage(self, name: str, total: int | None = None, unit: str = "", label: str | None = None) -> Iterator[Any]:
        """Time the block as ``stages[name]``; yields the stage's progress bar (None without a
        Progress), shown as ``label`` (default: ``name``)."""
        t0 = time.perf_counter()
        shown = label or name
        bar = (contextlib.nullcontext() if self.progress is None else
               self.progress.stage(f"{self.label}: {shown}" if self.label else shown, total, unit))
        try:
            with bar as shown:
                yield shown
        finally:
            self.stages[name] = round(time.perf_counter() - t0, 4)

    def total(self) -> float:
        return round(time.perf_counter() - self.start, 4)
