"""Makes the installed skill tree's modules importable for the console commands.

The console subcommands use the same exit codes, one-line errors and version gate as the helper
scripts, so they import the tree's own runtime (``scripts/skill_runtime/``) rather than keeping a
copy: importing this module puts the installed tree's ``scripts/`` first on ``sys.path`` and imports
``skill_runtime``, which adds the tree's other ``scripts/`` folders (its ``IMPORT_ROOTS``). A
``skill_runtime`` already imported in this process (a helper script run in it imported its own) is
kept, so there is one runtime per process whichever file loaded it first. Importing this module
does not import torch. It also installs the runtime's hook for a damaged tree (one line, exit 2);
when the runtime's own ``__init__.py`` is missing or broken, this module says so itself, as the
entry scripts do (``skill_runtime``'s docstring), and exits 2.
"""
from __future__ import annotations

import sys
from pathlib import Path

from palm_rlhf_skill import skill_root

SCRIPTS = str(skill_root() / "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)

try:
    import skill_runtime  # noqa: E402,F401  (puts the tree's other scripts/ folders on sys.path)
    skill_runtime.SKILL_ROOT  # noqa: B018  (absent when skill_runtime/__init__.py is: a namespace package)
except (ImportError, SyntaxError, AttributeError) as damage:
    sys.stderr.write(f"{Path(sys.argv[0]).name}: error: {Path(SCRIPTS, 'skill_runtime', '__init__.py')}: "
                     f"{damage} (reinstall the skill tree)\n")
    sys.exit(2)
