"""Every declared lower bound is a version someone verified (issue 15, item 1).

The record is the table tools/verify_floors.py printed, kept in
references/installation.md#verified-floors. pyproject.toml is the one source of the package's
own bounds; these tests tie the record, pyproject, doctor's checks and the run-time torch gate
together. (The script itself installs packages from the network, so the suite does not run it.)
"""
from __future__ import annotations

import json
import re
import sys
import tomllib

import pytest
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import verify_floors  # noqa: E402

from palm_rlhf_skill import doctor  # noqa: E402
from skill_runtime import version_gate

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
RECORD = json.loads((REPO / "scripts" / "api_record.json").read_text(encoding="utf-8"))


def recorded_tables() -> list[list[list[str]]]:
    """The tables of installation.md's "Verified floors" section, as rows of cells (header first)."""
    text = (REPO / "references" / "installation.md").read_text(encoding="utf-8")
    section = text.split("\n## Verified floors\n", 1)[1].split("\n## ", 1)[0]
    tables = [block for block in section.split("\n\n") if block.startswith("| ")]
    return [[[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in block.splitlines()
             if not line.startswith("| ---")] for block in tables]


def recorded_floors() -> dict[str, dict[str, str]]:
    """The floors table: {dependency: row}."""
    header, *body = recorded_tables()[0]
    assert header == ["dependency", "declared", "floor", "result at the floor"]
    return {row[0]: dict(zip(header, row)) for row in body}


def recorded_failures() -> list[tuple[str, str]]:
    """The versions below a floor that the record shows failing: [(name, version)]."""
    header, *body = recorded_tables()[1]
    assert header == ["tried", "result"]
    return [tuple(row[0].split("==")) for row in body if row[1].startswith("FAIL")]


def test_every_declared_floor_is_recorded_and_passed():
    requirements = verify_floors.declared_requirements()
    record = recorded_floors()
    assert set(record) == {"python", *requirements}, "rerun tools/verify_floors.py --markdown"
    for name, spec in requirements.items():
        floor = verify_floors.floor_of(spec)
        row = record[name]
        if floor is None:
            assert row["floor"] == "-" and row["result at the floor"].startswith("no floor declared"), row
        else:
            assert row["floor"] == floor and row["result at the floor"].startswith("pass"), row
    python = record["python"]
    assert python["floor"] == verify_floors.floor_of_python(PROJECT["requires-python"])
    assert python["result at the floor"].startswith(f"pass ({python['floor']}.")


def test_doctor_checks_what_pyproject_and_the_library_declare():
    """doctor reads the installed metadata: it must hold pyproject.toml's bounds (reinstall after
    editing them), merged with palm-rlhf-pytorch's exactly as the floors script merges them."""
    ours = verify_floors.declared_requirements()
    theirs = {name: entry["specifier"] for name, entry in doctor.declared_requirements().items()}
    assert theirs == ours


@pytest.mark.parametrize("name, below", recorded_failures())
def test_a_version_below_a_verified_floor_is_not_fit(capsys, monkeypatch, tmp_path, name, below):
    """Versions the record shows failing (or not installable) are a failed doctor check, exit 1;
    before, doctor called them fit."""
    real = doctor.version_gate.installed_version
    monkeypatch.setattr(version_gate, "installed_version", lambda dist: below if dist == name else real(dist))
    monkeypatch.chdir(tmp_path)
    assert doctor.main(["--json"]) == 1
    deps = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}["dependencies"]
    assert deps["status"] == "fail" and f"{name}: {below} is outside" in deps["detail"], deps


def test_torch_gate_is_the_library_requirement_and_the_floor_the_lowest_verified():
    """Issue 29: the helpers refuse only a torch below palm-rlhf-pytorch's own requirement (the
    record's torch_supported, as the installed library declares it); the package asks for the
    lowest torch release verified, so pip keeps a user's working torch; SKILL.md's compatibility
    line says both and lists the verified releases (the record the gate reads)."""
    declared = SpecifierSet(next(r for r in PROJECT["dependencies"] if re.match(r"torch\b(?!-)", r))[len("torch"):])
    library = doctor.declared_requirements()["torch"]["declared"]["palm-rlhf-pytorch"]
    assert SpecifierSet(RECORD["torch_supported"]) == library
    verified = version_gate.verified_torch(RECORD)
    assert verify_floors.floor_of(declared) == verified[0], "pyproject.toml's torch floor: the lowest release verified"
    compatibility = re.search(r"^compatibility: (.*)$", (REPO / "SKILL.md").read_text(encoding="utf-8"),
                              re.MULTILINE).group(1)
    python_floor = verify_floors.floor_of_python(PROJECT["requires-python"])
    assert f"Python {python_floor}+" in compatibility
    assert f"torch {RECORD['torch_supported']} (verified {', '.join(verified)})" in compatibility
    assert f"palm-rlhf-pytorch {RECORD['supported']}" in compatibility


def test_pins_are_the_records_tested_versions():
    """constraints.txt (what CI installs) pins exactly the versions the record says the docs were
    checked with, and every package whose code the docs cite is pinned in both."""
    from skill_check import citations, markdown
    pins = dict(line.split("==") for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines()
                if line and not line.startswith("#"))
    pins = {canonicalize_name(k): v for k, v in pins.items()}
    tested = {canonicalize_name(k): v for k, v in RECORD["tested_with"].items() if k != "python"}
    assert pins["palm-rlhf-pytorch"] == RECORD["tested_version"]
    assert {k: pins.get(k) for k in tested} == tested
    cited = {citations.package_of(c.path) for md in markdown.markdown_files() for c in citations.citations(md)}
    assert cited - {canonicalize_name(RECORD["library"])} <= tested.keys(), "pin every cited package in tested_with"
    assert f"{sys.version_info.major}.{sys.version_info.minor}" == RECORD["tested_with"]["python"]


def test_gated_requirement_floors_are_the_declared_and_verified_floors():
    """Issue 22, item 3: every helper gates accelerate on the floor pyproject.toml declares and
    the record verified (a version below it fails inside the library); installation.md says so."""
    gated = RECORD["requirements_supported"]
    assert set(gated) == {"accelerate"}
    declared = verify_floors.declared_requirements()
    floors = recorded_floors()
    text = " ".join((REPO / "references" / "installation.md").read_text(encoding="utf-8").split())
    for name, spec in gated.items():
        assert SpecifierSet(spec) == declared[name], (name, spec, declared[name])
        assert floors[name]["floor"] == verify_floors.floor_of(SpecifierSet(spec))
        assert any(f == name for f, _ in recorded_failures()), f"no recorded failure below {name}'s floor"
        assert f"gates {name} on its verified floor `{spec}` (`requirements_supported`" in text
        assert RECORD["tested_with"][name] in SpecifierSet(spec)
