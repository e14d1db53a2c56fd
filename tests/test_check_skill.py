"""``palm-rlhf-skill check`` / scripts/check_skill.py: the docs-versus-library drift check."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from conftest import BIN, REPO, main_in_process, load_script, run, run_json
from skill_check import api, arguments, budget, citations, derived, generated, install_state, markdown, paths, skills
from skill_check import report as check_report
from skill_runtime import runner, version_gate

SCRIPT = REPO / "scripts" / "check_skill.py"
check = load_script(SCRIPT, "check_skill")
RECORD = version_gate.load_api_record()


def library_copy(tmp_path: Path, *edits: tuple[str, str, str]) -> Path:
    """A copy of the installed palm_rlhf_pytorch with textual edits, for PYTHONPATH (the real
    install is never touched). Each edit is (file, old, new); ``old`` must occur exactly once."""
    import palm_rlhf_pytorch
    lib = tmp_path / "lib"
    shutil.copytree(Path(palm_rlhf_pytorch.__file__).parent, lib / "palm_rlhf_pytorch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for file, old, new in edits:
        target = lib / "palm_rlhf_pytorch" / file
        text = target.read_text()
        assert text.count(old) == 1, (f"this test's edit of the library copy: {old!r} occurs {text.count(old)} times "
                                      f"in the installed palm_rlhf_pytorch/{file}, not once (upstream changed the line)")
        target.write_text(text.replace(old, new))
    return lib


def tree_copy(dest: Path, project: bool = False) -> Path:
    """A copy of the skill tree (what the wheel ships; with ``project``, also pyproject.toml, so it
    reads as a source checkout) at ``dest``, byte-code caches left out."""
    for item in install_state.TREE_ITEMS + (("pyproject.toml",) if project else ()):
        source = REPO / item
        if source.is_dir():
            shutil.copytree(source, dest / item, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / item)
    return dest


def edit_file(path: Path, old: str, new: str) -> None:
    """Replace the one occurrence of ``old`` in a copy's file (an edit a test makes to prove a check)."""
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, (f"this test's edit of {path.name}: {old!r} occurs {text.count(old)} times in the copy, "
                                  "not once: the doc's text moved; edit the test's old text to match it")
    path.write_text(text.replace(old, new), encoding="utf-8")


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
            homes.setdefault(m["symbol"] or m["table"], []).append(path.relative_to(REPO).as_posix())
    assert homes == {**{symbol: [OWNERS.get(symbol, API_REFERENCE)] for symbol in RECORD["api"]},
                     "torch-verified": ["references/installation.md"]}


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


@pytest.mark.slow  # starts a process: not in the quick tier
def test_check_exits_0_on_this_tree(empty_dir):
    """The issue's 'done when': the installed console script finds no drift."""
    proc, report = run_json([str(BIN / "palm-rlhf-skill"), "check", "--json", "--strict"], empty_dir)
    assert proc.returncode == 0, (report["drift"], report["version_drift"], report["moved"])
    assert report["status"] == "ok" and report["drift"] == [] and report["moved"] == []
    assert report["versions"]["palm-rlhf-pytorch"] == report["tested"]["palm-rlhf-pytorch"] == "0.8.0"
    assert report["counts"]["symbols"] == 8 and report["counts"]["generated_blocks"] == 9
    assert report["budget"]["parts"] and "claude_details" in report["budget"]  # the context budget
    assert list(empty_dir.iterdir()) == []


@pytest.mark.slow  # starts a process: not in the quick tier
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


