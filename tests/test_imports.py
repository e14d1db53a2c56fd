"""The tree's imports are followable: one way to find the runtime (the import roots), no module
loaded by path, module names unique across the roots, and a pinned static checker (pyright, from
PyPI) resolves every import of the skill tree, src/ and tools/ (issue: a house a maintainer can
change in minutes)."""
from __future__ import annotations

import ast
import subprocess
import sys
import tomllib

from conftest import REPO

import skill_runtime

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
TREE = [p for root in skill_runtime.IMPORT_ROOTS for p in sorted((REPO / root).rglob("*.py"))]


def test_the_import_roots_are_one_list():
    roots = list(skill_runtime.IMPORT_ROOTS)
    assert sorted(PYPROJECT["tool"]["pytest"]["ini_options"]["pythonpath"]) == sorted(roots), \
        "pyproject.toml [tool.pytest.ini_options] pythonpath: the roots of scripts/skill_runtime/__init__.py IMPORT_ROOTS"
    assert sorted(PYPROJECT["tool"]["pyright"]["extraPaths"]) == sorted([*roots, "src", "tools"]), \
        "pyproject.toml [tool.pyright] extraPaths: IMPORT_ROOTS plus src and tools"


def test_module_names_are_unique_across_the_roots():
    seen: dict[str, str] = {}
    for root in skill_runtime.IMPORT_ROOTS:
        for entry in sorted((REPO / root).iterdir()):
            if entry.suffix == ".py" or (entry / "__init__.py").is_file():
                name = entry.stem
                assert name not in seen, f"module {name} in {seen.get(name)} and {root}: rename one"
                seen[name] = root


# the run kit's loader of the user's own files ([reward] program, [prompts] tokenizer): not the tree's
USER_FILE_LOADER = REPO / "sub-skills" / "policy-optimization" / "scripts" / "policy_optimization" / "programs.py"


def test_no_module_of_the_tree_is_loaded_by_path():
    offenders = []
    for path in [*TREE, *sorted((REPO / "src").rglob("*.py")), *sorted((REPO / "tests").glob("*.py"))]:
        if path == USER_FILE_LOADER:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("spec_from_file_location", "run_path", "load_by_path"):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {node.attr}")
    assert offenders == [], "import the module by name (its folder is an import root): " + "; ".join(offenders)


def test_every_entry_script_finds_the_runtime_the_same_way():
    line = 'sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))'
    entries = [p for p in REPO.glob("sub-skills/*/scripts/*.py") if 'if __name__ == "__main__"' in p.read_text(encoding="utf-8")]
    assert entries
    for path in entries:
        text = path.read_text(encoding="utf-8")
        if "import" in text and "skill_runtime" in text:
            assert line in text, f"{path.relative_to(REPO)}: find the runtime with `{line}`"


def test_pyright_resolves_every_import():
    proc = subprocess.run([sys.executable, "-m", "pyright", "--pythonpath", sys.executable], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    errors = [line.strip() for line in proc.stdout.splitlines() if "error:" in line]
    assert proc.returncode == 0 and not errors, "\n".join(errors[:20]) or proc.stdout[-2000:] + proc.stderr[-2000:]


def test_readme_layout_names_every_room():
    """Each module of the runtime, the run kit and the sub-skills' packages is named in README.md's Layout."""
    layout = (REPO / "README.md").read_text(encoding="utf-8").split("## Layout", 1)[1]
    rooms = [*(REPO / "scripts" / "skill_runtime").glob("*.py"), *(REPO / "scripts" / "run_kit").glob("*.py"),
             *(REPO / "scripts" / "data_kit").glob("*.py"),
             *(REPO / "sub-skills" / "policy-optimization" / "scripts" / "policy_optimization").rglob("*.py"),
             *(REPO / "sub-skills" / "reward-modeling" / "scripts" / "reward_modeling").glob("*.py")]
    missing = sorted(p.relative_to(REPO).as_posix() for p in rooms if not p.stem.startswith("__") and f"`{p.stem}`" not in layout)
    assert not missing, f"README.md under '## Layout': name each room: {missing}"
