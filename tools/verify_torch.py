#!/usr/bin/env python3
"""Verify a range of torch releases: for each, a scratch venv with that torch and everything else
at the newest version the declared ranges allow, then the same commands as tools/verify_floors.py
(the three smokes, check, doctor, the learning check and plan), on the CPU.

A torch release the helpers passed on is recorded in ``scripts/api_record.json`` ``torch_verified``
(with the date, the device, Python and accelerate), the record the helpers' version gate reads: a
release outside it runs with a one-line warning; only one below palm-rlhf-pytorch's own torch
requirement is refused. ``references/installation.md#verified-torch`` shows that record
(a generated block: ``check_skill.py --write-docs`` renders it from the record, ``check`` compares;
tests/test_floors.py ties pyproject.toml's torch floor to the lowest release verified).

The PyPI wheels for Linux are CUDA builds (about 3 GB with their NVIDIA libraries); they run on a
CPU, and each venv here runs with ``CUDA_VISIBLE_DEVICES=""``. A pip configuration that caps torch
(a machine-wide constraints file) must be lifted for the run, e.g. ``PIP_CONSTRAINT=/dev/null``.

This is a maintainer's tool, not part of the skill tree (it needs pip and the network).

Usage:
    .venv/bin/python tools/verify_torch.py 2.5.1 2.8.0 2.11.0 2.15.0 --out torch.jsonl
    .venv/bin/python tools/verify_torch.py --records torch.jsonl --write-record   # into api_record.json
    .venv/bin/python tools/verify_torch.py --markdown                             # the doc's table

Exit codes: 0 every release passed (or nothing to run); 1 a release failed; 2 usage or environment
error (pip or venv failed before any smoke ran).
"""
from __future__ import annotations

import datetime
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verify_floors  # noqa: E402
from verify_floors import LIBRARY, REPO  # noqa: E402
from skill_check import api, generated  # noqa: E402
from skill_runtime import exits, options, runner, version_gate  # noqa: E402

CHECKS = "tools/verify_torch.py"


def verify(version: str, wheel: Path, work: Path, watch: list[str]) -> dict[str, Any]:
    """One torch release: its own base venv, then verify_floors' trial with no pin; the trial's
    record plus the row for ``torch_verified`` (``row``)."""
    folder = work / f"torch-{version}"
    folder.mkdir()
    try:
        base, constraints = verify_floors.make_base(folder, f"torch=={version}")
    except exits.SkillError as err:
        return {"trial": f"torch {version}", "pins": [], "passed": False, "install_error": str(err), "results": {},
                "row": row_of(version, None, f"FAIL to install: {exits.one_line(err)[:160]}")}
    # pinned, so the trial drops pyproject.toml's own torch floor (the floor follows these results)
    rec = verify_floors.trial(f"torch {version}", [f"torch=={version}"], base, constraints, wheel, folder, watch)
    shutil.rmtree(base, ignore_errors=True)
    result = verify_floors.outcome(rec)
    if "install_error" in rec:  # pip names one conflict of many: ask each requirement alone
        blocking = blockers(version, folder)
        result = f"FAIL to install: no version of {', '.join(blocking)} the ranges allow accepts it" if blocking else result
    rec["row"] = row_of(rec.get("versions", {}).get("torch") or version, rec.get("versions", {}).get("accelerate"),
                        result)
    return rec


def blockers(version: str, work: Path) -> list[str]:
    """The declared requirements that no version in their range installs beside ``torch==version``
    (``pip install --dry-run`` of each alone: metadata only, nothing installed)."""
    found = []
    for name, spec in sorted(verify_floors.declared_requirements().items()):
        if name == "torch":
            continue
        code, _, _, _ = verify_floors.run([sys.executable, "-m", "pip", "install", "--dry-run", "-q",
                                           "--ignore-installed", "--disable-pip-version-check", f"torch=={version}",
                                           f"{name}{spec}"], work, verify_floors.PIP_TIMEOUT_S)
        if code != 0:
            found.append(name)
    return found


