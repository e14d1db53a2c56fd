"""Shared test helpers: repo paths, loading a skill-tree script in-process, running it as a CLI."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# One torch thread per test process (pytest-xdist runs two on a 2-core machine) and per child: set
# before anything imports torch; the helpers' own --cpu-threads still apply where a test gives them.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Per-user caches as a fresh machine has them (issue 39: matplotlib's first font scan runs
# ``fc-list``, a process, which the quick tier refuses; on a machine with a cache the same test
# passed). The controller makes one empty folder per session, every xdist worker and child process
# inherits it (``FRESH_CACHES``); ``pytest_configure`` fills matplotlib's font cache there once,
# before any test, and ``pytest_unconfigure`` removes the folder.
FRESH_CACHES = "PALM_RLHF_SKILL_TEST_CACHES"
OWN_CACHES = FRESH_CACHES not in os.environ  # this process made the folder (the controller): it removes it
if OWN_CACHES:
    os.environ[FRESH_CACHES] = tempfile.mkdtemp(prefix="palm-rlhf-skill-test-caches-")
os.environ["MPLCONFIGDIR"] = str(Path(os.environ[FRESH_CACHES]) / "matplotlib")

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "sub-skills" / "policy-optimization" / "scripts" / "tiny_rlhf_smoke.py"
BIN = Path(sys.executable).parent


def load_script(path: Path, name: str | None = None):
    """The skill-tree module at ``path``, imported by name (its folder is one of the tree's import
    roots: pytest's ``pythonpath`` in pyproject.toml)."""
    module = importlib.import_module(name or path.stem)
    assert Path(module.__file__).resolve() == path.resolve(), f"{name} imported from {module.__file__}, not {path}"
    return module


def run(cmd: list[str], cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a command and capture text output; CUDA hidden so runs are CPU on any machine."""
    full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def run_json(cmd: list[str], cwd: Path, **kwargs) -> tuple[subprocess.CompletedProcess, dict]:
    proc = run(cmd, cwd, **kwargs)
    assert proc.stdout.strip(), f"no stdout; stderr: {proc.stderr[-2000:]}"
    return proc, json.loads(proc.stdout)


def inprocess(module, capsys, monkeypatch, cwd, *argv) -> tuple[int, dict]:
    """Run a smoke's ``main(--json --device cpu *argv)`` in-process from ``cwd``; (exit code, report)."""
    monkeypatch.chdir(cwd)
    code = module.main(["--json", "--device", "cpu", *argv])
    return code, json.loads(capsys.readouterr().out)


def default_signals() -> None:
    """``preexec_fn`` for a child that a test signals: SIGINT and SIGTERM at their defaults, as in
    a foreground job, so the test holds when pytest itself runs as a background job (``nohup
    pytest &`` starts with SIGINT ignored, and a child inherits that)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def one_error_line(err: str) -> str:
    """The only line of a helper's stderr (an error is one line, never a traceback)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def usage_error_without_torch(script: Path, argv: list[str], cwd: Path) -> str:
    """Run ``script *argv`` under ``-X importtime``; assert exit 2, one stderr line and no torch
    import; return that line."""
    proc = run([sys.executable, "-X", "importtime", str(script), *argv], cwd)
    assert proc.returncode == 2, proc.stderr[-1000:]
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert len(errors) == 1 and "error:" in errors[0], errors
    assert not any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())
    return errors[0]


@pytest.fixture(scope="session")
def smoke():
    """The smoke helper loaded in-process from the skill tree."""
    return load_script(SMOKE, "tiny_rlhf_smoke")


@pytest.fixture
def empty_dir(tmp_path: Path) -> Path:
    d = tmp_path / "cwd"
    d.mkdir()
    return d


CANARY_LINES = 10      # a failed canary's report, at most (issue: it once embedded a 100-line trainer repr)
CANARY_LINE_CHARS = 400


def canary_failure(item, excinfo) -> str:
    """A failed canary (a test registered with ``canary.covers``) in at most CANARY_LINES lines: the
    test's line, the doc section it guards, and its own message (which names what to update),
    without pytest's assertion introspection, where ``trainer.attr`` put the trainer's whole
    module tree into the report; a library exception as its type and message."""
    anchor = item.function.anchor
    frames = [e for e in excinfo.traceback if Path(str(e.path)) == Path(item.path)]
    own = [e for e in frames if e.name == item.function.__name__] or frames  # the test's line, else a helper's
    where = f"{Path(item.path).name}:{own[-1].lineno + 1}" if own else item.nodeid
    if excinfo.errisinstance(AssertionError) or excinfo.typename == "Failed":
        text = str(excinfo.value).split("\nassert ", 1)[0]
    else:
        text = f"the library raised {excinfo.typename}: {excinfo.value}"
    lines = [ln if len(ln) <= CANARY_LINE_CHARS else ln[:CANARY_LINE_CHARS] + " ..." for ln in text.strip().splitlines()]
    room = CANARY_LINES - 1
    if len(lines) > room:
        lines = lines[:room - 1] + [f"... ({len(lines) - room + 1} more lines)"]
    return "\n".join([f"{where}: the canary of {sys.modules['canary'].doc(anchor)} failed:", *lines])


def pytest_configure(config):
    """The controller (or a run without workers) builds matplotlib's font cache in the session's
    fresh MPLCONFIGDIR before any test runs: the scan starts ``fc-list``, which a quick-tier test may
    not (``quick_tier_starts_no_process``). A test of the first scan itself starts its own process
    with an empty folder (tests/test_run_kit.py)."""
    if hasattr(config, "workerinput"):
        return
    with contextlib.suppress(ImportError):
        import matplotlib.font_manager  # noqa: F401 - builds fontlist-*.json in MPLCONFIGDIR


def pytest_unconfigure(config):
    """The process that made the session's cache folder removes it (nothing left behind)."""
    if OWN_CACHES:
        shutil.rmtree(os.environ[FRESH_CACHES], ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Canaries fail in a few lines (``canary_failure``); every other test as pytest reports it."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None and hasattr(getattr(item, "function", None), "anchor"):
        report.longrepr = canary_failure(item, call.excinfo)
        report.sections = []  # its captured progress bars would be most of the report


@pytest.fixture(autouse=True)
def restore_sigint():
    """A helper's report (``emit``) makes Ctrl-C end the process with the report's exit code: right
    for a helper's process, not for pytest's once a test has run a helper in-process."""
    import signal
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


# The quick tier (``pytest -m quick``, CONTRIBUTING.md): the doc contracts, the run config and the
# in-process CLI paths, for a maintainer's inner loop. Every test of these modules is in it unless
# marked ``slow``; a quick test must not start a process (``quick_tier_starts_no_process``).
QUICK_MODULES = {"test_api_reference_facts.py", "test_check_skill.py", "test_floors.py", "test_reference_gaps.py",
                 "test_reference_round3.py", "test_run_config.py", "test_run_dir.py", "test_output.py",
                 "test_trainers.py", "test_rule_reward.py", "test_doctor.py"}


@pytest.fixture(autouse=True)
def quick_tier_starts_no_process(request, monkeypatch):
    """A test of the quick tier that starts a child process fails, naming the fix (mark it slow):
    processes importing torch cost seconds each, the tier exists to avoid them."""
    if request.node.get_closest_marker("quick"):
        def refuse(*args, **kwargs):
            raise AssertionError(f"{request.node.nodeid} is in the quick tier but starts a process "
                                 f"({args[0] if args else kwargs.get('args')!r}): mark it @pytest.mark.slow")
        monkeypatch.setattr(subprocess, "Popen", refuse)
    yield


def pytest_itemcollected(item):
    """Groups for pytest-xdist's ``--dist loadgroup`` (pyproject.toml's addopts): every test that
    starts a multi-process world (marked ``distributed``) on one worker, one after another, so two
    torchrun worlds never share the cores; and the tests of a module that share a module-scoped
    fixture of that module (a trained run, a built wheel) on one worker, so it is built once.
    (Set as each item is collected: xdist reads the groups in its own collection_modifyitems.)"""
    if item.path.name in QUICK_MODULES and not item.get_closest_marker("slow") \
            and not item.get_closest_marker("distributed"):
        item.add_marker(pytest.mark.quick)
    if item.get_closest_marker("xdist_group"):
        return
    if item.get_closest_marker("distributed"):
        item.add_marker(pytest.mark.xdist_group("distributed"))
        return
    module = item.nodeid.split("::", 1)[0]
    shared = [d for defs in getattr(item, "_fixtureinfo").name2fixturedefs.values() for d in defs
              if d.scope in ("module", "class", "package") and d.baseid.startswith(module)]
    if shared:
        item.add_marker(pytest.mark.xdist_group(module))


def pytest_collection_finish(session):
    """A worker whose groups did not take (pytest-xdist renames a grouped test's node id; a pytest
    that refuses the rename schedules every test alone): stop, rather than build shared fixtures
    twice and start two multi-process worlds at once."""
    if getattr(session.config.option, "loadgroup", False):
        lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
        if lost:
            raise pytest.UsageError(f"pytest-xdist's --dist loadgroup did not group {lost[0]} (and {len(lost) - 1} "
                                    "more): install the pytest of pyproject.toml's test extra")


def main_in_process(main, capture, monkeypatch, cwd: Path, *argv: str, prog: str | Path | None = None
                    ) -> tuple[int, str, str]:
    """An entry point's ``main(argv)`` in this process, as its process runs it (``runner.run_cli``:
    a SkillError is one stderr line and its exit code), from ``cwd``; with ``prog``, ``sys.argv`` is
    ``[prog, *argv]`` (the program name of its messages and of the next command it suggests).
    Returns (exit code, stdout, stderr) of this run alone from ``capture`` (capsys, or capfd to see
    the file descriptors too). For tests that read only those three: a process stays where the
    boundary is what is tested."""
    from skill_runtime import runner
    monkeypatch.chdir(cwd)
    if prog is not None:
        monkeypatch.setattr(sys, "argv", [str(prog), *argv])
    capture.readouterr()  # only this run's output
    code = runner.run_cli(main, list(argv))
    out, err = capture.readouterr()
    return code, out, err


@contextlib.contextmanager
def fresh_accelerate(monkeypatch=None):
    """Accelerate as a fresh process has it for the block: no PartialState, AcceleratorState or
    GradientState (``._shared_state`` empty), so that the next one built reads the environment as a
    fresh process's first does (Accelerate reads ACCELERATE_MIXED_PRECISION and the launcher
    variables only while none exists: with this process's states kept, those runs exit 0); with
    ``monkeypatch``, no ``ACCELERATE_*`` variable either. Afterwards the states as they were found
    (cleared and refilled in place: instances share those dicts; whatever the block built is
    dropped) and torch's CPU generator as it was."""
    import torch
    from accelerate.state import AcceleratorState, GradientState, PartialState
    saved = {cls: dict(cls._shared_state) for cls in (PartialState, AcceleratorState, GradientState)}
    for name in [k for k in os.environ if k.startswith("ACCELERATE_")] if monkeypatch else []:
        monkeypatch.delenv(name)
    rng = torch.random.get_rng_state()
    try:
        for cls in saved:
            cls._shared_state.clear()
        yield
    finally:
        for cls, state in saved.items():
            cls._shared_state.clear()
            cls._shared_state.update(state)
        torch.random.set_rng_state(rng)
