#!/usr/bin/env python3
"""Verify every declared dependency floor: install it in a scratch venv and run the smokes there.

A lower bound in ``pyproject.toml`` is a promise that the skill works at that version. For every
requirement with a lower bound that this package (``pyproject.toml``) or palm-rlhf-pytorch (its
installed metadata) declares, merged by name as ``palm-rlhf-skill doctor`` merges them, this
script makes a scratch venv holding that version and everything else at the newest version the
declared ranges allow, then runs the smokes and checks there:

    tiny-rlhf-smoke --trainer all --json    tiny-palm-smoke --json    tiny-reward-smoke --json
    palm-rlhf-skill check --json            palm-rlhf-skill doctor --json
    tiny-rlhf-smoke --learn --trainer all --json
    palm-rlhf-skill plan --config <assets/plans/accuracy-grpo.toml> --probe-seconds 10 --json

A trial passes when every one exits 0. A ``newest`` trial (no pin) runs first as the baseline, so
a failing floor is the floor's fault. torch is never changed: each venv gets the torch named by
``--torch`` (default: the tested version from scripts/api_record.json) first, and every pip call
runs with a constraints file pinning that torch, so no step can pull another (multi-GB CUDA)
build. torch's own floor is that version, verified by the baseline. The venvs share torch's files
through hard links, so a trial costs the dependencies' install and the smokes, not torch's.

This is a maintainer's tool, not part of the skill tree (it needs pip and the network), so it
lives under tools/ and ships only in the sdist. Record what it prints in
references/installation.md#verified-floors; tests/test_floors.py ties that record to
pyproject.toml and to doctor.

Usage:
    .venv/bin/python tools/verify_floors.py                             # every floor
    .venv/bin/python tools/verify_floors.py --only accelerate --try accelerate==0.29.3
    .venv/bin/python tools/verify_floors.py --markdown --out floors.jsonl
    .venv/bin/python tools/verify_floors.py --records floors.jsonl --markdown    # the table again
    PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu .venv/bin/python tools/verify_floors.py

Exit codes: 0 every trial passed; 1 a trial failed; 2 usage or environment error (pip or venv
failed before any smoke ran).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from skill_runtime import exits, options, runner, version_gate  # noqa: E402

LIBRARY = "palm-rlhf-pytorch"
SMOKES = (
    ("tiny-rlhf-smoke", "--trainer", "all", "--json", "--device", "cpu"),
    ("tiny-palm-smoke", "--json", "--device", "cpu"),
    ("tiny-reward-smoke", "--json", "--device", "cpu"),
    ("palm-rlhf-skill", "check", "--json"),
    ("palm-rlhf-skill", "doctor", "--json"),
    ("tiny-rlhf-smoke", "--learn", "--trainer", "all", "--json", "--device", "cpu"),
    ("palm-rlhf-skill", "plan", "--config", str(REPO / "sub-skills" / "policy-optimization" / "assets" / "plans"
                                                / "accuracy-grpo.toml"), "--probe-seconds", "10", "--json"),
)
SMOKE_TIMEOUT_S = 1800
PIP_TIMEOUT_S = 1800


def canonical(requirement: str) -> str:
    """The normalized distribution name of a requirement string."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    return canonicalize_name(Requirement(requirement).name)


def own_requirements() -> list[str]:
    """pyproject.toml's dependencies, as written."""
    import tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]


def declarations() -> dict[str, dict[str, Any]]:
    """doctor's merge of the requirements (``palm_rlhf_skill.doctor.declared_requirements``), with
    this package's read from pyproject.toml rather than its installed metadata: ``{canonical name:
    {"specifier": SpecifierSet, "declared": {declaring distribution: SpecifierSet}}}``."""
    from palm_rlhf_skill import doctor

    if version_gate.installed_version(LIBRARY) is None:
        raise exits.SkillError(f"{LIBRARY} is not installed in {sys.prefix}: run this with the "
                            "project's .venv/bin/python")
    return doctor.declared_requirements(own_requirements())


def declared_requirements() -> dict[str, Any]:
    """``{canonical name: SpecifierSet}``: every declaration of a name intersected."""
    return {name: entry["specifier"] for name, entry in declarations().items()}


