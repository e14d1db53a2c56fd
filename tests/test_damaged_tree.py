"""A damaged copy of the skill tree (issue 22, item 1): a deleted or broken file is one stderr
line naming it, saying "reinstall the skill tree", and exit 2, never a traceback and exit 1.

Both ways in are run for real on a copy: the console scripts (``palm_rlhf_skill.cli``, here from a
copy of the package whose ``skill/`` is the damaged tree, as in the wheel) and a script run by path
from the copy. The mechanism is one hook (``skill_runtime.report_damaged_tree``, installed when the
runtime is imported) plus, for the runtime's own ``__init__.py``, ``skill_bootstrap``, the module
every entry script imports first with the same line, checked word for word here.
"""
from __future__ import annotations

import ast
import re
import shutil
import sys
from pathlib import Path

import pytest

import palm_rlhf_skill
import skill_bootstrap
import skill_runtime
from conftest import REPO, one_error_line, run
from palm_rlhf_skill import install as inst
from skill_runtime import reporting

POLICY = "sub-skills/policy-optimization/scripts"
SMOKE = f"{POLICY}/tiny_rlhf_smoke.py"
PLAN = f"{POLICY}/plan_run.py"
FIRST_RUN = "sub-skills/policy-optimization/assets/first-run/run.toml"
SMOKE_ARGS = ["--construct-only", "--device", "cpu", "--json"]
CONSOLE = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from palm_rlhf_skill import cli; "
           "sys.argv[0] = sys.argv.pop(1); sys.exit(getattr(cli, sys.argv.pop(1))())")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A copy of this package with the skill tree under ``skill/``, the wheel's layout."""
    pkg = tmp_path_factory.mktemp("pristine") / "palm_rlhf_skill"
    shutil.copytree(Path(palm_rlhf_skill.__file__).parent, pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "skill"))
    (pkg / "skill").mkdir()
    inst._copy_tree(REPO, pkg / "skill")
    return pkg


@pytest.fixture
def copy(pristine, tmp_path) -> Path:
    """A fresh copy of the package (and so of the tree) to damage; returns the folder above it."""
    shutil.copytree(pristine, tmp_path / "site" / "palm_rlhf_skill")
    (tmp_path / "cwd").mkdir()
    return tmp_path / "site"


def tree(site: Path) -> Path:
    return site / "palm_rlhf_skill" / "skill"


def console(site: Path, command: str, *args: str, timeout: int = 300):
    """``command`` (``tiny-rlhf-smoke`` or ``palm-rlhf-skill``) as its console script runs it, from
    the copy of the package in ``site``."""
    function = {"tiny-rlhf-smoke": "tiny_rlhf_smoke", "palm-rlhf-skill": "main"}[command]
    return run([sys.executable, "-c", CONSOLE, str(site), command, function, *args], site.parent / "cwd",
               timeout=timeout)


def by_path(site: Path, script: str, *args: str, timeout: int = 300):
    return run([sys.executable, str(tree(site) / script), *args], site.parent / "cwd", timeout=timeout)


