"""What users really do (issue 15): a torch outside the tested range, other programs writing into
the caller's directory, files that shadow the installed modules, a closed stdout, and Ctrl-C
while Python shuts down. Each case is run for real through the public entry points."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import BIN, REPO, SMOKE, fresh_accelerate, inprocess, main_in_process, load_script, one_error_line, run, run_json
from skill_runtime import exits, placement, runner, version_gate, workspace

PALM_SMOKE = REPO / "sub-skills" / "palm-modeling" / "scripts" / "tiny_palm_smoke.py"


# --- torch: refused only below palm-rlhf-pytorch's own floor, a warning where not verified --------

def gated_line(smoke, monkeypatch, capsys, empty_dir, dist: str, version: str) -> tuple[str, dict]:
    """The smoke's one error line (it must exit 3) with ``dist`` reported at ``version``, and the api record."""
    real = version_gate.installed_version
    monkeypatch.setattr(version_gate, "installed_version", lambda d: version if d == dist else real(d))
    monkeypatch.chdir(empty_dir)
    assert runner.run_cli(smoke.main, ["--construct-only", "--device", "cpu"]) == 3
    return one_error_line(capsys.readouterr().err), version_gate.load_api_record()


@pytest.mark.parametrize("version", ["2.1.2", "1.13.1"])
def test_torch_below_the_library_floor_exits_3_unless_allowed(smoke, monkeypatch, capsys, empty_dir, version):
    """Issue 29, item 3: exit 3 only below palm-rlhf-pytorch's own torch requirement."""
    line, record = gated_line(smoke, monkeypatch, capsys, empty_dir, "torch", version)
    assert f"torch {version} is outside {record['torch_supported']}, palm-rlhf-pytorch's own torch requirement" in line
    assert "--allow-untested" in line and f"torch=={record['tested_with']['torch']}" in line
    code, report = inprocess(smoke, capsys, monkeypatch, empty_dir, "--construct-only", "--allow-untested")
    assert code == 0 and any(w.startswith(f"torch {version} is outside") for w in report["warnings"])


@pytest.mark.parametrize("version", ["2.12.1", "2.16.0", "2.11.0+cu130"])
def test_torch_not_verified_runs_with_one_warning(smoke, monkeypatch, capsys, empty_dir, version):
    """Issue 29, item 3: a torch that meets the library's requirement runs (exit 0, no flag); one
    not in the record's verified releases gets one warning naming them; a verified release in
    another build (2.11.0+cu130: the H200's) gets none."""
    real = version_gate.installed_version
    monkeypatch.setattr(version_gate, "installed_version", lambda d: version if d == "torch" else real(d))
    code, report = inprocess(smoke, capsys, monkeypatch, empty_dir, "--construct-only")
    assert code == 0, report
    verified = version_gate.verified_torch(version_gate.load_api_record())
    warned = [w for w in report["warnings"] if w.startswith(f"torch {version} ")]
    if version_gate.release(version) in verified:
        assert warned == [], report["warnings"]
    else:
        assert warned == [f"torch {version} was not verified with these helpers (verified: {', '.join(verified)}); "
                          "it meets palm-rlhf-pytorch's requirement torch>=2.2"], report["warnings"]


@pytest.mark.parametrize("version", ["0.26.0", "0.29.3"])
def test_accelerate_below_its_floor_exits_3_unless_allowed(smoke, monkeypatch, capsys, empty_dir, version):
    """Issue 22, item 3: below accelerate's verified floor the smoke failed inside the library
    ('TypeError: 'NoneType' object is not iterable', exit 1, references/installation.md#verified-floors);
    the gate stops it first, as for torch: exit 3, one line naming accelerate and the range."""
    line, record = gated_line(smoke, monkeypatch, capsys, empty_dir, "accelerate", version)
    floor = record["requirements_supported"]["accelerate"]
    assert f"accelerate {version} is outside {floor}, its verified floor" in line, line
    assert f"pip install 'accelerate{floor}'" in line and "--allow-untested" in line
    code, report = inprocess(smoke, capsys, monkeypatch, empty_dir, "--construct-only", "--allow-untested")
    assert code == 0 and any(w.startswith(f"accelerate {version} is outside") for w in report["warnings"])