def floor_of(specifier) -> str | None:
    """The lowest version a specifier set admits through ``>=``, ``==`` or ``~=`` (the highest
    such bound when there are several), or None when it has no inclusive lower bound."""
    from packaging.version import Version
    bounds = [Version(s.version) for s in specifier if s.operator in (">=", "==", "~=")
              and "*" not in s.version]
    return str(max(bounds)) if bounds else None


def run(cmd: list[str], cwd: Path, timeout: float) -> tuple[int, str, str, float]:
    """Run ``cmd`` on the CPU; return (exit code, stdout, stderr, seconds); 124 on timeout."""
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = 124, "", f"timed out after {timeout} s: {exc.stderr or ''}"
    return code, out, str(err), round(time.perf_counter() - started, 1)


def failed_checks(report: Any) -> list[str]:
    """``name: detail`` of every check with ``"passed": false`` anywhere in a JSON report, and
    every doctor check whose status is fail or missing."""
    found: list[str] = []
    if isinstance(report, dict):
        if report.get("passed") is False or report.get("status") in ("fail", "missing") and "fix" in report:
            found.append(f"{report.get('name')}: {report.get('detail')}")
        for value in report.values():
            found += failed_checks(value)
    elif isinstance(report, list):
        for value in report:
            found += failed_checks(value)
    return list(dict.fromkeys(found))


def pip(venv: Path, args: list[str], constraints: Path, work: Path) -> None:
    """``python -m pip install -c constraints ARGS`` in ``venv``; SkillError(exit 2) on failure."""
    code, out, err, _ = run([str(venv / "bin" / "python"), "-m", "pip", "install",
                             "--disable-pip-version-check", "-c", str(constraints), *args], work, PIP_TIMEOUT_S)
    if code != 0:  # pip names the cause on stdout ("X 1.0 depends on torch>=2.5"), its verdict on stderr
        causes = list(dict.fromkeys(line.strip() for line in out.splitlines() if " depends on " in line))
        reasons = causes[:3] + [line.strip() for line in err.splitlines() if "requires" in line or "ERROR" in line]
        raise exits.SkillError(f"pip install {' '.join(args)} failed: {' | '.join(reasons[-6:]) or err[-500:]}")


