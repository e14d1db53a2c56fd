"""The skill tree's markdown: which files, their fenced blocks, headings, anchors and sections."""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from skill_check import ROOT

SKILL_PARTS = ("SKILL.md", "references", "scripts", "sub-skills")  # what the wheel ships
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                   re.DOTALL | re.MULTILINE)
HEADING = re.compile(r"^(?P<hashes>#{1,6})\s+(?P<title>.+?)\s*#*\s*$", re.MULTILINE)
EXPLICIT_ID = re.compile(r"""<a id=["'](?P<id>[^"']+)["']></a>\s*$""")


def rel(path: Path) -> str:
    """``path`` relative to the skill root, POSIX style (unchanged when outside it)."""
    try:
        return path.resolve().relative_to(ROOT.resolve()).as_posix()
    except ValueError:
        return str(path)


def markdown_files(root: Path = ROOT) -> list[Path]:
    """Every ``*.md`` file of the skill tree (root SKILL.md, references/, scripts/, sub-skills/)."""
    files = []
    for part in SKILL_PARTS:
        p = root / part
        if p.is_file() and p.suffix == ".md":
            files.append(p)
        elif p.is_dir():
            files += sorted(q for q in p.rglob("*.md") if "__pycache__" not in q.parts)
    return files


def skill_files(root: Path = ROOT) -> list[Path]:
    """Every SKILL.md of the skill tree (the root router and each sub-skill)."""
    return [p for p in markdown_files(root) if p.name == "SKILL.md"]


def reference_files(root: Path = ROOT) -> list[Path]:
    """The references an agent is sent to: every ``*.md`` under a ``references/`` folder."""
    return [p for p in markdown_files(root) if "references" in p.relative_to(root).parts]


def code_blocks(text: str) -> Iterator[tuple[int, str, str, int, int]]:
    """Fenced code blocks as ``(first body line number, info string, body, start, end offsets)``."""
    for m in FENCE.finditer(text):
        yield text.count("\n", 0, m.start("body")) + 1, m["info"].strip(), m["body"], m.start(), m.end()


def strip_code_blocks(text: str) -> str:
    """Text with fenced blocks blanked (line numbers kept), for link and inline-code scanning."""
    out, last = [], 0
    for _, _, _, start, end in code_blocks(text):
        out.append(text[last:start])
        out.append("\n" * text.count("\n", start, end))
        last = end
    out.append(text[last:])
    return "".join(out)


def slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_~]|<[^>]+>", "", heading.strip()).lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", text))


def anchors(path: Path) -> set[str]:
    """Anchors a link may target in ``path``: heading slugs and explicit ``id="..."`` attributes."""
    text = strip_code_blocks(path.read_text(encoding="utf-8"))
    found = {slug(m["title"]) for m in HEADING.finditer(text)}
    return found | set(re.findall(r"""\bid=["']([^"']+)["']""", text))


@dataclass(frozen=True)
class Section:
    """One heading and the text up to the next heading of any level.

    ``anchor`` is the explicit ``<a id>`` on the line above the heading, else the heading's slug
    ("" for the text before the first heading); ``line`` the heading's 1-based line; ``text`` the
    raw section (fenced blocks included), ``prose`` the same with fenced blocks blanked."""
    file: str
    level: int
    title: str
    anchor: str
    line: int
    text: str
    prose: str

    @property
    def where(self) -> str:
        """``file#anchor``, how a drift names the section."""
        return f"{self.file}#{self.anchor}" if self.anchor else self.file


def sections(path: Path) -> list[Section]:
    """The sections of a markdown file, in order (headings inside fenced blocks are not headings)."""
    return list(_sections(str(path.resolve()), path.stat().st_mtime_ns))


@lru_cache(maxsize=64)
def _sections(path: str, _mtime: int) -> tuple[Section, ...]:
    raw = Path(path).read_text(encoding="utf-8").split("\n")
    prose = strip_code_blocks("\n".join(raw)).split("\n")  # same lines, fenced blocks blank
    name = rel(Path(path))
    starts = [(i, m) for i, line in enumerate(prose) if (m := HEADING.fullmatch(line))]
    bounds = [(0, None)] + starts
    out = []
    for k, (i, m) in enumerate(bounds):
        end = bounds[k + 1][0] if k + 1 < len(bounds) else len(raw)
        if m is None:
            level, title, anchor = 0, "", ""
        else:
            level, title = len(m["hashes"]), m["title"]
            explicit = EXPLICIT_ID.search(prose[i - 1]) if i else None
            anchor = explicit["id"] if explicit else slug(title)
        out.append(Section(name, level, title, anchor, i + 1, "\n".join(raw[i:end]), "\n".join(prose[i:end])))
    return tuple(out)


def section_at(path: Path, line: int) -> Section:
    """The section holding 1-based ``line`` of ``path``."""
    found = sections(path)[0]
    for section in sections(path):
        if section.line <= line:
            found = section
    return found
