"""palm-rlhf-skill: an agent skill tree for palm-rlhf-pytorch, shipped with its smoke helpers."""
from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def skill_root() -> Path:
    """Root of the installed skill tree (``palm_rlhf_skill/skill`` in the wheel), or the source
    checkout's root when the package is imported from ``src/`` without being built. Here, below
    ``cli`` and ``runtime``, so that both import it and neither imports the other to find it."""
    from importlib import resources
    packaged = Path(str(resources.files("palm_rlhf_skill") / "skill"))
    if (packaged / "SKILL.md").is_file():
        return packaged
    return Path(__file__).resolve().parents[2]