def make_base(work: Path, torch_req: str) -> tuple[Path, Path]:
    """A venv holding only torch, and a constraints file pinning exactly that torch."""
    base = work / "base"
    code, _, err, _ = run([sys.executable, "-m", "venv", str(base)], work, 300)
    if code != 0:
        raise exits.SkillError(f"python -m venv failed: {err[-500:]}")
    loose = work / "no-constraints.txt"
    loose.write_text("", encoding="utf-8")
    pip(base, [torch_req], loose, work)
    version = subprocess.run([str(base / "bin" / "python"), "-c",
                              "from importlib.metadata import version; print(version('torch'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    constraints = work / "constraints.txt"
    constraints.write_text(f"torch=={version}\n", encoding="utf-8")
    return base, constraints


def clone_venv(base: Path, dest: Path) -> None:
    """Copy the base venv with hard links (torch's files are shared, not copied; pip only adds
    or removes files, never rewrites one, so the base stays intact)."""
    subprocess.run(["cp", "-al", str(base), str(dest)], check=True)


def installed(venv: Path, names: list[str]) -> dict[str, str | None]:
    """Installed versions of ``names`` in ``venv``."""
    code = ("import json, sys\nfrom importlib.metadata import version, PackageNotFoundError\n"
            "def v(n):\n    try:\n        return version(n)\n    except PackageNotFoundError:\n        return None\n"
            "print(json.dumps({n: v(n) for n in sys.argv[1:]}))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code, *names], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


def trial(name: str, pins: list[str], base: Path, constraints: Path, wheel: Path, work: Path,
          watch: list[str]) -> dict[str, Any]:
    """One scratch venv: the package's wheel plus ``pins``; run every smoke; the trial's record."""
    venv = work / f"venv-{len(list(work.glob('venv-*')))}"
    clone_venv(base, venv)
    started = time.perf_counter()
    record: dict[str, Any] = {"trial": name, "pins": pins, "results": {}}
    pinned = {canonical(pin) for pin in pins}
    others = [line for line in own_requirements() if canonical(line) not in pinned]
    try:  # the wheel without its requirements, so a --try below a declared floor still installs
        pip(venv, ["--no-deps", str(wheel)], constraints, work)
        pip(venv, [*others, *pins], constraints, work)
    except exits.SkillError as err:
        record.update(passed=False, install_error=str(err), seconds=round(time.perf_counter() - started, 1))
        shutil.rmtree(venv, ignore_errors=True)
        return record
    record["versions"] = installed(venv, watch)
    cwd = work / "cwd"
    cwd.mkdir(exist_ok=True)
    for smoke in SMOKES:
        label = " ".join(smoke[:2]) if smoke[0] == "palm-rlhf-skill" or "--learn" in smoke else smoke[0]
        code, out, err, seconds = run([str(venv / "bin" / smoke[0]), *smoke[1:]], cwd, SMOKE_TIMEOUT_S)
        result: dict[str, Any] = {"exit": code, "seconds": seconds}
        if code != 0:
            try:
                result["failed_checks"] = failed_checks(json.loads(out))
            except json.JSONDecodeError:
                result["stderr_tail"] = err[-1500:]
        record["results"][label] = result
    record["passed"] = all(r["exit"] == 0 for r in record["results"].values())
    record["seconds"] = round(time.perf_counter() - started, 1)
    shutil.rmtree(venv, ignore_errors=True)
    return record


def plan(requirements: dict[str, Any], only: list[str], tries: list[str]) -> list[tuple[str, list[str]]]:
    """``(trial name, pins)``: the baseline, each requirement's floor (torch's is the baseline's
    torch), then each ``--try`` pin."""
    trials: list[tuple[str, list[str]]] = [("newest", [])]
    for name, spec in sorted(requirements.items()):
        floor = floor_of(spec)
        if name == "torch" or floor is None or (only and name not in only):
            continue
        trials.append((f"{name} floor", [f"{name}=={floor}"]))
    trials += [(f"{canonical(pin)} try", [pin]) for pin in tries]
    return trials


def floor_of_python(requires: str) -> str | None:
    """The floor of a Requires-Python specifier, e.g. ``>=3.11`` -> ``3.11``."""
    from packaging.specifiers import SpecifierSet
    return floor_of(SpecifierSet(requires))


def outcome(record: dict[str, Any]) -> str:
    """``pass``, or ``FAIL`` with the first failing command and check, or what pip could not
    install it with."""
    if record["passed"]:
        return "pass"
    if "install_error" in record:
        pinned = {canonical(pin) for pin in record["pins"]}
        named = (re.findall(r"([A-Za-z0-9_.-]+) [^ |]+ depends on", record["install_error"])
                 or re.findall(r"([A-Za-z0-9_.-]+)==", record["install_error"]))
        others = sorted({canonical(n) for n in named} - pinned - {LIBRARY})
        return ("FAIL to install: no version of " + ", ".join(others) + " the ranges allow accepts it"
                if others else "FAIL to install: " + record["install_error"][-160:])
    name, result = next((k, v) for k, v in record["results"].items() if v["exit"] != 0)
    lines = result.get("stderr_tail", "").strip().splitlines()
    first = (result.get("failed_checks") or lines[-1:] or ["no report"])[0]
    first = re.sub(r" \(/[^)]*\)", "", first)  # a file path in an error message says nothing here
    return f"FAIL: {name} exit {result['exit']}, {first[:120]}".replace("|", "/")


def markdown(requirements: dict[str, Any], records: list[dict[str, Any]], torch_version: str) -> str:
    """The verified-floors table of references/installation.md."""
    import platform
    import tomllib
    lines = ["| dependency | declared | floor | result at the floor |", "| --- | --- | --- | --- |"]
    by_pin = {tuple(r["pins"]): r for r in records}
    baseline = by_pin.get(())
    python = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    by_source = declarations()
    lines.append(f"| python | palm-rlhf-skill `{python}` | {floor_of_python(python)} | "
                 + (f"pass ({platform.python_version()}, every trial) |" if baseline and baseline["passed"] else "see newest |"))
    for name, spec in sorted(requirements.items()):
        floor = floor_of(spec)
        if name == "torch":
            result = (f"pass ({torch_version}, every trial; each release: [Verified torch](#verified-torch))"
                      if baseline and baseline["passed"] else "see newest")
        elif floor is None:
            result = "no floor declared; newest passes" if baseline and baseline["passed"] else "no floor declared"
        else:
            rec = by_pin.get((f"{name}=={floor}",))
            result = "not run" if rec is None else outcome(rec)
        declared = "; ".join(f"{source} `{s or 'any'}`" for source, s in by_source[name]["declared"].items())
        lines.append(f"| {name} | {declared} | {floor or '-'} | {result} |")
    extra = [r for r in records if r["trial"].endswith(" try")]
    if extra:
        lines += ["", "| tried | result |", "| --- | --- |"]
        lines += [f"| {' '.join(r['pins'])} | {outcome(r)} |" for r in extra]
    return "\n".join(lines)


def build_wheel(work: Path) -> Path:
    """This repository's wheel, built into ``work/dist``; SkillError(exit 2) when the build fails."""
    dist = work / "dist"
    code, _, err, _ = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)],
                          work, PIP_TIMEOUT_S)
    if code != 0:
        raise exits.SkillError(f"building the palm-rlhf-skill wheel failed: {err[-500:]}")
    return next(dist.glob("*.whl"))


