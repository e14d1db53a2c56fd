"""The first import of every entry script of the tree: the runtime (``skill_runtime``), which puts
the tree's import roots on ``sys.path`` and installs the hook that turns a damaged file of the
tree into one stderr line and exit 2 (``skill_runtime.report_damaged_tree``). The one file that
hook cannot cover is the runtime's own ``__init__.py``: a missing or broken one is reported here,
in the same one line, with exit 2.

Every entry script puts the skill root's ``scripts/`` first on ``sys.path``
(``sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))``; ``check_skill.py``,
in this folder, its own folder) and imports this module on the next line, before any other module
of the tree, with this line word for word (tests/test_damaged_tree.py checks each):

    import skill_bootstrap  # noqa: E402,F401  (first: the runtime; a damaged file of the tree is then one line, exit 2)

A copy of the tree without
this file is Python's to report (``No module named 'skill_bootstrap'``), as an entry script's own
syntax error is; the console scripts report it in one line (``palm_rlhf_skill.runtime``).
"""
from __future__ import annotations

import sys
from pathlib import Path

try:
    from skill_runtime import SKILL_ROOT  # noqa: F401  (a namespace package, no __init__.py, has none)
except (ImportError, SyntaxError) as damage:  # the runtime's own __init__.py is missing or broken
    sys.stderr.write(f"{Path(sys.argv[0]).name if sys.argv else 'skill'}: error: "
                     f"{Path(__file__).resolve().parent / 'skill_runtime' / '__init__.py'}: "
                     f"{damage} (reinstall the skill tree)\n")
    sys.exit(2)

if __name__ == "__main__":  # run by path: say what it is (one line, exit 2), do nothing else
    sys.stderr.write("skill_bootstrap.py: error: a module, not a command: every entry script of the tree imports it "
                     "first: run one of them (e.g. sub-skills/policy-optimization/scripts/tiny_rlhf_smoke.py --help)\n")
    sys.exit(2)