def assert_reported(proc, named: Path | str, *also: str) -> str:
    """Exit 2 and one stderr line naming ``named`` and saying to reinstall; nothing left in cwd."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    line = one_error_line(proc.stderr)
    assert ": error: " in line and str(named) in line and line.endswith("(reinstall the skill tree)"), line
    for words in also:
        assert words in line, line
    return line


def entry_points(site: Path) -> dict[str, object]:
    """The four entry points of the issue, each failing at import for a damage there."""
    return {
        "tiny-rlhf-smoke": lambda: console(site, "tiny-rlhf-smoke", *SMOKE_ARGS),
        "by path": lambda: by_path(site, SMOKE, *SMOKE_ARGS),
        "plan": lambda: console(site, "palm-rlhf-skill", "plan", "--config", str(tree(site) / FIRST_RUN), "--json"),
        "train": lambda: console(site, "palm-rlhf-skill", "train", "--config", str(tree(site) / FIRST_RUN),
                                 "--run-dir", str(site.parent / "run"), "--json"),
        "check": lambda: console(site, "palm-rlhf-skill", "check", "--json"),
    }


# --- each kind of damage, through several entry points -------------------------------------------

@pytest.mark.parametrize("module", ["exits.py", "runner.py", "version_gate.py"])
def test_a_deleted_runtime_module_is_one_line_for_every_entry_point(copy, module):
    missing = tree(copy) / "scripts" / "skill_runtime" / module
    missing.unlink()
    for name, start in entry_points(copy).items():
        assert_reported(start(), missing, "missing")
    assert list((copy.parent / "cwd").iterdir()) == []


def test_a_deleted_runtime_init_is_one_line_for_every_entry_point(copy):
    """The hook lives in that file, so the entry scripts' own lines (and palm_rlhf_skill.runtime,
    for the console scripts) report it."""
    missing = tree(copy) / "scripts" / "skill_runtime" / "__init__.py"
    missing.unlink()
    for name, start in entry_points(copy).items():
        assert_reported(start(), missing)
    assert_reported(console(copy, "palm-rlhf-skill", "doctor"), missing)


def test_a_deleted_bootstrap_is_one_line_from_the_console_scripts(copy):
    """The console scripts import the bootstrap through palm_rlhf_skill.runtime, which reports it.
    (Run by path, a copy without it is Python's to report, as a script's own syntax error is:
    skill_bootstrap's docstring.)"""
    missing = tree(copy) / "scripts" / "skill_bootstrap.py"
    missing.unlink()
    for name in ("tiny-rlhf-smoke", "plan", "check"):
        assert_reported(entry_points(copy)[name](), missing)


def test_a_syntax_error_in_the_runtime_init_is_one_line(copy):
    broken = tree(copy) / "scripts" / "skill_runtime" / "__init__.py"
    broken.write_text(broken.read_text(encoding="utf-8") + "\ndef broken(:\n", encoding="utf-8")
    assert_reported(by_path(copy, SMOKE, *SMOKE_ARGS), broken)
    assert_reported(console(copy, "palm-rlhf-skill", "check"), broken)


def test_a_deleted_ddp_fixes_is_one_line_without_nproc(copy):
    """ddp_fixes.py is imported by every smoke run, not only with --nproc."""
    (tree(copy) / "scripts" / "ddp_fixes.py").unlink()
    for proc in (by_path(copy, SMOKE, *SMOKE_ARGS), console(copy, "tiny-rlhf-smoke", *SMOKE_ARGS)):
        assert_reported(proc, "ddp_fixes.py", "module ddp_fixes is missing",
                        "imported by sub-skills/policy-optimization/scripts/policy_optimization/smoke/settings.py:")


def test_a_deleted_rule_reward_is_one_line_from_plan(copy):
    """plan imports rule_reward.py when it builds the config's rule reward (the first-run config)."""
    (tree(copy) / "sub-skills" / "reward-modeling" / "scripts" / "rule_reward.py").unlink()
    proc = console(copy, "palm-rlhf-skill", "plan", "--config", str(tree(copy) / FIRST_RUN), "--probe-seconds", "2")
    assert_reported(proc, "rule_reward.py", "module rule_reward is missing")


def test_a_deleted_plan_run_is_one_line_from_palm_rlhf_skill_plan(copy):
    missing = tree(copy) / PLAN
    missing.unlink()
    assert_reported(console(copy, "palm-rlhf-skill", "plan", "--config", str(tree(copy) / FIRST_RUN)),
                    missing, "missing")


@pytest.mark.parametrize("module", ["trainers.py", "run/loop.py"])
def test_a_deleted_policy_optimization_module_is_one_line(copy, module):
    missing = tree(copy) / POLICY / "policy_optimization" / module
    missing.unlink()
    starts = entry_points(copy)
    for name in (["by path", "tiny-rlhf-smoke", "plan", "train"] if module == "trainers.py" else ["train"]):
        assert_reported(starts[name](), missing, "missing")
    if module == "trainers.py":
        assert_reported(by_path(copy, PLAN, "--config", str(tree(copy) / FIRST_RUN)), missing)


def test_a_syntax_error_in_a_module_is_one_line_naming_file_and_line(copy):
    broken = tree(copy) / POLICY / "policy_optimization" / "smoke" / "report.py"
    lines = broken.read_text(encoding="utf-8").count("\n")
    broken.write_text(broken.read_text(encoding="utf-8") + "def broken(:\n", encoding="utf-8")
    for proc in (by_path(copy, SMOKE, *SMOKE_ARGS), console(copy, "tiny-rlhf-smoke", *SMOKE_ARGS)):
        assert_reported(proc, f"{broken}:{lines + 1}", "syntax error")


def test_a_syntax_error_in_an_entry_script_is_one_line_from_its_console_script(copy):
    """The console scripts import the entry script, so its syntax error is reported too. (Run by
    path, a script's own syntax error is Python's to report: none of its lines runs.)"""
    broken = tree(copy) / SMOKE
    broken.write_text(broken.read_text(encoding="utf-8") + "def broken(:\n", encoding="utf-8")
    assert_reported(console(copy, "tiny-rlhf-smoke", *SMOKE_ARGS), broken, "syntax error")
    broken = tree(copy) / "scripts" / "check_skill.py"
    broken.write_text(broken.read_text(encoding="utf-8") + "def broken(:\n", encoding="utf-8")
    assert_reported(console(copy, "palm-rlhf-skill", "check"), broken, "syntax error")


@pytest.mark.parametrize("content", ["{not json", "", "[1, 2]"])
def test_a_corrupt_api_record_is_one_line_for_check_and_the_smoke(copy, content):
    record = tree(copy) / "scripts" / "api_record.json"
    record.write_text(content, encoding="utf-8")
    assert_reported(console(copy, "palm-rlhf-skill", "check", "--json"), record)
    assert_reported(by_path(copy, SMOKE, *SMOKE_ARGS), record)


def test_the_pristine_copy_runs(copy):
    """The copies above fail because of their damage alone."""
    proc = by_path(copy, SMOKE, *SMOKE_ARGS)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = console(copy, "palm-rlhf-skill", "plan", "--help")
    assert proc.returncode == 0 and "--config" in proc.stdout, proc.stderr[-2000:]


# --- what the hook leaves alone ------------------------------------------------------------------

def raised(code: str, filename: str) -> BaseException:
    """The exception that running ``code`` as if it were the file ``filename`` raises."""
    try:
        exec(compile(code, filename, "exec"), {})
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("no exception")


def test_the_hook_leaves_missing_libraries_and_other_errors_to_the_traceback(tmp_path, monkeypatch):
    in_tree = str(skill_runtime.SKILL_ROOT / "scripts" / "some_module.py")
    line = skill_runtime.damaged_file(raised("import no_such_tree_module", in_tree))
    assert line == skill_runtime.damaged(skill_runtime.SKILL_ROOT, "module no_such_tree_module is missing: no "
                                         "no_such_tree_module.py in the tree's scripts folders (imported by "
                                         "scripts/some_module.py:1)")
    assert skill_runtime.damaged_file(raised("import no_such_tree_module", str(tmp_path / "library.py"))) is None
    for name in sorted(skill_runtime.DEPENDENCY_MODULES) + ["json"]:
        with monkeypatch.context() as patch:  # the module as it was afterwards (torch is never imported twice)
            patch.setitem(sys.modules, name, None)  # import NAME now raises ModuleNotFoundError(name=NAME)
            exc = raised(f"import {name}", in_tree)
        assert isinstance(exc, ModuleNotFoundError) and exc.name == name
        assert skill_runtime.damaged_file(exc) is None, name
    assert skill_runtime.damaged_file(raised("1 / 0", in_tree)) is None
    assert skill_runtime.damaged_file(raised("def f(:", str(tmp_path / "elsewhere.py"))) is None
    assert skill_runtime.damaged_file(raised("def f(:", in_tree)).startswith(f"{in_tree}:1: syntax error: ")
    assert sys.excepthook is skill_runtime.report_damaged_tree


def tree_modules() -> set[str]:
    """Top-level module names that the tree's import roots provide."""
    names = set()
    for root in skill_runtime.IMPORT_ROOTS:
        for path in (REPO / root).iterdir():
            if path.suffix == ".py" or (path / "__init__.py").is_file():
                names.add(path.stem)
    return names


def test_dependency_modules_are_exactly_the_other_distributions_the_tree_imports():
    imported = set()
    for root in skill_runtime.IMPORT_ROOTS:
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    imported |= {alias.name.partition(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported.add(node.module.partition(".")[0])
    others = imported - tree_modules() - set(sys.stdlib_module_names)
    assert others == skill_runtime.DEPENDENCY_MODULES


# --- one mechanism: the same lines in every entry script ---------------------------------------------

def guard_block() -> str:
    """The line ``skill_bootstrap``'s docstring prescribes, as it appears in a script."""
    doc = skill_bootstrap.__doc__.split("(tests/test_damaged_tree.py checks each):\n\n", 1)[1]
    return doc.split("\n\n", 1)[0].strip() + "\n"


def entry_scripts() -> list[Path]:
    """Every script of the tree that runs a helper's main (``runner.run_cli(main)``)."""
    found = [path for root in skill_runtime.IMPORT_ROOTS for path in (REPO / root).glob("*.py")
             if "sys.exit(runner.run_cli(main))" in path.read_text(encoding="utf-8")]
    assert {REPO / script for script in reporting.HELPER_SCRIPTS.values()} <= set(found)
    return sorted(found)


@pytest.mark.parametrize("script", entry_scripts(), ids=lambda p: p.name)
def test_every_entry_script_imports_the_runtime_with_the_same_lines(script):
    text = script.read_text(encoding="utf-8")
    block = guard_block()
    assert block.startswith("import skill_bootstrap  # noqa") and block.count("\n") == 1
    insert = re.search(r"^sys\.path\.insert\(0, str\(Path\(__file__\)\.resolve\(\)[^\n]*\n", text, re.MULTILINE)
    assert insert, f"{script.name}: no sys.path.insert of the skill root's scripts/"
    assert text[insert.end():].startswith(block), f"{script.name}: the runtime's import is not the prescribed block"
    first_tree_import = re.search(r"^(from|import) (skill_runtime|skill_check|policy_optimization|reward_modeling|"
                                  r"run_kit|config_kit|data_kit|probe_kit)\b",
                                  text, re.MULTILINE)
    assert first_tree_import.start() > insert.end(), f"{script.name}: a tree module imported before the block"
