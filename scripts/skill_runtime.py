"""Shared runtime for this skill's helper scripts: exit codes, one-line errors, version gate,
Accelerate device selection, a private working directory, library-output capture, weight
snapshots, progress on stderr and the plain report on stdout (verdict last, each failing check
with the doc section that explains it).

Every helper script imports this file by path (``scripts/`` at the skill root), so the skill tree
runs wherever it is copied with only palm-rlhf-pytorch installed. Nothing here imports torch at
module level: ``--help`` and usage errors must answer without it.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator

SKILL_ROOT = Path(__file__).resolve().parent.parent
API_RECORD_PATH = SKILL_ROOT / "scripts" / "api_record.json"

# Exit codes shared by every helper (documented in references/installation.md).
EXIT_OK = 0          # every check passed
EXIT_CHECK_FAILED = 1  # the helper ran and at least one check failed
EXIT_USAGE = 2       # bad arguments or an unfit environment (e.g. --device cuda without CUDA)
EXIT_DEPENDENCY = 3  # palm-rlhf-pytorch or torch missing, shadowed, or outside the tested range
EXIT_INCONCLUSIVE = 75  # the bench only: too busy a machine to judge a time budget; rerun
                        # (sysexits.h EX_TEMPFAIL, "a temporary failure ... the user is invited to retry")
EXIT_INTERRUPTED = 130  # 128 + SIGINT (Ctrl-C)
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: the reader of stdout went away (`| head -1`)
EXIT_TERMINATED = 143   # 128 + SIGTERM

EXIT_CODES_EPILOG = (
    "exit codes: 0 ok; 1 a check failed; 2 usage or environment error; "
    "3 palm-rlhf-pytorch or torch missing, shadowed or outside the tested range"
)


# The one command every doc and helper gives as the first thing to run: all four trainers, end to end.
FIRST_COMMAND = "tiny-rlhf-smoke --trainer all --json"


class SkillError(Exception):
    """An expected failure reported as one line on stderr with a documented exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


def one_line(exc: BaseException) -> str:
    """``Type: first line of message`` for reporting a library exception inside a check."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0] if text else type(exc).__name__


def status_of(checks: list[dict[str, Any]]) -> str:
    """'ok' when there is at least one ``{name, passed, detail}`` check and every one passed, else 'failed'."""
    return "ok" if checks and all(c["passed"] for c in checks) else "failed"


class OneLineParser(argparse.ArgumentParser):
    """argparse parser whose usage errors are a single stderr line and exit code 2, and whose
    description and epilog (examples, exit codes) keep their line breaks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # noqa: D102 - argparse API
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(?::(\d+))?")
MAX_SEED = 2**32 - 1        # accelerate.utils.set_seed accepts 0 .. 2**32 - 1
MAX_OPTIMIZER_STEPS = 1000  # --steps bound of the palm and reward smokes: they stay seconds long


