"""The docs' sections and tables, read by the tests that hold them to the code and the library.

Every failure names the file and the heading to change: ``section`` and ``table`` when the heading
or its table is missing, ``assert_keys_documented`` in its messages, and ``documents`` (a test
decorator) for any assertion of the test it wraps.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

from conftest import REPO

REPORTS = REPO / "references" / "reports.md"  # the --json keys of the smoke helpers
# the --json keys of every helper: the smokes, then plan/doctor/bench/list, then the runs
REPORT_FILES = (REPORTS, REPO / "references" / "tool-reports.md", REPO / "references" / "run-reports.md")
PLACEHOLDERS = {"results": "<trainer>", "losses": "<loss>", "observed": "<optimizer>"}
JSON_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number", dict: "object",
              list: "array", type(None): "null"}


def where(path: Path, *headings: str) -> str:
    """``references/reports.md under '## tiny-rlhf-smoke'``: what a failing doc check names."""
    return f"{Path(path).resolve().relative_to(REPO).as_posix()} under " + " or ".join(f"'{h}'" for h in headings)


def section(path: Path, heading: str) -> str:
    """The text of ``path`` under ``heading`` (a full markdown heading line) up to the next heading;
    AssertionError naming the file and the heading when there is none."""
    markdown = Path(path).read_text(encoding="utf-8")
    assert heading + "\n" in markdown, f"{where(path, heading)}: no such heading (restore it, or update this test)"
    start = markdown.index(heading + "\n") + len(heading) + 1
    end = re.search(r"^#{1,6} ", markdown[start:], re.MULTILINE)
    return markdown[start:start + end.start()] if end else markdown[start:]


def table(path: Path, heading: str) -> list[list[str]]:
    """Body rows of the first markdown table under ``heading`` in ``path``, cells stripped;
    AssertionError naming the file and the heading when the section holds no table."""
    rows = [line for line in section(path, heading).splitlines() if line.startswith("|")]
    assert len(rows) >= 2, f"{where(path, heading)}: no table under this heading"
    split = lambda row: re.split(r"(?<!\\)\|", row.strip()[1:-1])  # GFM: \| is a literal pipe
    return [[cell.strip().replace("\\|", "|") for cell in split(row)] for row in rows[2:]]


def code(cell: str) -> str:
    """The text of a cell that is one `code` span."""
    match = re.fullmatch(r"`([^`]+)`", cell)
    assert match, f"expected one `code` cell, got {cell!r}"
    return match.group(1)


def documents(path: Path, *headings: str):
    """Decorate a test that holds ``path``'s ``headings`` to the code: an AssertionError it raises
    starts with the file and the headings to change (``where``)."""
    def wrap(test):
        @functools.wraps(test)
        def checked(*args, **kwargs):
            try:
                return test(*args, **kwargs)
            except AssertionError as exc:
                raise AssertionError(f"{where(path, *headings)}: {exc}") from None
        return checked
    return wrap


def flatten(value, path: str, found: dict[str, set], copies: set[str] = frozenset(),
            placeholders: dict[str, str] = PLACEHOLDERS) -> None:
    """Record the JSON type of every key path, not below the paths in ``copies``; the keys of an
    object named in ``placeholders`` (trainer, loss and optimizer keys by default) become its
    placeholder."""
    if path:
        found.setdefault(path, set()).add(JSON_TYPES[type(value)])
    if path in copies:
        return
    if isinstance(value, dict):
        last = path.rsplit(".", 1)[-1]
        for key, item in value.items():
            name = placeholders.get(last, key)
            flatten(item, f"{path}.{name}" if path else name, found, copies, placeholders)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for item in value:
            for key, inner in item.items():
                flatten(inner, f"{path}[].{key}", found, copies, placeholders)


def report_file(heading: str) -> Path:
    """The one file of ``REPORT_FILES`` holding ``heading`` (a full heading line); AssertionError
    naming the files when none or several do."""
    found = [p for p in REPORT_FILES if heading + "\n" in p.read_text(encoding="utf-8")]
    names = ", ".join(p.name for p in REPORT_FILES)
    assert len(found) == 1, f"references/ ({names}): {len(found)} headings {heading!r} (restore one, or update this test)"
    return found[0]


def assert_keys_documented(heading: str, reports: list[dict], placeholders: dict[str, str] | None = None) -> None:
    """The key table under ``heading`` in the report files against real reports: every key path
    they hold is a row, every row is seen in one of them, and the JSON types agree. A row with no
    row below it is a leaf: its meaning cell describes what it holds (not checked here), so a table
    documents as deep as it means to and can still not drift."""
    doc = report_file(heading)
    rows = {code(r[0]): r for r in table(doc, heading)}
    leaves = {k for k in rows if not any(o.startswith((k + ".", k + "[].")) for o in rows)}
    found: dict[str, set] = {}
    for report in reports:
        flatten(report, "", found, leaves, placeholders or {})
    assert set(found) == set(rows), (f"{where(doc, heading)}: undocumented: {sorted(set(found) - set(rows))}; "
                                     f"documented but never seen: {sorted(set(rows) - set(found))}")
    for key, types in found.items():
        documented = {t.strip() for t in rows[key][1].split(" or ")}
        assert types <= documented, f"{where(doc, heading)}: {key}: real {types}, documented {documented}"