def build_parser() -> options.OneLineParser:
    parser = options.OneLineParser(
        prog="verify_floors.py",
        description="Install each declared dependency floor in a scratch venv and run the smokes.",
        epilog="examples:\n  .venv/bin/python tools/verify_floors.py --markdown\n"
               "  .venv/bin/python tools/verify_floors.py --only accelerate --try accelerate==0.29.3\n\n"
               "exit codes: 0 every trial passed; 1 a trial failed; 2 usage or environment error")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="check only these requirements' floors (repeatable; the baseline always runs)")
    parser.add_argument("--try", dest="tries", action="append", default=[], metavar="PIN",
                        help="also run a trial with this pin, e.g. accelerate==0.29.3 (repeatable)")
    parser.add_argument("--torch", help="what to pip install as torch first (default: torch==<tested "
                                        "version in scripts/api_record.json>), a pin or a wheel path")
    parser.add_argument("--out", type=Path, help="append each trial's JSON record to this file as it ends")
    parser.add_argument("--markdown", action="store_true", help="print the installation.md table on stdout")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--records", type=Path, metavar="FILE",
                        help="run nothing: print the table (--markdown) or records of an earlier --out file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    record = version_gate.load_api_record()
    torch_req = args.torch or f"torch=={record['tested_with']['torch']}"
    requirements = declared_requirements()
    if args.records:
        records = [json.loads(line) for line in args.records.read_text(encoding="utf-8").splitlines() if line]
        torch_version = next(r["versions"]["torch"] for r in records if r.get("versions"))
        sys.stdout.write((markdown(requirements, records, torch_version) if args.markdown
                          else json.dumps(records, indent=2)) + "\n")
        return exits.EXIT_OK if all(r["passed"] for r in records) else exits.EXIT_CHECK_FAILED
    trials = plan(requirements, [n.lower() for n in args.only], args.tries)
    work = Path(tempfile.mkdtemp(prefix="verify-floors-"))
    started = time.perf_counter()
    records = []
    try:
        sys.stderr.write(f"scratch {work}; {len(trials)} trials: {', '.join(t for t, _ in trials)}\n")
        base, constraints = make_base(work, torch_req)
        torch_version = constraints.read_text(encoding="utf-8").split("==")[1].strip()
        wheel = build_wheel(work)
        watch = sorted({*requirements, LIBRARY})
        for name, pins in trials:
            rec = trial(name, pins, base, constraints, wheel, work, watch)
            records.append(rec)
            failed = [k for k, v in rec.get("results", {}).items() if v["exit"] != 0]
            sys.stderr.write(f"{name:<28} {'pass' if rec['passed'] else 'FAIL'} in {rec['seconds']} s"
                             + (f": {', '.join(failed) or rec.get('install_error', '')}" if not rec["passed"] else "")
                             + "\n")
            if args.out:
                with args.out.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(rec) + "\n")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    sys.stderr.write(f"{len(records)} trials in {round(time.perf_counter() - started)} s\n")
    if args.markdown:
        sys.stdout.write(markdown(requirements, records, torch_version) + "\n")
    else:
        sys.stdout.write(json.dumps(records, indent=2) + "\n")
    return exits.EXIT_OK if all(r["passed"] for r in records) else exits.EXIT_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