@pytest.mark.slow  # starts a process: not in the quick tier
def test_fixed_trap_fails_its_canary_naming_the_section(tmp_path):
    """Fix the PPO max_norm bug in a library copy: its canary fails and names the doc section."""
    lib = library_copy(tmp_path, ("ppo.py", "self.accelerator.clip_grad_norm_(self.actor_critic.actor_parameters()",
                                  "self.accelerate.clip_grad_norm_(self.actor_critic.actor_parameters()"))
    lib_ppo = lib / "palm_rlhf_pytorch" / "ppo.py"
    lib_ppo.write_text(lib_ppo.read_text().replace("self.accelerator.clip", "self.accelerate.clip"))
    proc = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                "tests/test_canaries.py::test_ppo_max_norm[ppo]"], REPO, env={"PYTHONPATH": str(lib)})
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "traps-setup.md#ppo-max-norm" in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow  # starts a process: not in the quick tier
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
    assert any(w.startswith("palm-rlhf-pytorch 0.9.1 is outside >=0.8.0,<0.9") for w in report["warnings"])


def test_skills_ref_missing_exits_3(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "skills_ref.parser", None)  # import fails as if not installed
    assert runner.run_cli(check.main, []) == 3
    assert "skills-ref is not installed" in capsys.readouterr().err


@pytest.mark.slow  # starts a process: not in the quick tier
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


# --- the package: one module per check, a thin entry ---------------------------------------------

def test_checker_is_small_modules_behind_a_thin_entry():
    modules = sorted((REPO / "scripts" / "skill_check").glob("*.py"))
    assert {m.stem for m in modules} >= {"api", "arguments", "budget", "citations", "derived", "generated",
                                         "install_state", "markdown", "paths", "report", "skills"}
    sizes = {m.name: len(m.read_text(encoding="utf-8").splitlines()) for m in modules}
    assert max(sizes.values()) <= 600, sizes
    assert len(SCRIPT.read_text(encoding="utf-8").splitlines()) <= 150


# --- argument entries, citations, derived facts on this tree -------------------------------------

def test_every_argument_has_an_entry_in_the_reference_that_owns_it():
    drift, entries = arguments.check_arguments(RECORD, markdown.markdown_files())
    assert drift == [] and entries >= 100
    params = {(s, m, p["name"]) for s, e in RECORD["api"].items() for m, d in e["methods"].items() for p in d["params"]}
    assert len(params) >= 240  # every argument of the record, *args and **kwargs included


def test_every_reference_section_cites_its_library_lines():
    assert citations.uncited_sections(markdown.reference_files()) == []
    for key in citations.NO_LIBRARY_CLAIM:
        file, _, anchor = key.partition("#")
        assert not anchor or anchor in markdown.anchors(REPO / file), f"NO_LIBRARY_CLAIM names a missing section: {key}"
    # a short list: sections about this tree's own helpers (25: the run kit's training-run.md added 5;
    # 27: the layouts this tree reads and its input table, issues 35 and 38; 28: the second worked example;
    # 30: reports.md split into three files, issue 37)
    assert len(citations.NO_LIBRARY_CLAIM) <= 30


def test_citations_match_the_recorded_lines():
    """scripts/citations.json holds exactly the tree's citations, each as the installed code reads."""
    files = markdown.markdown_files()
    drift, moved, checked = citations.check_citations(files)
    assert drift == [] and moved == [] and checked >= 300
    assert citations.record_of(files) == citations.load_record(), \
        "scripts/citations.json is not the tree's: check the new citations, then run check_skill.py --write-citations"


def test_derived_facts_and_stated_defaults_match_the_library():
    installed = api.installed_api(RECORD)
    assert derived.check_facts(RECORD, installed, REPO) == []
    assert derived.check_default_claims(installed, markdown.markdown_files(), REPO) == []
    assert len(derived.FACTS) >= 50


def test_default_claims_are_read_from_prose():
    names = {"kl_div_loss_weight", "pad_value", "max_episodes", "update_timesteps"}
    text = ("`kl_div_loss_weight` of PPO's `RLHFTrainer` (default 0.7). With the default `pad_value=0`, ... "
            "`max_episodes` (a `train()` argument, default 4). Default `update_timesteps=5000`: ... "
            "`pad_value=-1` is a fix, not a default.")
    assert [(n, v) for _, n, v in derived.default_claims(text, names)] == [
        ("kl_div_loss_weight", "0.7"), ("max_episodes", "4"), ("pad_value", "0"), ("update_timesteps", "5000")]


