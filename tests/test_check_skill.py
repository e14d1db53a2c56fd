"""``palm-rlhf-skill check`` / scripts/check_skill.py: the docs-versus-library drift check."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BIN, REPO, load_script, run, run_json
from skill_check import api, budget, generated, markdown, paths, skills
from skill_check import report as check_report
from skill_runtime import runner, version_gate

SCRIPT = REPO / "scripts" / "check_skill.py"
check = load_script(SCRIPT, "check_skill")
RECORD = version_gate.load_api_record()


def library_copy(tmp_path: Path, edit: tuple[str, str, str]) -> Path:
    """A copy of the installed palm_rlhf_pytorch with one textual edit, for PYTHONPATH (the real
    install is never touched). ``edit`` is (file, old, new); ``old`` must occur exactly once."""
    import palm_rlhf_pytorch
    lib = tmp_path / "lib"
    shutil.copytree(Path(palm_rlhf_pytorch.__file__).parent, lib / "palm_rlhf_pytorch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    target = lib / "palm_rlhf_pytorch" / edit[0]
    text = target.read_text()
    assert text.count(edit[1]) == 1, f"{edit[1]!r} not unique in {edit[0]}"
    target.write_text(text.replace(edit[1], edit[2]))
    return lib


def test_record_matches_installed_library():
    assert api.compare_api(RECORD, api.installed_api(RECORD)) == []
    assert len(RECORD["api"]) == 8
    assert {"tested_version", "supported", "tested_with", "library"} <= RECORD.keys()


# One home per symbol: the sub-skill that owns it; api-reference.md keeps ActorCritic and the trainers.
OWNERS = {"palm_rlhf_pytorch.PaLM": "sub-skills/palm-modeling/references/palm-api.md",
          "palm_rlhf_pytorch.RewardModel": "sub-skills/reward-modeling/references/reward-api.md",
          "palm_rlhf_pytorch.ImplicitPRM": "sub-skills/reward-modeling/references/implicit-prm.md"}
API_REFERENCE = "sub-skills/policy-optimization/references/api-reference.md"


def test_reference_equals_rendering_of_record():
    files = markdown.markdown_files()
    assert generated.compare_docs(RECORD, files) == []
    homes = {}
    for path in files:
        for m in generated.generated_blocks(path.read_text(encoding="utf-8")):
            homes.setdefault(m["symbol"], []).append(path.relative_to(REPO).as_posix())
    assert homes == {symbol: [OWNERS.get(symbol, API_REFERENCE)] for symbol in RECORD["api"]}


def test_record_json_is_the_canonical_formatting():
    assert api.record_json(RECORD) == (REPO / "scripts" / "api_record.json").read_text()


def test_skill_files_validate_with_skills_ref(tmp_path):
    import skills_ref
    found = markdown.skill_files()
    assert {p.relative_to(REPO).as_posix() for p in found} >= {"SKILL.md", "sub-skills/policy-optimization/SKILL.md"}
    assert skills.validate_skills(found) == []
    if REPO.name != skills.ROOT_SKILL_NAME:  # without the symlink the root fails on its folder name
        assert any("must match skill name" in e for e in skills_ref.validate(REPO))
    bad = tmp_path / "bad-skill"
    bad.mkdir()
    (bad / "SKILL.md").write_text("---\nname: bad-skill\ndescription: x\nfoo: 1\n---\nbody\n")
    assert any("foo" in d["installed"] for d in skills.validate_skills([bad / "SKILL.md"]))


def test_broken_link_path_and_anchor_are_drift(tmp_path):
    md = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading\n")
    md.write_text("[ok](there.md#a-heading) [gone](missing.md) [anchor](there.md#nope) `nope/file.py`\n"
                  "```bash\npython scripts/also_missing.py --json\n```\n")
    drift, checked = paths.check_paths([md])
    symbols = sorted(d["symbol"] for d in drift)
    assert symbols == ["link missing.md", "link there.md#nope", "path nope/file.py",
                       "path scripts/also_missing.py"] and checked == 5


def test_check_exits_0_on_this_tree(empty_dir):
    """The issue's 'done when': the installed console script finds no drift."""
    proc, report = run_json([str(BIN / "palm-rlhf-skill"), "check", "--json"], empty_dir)
    assert proc.returncode == 0, report["drift"]
    assert report["status"] == "ok" and report["drift"] == []
    assert report["versions"]["palm-rlhf-pytorch"] == report["tested"]["palm-rlhf-pytorch"] == "0.8.0"
    assert report["counts"]["symbols"] == 8 and report["counts"]["generated_blocks"] == 8
    assert report["budget"]["parts"] and "claude_details" in report["budget"]  # the context budget
    assert list(empty_dir.iterdir()) == []


def test_edited_default_in_library_copy_exits_1(tmp_path, empty_dir):
    lib = library_copy(tmp_path, ("ppo.py", "eps_clip = 0.2,", "eps_clip = 0.3,"))
    proc = run([sys.executable, str(SCRIPT), "--json"], empty_dir, env={"PYTHONPATH": str(lib)})
    assert proc.returncode == 3 and "--allow-untested runs with it" in proc.stderr, proc.stderr[-2000:]
    proc, report = run_json([sys.executable, str(SCRIPT), "--json", "--allow-untested"], empty_dir,
                            env={"PYTHONPATH": str(lib)})
    assert proc.returncode == 1 and report["status"] == "drift", proc.stderr[-2000:]
    line = ("scripts/api_record.json: palm_rlhf_pytorch.RLHFTrainer.__init__(eps_clip): "
            "documented default 0.2, installed default 0.3")
    assert line in [check_report.drift_line(d) for d in report["drift"]], report["drift"]  # the text-mode line
    # the copy shadows the installed library: refused (exit 3) unless --allow-untested, then compared and said
    assert any(w.startswith(f"{lib / 'palm_rlhf_pytorch'} shadows the installed palm_rlhf_pytorch")
               for w in report["warnings"]), report["warnings"]
    assert list(empty_dir.iterdir()) == []