def row_of(torch: str, accelerate: str | None, result: str) -> dict[str, str]:
    """A ``torch_verified`` row: the CPU device this tool runs on, today's date."""
    return {"torch": torch, "device": "cpu", "python": platform.python_version(), "accelerate": accelerate or "-",
            "date": datetime.date.today().isoformat(), "result": result, "by": CHECKS}


def write_record(rows: list[dict[str, str]]) -> Path:
    """Replace the rows of the same torch release and device in ``torch_verified``, keep the
    others, oldest torch first; returns the record's path."""
    from packaging.version import Version
    record = version_gate.load_api_record()
    new = {(version_gate.release(r["torch"]), r["device"]): r for r in rows}
    kept = [r for r in record.get("torch_verified", []) if (version_gate.release(r["torch"]), r["device"]) not in new]
    record["torch_verified"] = sorted(kept + list(new.values()),
                                      key=lambda r: (Version(version_gate.release(r["torch"])), r["device"]))
    version_gate.API_RECORD_PATH.write_text(api.record_json(record), encoding="utf-8")
    return version_gate.API_RECORD_PATH


def build_parser() -> options.OneLineParser:
    parser = options.OneLineParser(
        prog="verify_torch.py",
        description="Run the smokes, check, doctor, the learning check and plan on several torch releases.",
        epilog="examples:\n  PIP_CONSTRAINT=/dev/null .venv/bin/python tools/verify_torch.py 2.5.1 2.15.0 --out t.jsonl\n"
               "  .venv/bin/python tools/verify_torch.py --records t.jsonl --write-record\n"
               "  .venv/bin/python tools/verify_torch.py --markdown\n\n"
               "exit codes: 0 every release passed; 1 a release failed; 2 usage or environment error")
    parser.add_argument("versions", nargs="*", metavar="VERSION", help="torch releases to verify, e.g. 2.5.1")
    parser.add_argument("--out", type=Path, help="append each release's JSON record to this file as it ends")
    parser.add_argument("--records", type=Path, metavar="FILE", help="run nothing: take the records of an earlier --out")
    parser.add_argument("--write-record", action="store_true",
                        help="write the releases' rows into scripts/api_record.json torch_verified")
    parser.add_argument("--markdown", action="store_true", help="print installation.md's verified-torch table")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.records:
        records = [json.loads(line) for line in args.records.read_text(encoding="utf-8").splitlines() if line]
    elif args.versions:
        records = run_all(args.versions, args.out, args.keep)
    else:
        records = []
    if args.write_record and records:
        sys.stderr.write(f"rewrote {write_record([r['row'] for r in records])}\n")
    if args.markdown:
        sys.stdout.write(generated.render_torch_verified(version_gate.load_api_record()))
    elif records:
        sys.stdout.write(json.dumps(records, indent=2) + "\n")
    return exits.EXIT_OK if all(r["passed"] for r in records) else exits.EXIT_CHECK_FAILED


def run_all(versions: list[str], out: Path | None, keep: bool) -> list[dict[str, Any]]:
    """Verify each release in a scratch directory (removed unless ``keep``); the records."""
    work = Path(tempfile.mkdtemp(prefix="verify-torch-"))
    started, records = time.perf_counter(), []
    try:
        sys.stderr.write(f"scratch {work}; torch {', '.join(versions)}\n")
        wheel = verify_floors.build_wheel(work)
        watch = sorted({*verify_floors.declared_requirements(), LIBRARY})
        for version in versions:
            rec = verify(version, wheel, work, watch)
            records.append(rec)
            sys.stderr.write(f"torch {version:<10} {rec['row']['result']} in {rec.get('seconds', '-')} s\n")
            if out:
                with out.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(rec) + "\n")
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    sys.stderr.write(f"{len(records)} releases in {round(time.perf_counter() - started)} s ({REPO})\n")
    return records


if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
