"""Every SKILL.md validated with ``skills-ref``, the Agent Skills reference validator."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from skill_check import ROOT, markdown
from skill_runtime import exits

ROOT_SKILL_NAME = "palm-rlhf-pytorch"  # the root folder may be named otherwise (repo, wheel: skill/)
# Claude Code's extension key: sub-skills are loaded by the router, never auto-invoked by the
# model; the Agent Skills spec (and so skills-ref) does not know it, so it is allowed by name
# (why, for readers: references/installation.md#checking-the-skill-files).
ALLOWED_EXTENSION_KEYS = {"disable-model-invocation"}


def frontmatter_and_body(path: Path) -> tuple[dict[str, Any], str]:
    """A SKILL.md's frontmatter (skills-ref's parser) and its body."""
    from skills_ref.parser import parse_frontmatter
    return parse_frontmatter(path.read_text(encoding="utf-8"))


def validate_skills(files: list[Path]) -> list[dict[str, str]]:
    """Validate each SKILL.md with skills-ref (the Agent Skills reference validator).

    skills-ref's ``validate()`` rejects keys outside the spec, so this calls its own parser and
    ``validate_metadata`` with ``ALLOWED_EXTENSION_KEYS`` removed first. The skill folder is the
    file's parent, except the root skill: it is validated through a temporary symlink named
    ``palm-rlhf-pytorch``, its real name (the repository or wheel folder is named otherwise).
    Raises SkillError(exit 3) when skills-ref is not installed.
    """
    try:
        from skills_ref.errors import ParseError
        from skills_ref.parser import find_skill_md, parse_frontmatter
        from skills_ref.validator import validate_metadata
    except ImportError:
        raise exits.SkillError("skills-ref is not installed: pip install 'skills-ref>=0.1.1' "
                            "(a dependency of palm-rlhf-skill)", exits.EXIT_DEPENDENCY)
    drift = []
    with tempfile.TemporaryDirectory(prefix="palm-rlhf-skill-check-") as tmp:
        for md in files:
            skill_dir = md.parent
            if md.parent.resolve() == ROOT.resolve():
                skill_dir = Path(tmp) / ROOT_SKILL_NAME
                skill_dir.symlink_to(ROOT.resolve(), target_is_directory=True)
            try:
                metadata, _ = parse_frontmatter(find_skill_md(skill_dir).read_text(encoding="utf-8"))
                errors = []
                for key in ALLOWED_EXTENSION_KEYS & metadata.keys():
                    if metadata.pop(key) not in ("true", "false"):
                        errors.append(f"{key} must be true or false")
                errors += validate_metadata(metadata, skill_dir)
            except ParseError as err:
                errors = [str(err)]
            drift += [{"file": markdown.rel(md), "symbol": "frontmatter", "documented": "valid (skills-ref)",
                       "installed": e} for e in errors]
    return drift