def test_accelerate_missing_exits_3(smoke, monkeypatch, capsys, empty_dir):
    real = version_gate.installed_version
    monkeypatch.setattr(version_gate, "installed_version", lambda d: None if d == "accelerate" else real(d))
    monkeypatch.chdir(empty_dir)
    assert runner.run_cli(smoke.main, ["--construct-only", "--device", "cpu"]) == 3
    line = one_error_line(capsys.readouterr().err)
    assert "accelerate is not installed: pip install 'accelerate>=" in line, line


def test_doctor_exits_3_for_torch_below_the_library_floor(monkeypatch, capsys, empty_dir):
    from palm_rlhf_skill import doctor
    real = doctor.version_gate.installed_version
    monkeypatch.setattr(version_gate, "installed_version", lambda d: "2.1.0" if d == "torch" else real(d))
    monkeypatch.chdir(empty_dir)
    assert doctor.main(["--json"]) == 3
    library = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}["library"]
    assert library["status"] == "unsupported" and "torch 2.1.0 is outside >=2.2" in library["detail"]


# --- the caller's directory: only this run's own writes count ---------------------------------------

INTRUDER = ("import pathlib; pathlib.Path('written-by-another-program.txt').write_text('x'); "
            "pathlib.Path('removed-by-another-program.txt').unlink()")


def intrude(monkeypatch, caller: Path, own_write: bool) -> None:
    """While the smoke runs (inside its torch_threads block, between its before and after looks at
    the caller's directory), another program adds one file there and removes another; with
    ``own_write`` this process also writes a file there itself."""
    real = placement.torch_threads

    @contextlib.contextmanager
    def torch_threads(count):
        subprocess.run([sys.executable, "-c", INTRUDER], cwd=caller, check=True)
        if own_write:
            (caller / "written-by-the-smoke.txt").write_text("leak\n", encoding="utf-8")
        with real(count) as threads:
            yield threads

    monkeypatch.setattr(placement, "torch_threads", torch_threads)


@pytest.mark.parametrize("script", ["rlhf", "palm"])
def test_other_programs_writing_in_the_caller_directory_are_not_blamed(smoke, monkeypatch, capsys,
                                                                       empty_dir, script):
    (empty_dir / "removed-by-another-program.txt").write_text("x\n", encoding="utf-8")
    intrude(monkeypatch, empty_dir, own_write=False)
    if script == "rlhf":
        code, report = inprocess(smoke, capsys, monkeypatch, empty_dir, "--construct-only")
    else:
        palm = load_script(PALM_SMOKE)
        code, report = inprocess(palm, capsys, monkeypatch, empty_dir)
    check = {c["name"]: c for c in report["checks"]}["caller_directory_untouched"]
    assert code == 0 and check["passed"], check
    assert check["detail"] == "this run added and removed nothing here"
    assert sorted(p.name for p in empty_dir.iterdir()) == ["written-by-another-program.txt"]


def test_the_runs_own_write_in_the_caller_directory_still_fails(smoke, monkeypatch, capsys, empty_dir):
    (empty_dir / "removed-by-another-program.txt").write_text("x\n", encoding="utf-8")
    intrude(monkeypatch, empty_dir, own_write=True)
    code, report = inprocess(smoke, capsys, monkeypatch, empty_dir, "--construct-only")
    check = {c["name"]: c for c in report["checks"]}["caller_directory_untouched"]
    assert code == 1 and not check["passed"]
    assert check["detail"] == "added: ['written-by-the-smoke.txt']"  # the other program's file is not named


