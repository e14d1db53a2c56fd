"""Makes the installed skill tree's modules importable for the console commands.

The console subcommands use the same exit codes, one-line errors and version gate as the helper
scripts, so they import the tree's own runtime (``scripts/skill_runtime/``) rather than keeping a
copy: importing this module puts the installed tree's ``scripts/`` first on ``sys.path`` and imports
``skill_bootstrap``, as every entry script does: it imports ``skill_runtime``, which adds the tree's
other ``scripts/`` folders (its ``IMPORT_ROOTS``). A
``skill_runtime`` already imported in this process (a helper script run in it imported its own) is
kept, so there is one runtime per process whichever file loaded it first. Importing this module
does not import torch. It also installs the runtime's hook for a damaged tree (one line, exit 2);
the bootstrap reports the runtime's own ``__init__.py`` missing or broken, and this module the
bootstrap's own file (one line, exit 2).
"""
from __future__ import annotations

import sys
from pathlib import Path

from palm_rlhf_skill import skill_root

SCRIPTS = str(skill_root() / "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)

try:  # the tree's own first import: the runtime, or one line and exit 2 for its damaged __init__.py
    import skill_bootstrap  # noqa: E402,F401
except (ImportError, SyntaxError) as damage:  # the bootstrap itself is missing or broken
    sys.stderr.write(f"{Path(sys.argv[0]).name}: error: {Path(SCRIPTS, 'skill_bootstrap.py')}: "
                     f"{damage} (reinstall the skill tree)\n")
    sys.exit(2)
