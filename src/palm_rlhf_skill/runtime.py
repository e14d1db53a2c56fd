"""The skill tree's shared runtime (``scripts/skill_runtime.py``), imported by path.

The console subcommands use the same exit codes, one-line errors and version gate as the helper
scripts, so they import the one file the scripts import, from the installed skill tree, rather than
keeping a copy. Importing it does not import torch.
"""
from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from palm_rlhf_skill.cli import skill_root


def skill_runtime() -> ModuleType:
    """``scripts/skill_runtime.py`` of the installed tree as module ``skill_runtime``.

    A helper script run in this process already imported it under that name; that module is reused,
    so there is one runtime per process whichever file loaded it first.
    """
    loaded = sys.modules.get("skill_runtime")
    if loaded is not None:
        return loaded
    path = skill_root() / "scripts" / "skill_runtime.py"
    spec = importlib.util.spec_from_file_location("skill_runtime", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["skill_runtime"] = module  # its dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module
