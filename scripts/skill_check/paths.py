"""Relative links (and their anchors) and file paths named in the markdown: each must exist."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from skill_check import ROOT, markdown

# Files of the source project that the markdown may name but the wheel's skill tree does not ship.
PROJECT_FILES = {"pyproject.toml", "README.md", "constraints.txt", "tools/verify_floors.py", "tools/verify_torch.py"}
PATH_EXTENSIONS = ("md", "py", "json", "txt", "toml", "yaml", "yml", "sh", "cfg")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\((?P<target><[^>]+>|[^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_PATH = re.compile(r"`(?P<path>[\w.\-/]+\.(?:" + "|".join(PATH_EXTENSIONS) + r"))`")
SHELL_PATH = re.compile(r"(?<![\w/.:-])(?P<path>[\w.\-]+(?:/[\w.\-]+)+\.(?:" + "|".join(PATH_EXTENSIONS) + r"))\b")


def library_dir() -> Path | None:
    """Folder above the installed ``palm_rlhf_pytorch`` package, or None when it is missing."""
    spec = importlib.util.find_spec("palm_rlhf_pytorch")
    return Path(spec.origin).parent.parent if spec and spec.origin else None


def path_bases(md: Path) -> list[Path]:
    """Where a path named in ``md`` may live: next to it, at its sub-skill's root, at the skill
    root, or in the installed library (``palm_rlhf_pytorch/ppo.py`` cites upstream source)."""
    bases = [md.parent]
    try:
        parts = md.resolve().relative_to(ROOT.resolve()).parts
    except ValueError:  # a file outside the tree (tests)
        parts = ()
    if len(parts) >= 2 and parts[0] == "sub-skills":
        bases.append(ROOT / "sub-skills" / parts[1])
    bases.append(ROOT)
    lib = library_dir()
    if lib:
        bases.append(lib)
    return bases


def check_paths(files: list[Path]) -> tuple[list[dict[str, str]], int]:
    """Broken relative links, missing anchors and missing named files; returns (drift, checked)."""
    drift, checked = [], 0
    for md in files:
        raw = md.read_text(encoding="utf-8")
        text = markdown.strip_code_blocks(raw)
        for m in LINK.finditer(text):
            target = m["target"].strip("<>")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
                continue  # URL or mailto:
            checked += 1
            file_part, _, anchor = target.partition("#")
            dest = (md.parent / file_part) if file_part else md
            line = text.count("\n", 0, m.start()) + 1
            if not dest.exists():
                drift.append({"file": f"{markdown.rel(md)}:{line}", "symbol": f"link {target}",
                              "documented": "a file that exists", "installed": "missing"})
            elif anchor and dest.suffix == ".md" and anchor not in markdown.anchors(dest):
                drift.append({"file": f"{markdown.rel(md)}:{line}", "symbol": f"link {target}",
                              "documented": f"anchor #{anchor}", "installed": f"no such anchor in {markdown.rel(dest)}"})
        named = [(text.count("\n", 0, m.start()) + 1, m["path"]) for m in INLINE_PATH.finditer(text)]
        for first, info, body, _, _ in markdown.code_blocks(raw):
            if info.split()[:1] in (["bash"], ["sh"], ["shell"], ["console"]):
                named += [(first + body.count("\n", 0, m.start()), m["path"]) for m in SHELL_PATH.finditer(body)]
        for line, name in named:
            if name.startswith(("/", "~")) or name in PROJECT_FILES:
                continue
            checked += 1
            if not any((base / name).exists() for base in path_bases(md)):
                drift.append({"file": f"{markdown.rel(md)}:{line}", "symbol": f"path {name}",
                              "documented": "a file that exists", "installed": "missing"})
    return drift, checked


# A doc section named in Python (a helper prints it, a docstring points to it): ``<page>.md#<anchor>``,
# or ``{NAME}#anchor`` where the module assigns ``NAME = "....md"``.
CODE_DOC_LINK = re.compile(r"(?<![\w/.-])(?P<path>[\w.\-/]*[\w-]\.md|\{(?P<name>[A-Z_]+)\})#(?P<anchor>[\w-]+)")
CODE_DOC_NAME = re.compile(r'^(?P<name>[A-Z_]+) = "(?P<path>[\w.\-/]+\.md)"', re.MULTILINE)


def code_files(root: Path = ROOT) -> list[Path]:
    """The tree's Python files: ``scripts/`` and each sub-skill's ``scripts/``."""
    return sorted(p for part in ("scripts", "sub-skills") if (root / part).is_dir()
                  for p in (root / part).rglob("*.py") if "__pycache__" not in p.parts)


def check_code_links(code: list[Path], files: list[Path]) -> tuple[list[dict[str, str]], int]:
    """Each doc section a Python file of ``code`` names resolves: a markdown file of ``files``
    whose path from the skill root ends with the named path holds the anchor (a moved section
    leaves no stale pointer in a helper's output). Returns (drift, checked)."""
    pages = {markdown.rel(md): md for md in files}
    drift, checked = [], 0
    for py in code:
        text = py.read_text(encoding="utf-8")
        names = {m["name"]: m["path"] for m in CODE_DOC_NAME.finditer(text)}
        for m in CODE_DOC_LINK.finditer(text):
            path = names.get(m["name"]) if m["name"] else m["path"]
            if path is None:
                continue  # a placeholder this module does not assign: not a doc path
            checked += 1
            where = f"{markdown.rel(py)}:{text.count(chr(10), 0, m.start()) + 1}"
            found = [md for name, md in pages.items() if name == path or name.endswith("/" + path.lstrip("./"))]
            if not found:
                drift.append({"file": where, "symbol": f"doc {path}#{m['anchor']}",
                              "documented": "a markdown file that exists", "installed": "missing"})
            elif not any(m["anchor"] in markdown.anchors(md) for md in found):
                drift.append({"file": where, "symbol": f"doc {path}#{m['anchor']}", "documented": f"anchor #{m['anchor']}",
                              "installed": f"no such anchor in {', '.join(markdown.rel(md) for md in found)}"})
    return drift, checked