def bounded_int(low: int, high: int | None = None) -> Callable[[str], int]:
    """argparse ``type=`` for an integer in ``[low, high]``: a bad value is a one-line usage error
    (exit 2) before torch is imported, never a traceback from deep in the library."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value
    return parse


def finite_nonnegative_float(text: str) -> float:
    """argparse ``type=`` for a finite float >= 0 (a learning rate): nan, inf and negatives refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def device_spec(text: str) -> str:
    """argparse ``type=`` for ``--device``: the syntax auto|cpu|cuda|cuda:N, checked without torch."""
    if not DEVICE_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not one of auto, cpu, cuda, cuda:N")
    return text


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """The options every smoke shares: --device, --seed, --cpu-threads, --json, --allow-untested."""
    parser.add_argument("--device", default="auto", type=device_spec,
                        help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0,
                        help=f"seed for random, numpy and torch, 0 to {MAX_SEED} (default: 0)")
    parser.add_argument("--cpu-threads", type=bounded_int(1, os.cpu_count() or 1), default=1, metavar="N",
                        help="torch intra-op threads while the smoke runs (default: 1; tiny models gain "
                             "nothing from more, and on a busy CPU they multiply the run time)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_progress_option(parser)
    add_allow_untested_option(parser)


def add_allow_untested_option(parser: argparse.ArgumentParser) -> None:
    """``--allow-untested``: check_versions warns instead of raising SkillError(3)."""
    parser.add_argument("--allow-untested", action="store_true",
                        help="warn instead of exiting 3 when palm-rlhf-pytorch or torch is outside the "
                             "tested range, or a file on the import path shadows one of their modules "
                             "(whose code then runs)")


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """``--progress``: progress lines on stderr also with --json (plain output always has them)."""
    parser.add_argument("--progress", action="store_true",
                        help="progress lines on stderr also with --json (without --json they are on by default)")


def load_by_path(name: str, path: Path):
    """Import a skill-tree script by path as module ``name`` (the tree runs without the Python
    package); an already loaded module from the same file is reused. Registered in sys.modules,
    where dataclasses resolve annotations. Raises FileNotFoundError when the file is missing."""
    import importlib.util
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_api_record() -> dict[str, Any]:
    """The machine-checkable record of what the docs claim: tested version range and API facts."""
    return json.loads(API_RECORD_PATH.read_text(encoding="utf-8"))


def installed_version(distribution: str) -> str | None:
    """Installed version of a distribution via importlib.metadata, or None when not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def shadowed_modules() -> list[dict[str, str]]:
    """Modules of palm-rlhf-pytorch, its declared requirements and ``packaging`` that Python would
    import from somewhere other than their installed distribution.

    A ``torch.py`` or a ``palm_rlhf_pytorch/`` package earlier on ``sys.path`` (the current
    directory under ``PYTHONPATH=.``, ``python -c`` or ``python -m``; a script's own folder) wins
    over the installed one, and its code would run on import. ``importlib.util.find_spec`` locates
    a top-level module without running it. Editable installs, distributions that are not
    installed, and ones whose import name is not their normalized name are skipped.
    Returns ``[{"module", "found", "installed"}]`` (file paths), empty when nothing is shadowed.
    """
    import importlib.util

    record = load_api_record()
    try:
        requires = metadata.requires(record["library"]) or []
    except metadata.PackageNotFoundError:
        requires = []
    names = [record["library"], "packaging",
             *(re.match(r"[A-Za-z0-9._-]+", line).group(0) for line in requires if "extra ==" not in line)]
    found = []
    for dist_name in dict.fromkeys(names):
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            continue
        if '"editable": true' in (dist.read_text("direct_url.json") or "").replace("'", '"'):
            continue
        module = re.sub(r"[-_.]+", "_", dist_name).lower()
        base = Path(dist.locate_file("")).resolve()
        installed = next((p for p in (base / module, base / f"{module}.py") if p.exists()), None)
        if installed is None:
            continue
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
            continue
        origin = Path(spec.origin).resolve()
        if origin != installed and installed not in origin.parents:
            found.append({"module": module, "found": str(origin if origin.name != "__init__.py" else origin.parent),
                          "installed": str(installed)})
    return found


SHADOW_FIX = "rename or move it, or run from another directory / drop it from PYTHONPATH"


def shadow_text(shadow: dict[str, str]) -> str:
    """One ``shadowed_modules()`` entry in words: ``FOUND shadows the installed MODULE (INSTALLED)``."""
    return f"{shadow['found']} shadows the installed {shadow['module']} ({shadow['installed']})"


def check_versions(allow_untested: bool = False, allow_shadowed: bool | None = None) -> dict[str, Any]:
    """Check torch and palm-rlhf-pytorch against the tested ranges in ``scripts/api_record.json``
    (``supported`` and ``torch_supported``), after making sure no file shadows them.

    Returns ``{"versions": {...}, "tested": {...}, "warnings": [...]}``.
    Raises SkillError(exit 3) when torch or palm-rlhf-pytorch is missing; when a module of the
    library or its requirements would be imported from outside its installed distribution (see
    ``shadowed_modules``: a modified library copy on PYTHONPATH is untested too), unless
    ``allow_shadowed`` (default: ``allow_untested``; every helper's --allow-untested; then a warning
    instead); and when either is outside its tested range, unless ``allow_untested``. ``check``
    compares the docs with any installed version (``allow_untested=True``) and with a shadow only
    on its --allow-untested.
    """
    warnings = []
    allow_shadowed = allow_untested if allow_shadowed is None else allow_shadowed
    for s in shadowed_modules():  # before anything imports them: a shadow's code never runs
        message = shadow_text(s)
        if not allow_shadowed:
            raise SkillError(f"{message}: {SHADOW_FIX} (--allow-untested runs with it)", EXIT_DEPENDENCY)
        warnings.append(message)
    from packaging.specifiers import SpecifierSet

    record = load_api_record()
    lib, supported = record["library"], record["supported"]
    torch_supported, torch_tested = record["torch_supported"], record["tested_with"]["torch"]
    versions = {
        "palm-rlhf-pytorch": installed_version(lib),
        "torch": installed_version("torch"),
        "accelerate": installed_version("accelerate"),
        "python": ".".join(map(str, sys.version_info[:3])),
    }
    if versions["torch"] is None:
        raise SkillError(
            f"torch is not installed: pip install torch=={torch_tested} (CPU) or a CUDA build from "
            f"https://pytorch.org, then pip install '{lib}{supported}'", EXIT_DEPENDENCY)
    if versions["palm-rlhf-pytorch"] is None:
        raise SkillError(f"palm-rlhf-pytorch is not installed: pip install '{lib}{supported}'",
                         EXIT_DEPENDENCY)
    for name, spec, tested, fix in ((lib, supported, record["tested_version"], f"pip install '{lib}{supported}'"),
                                    ("torch", torch_supported, torch_tested,
                                     f"pip install torch=={torch_tested} (or that CUDA build)")):
        if versions[name] not in SpecifierSet(spec, prereleases=True):
            message = f"{name} {versions[name]} is outside the tested range {spec} (tested: {tested})"
            if not allow_untested:
                raise SkillError(f"{message}: {fix}, or pass --allow-untested", EXIT_DEPENDENCY)
            warnings.append(message)
    tested = {"palm-rlhf-pytorch": record["tested_version"], "supported": supported,
              "torch": torch_tested, "torch_supported": torch_supported}
    return {"versions": versions, "tested": tested, "warnings": warnings}


ACCELERATE_FIX = "fix or unset it (ACCELERATE_USE_CPU takes 1/0, true/false, yes/no or on/off)"


def probe_accelerator(kwargs: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """Build ``Accelerator(**kwargs)`` once, as every trainer's constructor does, to see what this
    environment gives it: Accelerate reads ACCELERATE_USE_CPU, ACCELERATE_MIXED_PRECISION and its
    other ``ACCELERATE_*`` variables there, and raises ValueError for a value it cannot use.

    Returns ``(state, None)`` with ``state`` = {distributed_type, device, num_processes,
    mixed_precision}, or ``(None, "Type: message")`` when it raised (ValueError, RuntimeError,
    ImportError). Accelerate's process-wide states that this call created are cleared afterwards
    (the trainers build their own); ones that existed before are kept.
    """
    with capture_library_output():
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState, GradientState, PartialState
    had = {cls: bool(cls._shared_state) for cls in (PartialState, AcceleratorState, GradientState)}
    try:
        with capture_library_output():
            state = Accelerator(**kwargs).state
        return {"distributed_type": state.distributed_type.value, "device": str(state.device),
                "num_processes": state.num_processes, "mixed_precision": state.mixed_precision}, None
    except (ValueError, RuntimeError, ImportError) as err:
        return None, one_line(err)
    finally:  # leave Accelerate's process-wide state as it was found
        for cls, initialized in had.items():
            if not initialized:
                cls._shared_state.clear()


# The launchers' variables Accelerate reads with int() while it builds its state (accelerate/state.py,
# PartialState.__init__; accelerate/utils/environment.py, get_cpu_distributed_information): a value
# that is not an integer raises ValueError: invalid literal for int() with base 10.
ACCELERATE_INT_VARIABLES = (
    "LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE",
)


def non_integer_variables() -> list[str]:
    """``["LOCAL_RANK='garbage'"]``: the ACCELERATE_INT_VARIABLES set here to something int() refuses."""
    bad = []
    for name in ACCELERATE_INT_VARIABLES:
        value = os.environ.get(name)
        try:
            int(value) if value is not None else None
        except ValueError:
            bad.append(f"{name}={value!r}")
    return bad


def accelerate_variables() -> str:
    """``LOCAL_RANK='garbage', ACCELERATE_USE_CPU='banana'``: what Accelerate reads here that can make
    it refuse: launcher variables it parses as integers whose value is not one, then every
    ``ACCELERATE_*`` variable set."""
    found = [*non_integer_variables(),
             *(f"{k}={v!r}" for k, v in sorted(os.environ.items()) if k.startswith("ACCELERATE_"))]
    return ", ".join(found) or "no ACCELERATE_* variable set, and no launcher variable it reads as an integer is malformed"


def accelerate_fix() -> str:
    """How to fix what ``accelerate_variables`` names."""
    if non_integer_variables():
        return "fix or unset it: launchers (torchrun, mpirun) set these to integers; outside one, unset them"
    return ACCELERATE_FIX


def resolve_device(spec: str, trainers: bool = True) -> tuple[dict[str, Any], Any]:
    """Map ``--device auto|cpu|cuda|cuda:N`` to (accelerate_kwargs, torch.device) via Accelerate.

    auto means CUDA when ``torch.cuda.is_available()``, else CPU. The returned kwargs go to the
    trainers' ``accelerate_kwargs`` so their Accelerator picks the same device.
    Raises SkillError(exit 2) for a malformed spec, CUDA that is not available, or, when
    ``trainers`` (the caller builds a trainer, which builds an Accelerator), an environment whose
    ``ACCELERATE_*`` variables Accelerate refuses (``probe_accelerator``): an environment error,
    never a failed check of the trainer built afterwards.
    """
    import torch
    from accelerate import PartialState

    match = DEVICE_PATTERN.fullmatch(spec)
    if not match:
        raise SkillError(f"--device {spec!r} is not one of auto, cpu, cuda, cuda:N")
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SkillError(
                f"--device {spec} requested but CUDA is not available to torch {torch.__version__} "
                "(torch.cuda.is_available() is False): use --device cpu or auto, or install a CUDA "
                "build of torch")
        index = int(match.group(1) or 0)
        if index >= torch.cuda.device_count():
            raise SkillError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) visible")
        torch.cuda.set_device(index)  # Accelerate places on torch.device('cuda'), the current one
    use_cpu = spec == "cpu" or (spec == "auto" and not torch.cuda.is_available())
    kwargs = {"cpu": True} if use_cpu else {}
    _, error = probe_accelerator(kwargs) if trainers else (None, None)
    if error:
        raise SkillError(f"Accelerate refuses this environment ({accelerate_variables()}): {error}; "
                         + accelerate_fix())
    device = PartialState(**kwargs).device
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return kwargs, device


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


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else os.cpu_count())."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def available_memory_mib() -> int:
    """RAM a new allocation can get without swapping, MiB: psutil's ``virtual_memory().available``
    (MemAvailable of /proc/meminfo on Linux). psutil is a requirement of Accelerate, so it is there
    wherever the library is; the one reader for doctor, --nproc's resource check and plan."""
    import psutil
    return psutil.virtual_memory().available // 2**20


PAD_ID = 0  # the library's pad id: PaLM's cross_entropy_ignore_index and the trainers' pad_value


class ByteTokenizer:
    """Byte-level tokenizer: UTF-8 byte b -> id b + 1, so id 0 stays the pad id.

    ``__call__(prompts: list[str]) -> LongTensor (num_prompts, max_bytes)``, right-padded with 0.
    Empty strings are dropped (counted in ``dropped_empty``): the trainers split ``prompts_path``
    on '\\n', so a file's trailing newline becomes an empty prompt whose rollout would crash.
    Raises SkillError(exit 2) when nothing is left to tokenize. Vocabulary: 257 ids (pad + 256 bytes).
    """

    vocab_size = 257

    def __init__(self) -> None:
        self.dropped_empty = 0

    def __call__(self, prompts: list[str]):
        import torch
        kept = [p for p in prompts if p.strip()]
        self.dropped_empty += len(prompts) - len(kept)
        if not kept:
            raise SkillError("no non-empty prompts to tokenize")
        rows = [[b + 1 for b in p.encode("utf-8")] for p in kept]
        out = torch.full((len(rows), max(map(len, rows))), PAD_ID, dtype=torch.long)
        for i, row in enumerate(rows):
            out[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        return out


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[int]:
    """Run with ``torch.set_num_threads(count)`` and restore the previous count afterwards.

    Tiny CPU models gain nothing from intra-op threads, and on a CPU shared with other work the
    threads wait on each other (measured here: 27 s with the default pool vs 4 s with one thread
    for the reward-modeling smoke on a loaded 2-core machine). Yields the count in effect.
    """
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


@dataclass
class CapturedOutput:
    """What the library printed while captured: its stdout prints and its stderr (tqdm bars)."""
    stdout: str = ""
    stderr: str = ""


@contextlib.contextmanager
def capture_library_output() -> Iterator[CapturedOutput]:
    """Capture Python-level stdout and stderr (the library's print() and tqdm bars).

    Keeps stdout clean for ``--json``; the captured prints are parsed for losses afterwards.
    """
    out, err, captured = io.StringIO(), io.StringIO(), CapturedOutput()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield captured
    finally:
        captured.stdout, captured.stderr = out.getvalue(), err.getvalue()


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


def snapshot(named_params: Iterator[tuple[str, Any]]) -> dict[str, Any]:
    """Detached clones of ``(name, tensor)`` pairs, keyed by name, for a later ``changed_names``."""
    return {name: p.detach().clone() for name, p in named_params}


def changed_names(before: dict[str, Any], named_params: Iterator[tuple[str, Any]]) -> list[str]:
    """Names whose tensor differs (any element, exact comparison) from its snapshot."""
    import torch
    return [name for name, p in named_params if not torch.equal(before[name], p.detach().to(before[name].device))]


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
        """One line ``prog: text`` (between bars, or above a running one)."""
        if self.enabled:
            from tqdm import tqdm
            tqdm.write(f"{self.prog}: {text}", file=self.stream)

    @contextlib.contextmanager
    def stage(self, label: str, total: int | None = None, unit: str = "") -> Iterator[Any]:
        """A bar ``prog: label`` for the ``with`` block; yields it (``update(n)``, ``set_postfix_str``).
        ``total`` counts ``unit``s (rollouts, seeds); without it the bar shows the elapsed time only.
        Not at a terminal, the bar counts and formats but draws into nothing until the stage ends,
        when its one line is written."""
        from tqdm import tqdm
        counted = "{n_fmt}/{total_fmt} " + unit + " " if total is not None else ""
        # disable only when off: passed explicitly, it would override TQDM_DISABLE (tqdm's envwrap)
        bar = tqdm(total=total, desc=f"{self.prog}: {label}", leave=True, miniters=0,
                   file=self.stream if self.live else io.StringIO(),
                   mininterval=self.redraw_s if self.live else math.inf,
                   bar_format="{desc}: " + counted + "[{elapsed}{postfix}]",
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


@dataclass
class Checks:
    """An ordered list of ``{name, passed, detail}`` checks."""
    items: list[dict[str, Any]] = field(default_factory=list)

    def add(self, name: str, passed: bool, detail: str) -> bool:
        self.items.append({"name": name, "passed": bool(passed), "detail": detail})
        return bool(passed)

    @property
    def passed(self) -> bool:
        return status_of(self.items) == "ok"


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


# Where each check a helper reports is explained: the section to read when it fails, as a path from
# the skill root. The one map of check names to docs (tests/test_output.py: every anchor exists and
# every check name the helpers emit is here).
TROUBLE = "sub-skills/policy-optimization/references/troubleshooting.md"
DIST = "sub-skills/policy-optimization/references/distributed.md"
REPORTS = "references/reports.md"
CHECK_DOCS = {
    # tiny-rlhf-smoke train smoke
    "trainer_constructed": f"{TROUBLE}#symptom-index",
    "actor_lora_scope_added": f"{TROUBLE}#actor-scope-reused-palm",
    "trainable_parameters_on_device": f"{REPORTS}#train-smoke-checks",
    "update_ran": f"{TROUBLE}#symptom-index",
    "optimizer_steps": f"{TROUBLE}#optimizer-first-steps",
    "rollout_group_size": f"{TROUBLE}#group-size-per-rollout",
    "rollouts_ended_at_eos": f"{REPORTS}#train-smoke-checks",
    "actor_lora_changed": f"{TROUBLE}#optimizer-first-steps",
    "critic_lora_changed": f"{TROUBLE}#optimizer-first-steps",
    "value_head_changed": f"{TROUBLE}#optimizer-first-steps",
    "partition_function_changed": f"{TROUBLE}#optimizer-first-steps",
    "base_weights_unchanged": f"{TROUBLE}#base-weights-accumulate-grad",
    "reward_model_unchanged": f"{REPORTS}#train-smoke-checks",
    "losses_finite": f"{TROUBLE}#symptom-index",
    "replay_buffer_in_private_dir": f"{TROUBLE}#tpo-replay-buffer-dir",
    "reference_policy_is_lora_off_palm": f"{TROUBLE}#flowrl-no-lora-reference",
    "generated_sequence": f"{TROUBLE}#generate-one-prompt",
    "caller_directory_untouched": "references/installation.md#exit-codes-of-every-helper",
    # tiny-rlhf-smoke --learn
    "learning_ran": f"{TROUBLE}#symptom-index",
    "reward_rose": "sub-skills/policy-optimization/references/workflows.md#learning-check",
    # tiny-rlhf-smoke on several processes (--nproc, or under a launcher)
    "accelerate_multi_process": f"{DIST}#launching",
    "parameters_finite": f"{DIST}#rotary-caches-under-eos",
    "ranks_in_sync": f"{DIST}#what-each-trainer-needs",
    "ranks_drew_different_prompts": f"{DIST}#seeding",
    "only_main_process_wrote": f"{DIST}#checkpoints",
    "replay_buffer_per_rank": f"{DIST}#what-each-trainer-needs",
    "all_ranks_passed": f"{DIST}#check-first-the-smoke-helper-on-n-processes",
    "trainer_ran": f"{TROUBLE}#symptom-index",
    "workers_finished": f"{DIST}#check-first-the-smoke-helper-on-n-processes",
    # tiny-palm-smoke
    "constructed": "sub-skills/palm-modeling/references/palm-api.md#constructor",
    "next_token_loss_decreases": "sub-skills/palm-modeling/references/palm-api.md#forward",
    "generate_with_prompt": "sub-skills/palm-modeling/references/palm-api.md#generate",
    "generate_without_prompt": "sub-skills/palm-modeling/references/palm-api.md#generate",
    "fresh_lora_scope_is_identity": "sub-skills/palm-modeling/references/lora-scopes.md",
    "lora_scope_isolated": "sub-skills/palm-modeling/references/lora-scopes.md",
    "merge_reproduces_scoped_logits": "sub-skills/palm-modeling/references/lora-scopes.md",
    "save_load_round_trip": "sub-skills/palm-modeling/references/palm-api.md#dropout-saving-and-loading",
    # tiny-reward-smoke
    "scalar_rewards_shape": "sub-skills/reward-modeling/references/reward-api.md#forward",
    "scalar_mse_loss_decreases": "sub-skills/reward-modeling/references/reward-api.md#training",
    "held_out_accuracy_above_chance": f"{REPORTS}#tiny-reward-smoke",
    "binned_cross_entropy_decreases": "sub-skills/reward-modeling/references/reward-api.md#forward",
    "binned_inference_returns_bin_index": f"{TROUBLE}#binned-reward-sampled",
    "implicit_prm_rewards_shape": "sub-skills/reward-modeling/references/implicit-prm.md#what-it-computes",
    "implicit_prm_loss_backpropagates": "sub-skills/reward-modeling/references/implicit-prm.md#what-it-computes",
    "implicit_prm_output_is_minus_bce": "sub-skills/reward-modeling/references/implicit-prm.md#what-it-computes",
    "base_palm_untouched": "sub-skills/reward-modeling/references/reward-api.md#constructor",
}


def names_text(names: list[str], shown: int = 4) -> str:
    """``a, b, c, d and 3 more``: a list cut at ``shown`` that says how much it left out; 'none'."""
    if not names:
        return "none"
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def check_lines(checks: list[dict[str, Any]], indent: str = "  ") -> list[str]:
    """The failing checks in full, each with the section of ``CHECK_DOCS`` that explains it; the
    passing ones only counted (the count is on the caller's headline)."""
    lines = []
    for c in checks:
        if not c["passed"]:
            lines.append(f"{indent}FAIL {c['name']}: {c['detail']}")
            lines.append(f"{indent}     read: {CHECK_DOCS.get(c['name'], REPORTS)}")
    return lines


def passed_count(checks: list[dict[str, Any]]) -> str:
    """``all 14 checks passed`` or ``4 of 14 checks failed``."""
    failed = sum(not c["passed"] for c in checks)
    return f"all {len(checks)} checks passed" if not failed else f"{failed} of {len(checks)} checks failed"


# How a person runs each helper, and the file behind it (path from the skill root): a next step is
# written the way this run was started, by console script or by path (python path/to/script.py).
HELPER_SCRIPTS = {
    "tiny-rlhf-smoke": "sub-skills/policy-optimization/scripts/tiny_rlhf_smoke.py",
    "tiny-palm-smoke": "sub-skills/palm-modeling/scripts/tiny_palm_smoke.py",
    "tiny-reward-smoke": "sub-skills/reward-modeling/scripts/tiny_reward_smoke.py",
    "palm-rlhf-skill check": "scripts/check_skill.py",
    "palm-rlhf-skill bench": "sub-skills/policy-optimization/scripts/bench_smoke.py",
    "palm-rlhf-skill plan": "sub-skills/policy-optimization/scripts/plan_run.py",
}


def command(helper: str, arguments: str = "") -> str:
    """The command line that runs ``helper`` (a key of HELPER_SCRIPTS) with ``arguments``: the
    console script when this process was started as one, else ``python <path>``, the path relative
    to the working directory when it lies below it."""
    started_by_path = bool(sys.argv) and sys.argv[0].endswith(".py")
    if started_by_path:
        path = SKILL_ROOT / HELPER_SCRIPTS[helper]
        try:
            shown = str(path.relative_to(Path.cwd()))
        except ValueError:
            shown = str(path)
        head = f"python {shown}"
    else:
        head = helper
    return f"{head} {arguments}".strip()


def device_words(device: Any) -> str:
    """``the CPU`` or ``GPU 0 (cuda:0)``: a torch device in a newcomer's words."""
    text = str(device)
    if text.startswith("cpu"):
        return "the CPU"
    if text.startswith("cuda"):
        return f"GPU {text.partition(':')[2] or 0} ({text})"
    return text


def seconds_text(seconds: float) -> str:
    """``0.042 s``, ``4.4 s``, ``2.5 min``, ``1.2 h``, ``4,572,460 days`` (plan's runs too long to run)."""
    if seconds < 1:
        return f"{seconds:.3f} s"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.0f} days"


def timings_line(timings: dict[str, float | None]) -> str:
    """``timings (s): import 3.09, update 0.34, total 3.48`` (stages that ran)."""
    return "timings (s): " + ", ".join(f"{k} {v:.2f}" for k, v in timings.items() if v is not None)


def checks_summary(title: str, report: dict[str, Any], next_step: str) -> str:
    """The plain report of a single-report smoke: the count of checks, each failing one in full
    with its doc section, timings, warnings, and last the verdict with the next step."""
    checks = report["checks"]
    lines = [f"{title} on {device_words(report['device'])}: {passed_count(checks)}", *check_lines(checks)]
    lines.append(timings_line(report["timings_s"]))
    lines += [f"warning: {w}" for w in report.get("warnings", [])]
    failed = [c for c in checks if not c["passed"]]
    if failed:
        lines.append(f"{title}: FAILED (exit 1): {len(failed)} check(s) failed; next: read "
                     f"{CHECK_DOCS.get(failed[0]['name'], REPORTS)}")
    else:
        lines.append(f"{title}: OK (exit 0); next: {next_step}")
    return "\n".join(lines)


IMPORT_LABEL = "import torch and palm-rlhf-pytorch"  # the import stage's progress line


def run_checked_smoke(args: argparse.Namespace, title: str, config: dict[str, Any],
                      body: Callable[[Any, Timer], dict[str, Any]], started: float, next_step: str) -> int:
    """Shared main of the palm-modeling and reward-modeling smokes.

    Version gate, timed import of torch and palm_rlhf_pytorch, ``--device`` via Accelerate, then
    ``body(device, timer)`` inside a private working directory with ``--cpu-threads`` torch threads
    and the library's output captured; ``timer`` shows each of its stages as a progress line.
    ``body`` returns JSON-ready results plus ``checks`` (Checks) and ``timings_s`` (seconds per
    stage). Emits the report (``--json``, or the summary ending with the verdict and
    ``next_step``) and returns exit 0 when every check passed, else 1. ``started`` is the
    script's ``time.perf_counter()`` at start.
    Raises SkillError (exit 2 or 3) from the version gate and device resolution.
    """
    env = check_versions(args.allow_untested)
    progress = Progress(title, not args.json or args.progress)
    timer = Timer(progress)
    with timer.stage("import", label=IMPORT_LABEL):
        import torch  # noqa: F401  (the import floor, timed)
        import palm_rlhf_pytorch  # noqa: F401
    _, device = resolve_device(args.device, trainers=False)  # these smokes build no Accelerator
    caller = os.getcwd()
    caller_before = watch_directory(caller)
    with private_workdir(), torch_threads(args.cpu_threads) as threads, \
            capture_library_output() as captured:
        result = body(device, Timer(progress))
    checks: Checks = result.pop("checks")
    checks.items.append(caller_directory_check(caller, caller_before))
    report: dict[str, Any] = {
        "status": "ok" if checks.passed else "failed", "device": str(device), "seed": args.seed,
        "cpu_threads": threads,
        "versions": env["versions"], "tested": env["tested"], "warnings": env["warnings"],
        "config": dict(config), **result, "checks": checks.items,
        "library_output": captured.stdout.strip() or None,
        "timings_s": {"import": timer.stages["import"], **result["timings_s"]},
    }
    report["timings_s"]["total"] = round(time.perf_counter() - started, 4)
    return emit(report, args.json, lambda r: checks_summary(title, r, next_step),
                EXIT_OK if checks.passed else EXIT_CHECK_FAILED)


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
    return EXIT_PIPE_CLOSED


class StdoutUnwritable(BaseException):
    """Writing to stdout failed for another reason than a reader that went away: a full disk
    (``> /dev/full``), a quota, an I/O error. A BaseException, so no ``except Exception`` on the
    way swallows it; ``run_cli`` reports it as an environment error (exit 2)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(one_line(error))


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


def out_of_memory(exc: BaseException) -> bool:
    """True for an allocation that failed: MemoryError, torch.OutOfMemoryError (CUDA), or the
    RuntimeError torch's CPU allocator raises ('DefaultCPUAllocator: can't allocate memory')."""
    return (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
            or (isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)))


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
    os._exit(_exit_code if _exit_code is not None else EXIT_INTERRUPTED)


def _quiet_interrupts_at_exit() -> None:
    """An exit handler, registered after the work is done so that it runs before the libraries'
    own (atexit runs last-registered first): from here on Ctrl-C ends the process at once with
    the run's exit code, instead of raising KeyboardInterrupt inside a library's exit handler
    (torch's weakref finalizers print 'Exception ignored in atexit callback' and a traceback)."""
    import signal
    signal.signal(signal.SIGINT, _exit_now)


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
    prog = Path(sys.argv[0]).name

    def say(line: str) -> None:
        write_stderr(f"{prog}: {line}\n")

    if sys.stdout is None:  # file descriptor 1 was closed when Python started
        say("error: stdout is closed: give the report somewhere to go (> report.txt, or > /dev/null)")
        return EXIT_USAGE
    guarded = not isinstance(sys.stdout, _GuardedStdout)  # the outermost run_cli of the process
    if guarded:
        sys.stdout = _GuardedStdout(sys.stdout)
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        code = main(argv)
        sys.stdout.flush()  # a reader that went away shows here, not in Python's final flush
    except Terminated:
        say("terminated")
        code = EXIT_TERMINATED
    except SkillError as err:
        say(f"error: {err}")
        code = err.exit_code
    except KeyboardInterrupt:
        say("interrupted")
        code = EXIT_INTERRUPTED
    except BrokenPipeError:
        code = _stdout_gone()
    except StdoutUnwritable as err:
        _stdout_to_devnull()
        say(f"error: cannot write the report to stdout: {err}: free space there or send stdout elsewhere")
        code = EXIT_USAGE
    except SystemExit:  # argparse: --help or --version on stdout, or a usage error
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            raise SystemExit(_stdout_gone()) from None
        except StdoutUnwritable as err:
            _stdout_to_devnull()
            say(f"error: cannot write to stdout: {err}")
            raise SystemExit(EXIT_USAGE) from None
        raise
    except Exception as exc:  # noqa: BLE001 - only a failed allocation is turned into one line
        if not out_of_memory(exc):
            raise
        say(f"error: ran out of memory: {one_line(exc)}: these sizes need more memory than this process "
            "may use; choose smaller ones")
        code = EXIT_USAGE
    finally:
        signal.signal(signal.SIGTERM, previous)
        if guarded and isinstance(sys.stdout, _GuardedStdout):
            sys.stdout = sys.stdout._stream
    if not _quiet_at_exit:
        atexit.register(_quiet_interrupts_at_exit)
        _quiet_at_exit = True
    _exit_code = code
    return code


if __name__ == "__main__":  # run by path: say what it is (one line, exit 2), do nothing else
    sys.stderr.write("skill_runtime.py: error: a module, not a command: the helpers' shared runtime, imported by "
                     f"them: run one of them, e.g. {command('tiny-rlhf-smoke', '--help')}\n")  # by path: a copy has no console scripts
    sys.exit(2)