def test_helper_flag_defaults_are_read_from_prose_and_parsers():
    """A helper's flag in prose next to "default": the nearest flag before it claims it, a flag
    with no known default included (so `--max-days` (default 30) is not a claim about `--seed`)."""
    text = "`--seed N` (default 1), `--json`. Flags: `--seed`, `--max-days` (default 30: too long)."
    assert [(n, v) for _, n, v in derived.default_claims(text, {"--seed"})] == [("--seed", "1")]
    flags = derived.helper_option_defaults(REPO)
    assert ("plan_run.py", 60.0) in flags["--probe-seconds"]  # None in the parser: its --help's "(default: 60)"
    assert ("tiny_rlhf_smoke.py", 0) in flags["--seed"] and ("tiny_rlhf_smoke.py", "ppo") in flags["--trainer"]


# --- the proofs: a changed library, an edited tree -----------------------------------------

REWARD_TRAPS = "sub-skills/policy-optimization/references/traps-rewards.md"
ROLLOUT_TRAPS = "sub-skills/policy-optimization/references/traps-rollouts.md"
WEIGHT_TRAPS = "sub-skills/policy-optimization/references/traps-weights.md"
SEL = "sub-skills/policy-optimization/references/trainer-selection.md"
GROUP_SIZE_PLACES = {f"{REWARD_TRAPS}#equal-rewards-group", f"{ROLLOUT_TRAPS}#printed-losses", f"{WEIGHT_TRAPS}#stored-probabilities-memory",
                     f"{WEIGHT_TRAPS}#group-size-per-rollout", f"{SEL}#decision-table", f"{SEL}#decision-points"}


def derived_places(report: dict) -> set[str]:
    return {d["file"] for d in report["drift"] if d["symbol"].startswith("derived fact")}


def default_edit(file: str, symbol: str, param: str, new: str) -> tuple[str, str, str]:
    """The library-copy edit that moves ``param``'s installed default (its line ``param = default,``
    in ``file``) to ``new``: written from the installed signature, so it follows upstream."""
    default = derived.defaults_of(api.installed_api(RECORD))(symbol, "__init__", param)
    return file, f"{param} = {default!r},", f"{param} = {new},"


@pytest.mark.parametrize("edit, places", [
    (("grpo.py", "grpo.RLHFTrainer", "grpo_num_times_sample_rewards", "7"), GROUP_SIZE_PLACES),
    (("flowrl.py", "flowrl.FlowRLTrainer", "beta", "10.5"),
     {f"{REWARD_TRAPS}#equal-rewards-group", f"{ROLLOUT_TRAPS}#flowrl-printed-balance", f"{ROLLOUT_TRAPS}#flowrl-probabilities", f"{SEL}#decision-points"}),
], ids=["grpo-group-size", "flowrl-beta"])
@pytest.mark.slow  # starts a process: not in the quick tier
def test_changed_default_names_every_stale_place(tmp_path, empty_dir, edit, places):
    """Issue 21: a library whose default moved names every section whose prose follows from it."""
    lib = library_copy(tmp_path, default_edit(*edit))
    proc, report = run_json([sys.executable, str(SCRIPT), "--json", "--allow-untested"], empty_dir,
                            env={"PYTHONPATH": str(lib)})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert derived_places(report) == places, sorted(derived_places(report) ^ places)
    lines = [check_report.drift_line(d) for d in report["drift"] if d["symbol"].startswith("derived fact")]
    assert lines and all(": documented " in line and "installed defaults give " in line for line in lines), lines
    if edit[0] == "grpo.py":
        group = derived.defaults_of(api.installed_api(RECORD))(edit[1], "__init__", edit[2]) + 1
        assert (f"{REWARD_TRAPS}#equal-rewards-group: derived fact grpo_group: documented \"GRPO's default group of {group}\", "
                "installed defaults give \"GRPO's default group of 8\"") in " ".join(lines), lines


