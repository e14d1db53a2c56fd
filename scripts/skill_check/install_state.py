"""Whether the tree this check reads is the one the user is editing.

``palm-rlhf-skill check`` runs the *installed* copy of this script and reads the installed skill
tree (the wheel's ``palm_rlhf_skill/skill``). Run from a source checkout after an edit, it would
report the old tree's drift until a reinstall. This module finds the checkout around the working
directory and compares its skill tree with the one being checked, file by file.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

TREE_ITEMS = ("SKILL.md", "LICENSE", "references", "scripts", "sub-skills")  # what the wheel carries
PROJECT = re.compile(r'^name\s*=\s*"palm-rlhf-skill"\s*$', re.MULTILINE)


def checkout_around(cwd: Path) -> Path | None:
    """The source checkout holding ``cwd`` (a folder with this project's ``pyproject.toml`` and a
    ``SKILL.md``), searching upwards, or None."""
    for folder in (cwd, *cwd.parents):
        project = folder / "pyproject.toml"
        if (folder / "SKILL.md").is_file() and project.is_file():
            try:
                if PROJECT.search(project.read_text(encoding="utf-8")):
                    return folder
            except OSError:
                return None
    return None


def tree_digests(root: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of the skill tree under ``root``, byte-code caches left out."""
    out = {}
    for item in TREE_ITEMS:
        path = root / item
        paths = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
        for p in paths:
            if "__pycache__" in p.parts or p.suffix == ".pyc":
                continue
            out[p.relative_to(root).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def install_state(checked: Path, cwd: Path) -> dict[str, Any]:
    """``{"checked", "checkout", "stale", "differing"}``: ``checkout`` is the source checkout around
    ``cwd`` when it is not the tree being checked (else None), ``stale`` whether the two trees
    differ, ``differing`` the paths that differ (first 20; added, removed or edited)."""
    checkout = checkout_around(cwd.resolve())
    if checkout is None or checkout.resolve() == checked.resolve():
        return {"checked": str(checked), "checkout": None, "stale": False, "differing": []}
    mine, theirs = tree_digests(checked), tree_digests(checkout)
    differing = sorted(p for p in mine.keys() | theirs.keys() if mine.get(p) != theirs.get(p))
    return {"checked": str(checked), "checkout": str(checkout), "stale": bool(differing), "differing": differing[:20],
            "differing_count": len(differing)}


def warning(state: dict[str, Any]) -> str | None:
    """The one-line warning for a stale install, or None."""
    if not state["stale"]:
        return None
    return (f"stale install: this checks the installed skill tree ({state['checked']}), which differs from the "
            f"checkout at {state['checkout']} in {state['differing_count']} file(s) (first: {state['differing'][0]}): "
            f"reinstall (pip install '{state['checkout']}') and run check again, or run "
            f"python {Path(state['checkout']) / 'scripts' / 'check_skill.py'} to check the checkout itself")