def test_a_child_that_imports_the_runtime_is_part_of_the_run(empty_dir, tmp_path):
    """A torchrun rank is a child process that imports the runtime: its writes into the watched
    directory count (they reach the parent through PALM_RLHF_SKILL_WATCH); a child that does not
    import it is another program."""
    child = (f"import pathlib, sys; sys.path.insert(0, {str(REPO / 'scripts')!r}); from skill_runtime import workspace\n"
             f"pathlib.Path({str(empty_dir / 'from-a-rank')!r}).mkdir()\n")
    watch = workspace.watch_directory(empty_dir)
    subprocess.run([sys.executable, "-c", child], check=True)
    subprocess.run([sys.executable, "-c", f"open({str(empty_dir / 'from-elsewhere')!r}, 'w')"], check=True)
    check = workspace.caller_directory_check(empty_dir, watch)
    assert not check["passed"] and check["detail"] == "added: ['from-a-rank']"
    assert workspace.WATCH_ENV not in os.environ


# --- shadowed modules: one line naming the file, exit 3; doctor names it ----------------------------

SHADOW_CODE = "print('SHADOW RAN')\n"


@pytest.mark.parametrize("shadow", ["torch.py", "palm_rlhf_pytorch/__init__.py"])
def test_a_shadowing_module_is_named_in_one_line_and_exits_3(empty_dir, shadow):
    path = empty_dir / shadow
    path.parent.mkdir(exist_ok=True)
    path.write_text(SHADOW_CODE, encoding="utf-8")
    named = path if path.name != "__init__.py" else path.parent
    for cmd in ([str(BIN / "tiny-rlhf-smoke"), "--json"], [sys.executable, str(SMOKE), "--json"],
                [str(BIN / "palm-rlhf-skill"), "check", "--json"]):  # check too: never compares a shadow
        proc = run(cmd, empty_dir, env={"PYTHONPATH": "."})
        assert proc.returncode == 3 and proc.stdout == "", proc.stderr[-2000:]
        line = one_error_line(proc.stderr)
        assert f"{named} shadows the installed {shadow.split('/')[0].removesuffix('.py')} (" in line
    proc, report = run_json([str(BIN / "palm-rlhf-skill"), "doctor", "--json"], empty_dir,
                            env={"PYTHONPATH": "."})
    assert proc.returncode == 3 and "SHADOW RAN" not in proc.stdout + proc.stderr
    checks = {c["name"]: c for c in report["checks"]}
    assert str(named) in checks["library"]["detail"] and checks["library"]["status"] == "missing"
    if shadow == "torch.py":
        assert checks["torch"]["status"] == "skipped"


def test_an_editable_or_installed_module_is_not_a_shadow():
    assert version_gate.shadowed_modules() == []


# --- a closed stdout: every console script exits quietly --------------------------------------------

CLOSED_STDOUT_CASES = {
    "tiny-rlhf-smoke": ["--construct-only", "--json", "--device", "cpu"],
    "tiny-palm-smoke": ["--steps", "1", "--json", "--device", "cpu"],
    "tiny-reward-smoke": ["--steps", "2", "--json", "--device", "cpu"],
    "palm-rlhf-skill": ["list"],
}