@pytest.mark.slow  # starts a process: not in the quick tier
def test_edited_cited_code_names_the_sections_citing_it(tmp_path, empty_dir):
    lib = library_copy(tmp_path, ("grpo.py", "    assert (den >= 0).all()\n", "    assert (den >= 0.).all()\n"))
    proc, report = run_json([sys.executable, str(SCRIPT), "--json", "--allow-untested"], empty_dir,
                            env={"PYTHONPATH": str(lib)})
    assert proc.returncode == 1, proc.stderr[-2000:]
    cited = [d for d in report["drift"] if d["symbol"] == "citation palm_rlhf_pytorch/grpo.py:204"]
    run_doc = "sub-skills/policy-optimization/references/training-run.md"
    assert sorted(d["file"] for d in cited) == [f"{run_doc}#non-finite-rewards", f"{REWARD_TRAPS}#group-of-one"], report["drift"]
    assert "assert (den >= 0.).all()" in cited[0]["installed"] and "changed at line 204" in cited[0]["installed"]


@pytest.mark.slow  # starts a process: not in the quick tier
def test_an_edited_line_inside_a_cited_range_is_named(tmp_path, empty_dir):
    """A change in the middle of a cited range: the drift names that line and its new text, not
    the range's unchanged first line."""
    lib = library_copy(tmp_path, ("grpo.py", "                    prompt_mask = prompt_mask,\n                    mask = mask,\n                )",
                                  "                    prompt_mask = prompt_mask,\n                    mask = mask & True,\n                )"))
    proc, report = run_json([sys.executable, str(SCRIPT), "--json", "--allow-untested"], empty_dir,
                            env={"PYTHONPATH": str(lib)})
    assert proc.returncode == 1, proc.stderr[-2000:]
    cited = [d for d in report["drift"] if d["symbol"].endswith("grpo.py:650-654")]
    assert cited and all("changed at line 653: 'mask = mask & True,'" in d["installed"] for d in cited), report["drift"]


@pytest.mark.slow  # starts a process: not in the quick tier
def test_edited_tree_copy_names_each_kind_of_drift(tmp_path, empty_dir):
    """A copy of the tree checks itself: a deleted argument row, a wrong default in the glossary,
    an argument row citing unrelated lines, a citation moved to unrecorded lines, a section
    without a citation, an edited derived number and a wrong default of a helper's flag each
    fail, naming file and section."""
    tree = tree_copy(tmp_path / "tree")
    ar = tree / arguments.API_REFERENCE
    text = ar.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `eps_clip` |"))
    edit_file(ar, row + "\n", "")
    edit_file(ar, "| `grpo.py:485` |", "| `grpo.py:486` |")
    edit_file(tree / "references/glossary.md", "(default 0.1)", "(default 0.7)")
    edit_file(tree / REWARD_TRAPS, "`safe_div`, `palm_rlhf_pytorch/grpo.py:204`", "`safe_div`, `palm_rlhf_pytorch/grpo.py:205`")
    edit_file(tree / "sub-skills/policy-optimization/references/distributed.md", "\n## Seeding\n",
              "\n## A new claim\nGRPO shards the prompts.\n\n## Seeding\n")
    edit_file(tree / SEL, "(11 by default)", "(12 by default)")
    edit_file(tree / "references/installation.md", "`--seed` (default 0)", "`--seed` (default 1)")
    proc, report = run_json([sys.executable, str(tree / "scripts" / "check_skill.py"), "--json"], empty_dir)
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = [check_report.drift_line(d) for d in report["drift"]]
    for symbol in ("palm_rlhf_pytorch.RLHFTrainer", "palm_rlhf_pytorch.grpo.RLHFTrainer",
                   "palm_rlhf_pytorch.flowrl.FlowRLTrainer"):
        assert (f"{arguments.API_REFERENCE}: {symbol}.__init__(eps_clip): documented no behaviour entry, "
                "installed an argument (default 0.2)") in lines, lines
    want = ["references/glossary.md#glossary: default of `kl_div_loss_weight`: documented 0.7, installed 0.1",
            f"{arguments.API_REFERENCE}:", "argument entry `epochs`: citation grpo.py:486",
            f"{REWARD_TRAPS}#group-of-one: citation palm_rlhf_pytorch/grpo.py:205: documented lines not yet recorded, installed no entry in scripts/citations.json",
            "distributed.md#a-new-claim: section citations: documented 'A new claim' cites no library lines",
            f"{SEL}#decision-points: derived fact grpo_group",
            "references/installation.md#helpers: default of `--seed`: documented 1, installed 0 ("]
    for piece in want:
        assert any(piece in line for line in lines), (piece, lines)


