"""``palm-rlhf-skill doctor``: report keys, verdicts and exit codes, with real and simulated faults."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import BIN, REPO, fresh_accelerate, main_in_process, run, run_json
from doc_tables import assert_keys_documented
from palm_rlhf_skill import doctor
from skill_runtime import placement, version_gate

CHECKS = ["python", "library", "dependencies", "torch", "accelerate", "tqdm", "memory", "disk"]
TOP_KEYS = {"status", "exit_code", "python", "library", "packages", "torch", "accelerate", "tqdm",
            "resources", "tested", "checks"}
DOCTOR = str(BIN / "palm-rlhf-skill")


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch) -> Path:
    """A temporary HOME: accelerate looks for its config file under it (~/.cache/huggingface)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("HF_HOME", "XDG_CACHE_HOME", "ACCELERATE_USE_CPU", "ACCELERATE_MIXED_PRECISION", "TQDM_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    return home


def checks_by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def diagnose_in_process(capsys, monkeypatch, tmp_path, *argv) -> tuple[int, dict]:
    monkeypatch.chdir(tmp_path)
    code = doctor.main(["--json", *argv])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.slow  # starts a process: not in the quick tier
def test_doctor_json_is_fit_on_this_machine(empty_dir, home):
    proc, report = run_json([DOCTOR, "doctor", "--json"], empty_dir, env={"HOME": str(home)})
    assert proc.returncode == 0 and report["status"] == "fit" and report["exit_code"] == 0, proc.stderr
    assert TOP_KEYS <= report.keys()
    assert [c["name"] for c in report["checks"]] == CHECKS
    for check in report["checks"]:
        assert set(check) == {"name", "status", "detail", "fix"} and check["detail"]
        assert check["status"] in {"ok", "warn"}, check
    assert report["library"]["versions"]["palm-rlhf-pytorch"] == "0.8.0"
    torch_info = report["torch"]
    assert torch_info["build"] == "CPU" or torch_info["build"].startswith("CUDA ")
    assert torch_info["cuda_available"] is False and torch_info["devices"] == []  # CUDA hidden by run()
    assert_keys_documented("## doctor report", [report], {"packages": "<package>"})  # references/tool-reports.md
    assert isinstance(torch_info["cpu_bf16"], bool) and torch_info["auto_device"] == "cpu"
    accel = report["accelerate"]
    assert accel["distributed_type"] == "NO" and accel["device"] == "cpu" and accel["num_processes"] == 1
    assert accel["launch"] == {"config_file": None, "distributed_type": "NO", "num_processes": 1}
    assert report["tqdm"] == {"TQDM_DISABLE": None, "generate_bars_off": False, "episodes_bar_off": False}
    packages = report["packages"]
    # palm-rlhf-pytorch's declared requirements, each installed in its range
    assert {"torch", "accelerate", "einops", "einx", "beartype", "tqdm", "memmap-replay-buffer"} <= packages.keys()
    assert "palm-rlhf-pytorch" not in packages  # the version gate ('library') covers it
    assert "pytest" not in packages  # extras are left out
    assert all(p["installed"] for p in packages.values())
    assert packages["torch"]["tested"] == report["tested"]["tested_with"]["torch"]
    resources = report["resources"]
    assert resources["memory_available_mib"] > doctor.MIN_MEMORY_MIB
    assert resources["disk"]["cwd"]["path"] == str(empty_dir)
    assert all(d["free_mib"] > doctor.MIN_DISK_MIB for d in resources["disk"].values())
    assert list(empty_dir.iterdir()) == []


@pytest.mark.slow  # starts a process: not in the quick tier
def test_doctor_without_json_writes_the_summary_to_stdout(empty_dir, home):
    # a process, as the next two: tqdm reads TQDM_DISABLE once, when it is imported
    proc = run([DOCTOR, "doctor"], empty_dir,
               env={"HOME": str(home), "ACCELERATE_USE_CPU": "1", "TQDM_DISABLE": "1"})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [line.split()[1] for line in lines[:-1]] == CHECKS  # every check ok or warn: no fix lines
    assert lines[-1] == ("verdict: fit (exit 0): this environment can run the trainers; next: "
                         + doctor.reporting.FIRST_COMMAND)
    accelerate = next(line for line in lines if line.split()[1] == "accelerate")
    assert accelerate.endswith("a plain `python` run: 1 process on cpu, not distributed; "
                               "`accelerate launch`: 1 process, not distributed (no config file)")
    assert not any(" NO " in line or " x1 " in line for line in lines)  # no Accelerate enum jargon


@pytest.mark.slow  # starts a process: not in the quick tier
def test_doctor_says_what_troubleshooting_says_about_tqdm_disable(empty_dir, home):
    """traps-setup.md#tqdm-disable: TQDM_DISABLE=1 hides the generate bars, but the `episodes`
    bar still prints (tests/test_canaries.py::test_tqdm_disable proves it on the library). doctor
    probes the same two bars, says the same, and points to that section."""
    proc, report = run_json([DOCTOR, "doctor", "--json"], empty_dir, env={"HOME": str(home), "TQDM_DISABLE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert report["tqdm"] == {"TQDM_DISABLE": "1", "generate_bars_off": True, "episodes_bar_off": False}
    detail = checks_by_name(report)["tqdm"]["detail"]
    assert "hides the generate bars, but the `episodes` bar still prints" in detail
    page, _, anchor = doctor.TQDM_DOC.partition("#")
    assert f"({doctor.TQDM_DOC})" in detail
    text = (REPO / page).read_text(encoding="utf-8")
    section = text.split(f'<a id="{anchor}"></a>', 1)[1].split("<a id=", 1)[0]
    assert "the `episodes` bar still prints" in " ".join(section.split())


@pytest.mark.slow  # starts a process: not in the quick tier
def test_bad_accelerate_flag_fails_and_tqdm_zero_warns(empty_dir, home):
    # both real: accelerate rejects the value; tqdm reads any non-empty TQDM_DISABLE as true
    proc, report = run_json([DOCTOR, "doctor", "--json"], empty_dir,
                            env={"HOME": str(home), "ACCELERATE_USE_CPU": "maybe", "TQDM_DISABLE": "0"})
    assert proc.returncode == 1 and report["status"] == "must-change" and report["exit_code"] == 1
    checks = checks_by_name(report)
    assert checks["accelerate"]["status"] == "fail"
    assert "invalid truth value maybe" in checks["accelerate"]["detail"]
    assert "ACCELERATE_USE_CPU" in checks["accelerate"]["fix"]
    assert checks["tqdm"]["status"] == "warn" and report["tqdm"]["generate_bars_off"] is True
    assert "unset TQDM_DISABLE" in checks["tqdm"]["fix"]


def test_mixed_precision_variable_is_shown_and_a_value_accelerate_ignores_warns(empty_dir, home, capsys, monkeypatch):
    """Accelerate takes ACCELERATE_MIXED_PRECISION unchecked: `BF16` (upper case) trains in full
    precision without a word. The text report shows the value; one outside PrecisionType warns.
    In-process: Accelerate reads the variable when the Accelerator is built, not at import; its
    process-wide states start cleared (``fresh_accelerate``) so this run builds its own."""
    from accelerate.utils import PrecisionType
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # as run() hides CUDA
    lines = {}
    for value in ("bf16", "BF16"):
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", value)
        with fresh_accelerate():
            code, out, err = main_in_process(doctor.main, capsys, monkeypatch, empty_dir)
        at = out.splitlines()
        i = next(i for i, line in enumerate(at) if line.split()[1:2] == ["accelerate"])
        lines[value] = at[i:i + 2]
        assert f"ACCELERATE_MIXED_PRECISION={value!r}" in lines[value][0], lines[value]
    assert lines["bf16"][0].startswith("ok ")
    accepted = ", ".join(p.value for p in PrecisionType)
    assert lines["BF16"][0].startswith("warn ") and "trains in full precision" in lines["BF16"][0]
    assert lines["BF16"][1].split("fix: ")[1] == f"set ACCELERATE_MIXED_PRECISION to one of {accepted}, or unset it"


def write_accelerate_config(monkeypatch, tmp_path: Path, text: str) -> Path:
    """An accelerate default config file (where `accelerate config` writes it, patched per test)."""
    from accelerate.commands.config import config_args
    path = tmp_path / "default_config.yaml"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setattr(config_args, "default_config_file", str(path))
    return path


def test_launch_config_asking_for_more_gpus_than_visible_warns(capsys, monkeypatch, tmp_path):
    path = write_accelerate_config(monkeypatch, tmp_path, "compute_environment: LOCAL_MACHINE\n"
                                   "distributed_type: MULTI_GPU\nnum_processes: 64\nmixed_precision: bf16\n")
    code, report = diagnose_in_process(capsys, monkeypatch, tmp_path)
    assert code == 0  # a warning: a plain python run is not affected
    assert report["accelerate"]["launch"] == {"config_file": str(path), "distributed_type": "MULTI_GPU",
                                              "num_processes": 64, "mixed_precision": "bf16"}
    check = checks_by_name(report)["accelerate"]
    assert check["status"] == "warn" and "asks for 64 GPU processes" in check["detail"]


def test_unreadable_launch_config_fails_with_one_line(capsys, monkeypatch, tmp_path):
    path = write_accelerate_config(monkeypatch, tmp_path, "distributed_type: [\n")
    code, report = diagnose_in_process(capsys, monkeypatch, tmp_path)
    assert code == 1
    check = checks_by_name(report)["accelerate"]
    assert check["status"] == "fail" and "config file is unreadable" in check["detail"]
    assert "\n" not in check["detail"] and str(path) in check["fix"]


def test_missing_library_exits_3(capsys, monkeypatch, tmp_path):
    real = version_gate.installed_version
    monkeypatch.setattr(version_gate, "installed_version",
                        lambda dist: None if dist == "palm-rlhf-pytorch" else real(dist))
    code, report = diagnose_in_process(capsys, monkeypatch, tmp_path)
    assert code == 3 and report["status"] == "missing" and report["exit_code"] == 3
    library = checks_by_name(report)["library"]
    assert library["status"] == "missing" and library["detail"] == "palm-rlhf-pytorch is not installed"
    assert library["fix"] == "pip install 'palm-rlhf-pytorch>=0.8.0,<0.9'"


def test_untested_library_version_exits_3(capsys, monkeypatch, tmp_path):
    real = version_gate.installed_version
    monkeypatch.setattr(version_gate, "installed_version",
                        lambda dist: "0.9.1" if dist == "palm-rlhf-pytorch" else real(dist))
    code, report = diagnose_in_process(capsys, monkeypatch, tmp_path)
    assert code == 3
    library = checks_by_name(report)["library"]
    assert library["status"] == "unsupported", library
    assert "palm-rlhf-pytorch 0.9.1 is outside >=0.8.0,<0.9" in library["detail"] and "--allow-untested" in library["fix"]


@pytest.mark.parametrize("torch, status, code", [("2.1.2", "unsupported", 3), ("2.12.1", "warn", 0),
                                                 ("2.11.0+cu130", "ok", 0)])
def test_torch_row_says_supported_verified_or_not(capsys, monkeypatch, tmp_path, torch, status, code):
    """Issue 29: a torch below palm-rlhf-pytorch's own requirement is 'unsupported' (exit 3), one
    not verified a warning (exit 0), a verified release in any build ok; never 'library: missing'."""
    real = version_gate.installed_version
    monkeypatch.setattr(version_gate, "installed_version", lambda dist: torch if dist == "torch" else real(dist))
    got, report = diagnose_in_process(capsys, monkeypatch, tmp_path)
    library = checks_by_name(report)["library"]
    assert library["status"] == status and f"torch {torch}" in library["detail"], library
    assert doctor.VERDICT_EXIT[status] == code and got == max(doctor.VERDICT_EXIT[c["status"]] for c in report["checks"])


def test_missing_dependency_exits_3(capsys, monkeypatch, tmp_path):
    real = version_gate.installed_version
    monkeypatch.setattr(version_gate, "installed_version", lambda dist: None if dist == "einx" else real(dist))
    code, report = diagnose_in_process(capsys, monkeypatch, tmp_path)
    assert code == 3 and report["status"] == "missing"
    deps = checks_by_name(report)["dependencies"]
    assert deps["status"] == "missing" and deps["detail"] == "not installed: einx>=0.4.1"  # our verified floor
    assert deps["fix"] == "pip install 'einx>=0.4.1'"
    assert report["packages"]["einx"]["installed"] is None


def test_missing_torch_exits_3_and_skips_torch_checks(capsys, monkeypatch, tmp_path):
    real = version_gate.installed_version
    monkeypatch.setattr(version_gate, "installed_version", lambda dist: None if dist == "torch" else real(dist))
    code, report = diagnose_in_process(capsys, monkeypatch, tmp_path)
    assert code == 3
    checks = checks_by_name(report)
    assert checks["library"]["status"] == "missing" and "torch is not installed" in checks["library"]["detail"]
    assert checks["torch"]["status"] == "skipped" and checks["accelerate"]["status"] == "skipped"
    assert checks["dependencies"]["fix"].startswith("install torch first")


def test_dependency_outside_its_range_exits_1(capsys, monkeypatch, tmp_path):
    real = version_gate.installed_version
    monkeypatch.setattr(version_gate, "installed_version", lambda dist: "0.3.0" if dist == "einx" else real(dist))
    code, report = diagnose_in_process(capsys, monkeypatch, tmp_path)
    assert code == 1 and report["status"] == "must-change"
    deps = checks_by_name(report)["dependencies"]
    assert deps["status"] == "fail" and deps["detail"] == "einx: 0.3.0 is outside >=0.4.1"


def test_low_memory_and_disk_exit_1(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(placement, "available_memory_mib", lambda: doctor.MIN_MEMORY_MIB - 1)
    monkeypatch.setattr(doctor, "MIN_DISK_MIB", 10 ** 12)  # more than any disk has free
    code, report = diagnose_in_process(capsys, monkeypatch, tmp_path)
    assert code == 1
    checks = checks_by_name(report)
    assert checks["memory"]["status"] == "fail" and f"{doctor.MIN_MEMORY_MIB - 1} MiB" in checks["memory"]["detail"]
    assert checks["disk"]["status"] == "fail" and "TMPDIR" in checks["disk"]["fix"]


@pytest.mark.parametrize("short", ["cwd", "tmp"])
def test_a_short_working_directory_is_not_a_tmpdir_fix(capsys, monkeypatch, tmp_path, short):
    """Only the working directory short: the fix names TPO's ./tpo_memmap_replay_buffer and not
    TMPDIR (which does not move it); only the temporary directory short: TMPDIR."""
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir(), tmp.mkdir()
    monkeypatch.setattr(doctor.tempfile, "gettempdir", lambda: str(tmp))
    real = doctor.shutil.disk_usage
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda path: real(path)._replace(free=0)
                        if str(path) == str({"cwd": cwd, "tmp": tmp}[short]) else real(path))
    code, report = diagnose_in_process(capsys, monkeypatch, cwd)
    check = checks_by_name(report)["disk"]
    assert code == 1 and check["status"] == "fail" and check["detail"].startswith(f"{short} ")
    assert ("tpo_memmap_replay_buffer" in check["fix"]) == (short == "cwd")
    assert ("TMPDIR" in check["fix"]) == (short == "tmp")


def test_available_memory_matches_proc_meminfo():
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        pytest.skip("no /proc/meminfo on this system")
    line = next(l for l in meminfo.read_text().splitlines() if l.startswith("MemAvailable:"))
    expected = int(line.split()[1]) // 1024
    assert abs(doctor.placement.available_memory_mib() - expected) < 256  # other processes move it a little


@pytest.mark.slow  # starts a process: not in the quick tier
def test_help_and_usage_errors_do_not_import_torch(empty_dir):
    proc = run([DOCTOR, "doctor", "--help"], empty_dir, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 0 and "exit codes:" in proc.stdout and "--json" in proc.stdout
    assert not any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())
    proc = run([DOCTOR, "doctor", "--bogus"], empty_dir, env={"PYTHONPROFILEIMPORTTIME": "1"})
    errors = [l for l in proc.stderr.splitlines() if not l.startswith("import time:")]
    assert proc.returncode == 2 and len(errors) == 1 and "unrecognized arguments: --bogus" in errors[0]
    assert not any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())
