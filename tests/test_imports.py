"""The tree's imports are followable: one way to find the runtime (the import roots), no module
loaded by path, module names unique across the roots, and a pinned static checker (pyright, from
PyPI) resolves every import of the skill tree, src/ and tools/ (issue: a house a maintainer can
change in minutes)."""
from __future__ import annotations

import ast
from pathlib import Path
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
USER_FILE_LOADER = REPO / "scripts" / "config_kit" / "programs.py"


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
             *(REPO / "scripts" / "data_kit").glob("*.py"), *(REPO / "scripts" / "config_kit").glob("*.py"),
             *(REPO / "sub-skills" / "policy-optimization" / "scripts" / "policy_optimization").rglob("*.py"),
             *(REPO / "sub-skills" / "reward-modeling" / "scripts" / "reward_modeling").glob("*.py")]
    missing = sorted(p.relative_to(REPO).as_posix() for p in rooms if not p.stem.startswith("__") and f"`{p.stem}`" not in layout)
    assert not missing, f"README.md under '## Layout': name each room: {missing}"


# --- the import graph (issue 37): no circles, a ground floor, sub-skills one way ---------------------

GRAPH_ROOTS = (*skill_runtime.IMPORT_ROOTS, "src")  # the folders whose modules import each other by name
ABOVE = ("policy_optimization", "reward_modeling", "palm_modeling")  # the sub-skills' packages


def tree_modules() -> dict[str, Path]:
    """Every module of the tree by its dotted name (``run_kit.rundir``, ``policy_optimization.plan``
    for a package's ``__init__.py``) -> its file."""
    found = {}
    for root in GRAPH_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            parts = path.relative_to(REPO / root).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            if parts:
                found[".".join(parts)] = path
    return found


MODULES = tree_modules()


def imports_of(name: str, path: Path) -> list[tuple[str, int]]:
    """The tree's modules that ``name`` imports (at module level or inside a function), each with
    the line: ``import a.b`` is ``a.b``; ``from a import b`` is ``a.b`` when that is a module, else
    ``a``; relative imports resolved; a module of another distribution left out. A string that is
    exactly a module's name (``importlib.import_module("policy_optimization.run.metrics")``) counts
    as an import of it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in MODULES:
            targets = [node.value]
        for target in targets:
            while target and target not in MODULES:  # a.b.c of a module a.b: the attribute c
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, node.lineno))
    return sorted(set(found))


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def where(name: str) -> str:
    return MODULES[name].relative_to(REPO).as_posix()


def circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target, _ in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in MODULES:
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_the_trees_imports(tmp_path):
    """The graph is the tree's: a module-level import, one inside a function, a module named in a string."""
    targets = {target for target, _ in GRAPH["run_kit.command"]}
    assert {"skill_runtime.exits", "run_kit.launch"} <= targets  # launch: inside add_run_options
    probe = tmp_path / "x.py"
    probe.write_text('import importlib\nimportlib.import_module("skill_runtime")\n', encoding="utf-8")
    assert imports_of("x", probe) == [("skill_runtime", 2)]


def test_no_import_circles():
    found = circles()
    lines = [" <-> ".join(where(m) for m in component) + ": " + "; ".join(
        f"{where(a)}:{line} imports {b}" for a in component for b, line in GRAPH[a] if b in component)
        for component in found]
    assert not found, "import circles (move what both sides need to the lower one): " + " | ".join(lines)
def test_the_ground_floor_imports_nothing_above_it():
    """Nothing in scripts/ imports a sub-skill's module (its package or a script beside it)."""
    upward = [f"{where(a)}:{line} imports {b}" for a in MODULES if where(a).startswith("scripts/")
              for b, line in GRAPH[a] if where(b).startswith("sub-skills/") or b.partition(".")[0] in ABOVE]
    assert not upward, "the ground floor reaches up (a sub-skill brings its own part to it instead): " + "; ".join(upward)


def test_reward_modeling_imports_nothing_of_policy_optimization():
    """The sub-skills depend one way: policy-optimization may read the reward room (its artifacts),
    reward-modeling never imports policy-optimization's modules."""
    policy = "sub-skills/policy-optimization/"
    back = [f"{where(a)}:{line} imports {b}" for a in MODULES if where(a).startswith("sub-skills/reward-modeling/")
            for b, line in GRAPH[a] if where(b).startswith(policy)]
    assert not back, "reward-modeling imports policy-optimization (move what both use to scripts/): " + "; ".join(back)


def test_contributing_names_real_ground_floor_pieces_for_a_third_kind_of_run():
    """CONTRIBUTING.md#a-third-kind-of-run: every dotted name it gives (``run_kit.claiming.claimed``)
    is a module of the ground floor or the runtime with that attribute, so the recipe cannot name a
    piece that moved or went."""
    import importlib
    import re
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8").split("## A third kind of run", 1)[1]
    text = text.split("\n## ", 1)[0]
    names = set(re.findall(r"`((?:run_kit|config_kit|skill_runtime|data_kit)(?:\.\w+)+)`", text))
    assert len(names) >= 10, sorted(names)
    missing = []
    for name in sorted(names):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then its attributes
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                missing.append(name)
            break
        else:
            missing.append(name)
    assert missing == [], f"CONTRIBUTING.md#a-third-kind-of-run names what is not there: {missing}"