def test_stale_install_says_reinstall(tmp_path, capsys, monkeypatch):
    """Issue 22: check run from a checkout whose installed copy differs says so, and what to do
    (this tree's check, ``main([])`` in-process, run from inside the edited checkout)."""
    checkout = tree_copy(tmp_path / "checkout", project=True)
    (checkout / "references" / "glossary.md").write_text("# Glossary\n\nedited\n", encoding="utf-8")
    _, out, _ = main_in_process(check.main, capsys, monkeypatch, checkout / "references")
    out = out.splitlines()
    warning = next(line for line in out if line.startswith("warning: stale install"))
    assert f"checkout at {checkout}" in warning and "references/glossary.md" in warning and "reinstall" in warning
    assert "reinstall from the checkout" in out[-1], out[-1]
    state = install_state.install_state(REPO, checkout)
    assert state["stale"] and state["differing"] == ["references/glossary.md"]
    same = tree_copy(tmp_path / "same", project=True)
    assert install_state.install_state(REPO, same)["stale"] is False
    assert install_state.install_state(REPO, REPO)["checkout"] is None  # run from the tree it checks


def test_version_mentions_follow_the_record():
    files = markdown.markdown_files()
    assert derived.check_version_mentions(RECORD, files) == []
    moved = {**RECORD, "tested_version": "0.8.1"}
    named = {d["file"] for d in derived.check_version_mentions(moved, files)}
    assert {"SKILL.md#palm-rlhf-pytorch", "references/glossary.md#glossary"} <= named, sorted(named)


# --- issue 29: citations anchored in content; a user's other versions warn, --strict fails -------

def shifted(monkeypatch, package: str, edit=lambda lines: lines, by: int = 7) -> None:
    """The installed sources as a release of ``package`` would show them: ``by`` new lines at the
    top of each of its files (every cited line moves), then ``edit`` applied to the lines."""
    real = citations.source_lines

    def source_lines(path: str):
        lines = real(path)
        if lines is None or not citations.qualified(path).startswith(package + "/"):
            return lines
        return edit(tuple(f"# new line {i}" for i in range(by)) + lines)
    monkeypatch.setattr(citations, "source_lines", source_lines)


def accelerate_citations() -> list[str]:
    return [c.key for md in markdown.markdown_files() for c in citations.citations(md) if c.path.startswith("accelerate/")]


