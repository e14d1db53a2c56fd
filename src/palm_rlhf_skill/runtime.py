"""Makes the installed skill tree's modules importable for the console commands.

The console subcommands use the same exit codes, one-line errors and version gate as the helper
scripts, so they import the tree's own runtime (``scripts/skill_runtime/``) rather than keeping a
copy: importing this module puts the installed tree's ``scripts/`` first on ``sys.path`` and imports
``skill_runtime``, which adds the tree's other ``scripts/`` folders (its ``IMPORT_ROOTS``). A
``skill_runtime`` already imported in this process (a helper script run in it imported its own) is
kept, so there is one runtime per process whichever file loaded it first. Importing this module
does not import torch.
"""
from __future__ import annotations

import sys

from palm_rlhf_skill.cli import skill_root

SCRIPTS = str(skill_root() / "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)

import skill_runtime  # noqa: E402,F401  (puts the tree's other scripts/ folders on sys.path)
