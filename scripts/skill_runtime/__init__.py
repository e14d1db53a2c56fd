r"""The shared runtime of this skill's helper scripts, one module per responsibility.

- ``exits``: exit codes, ``SkillError`` (one line on stderr, a documented code), ``one_line``.
- ``options``: argparse with one-line usage errors, typed option values, the common options.
- ``version_gate``: the tested-version record (``scripts/api_record.json``), shadowed modules,
  ``check_versions``.
- ``placement``: ``--device`` through Accelerate, CPUs, available memory, torch threads.
- ``workspace``: the private working directory and the watch on the caller's directory.
- ``streams``: capture of the library's own output, printed losses, best-effort stderr,
  progress bars, stage timers.
- ``byte_tokenizer``: the byte-level tokenizer (id = byte + 1, 0 = pad).
- ``snapshots``: weight snapshots and what changed.
- ``reporting``: checks, the doc section behind each check, plain-report text, helper commands.
- ``runner``: ``run_cli`` (errors, signals, stdout that went away) and ``emit`` (the report).
- ``smoke_main``: the shared main of the palm-modeling and reward-modeling smokes.

Every script of the tree finds its modules the same way: it puts the skill root's ``scripts/``
on ``sys.path`` and imports ``skill_bootstrap``, which imports ``skill_runtime``, which puts the
other ``scripts/`` folders of the tree (``IMPORT_ROOTS``) there too; from then on every module of the tree is a plain import, which
editors and ``pyright`` (``[tool.pyright] extraPaths`` in pyproject.toml) follow. Nothing here
imports torch at module level: ``--help`` and usage errors answer without it.

A damaged copy of the tree (a file deleted, a syntax error in one) is one stderr line naming the
file and exit 2, never a traceback: importing this package installs ``report_damaged_tree`` as
``sys.excepthook``, for every way in (a script run by path, the console scripts, which import this
package through ``palm_rlhf_skill.runtime``). The one file it cannot cover is its own
``__init__.py``: every entry script imports ``skill_bootstrap`` (``scripts/skill_bootstrap.py``)
first, which imports this package and reports that file itself.
"""
from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

SKILL_ROOT = Path(__file__).resolve().parents[2]
# The folders whose modules import each other by name: the root's scripts/ and each sub-skill's
# (tests/test_imports.py: the same list as pyproject.toml's pyright extraPaths and pytest pythonpath).
IMPORT_ROOTS = ("scripts", "sub-skills/policy-optimization/scripts", "sub-skills/reward-modeling/scripts",
                "sub-skills/palm-modeling/scripts")

for _root in IMPORT_ROOTS:
    _path = str(SKILL_ROOT / _root)
    if _path not in sys.path:
        sys.path.insert(0, _path)


# Modules of other distributions that the tree imports (tests/test_damaged_tree.py: exactly the
# ones it imports): one of them missing is not a damaged tree.
DEPENDENCY_MODULES = frozenset({"accelerate", "datasets", "matplotlib", "packaging", "palm_rlhf_pytorch", "psutil",
                                "pyarrow", "skills_ref", "tokenizers", "torch", "tqdm"})
REINSTALL = "reinstall the skill tree"


def damaged(where: str | Path, what: str) -> str:
    """The words for a file of the tree that is missing or damaged: ``WHERE: WHAT (reinstall the
    skill tree)``, the one form every such error takes (an error line's text, without ``prog:``)."""
    return f"{where}: {what} ({REINSTALL})"


def _in_tree(filename: str | None) -> bool:
    """Whether ``filename`` (a path, or ``<frozen ...>``, ``<string>``) lies in this tree."""
    return (bool(filename) and not filename.startswith("<")
            and Path(os.path.realpath(filename)).is_relative_to(SKILL_ROOT))


def _tree_package_dir(name: str) -> Path | None:
    """The folder of the tree's package ``name`` when it is imported (its ``__path__``), else None."""
    package = sys.modules.get(name)
    return next((Path(d) for d in getattr(package, "__path__", None) or () if _in_tree(d)), None)


def damaged_file(exc: BaseException) -> str | None:
    """``damaged(...)``'s words for an exception that shows a file of this tree missing or broken,
    else None (a missing library, a bug: the traceback stays):

    - a SyntaxError in a file of the tree: that file and line;
    - a module of one of the tree's packages missing (``No module named 'skill_runtime.exits'``,
      ``cannot import name 'trainers' from 'policy_optimization'``, a package without its
      ``__init__.py``): that file;
    - an ImportError whose ``path`` is a file of the tree (``palm_rlhf_skill.cli`` raises one for a
      helper script that is missing);
    - a top-level module that a file of the tree imports (the innermost frame) missing, neither
      of the standard library nor of ``DEPENDENCY_MODULES``: the module and the importing line.
    """
    if isinstance(exc, SyntaxError):
        return damaged(f"{exc.filename}:{exc.lineno}", f"syntax error: {exc.msg}") if _in_tree(exc.filename) else None
    if not isinstance(exc, ImportError) or not exc.name:
        return None
    parent, _, last = exc.name.rpartition(".")
    if not isinstance(exc, ModuleNotFoundError):  # from PACKAGE import NAME: NAME is neither in it nor a module
        parent, last = exc.name, str(exc).partition("cannot import name '")[2].partition("'")[0]
    folder = _tree_package_dir(parent) if parent else None
    if folder is not None:
        if getattr(sys.modules[parent], "__file__", None) is None:  # a namespace package: no __init__.py
            return damaged(folder / "__init__.py", "missing")
        if last and not (folder / f"{last}.py").exists() and not (folder / last).is_dir():
            return damaged(folder / f"{last}.py", "missing")
        return None
    if _in_tree(exc.path):
        return damaged(exc.path, "missing" if not Path(exc.path).exists() else f"cannot be imported: {exc}")
    frames = traceback.extract_tb(exc.__traceback__)
    top = exc.name.partition(".")[0]
    if (isinstance(exc, ModuleNotFoundError) and frames and _in_tree(frames[-1].filename)
            and top not in sys.stdlib_module_names and top not in DEPENDENCY_MODULES):
        importer = Path(os.path.realpath(frames[-1].filename)).relative_to(SKILL_ROOT)
        return damaged(SKILL_ROOT, f"module {top} is missing: no {top}.py in the tree's scripts folders "
                                   f"(imported by {importer}:{frames[-1].lineno})")
    return None


def report_damaged_tree(exc_type, exc, tb) -> None:
    """``sys.excepthook``: an uncaught exception that ``damaged_file`` recognises becomes one stderr
    line ``PROG: error: ...`` and exit 2 (raising SystemExit from the hook ends the process with
    it); any other goes to the hook that was there before (the traceback)."""
    text = damaged_file(exc) if exc is not None else None
    if text is None:
        return _previous_hook(exc_type, exc, tb)
    try:
        sys.stderr.write(f"{Path(sys.argv[0]).name if sys.argv else 'skill'}: error: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # no stderr to write to: the exit code still says it
        pass
    raise SystemExit(2)


if getattr(sys.excepthook, "__name__", None) != report_damaged_tree.__name__:  # once per process
    _previous_hook = sys.excepthook
    sys.excepthook = report_damaged_tree