def run_with_closed_stdout(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run with stdout a pipe whose reader is already gone (`cmd | true` without the race)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(cmd, cwd=cwd, stdout=write, stderr=subprocess.PIPE, text=True, timeout=300,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    finally:
        os.close(write)


def test_every_console_script_has_a_closed_stdout_case():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert set(scripts) == set(CLOSED_STDOUT_CASES)


@pytest.mark.parametrize("cmd", [[str(BIN / name), *args] for name, args in CLOSED_STDOUT_CASES.items()]
                         + [[str(BIN / "palm-rlhf-skill"), "doctor", "--json"],
                            [str(BIN / "palm-rlhf-skill"), "check", "--json"],
                            [sys.executable, str(SMOKE), "--construct-only", "--json", "--device", "cpu"]],
                         ids=lambda cmd: " ".join(Path(c).name for c in cmd[:2]))
def test_a_closed_stdout_exits_141_without_a_traceback(empty_dir, cmd):
    proc = run_with_closed_stdout(cmd, empty_dir)
    assert proc.returncode == exits.EXIT_PIPE_CLOSED, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-2000:]
    assert list(empty_dir.iterdir()) == []


# --- Ctrl-C while Python shuts down, right after the report -----------------------------------------

LATE_INTERRUPT = """
import atexit, os, runpy, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
def slow_library_exit_handler():  # registered first, so it runs last, like torch's finalizers
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(2)
atexit.register(slow_library_exit_handler)
sys.argv = [sys.argv[1], '--construct-only', '--json', '--device', 'cpu']
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def test_ctrl_c_after_the_report_exits_with_its_code_and_no_traceback(empty_dir):
    proc = run([sys.executable, "-c", LATE_INTERRUPT, str(SMOKE)], empty_dir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["status"] == "ok"
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-2000:]


# --- a report that cannot be written: one line, exit 2 (an environment error) -----------------------

@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("cmd", [[str(BIN / name), *args] for name, args in CLOSED_STDOUT_CASES.items()]
                         + [[str(BIN / "palm-rlhf-skill"), "doctor", "--json"]],
                         ids=lambda cmd: " ".join(Path(c).name for c in cmd[:2]))
def test_a_full_disk_under_stdout_is_one_line_and_exit_2(empty_dir, cmd):
    with open("/dev/full", "w") as full:
        proc = subprocess.run(cmd, cwd=empty_dir, stdout=full, stderr=subprocess.PIPE, text=True, timeout=300,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "TQDM_DISABLE": "1"})
    assert proc.returncode == exits.EXIT_USAGE, proc.stderr[-2000:]
    assert "cannot write the report to stdout: OSError: [Errno 28]" in one_error_line(proc.stderr)
    assert list(empty_dir.iterdir()) == []


@pytest.mark.parametrize("cmd", [[str(BIN / "palm-rlhf-skill"), "list"], [str(BIN / "tiny-rlhf-smoke"), "--json"],
                                 [sys.executable, str(SMOKE), "--help"]],
                         ids=lambda cmd: " ".join(Path(c).name for c in cmd[:2]))
def test_a_closed_stdout_is_refused_before_any_work(empty_dir, cmd):
    proc = subprocess.run(cmd, cwd=empty_dir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=300, preexec_fn=lambda: os.close(1))  # the child starts with fd 1 closed (>&-)
    assert proc.returncode == exits.EXIT_USAGE, proc.stderr[-2000:]
    assert "error: stdout is closed" in one_error_line(proc.stderr)


# --- Ctrl-C right after the report: the report's exit code, not 130 ----------------------------------

INTERRUPT_AFTER_REPORT = """
import os, runpy, signal, sys
sys.path.insert(0, sys.argv[2])
from skill_runtime import runner  # the module the smoke imports by the same name
signal.signal(signal.SIGINT, signal.default_int_handler)
write = runner.emit
def emit_then_ctrl_c(*args, **kwargs):  # the user's Ctrl-C the moment the verdict line appears
    code = write(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGINT)
    return code
runner.emit = emit_then_ctrl_c
sys.argv = [sys.argv[1], '--construct-only', '--device', 'cpu', '--trainer', sys.argv[3]]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


@pytest.mark.parametrize("trainer,code", [("grpo", 0), ("no-such-kwarg", 1)])
def test_ctrl_c_right_after_the_report_exits_with_the_reports_code(empty_dir, monkeypatch, trainer, code):
    """installation.md#exit-codes-of-every-helper: once the report is written, Ctrl-C ends the
    helper at once with the report's exit code; 'no-such-kwarg' is grpo with a constructor that
    raises (exit 1)."""
    script = SMOKE
    if trainer == "no-such-kwarg":  # a copy of the tree whose grpo settings pass an unknown argument
        tree = empty_dir.parent / "tree"
        shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(".git", ".venv", "tests", "__pycache__"))
        script = tree / SMOKE.relative_to(REPO)
        kit = tree / "sub-skills" / "policy-optimization" / "scripts" / "policy_optimization" / "tiny_trainers.py"
        old = 'SMOKE_EXTRA: dict[str, dict[str, Any]] = {"ppo": {"max_norm": None}}'
        assert kit.read_text(encoding="utf-8").count(old) == 1
        kit.write_text(kit.read_text(encoding="utf-8").replace(
            old, old[:-1] + ', "grpo": {"no_such_argument": 1}}'), encoding="utf-8")
    proc = run([sys.executable, "-c", INTERRUPT_AFTER_REPORT, str(script),
                str(script.parents[3] / "scripts"), "grpo"], empty_dir)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert proc.stdout.rstrip().splitlines()[-1].startswith("tiny-rlhf-smoke: " + ("OK" if code == 0 else "FAILED"))
    assert "interrupted" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


