"""What every copy of the skill must hold, computed here independently of the package's code:
every file under the repository's SKILL.md, LICENSE, references/, scripts/ and sub-skills/
(byte-code caches excepted), with its SHA-256."""
from __future__ import annotations

import hashlib
from pathlib import Path

from conftest import REPO

TREE_ITEMS = ("SKILL.md", "LICENSE", "references", "scripts", "sub-skills")


def _is_cache(relative: Path) -> bool:
    return "__pycache__" in relative.parts or relative.suffix == ".pyc"


def files_with_hashes(root: Path) -> dict[str, str]:
    """``{relative posix path: sha256}`` for every file under ``root`` except byte-code caches."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not _is_cache(p.relative_to(root))}


def repo_skill_files() -> dict[str, str]:
    """The skill tree of the repository: the files the wheel, the sdist and every install carry."""
    files = {}
    for item in TREE_ITEMS:
        path = REPO / item
        assert path.exists(), f"{item} is missing from the repository"
        if path.is_file():
            files[item] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            files.update({f"{item}/{name}": digest for name, digest in files_with_hashes(path).items()})
    return files