def test_a_release_that_only_moves_cited_lines_is_moved_not_drift(monkeypatch):
    """Every cited accelerate range 7 lines down: each is found at its new lines (moved), nothing
    is drift; exit 0, and 1 under --strict (CI: the docs cite the pinned lines exactly)."""
    shifted(monkeypatch, "accelerate")
    report = check_report.run_checks()
    assert report["drift"] == [] and report["version_drift"] == [], report["drift"]
    assert report["status"] == "moved" and report["exit_code"] == 0
    assert len(report["moved"]) == len(accelerate_citations()) >= 12
    for m in report["moved"]:
        old = citations.parse_spans(m["citation"].split(":")[1])
        assert citations.parse_spans(m["now"].split(":")[1]) == tuple((a + 7, b + 7) for a, b in old), m
    text = check_report.summary(report)
    assert "moved: accelerate/state.py:747-756 is at accelerate/state.py:754-763 in the installed accelerate" in text
    assert text.splitlines()[-1].startswith("check: OK (exit 0)")
    strict = check_report.run_checks(strict=True)
    assert strict["exit_code"] == 1 and "check_skill.py --write-citations" in check_report.summary(strict).splitlines()[-1]


def test_write_citations_rewrites_moved_citations_in_place(monkeypatch, tmp_path):
    """--write-citations relocates a moved citation without review, as it was written."""
    doc = tmp_path / "distributed.md"
    shutil.copy2(REPO / "sub-skills/policy-optimization/references/distributed.md", doc)
    shifted(monkeypatch, "accelerate")
    moves = citations.relocate([doc])
    assert {(m["citation"], m["now"]) for m in moves} >= {("accelerate/state.py:747-756", "accelerate/state.py:754-763")}
    text = doc.read_text(encoding="utf-8")
    assert "`accelerate/state.py:754-763`" in text and "accelerate/state.py:747-756" not in text
    assert citations.relocate([doc]) == []  # the record still holds the old keys: nothing more moves


def test_a_changed_cited_line_is_drift_at_the_pinned_version(monkeypatch):
    """A cited line whose text changed (not found anywhere else) is drift, exit 1, even with moves."""
    shifted(monkeypatch, "accelerate", lambda lines: tuple(
        "            elif int(os.environ.get('LOCAL_RANK', -1)) != -1:" if "!= -1 and not cpu" in line else line
        for line in lines))
    report = check_report.run_checks()
    assert report["exit_code"] == 1 and report["status"] == "drift"
    assert [d["symbol"] for d in report["drift"]] == ["citation accelerate/state.py:747-756"], report["drift"]
    assert report["drift"][0]["file"].endswith("distributed.md#launching")


def test_another_installed_version_warns_naming_the_sections(monkeypatch):
    """A user with another accelerate whose cited code changed: a warning naming each section,
    exit 0; --strict (maintainers, CI) exits 1."""
    shifted(monkeypatch, "accelerate", lambda lines: tuple(
        line.replace("!= -1 and not cpu", "!= -1") for line in lines))
    real = version_gate.installed_version
    monkeypatch.setattr(version_gate, "installed_version", lambda d: "1.15.0" if d == "accelerate" else real(d))
    report = check_report.run_checks()
    assert report["drift"] == [] and report["status"] == "version_drift" and report["exit_code"] == 0
    assert report["pinned"] == {"accelerate": {"installed": "1.15.0", "pinned": RECORD["tested_with"]["accelerate"]}}
    lines = check_report.summary(report).splitlines()
    warning = next(line for line in lines if line.startswith("warning: accelerate 1.15.0 is installed"))
    assert "sub-skills/policy-optimization/references/distributed.md#launching" in warning
    assert "cited range(s) stand at other lines" in warning
    assert lines[-1].startswith("check: VERSION DRIFT (exit 0)")
    assert check_report.run_checks(strict=True)["exit_code"] == 1


def test_strict_is_in_the_help():
    text = " ".join(check.build_parser().format_help().split())
    assert "check_skill.py --strict" in text and "--strict makes that 1" in text


def test_project_files_the_docs_may_name_exist_in_the_repository():
    """Files of the source project that the wheel's tree does not ship may be named in the docs
    (paths.PROJECT_FILES): each must exist here, so a rename is not silently exempt."""
    assert all((REPO / name).is_file() for name in paths.PROJECT_FILES), paths.PROJECT_FILES