# --- an environment Accelerate refuses: exit 2 with one line naming the variable ---------------------

def refused_run(smoke, monkeypatch, capsys, cwd, argv: list[str]) -> str:
    """``python tiny_rlhf_smoke.py *argv --device cpu`` in-process with a fresh Accelerate: it must
    exit 2 with nothing on stdout; its one stderr line. (``--device cpu``: the process ran with CUDA
    hidden, where the default ``auto`` is the CPU.)"""
    with fresh_accelerate():
        code, out, err = main_in_process(smoke.main, capsys, monkeypatch, cwd, *argv, "--device", "cpu", prog=SMOKE)
    assert code == 2 and out == "", err[-2000:]
    return one_error_line(err)


@pytest.mark.parametrize("variable", ["LOCAL_RANK", "WORLD_SIZE"])
def test_a_launcher_variable_that_is_not_an_integer_is_named(smoke, monkeypatch, capsys, empty_dir, variable):
    """Accelerate parses LOCAL_RANK, RANK, WORLD_SIZE ... with int(): the one line names the variable
    (no ACCELERATE_* is set, so that cannot be the culprit), and so does doctor's fix."""
    monkeypatch.setenv(variable, "garbage")
    line = refused_run(smoke, monkeypatch, capsys, empty_dir, ["--construct-only", "--json"])
    assert f"Accelerate refuses this environment ({variable}='garbage')" in line, line
    assert "launchers (torchrun, mpirun) set these to integers" in line
    if variable == "LOCAL_RANK":  # doctor's Accelerator() has no cpu=True: Accelerate reads WORLD_SIZE on that path only
        from palm_rlhf_skill import doctor
        with fresh_accelerate():
            doctor.main(["--json"])
        check = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "accelerate")
        assert check["status"] == "fail" and check["fix"].startswith(f"{variable}='garbage': "), check


@pytest.mark.parametrize("variable,value", [("ACCELERATE_USE_CPU", "banana"), ("ACCELERATE_MIXED_PRECISION", "fp8")])
def test_an_accelerate_variable_it_refuses_is_an_environment_error(smoke, monkeypatch, capsys, empty_dir,
                                                                   variable, value):
    """Each run starts without Accelerate's states, as a fresh process does (``fresh_accelerate``):
    Accelerate reads ACCELERATE_MIXED_PRECISION only while no AcceleratorState exists."""
    monkeypatch.setenv(variable, value)
    for argv in (["--construct-only", "--json"], ["--learn", "--learn-seeds", "1", "--trainer", "grpo", "--json"]):
        line = refused_run(smoke, monkeypatch, capsys, empty_dir, argv)
        assert f"Accelerate refuses this environment ({variable}={value!r})" in line and "fix or unset it" in line
    palm = load_script(PALM_SMOKE)
    with fresh_accelerate():
        code, _, err = main_in_process(palm.main, capsys, monkeypatch, empty_dir, "--steps", "1", "--json",
                                       "--device", "cpu", prog="tiny-palm-smoke")
    assert code == 0, err[-2000:]  # it builds no Accelerator: nothing to refuse
    assert list(empty_dir.iterdir()) == []
