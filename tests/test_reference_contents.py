"""References an agent can enter (issue 37 item 5): no markdown file over 40 kB, so an agent never
loads a whole long page to find one section; each reference over 300 lines opens with its contents
(links to its own ``##`` sections, in order); every doc section the Python names exists.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO
from skill_check import markdown, paths

MAX_BYTES = 40_000        # a markdown file, at most
CONTENTS_FROM_LINES = 300  # a reference longer than this opens with its contents
CONTENTS = re.compile(r"^Contents: (?P<body>.+?)(?:\n\n|\Z)", re.MULTILINE | re.DOTALL)


def repository_markdown(root: Path = REPO) -> list[Path]:
    """Every ``*.md`` of the repository, outside hidden folders (``.git``, ``.venv``)."""
    return sorted(p for p in root.rglob("*.md")
                  if not any(part.startswith(".") for part in p.relative_to(root).parts))


def contents_problem(path: Path) -> str | None:
    """Why ``path`` lacks the contents it needs, or None: under ``CONTENTS_FROM_LINES`` lines it
    needs none; above, the text before its first ``##`` holds a paragraph starting ``Contents: ``
    whose ``(#anchor)`` links are its ``##`` sections' anchors, in order."""
    text = path.read_text(encoding="utf-8")
    if len(text.splitlines()) <= CONTENTS_FROM_LINES:
        return None
    sections = markdown.sections(path)
    wanted = [s.anchor for s in sections if s.level == 2]
    opening = "\n".join(s.prose for s in sections if s.level <= 1)  # the text before the first ##
    found = CONTENTS.search(opening)
    if not found:
        return f"{len(text.splitlines())} lines and no 'Contents: ' paragraph before its first ## heading"
    listed = re.findall(r"\]\(#([\w-]+)\)", found["body"])
    if listed != wanted:
        return f"its contents list {listed}, its ## sections are {wanted}"
    return None


def test_no_markdown_file_over_40_kb():
    files = repository_markdown()
    assert len(files) >= 30
    big = {p.relative_to(REPO).as_posix(): p.stat().st_size for p in files if p.stat().st_size > MAX_BYTES}
    assert not big, f"over {MAX_BYTES} bytes (split by topic, and update every link: palm-rlhf-skill check): {big}"


def test_each_long_reference_opens_with_its_contents():
    references = markdown.reference_files()
    assert sum(len(p.read_text(encoding="utf-8").splitlines()) > CONTENTS_FROM_LINES for p in references) >= 3
    problems = {markdown.rel(p): why for p in references if (why := contents_problem(p))}
    assert not problems, problems


def page(tmp_path: Path, opening: str, headings: list[str], filler: int = 110) -> Path:
    body = "".join(f"## {h}\n" + "a line\n" * filler for h in headings)
    path = tmp_path / "page.md"
    path.write_text(f"# Page\n\nRead this when.\n\n{opening}{body}", encoding="utf-8")
    return path


@pytest.mark.parametrize("opening, why", [
    ("", "no 'Contents: ' paragraph"),
    ("Contents: [One](#one); [Three](#three).\n\n", "its ## sections are ['one', 'two', 'three']"),
    ("Contents: [Two](#two); [One](#one); [Three](#three).\n\n", "its contents list ['two', 'one', 'three']"),
], ids=["missing", "a section left out", "out of order"])
def test_a_long_page_without_matching_contents_fails(tmp_path, opening, why):
    assert why in contents_problem(page(tmp_path, opening, ["One", "Two", "Three"]))


def test_matching_contents_or_a_short_page_pass(tmp_path):
    good = "Contents: [One](#one); [Two,\nwrapped](#two); [Three](#three).\n\n"
    assert contents_problem(page(tmp_path, good, ["One", "Two", "Three"])) is None
    assert contents_problem(page(tmp_path, "", ["One", "Two"], filler=10)) is None


def test_every_doc_section_named_in_python_exists():
    """The helpers' pointers (``traps-setup.md#ppo-max-norm``, ``{NAME}#anchor`` with
    ``NAME = "....md"``) name a section of the tree; ``check`` runs the same on the shipped
    scripts, here with the package (``doctor``) too."""
    code = paths.code_files() + sorted((REPO / "src").rglob("*.py"))
    drift, checked = paths.check_code_links(code, markdown.markdown_files())
    assert checked >= 100 and not drift, drift


def test_a_stale_doc_section_in_python_is_named(tmp_path):
    stale = tmp_path / "helper.py"
    stale.write_text('TRAPS = "references/traps-setup.md"\n'
                     'A = "sub-skills/policy-optimization/references/troubleshooting.md#ppo-max-norm"\n'
                     'B = f"{TRAPS}#no-such-section"\nC = "references/gone.md#x"\nD = f"{TRAPS}#ppo-max-norm"\n',
                     encoding="utf-8")
    drift, checked = paths.check_code_links([stale], markdown.markdown_files())
    assert checked == 4
    assert [(d["symbol"], d["installed"].split(" in ")[0]) for d in drift] == [
        ("doc sub-skills/policy-optimization/references/troubleshooting.md#ppo-max-norm", "no such anchor"),
        ("doc references/traps-setup.md#no-such-section", "no such anchor"),
        ("doc references/gone.md#x", "missing")]