def test_fixed_trap_fails_its_canary_naming_the_section(tmp_path):
    """Fix the PPO max_norm bug in a library copy: its canary fails and names the doc section."""
    lib = library_copy(tmp_path, ("ppo.py", "self.accelerator.clip_grad_norm_(self.actor_critic.actor_parameters()",
                                  "self.accelerate.clip_grad_norm_(self.actor_critic.actor_parameters()"))
    lib_ppo = lib / "palm_rlhf_pytorch" / "ppo.py"
    lib_ppo.write_text(lib_ppo.read_text().replace("self.accelerator.clip", "self.accelerate.clip"))
    proc = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "tests/test_canaries.py::test_ppo_max_norm[ppo]"], REPO, env={"PYTHONPATH": str(lib)})
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "troubleshooting.md#ppo-max-norm" in proc.stdout, proc.stdout[-3000:]


def test_help_and_usage_error_without_torch():
    code = ("import runpy, sys; sys.argv = ['check_skill.py', '--help']\n"
            "try:\n    runpy.run_path(sys.argv.pop(1) if False else %r, run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0\n"
            "assert 'torch' not in sys.modules and 'palm_rlhf_pytorch' not in sys.modules\n" % str(SCRIPT))
    proc = run([sys.executable, "-c", code], REPO)
    assert proc.returncode == 0 and "exit codes" in proc.stdout, proc.stderr
    proc = run([sys.executable, str(SCRIPT), "--bogus"], REPO)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_library_missing_exits_3(monkeypatch, capsys):
    real = version_gate.installed_version
    monkeypatch.setattr(version_gate, "installed_version", lambda d: None if d == "palm-rlhf-pytorch" else real(d))
    assert runner.run_cli(check.main, []) == 3
    assert "palm-rlhf-pytorch is not installed" in capsys.readouterr().err


def test_untested_version_warns(monkeypatch):
    real = version_gate.installed_version
    monkeypatch.setattr(version_gate, "installed_version", lambda d: "0.9.1" if d == "palm-rlhf-pytorch" else real(d))
    report = check_report.run_checks()
    assert any("outside the tested range" in w for w in report["warnings"])


def test_skills_ref_missing_exits_3(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "skills_ref.parser", None)  # import fails as if not installed
    assert runner.run_cli(check.main, []) == 3
    assert "skills-ref is not installed" in capsys.readouterr().err


def test_write_docs_refuses_an_installed_copy(empty_dir):
    from conftest import BIN, run
    proc = run([str(BIN / "palm-rlhf-skill"), "check", "--write-docs"], empty_dir)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "source checkout" in proc.stderr


# --- context budget ----------------------------------------------------------------------------------

def test_budget_table_rows_name_existing_references():
    references = {markdown.rel(p) for p in markdown.markdown_files() if "references" in p.relative_to(REPO).parts}
    listed = set(budget.BUDGET["reference tokens"]) - {"*"}
    assert listed == references, "one row per reference in BUDGET (scripts/check_skill.py)"


def test_budget_rows_cover_every_part_an_agent_loads():
    rows, drift = budget.context_budget(markdown.markdown_files())
    assert drift == []
    parts = {(r["file"], r["part"]) for r in rows}
    bodies = {markdown.rel(p) for p in markdown.skill_files()}
    assert parts == ({("SKILL.md", "name and description (always loaded)")}
                     | {(s, "body") for s in bodies}
                     | {(f, "reference") for f in budget.BUDGET["reference tokens"] if f != "*"})
    always = next(r for r in rows if r["part"].startswith("name and description"))
    meta, _ = skills.frontmatter_and_body(REPO / "SKILL.md")
    assert always["chars"] == len(meta["name"]) + len(meta["description"]) and always["tokens"] == -(-always["chars"] // 4)


@pytest.mark.parametrize("key, file", [
    ("root description chars", "SKILL.md"),
    ("body lines", "sub-skills/policy-optimization/SKILL.md"),
    ("body tokens", "sub-skills/reward-modeling/SKILL.md"),
    ("sub-skills/policy-optimization/references/workflows.md", "sub-skills/policy-optimization/references/workflows.md"),
])
def test_over_budget_is_drift_and_exit_1(monkeypatch, capsys, key, file):
    limits = {**budget.BUDGET, "reference tokens": dict(budget.BUDGET["reference tokens"])}
    if key in limits:
        limits[key] = 10
    else:
        limits["reference tokens"][key] = 10
    monkeypatch.setattr(budget, "BUDGET", limits)
    assert runner.run_cli(check.main, []) == 1
    out, err = capsys.readouterr()
    lines = [line for line in out.splitlines() if line.startswith(f"{file}: context budget")]
    assert len(lines) >= 1 and "documented" in lines[0], out
    assert f"OVER {file}" in out and "context budget" in out and err == ""  # the report is on stdout
    assert out.splitlines()[-1].startswith("check: DRIFT (exit 1): ")  # the verdict last


def test_readme_states_the_budget_limits():
    layout = (REPO / "README.md").read_text(encoding="utf-8").split("## Layout", 1)[1]
    text = " ".join(layout.split())
    assert f"limit {budget.BUDGET['root description chars']:,} characters of description" in text
    assert (f"limit under {budget.BUDGET['body lines'] + 1} lines and {budget.BUDGET['body tokens']:,} tokens"
            in text)
    limits = [v for k, v in budget.BUDGET["reference tokens"].items() if k != "*"]
    assert f"limits {min(limits):,}-{max(limits):,} per file" in text
