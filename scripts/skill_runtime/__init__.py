"""The shared runtime of this skill's helper scripts, one module per responsibility.

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
on ``sys.path`` and imports ``skill_runtime``, which puts the other ``scripts/`` folders of the
tree (``IMPORT_ROOTS``) there too; from then on every module of the tree is a plain import, which
editors and ``pyright`` (``[tool.pyright] extraPaths`` in pyproject.toml) follow. Nothing here
imports torch at module level: ``--help`` and usage errors answer without it.
"""
from __future__ import annotations

import sys
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
