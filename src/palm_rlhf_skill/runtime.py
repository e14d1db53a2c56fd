"""The skill tree's shared runtime (``scripts/skill_runtime.py``), imported by path.

The console subcommands use the same exit codes, one-line errors and version gate as the helper
scripts, so they import the one file the scripts import, from the installed skill tree, rather than
keeping a copy. Importing it does not import torch.
"""
from __future__ import annotations

import sys
from types import ModuleType

from palm_rlhf_skill.cli import load_by_path, skill_root


def skill_runtime() -> ModuleType:
    """``scripts/skill_runtime.py`` of the installed tree as module ``skill_runtime``.

    A helper script run in this process already imported it under that name; that module is reused,
    so there is one runtime per process whichever file loaded it first.
    """
    loaded = sys.modules.get("skill_runtime")
    if loaded is not None:
        return loaded
    return load_by_path("skill_runtime", skill_root() / "scripts" / "skill_runtime.py")
