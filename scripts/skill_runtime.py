"""Shared runtime for this skill's helper scripts: exit codes, one-line errors, version gate,
Accelerate device selection, a private working directory, library-output capture and weight
snapshots.

Every helper script imports this file by path (``scripts/`` at the skill root), so the skill tree
runs wherever it is copied with only palm-rlhf-pytorch installed. Nothing here imports torch at
module level: ``--help`` and usage errors must answer without it.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import sys
import tempfile
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
EXIT_DEPENDENCY = 3  # palm-rlhf-pytorch or torch missing, or outside the tested range

EXIT_CODES_EPILOG = (
    "exit codes: 0 ok; 1 a check failed; 2 usage or environment error; "
    "3 palm-rlhf-pytorch or torch missing or outside the tested range"
)


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
    parser.add_argument("--allow-untested", action="store_true",
                        help="warn instead of exiting 3 when palm-rlhf-pytorch is outside the tested range")


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


def check_versions(allow_untested: bool = False) -> dict[str, Any]:
    """Check torch and palm-rlhf-pytorch against the tested range in ``scripts/api_record.json``.

    Returns ``{"versions": {...}, "tested": {...}, "warnings": [...]}``.
    Raises SkillError(exit 3) when torch or palm-rlhf-pytorch is missing, or when the library is
    outside the supported range and ``allow_untested`` is False (with it, a warning instead).
    """
    from packaging.specifiers import SpecifierSet

    record = load_api_record()
    lib, supported = record["library"], record["supported"]
    versions = {
        "palm-rlhf-pytorch": installed_version(lib),
        "torch": installed_version("torch"),
        "accelerate": installed_version("accelerate"),
        "python": ".".join(map(str, sys.version_info[:3])),
    }
    if versions["torch"] is None:
        raise SkillError(
            "torch is not installed: pip install torch==2.13.0 (CPU) or a CUDA build from "
            "https://pytorch.org, then pip install 'palm-rlhf-pytorch" + supported + "'",
            EXIT_DEPENDENCY)
    if versions["palm-rlhf-pytorch"] is None:
        raise SkillError(f"palm-rlhf-pytorch is not installed: pip install '{lib}{supported}'",
                         EXIT_DEPENDENCY)
    warnings = []
    if versions["palm-rlhf-pytorch"] not in SpecifierSet(supported, prereleases=True):
        message = (f"palm-rlhf-pytorch {versions['palm-rlhf-pytorch']} is outside the tested range "
                   f"{supported} (tested: {record['tested_version']})")
        if not allow_untested:
            raise SkillError(f"{message}: pip install '{lib}{supported}', or pass --allow-untested",
                             EXIT_DEPENDENCY)
        warnings.append(message)
    tested = {"palm-rlhf-pytorch": record["tested_version"], "supported": supported}
    return {"versions": versions, "tested": tested, "warnings": warnings}


def resolve_device(spec: str) -> tuple[dict[str, Any], Any]:
    """Map ``--device auto|cpu|cuda|cuda:N`` to (accelerate_kwargs, torch.device) via Accelerate.

    auto means CUDA when ``torch.cuda.is_available()``, else CPU. The returned kwargs go to the
    trainers' ``accelerate_kwargs`` so their Accelerator picks the same device.
    Raises SkillError(exit 2) for a malformed spec or CUDA that is not available.
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


def caller_directory_check(caller: str | Path, before: list[str]) -> dict[str, Any]:
    """The ``caller_directory_untouched`` check: ``before`` is ``sorted(os.listdir(caller))`` taken
    before the run; the check passes when the caller's directory lists the same names afterwards."""
    after = sorted(os.listdir(caller))
    added = sorted(set(after) - set(before))
    return {"name": "caller_directory_untouched", "passed": before == after,
            "detail": f"added: {added or 'nothing'}"}


def available_memory_mib() -> int | None:
    """MemAvailable from /proc/meminfo in MiB; else free physical pages (os.sysconf); else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024  # kB
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    except (ValueError, OSError, AttributeError):
        return None


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


class Timer:
    """Wall-clock stage timer in seconds (time.perf_counter)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.stages: dict[str, float | None] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
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


def emit(report: dict[str, Any], as_json: bool, summary: Callable[[dict[str, Any]], str]) -> None:
    """Write the report: one JSON object on stdout with ``--json``, else ``summary`` on stderr."""
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")
        sys.stdout.flush()
    else:
        sys.stderr.write(summary(report) + "\n")


def checks_summary(title: str, report: dict[str, Any]) -> str:
    """The human summary of a single-report smoke: status line, one line per check, timings (s)."""
    lines = [f"{title} on {report['device']}: {report['status'].upper()}"]
    lines += [f"    {'ok  ' if c['passed'] else 'FAIL'} {c['name']}: {c['detail']}" for c in report["checks"]]
    lines.append("timings (s): " + ", ".join(f"{k} {v}" for k, v in report["timings_s"].items()))
    lines += [f"warning: {w}" for w in report.get("warnings", [])]
    return "\n".join(lines)


def run_checked_smoke(args: argparse.Namespace, title: str, config: dict[str, Any],
                      body: Callable[[Any], dict[str, Any]], started: float) -> int:
    """Shared main of the palm-modeling and reward-modeling smokes.

    Version gate, timed import of torch and palm_rlhf_pytorch, ``--device`` via Accelerate, then
    ``body(device)`` inside a private working directory with ``--cpu-threads`` torch threads and the
    library's output captured. ``body`` returns JSON-ready results plus ``checks`` (Checks) and
    ``timings_s`` (seconds per stage). Emits the report (``--json`` or summary) and returns exit 0
    when every check passed, else 1. ``started`` is the script's ``time.perf_counter()`` at start.
    Raises SkillError (exit 2 or 3) from the version gate and device resolution.
    """
    env = check_versions(args.allow_untested)
    timer = Timer()
    with timer.stage("import"):
        import torch  # noqa: F401  (the import floor, timed)
        import palm_rlhf_pytorch  # noqa: F401
    _, device = resolve_device(args.device)
    caller = os.getcwd()
    caller_before = sorted(os.listdir(caller))
    with private_workdir(), torch_threads(args.cpu_threads) as threads, \
            capture_library_output() as captured:
        result = body(device)
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
    emit(report, args.json, lambda r: checks_summary(title, r))
    return EXIT_OK if checks.passed else EXIT_CHECK_FAILED


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM so context managers (the private temp dir) clean up;
    a BaseException, like KeyboardInterrupt, so no `except Exception` swallows it."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def run_cli(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Run ``main`` and turn SkillError into one stderr line plus its exit code (no traceback).

    SIGINT exits 130 and SIGTERM 143, each with one line, after the private working directory is
    removed (its ``finally`` runs because both arrive as exceptions).
    """
    import signal
    prog = Path(sys.argv[0]).name
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return main(argv)
    except Terminated:
        sys.stderr.write(f"{prog}: terminated\n")
        return 143
    except SkillError as err:
        sys.stderr.write(f"{prog}: error: {err}\n")
        return err.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
