"""Cited source lines (``palm_rlhf_pytorch/grpo.py:401-409``, ``accelerate/accelerator.py:1888``,
short ``grpo.py:204`` for the library's own files) checked by content, and every reference
section citing the library lines behind its claim.

A citation is checked three ways:

1. its lines exist in the installed file;
2. content: the cited lines' text equals the text recorded in ``scripts/citations.json`` when the
   citation was written and checked (``check_skill.py --write-citations`` records every citation
   of the tree). The record is an anchor in content, not in line numbers: text found unchanged at
   other lines of the same file (a release that only moved code) is reported as *moved*, with its
   new lines, and ``--write-citations`` rewrites the citation there without review; only text that
   changed or vanished is drift, naming every section that cites it;
3. relevance, in an argument table (``skill_check.arguments``): every citation of a row holds one
   of the arguments the row names, so a row cannot cite unrelated lines.

Every section of a reference cites the library lines behind its claim, unless ``NO_LIBRARY_CLAIM``
lists it (a section about this tree's own helpers, or a page of links).

Each drift names the section (``file#anchor``) that holds the citation.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from skill_check import ROOT, markdown

LIBRARY = "palm_rlhf_pytorch"
RECORD_FILE = "scripts/citations.json"
# First folders of a library citation: the library and the packages whose code it runs.
PACKAGES = {"palm_rlhf_pytorch", "accelerate", "torch", "hl_gauss_pytorch", "adam_atan2_pytorch", "einops",
            "memmap_replay_buffer", "beartype"}
CITE = re.compile(r"(?<![\w/.-])(?P<path>(?:[A-Za-z_]\w*/)*[A-Za-z_]\w*\.py):(?P<spans>\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)")


@dataclass(frozen=True)
class Citation:
    """One ``path:spans`` citation at 1-based ``line`` of a markdown file; ``row`` is the table
    row holding it ("" outside a table)."""
    md: Path
    line: int
    path: str
    spans: tuple[tuple[int, int], ...]
    row: str

    @property
    def key(self) -> str:
        """The citation normalized: ``package/file.py:spans`` (short library paths expanded)."""
        return f"{qualified(self.path)}:{_format_spans(self.spans)}"


def qualified(path: str) -> str:
    """``grpo.py`` -> ``palm_rlhf_pytorch/grpo.py`` (a bare name is one of the library's files)."""
    return path if "/" in path else f"{LIBRARY}/{path}"


def source_file(path: str) -> Path | None:
    """The installed file a citation names (its first folder is an importable package), or None."""
    package, _, rest = qualified(path).partition("/")
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return None
    target = Path(spec.origin).parent / rest
    return target if target.is_file() else None


def parse_spans(text: str) -> tuple[tuple[int, int], ...]:
    """``"468-469,515"`` -> ``((468, 469), (515, 515))``."""
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.append((int(a), int(b or a)))
    return tuple(out)


def citations(md: Path) -> Iterator[Citation]:
    """Every library citation in the prose of ``md`` (fenced blocks excluded)."""
    prose = markdown.strip_code_blocks(md.read_text(encoding="utf-8"))
    for m in CITE.finditer(prose):
        if "/" in m["path"] and m["path"].split("/")[0] not in PACKAGES:
            continue  # a path of this tree (scripts/...), not a library citation
        row = prose[prose.rfind("\n", 0, m.start()) + 1:prose.find("\n", m.end())]
        yield Citation(md, prose.count("\n", 0, m.start()) + 1, m["path"], parse_spans(m["spans"]),
                       row if row.lstrip().startswith("|") else "")


@lru_cache(maxsize=None)
def source_lines(path: str) -> tuple[str, ...] | None:
    """The lines of the installed file a citation names (None when it is missing), read once."""
    found = source_file(path)
    return tuple(found.read_text(encoding="utf-8").splitlines()) if found else None


def cited_text(citation: Citation) -> str | None:
    """The cited lines joined by newlines, or None when the file or a line is missing."""
    lines = source_lines(citation.path)
    if lines is None:
        return None
    if any(b > len(lines) or a < 1 or a > b for a, b in citation.spans):
        return None
    return "\n".join("\n".join(lines[a - 1:b]) for a, b in citation.spans)


def current_text(citation: Citation) -> str | None:
    """The cited text as the installed file holds it now: at the lines where ``located`` finds the
    recorded text when it moved, else at the cited lines (``cited_text``)."""
    known = load_record().get(citation.key)
    text = cited_text(citation)
    if known is not None and (text is None or fingerprint(text) != known["sha"]):
        spans = located(citation, known)
        if spans is not None:
            return cited_text(Citation(citation.md, citation.line, citation.path, spans, citation.row))
    return text


def fingerprint(text: str) -> str:
    """A short hash of cited lines, whitespace at the line ends ignored."""
    normal = "\n".join(line.rstrip() for line in text.splitlines())
    return hashlib.sha256(normal.encode("utf-8")).hexdigest()[:16]


def line_prints(text: str) -> list[str]:
    """A 6-character fingerprint of each cited line: which line changed, without storing the code."""
    return [fingerprint(line)[:6] for line in text.splitlines()]


def load_record() -> dict[str, Any]:
    """``{citation key: {"sha": fingerprint, "first": first cited line, "lines": line_prints
    joined by spaces}}`` (empty when missing)."""
    path = ROOT / RECORD_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def record_of(files: list[Path]) -> dict[str, Any]:
    """The record every citation of ``files`` would have against the installed sources."""
    out = {}
    for md in files:
        for c in citations(md):
            text = cited_text(c)
            if text is not None:
                out[c.key] = {"sha": fingerprint(text), "first": text.splitlines()[0].strip()[:100],
                              "lines": " ".join(line_prints(text))}
    return dict(sorted(out.items()))


def write_record(files: list[Path]) -> Path:
    """Write ``scripts/citations.json`` from the installed sources; returns its path."""
    path = ROOT / RECORD_FILE
    path.write_text(json.dumps(record_of(files), indent=1) + "\n", encoding="utf-8")
    return path


def check_citations(files: list[Path]) -> tuple[list[dict[str, str]], list[dict[str, str]], int]:
    """Every citation in ``files`` against the installed sources and the record.

    Returns (drift, moved, citations checked). Drift: lines missing from the installed file with
    the recorded text found nowhere else, cited code that differs from the record, or a citation
    not yet recorded; each names its section (``file``), ``symbol`` and the cited ``package``
    (distribution name, ``package_of``). Moved: the recorded text found unchanged at other lines of
    the same file (``located``), as ``{"file", "symbol", "citation", "now", "package"}``: not drift.
    """
    record, drift, moved, checked = load_record(), [], [], 0
    for md in files:
        for c in citations(md):
            checked += 1
            where = markdown.section_at(md, c.line).where
            text = cited_text(c)
            known = record.get(c.key)
            symbol = f"citation {c.path}:{_spans(c)}"

            def add(documented: str, installed: str) -> None:
                drift.append({"file": where, "symbol": symbol, "documented": documented, "installed": installed,
                              "package": package_of(c.path)})

            if known is not None and (text is None or known["sha"] != fingerprint(text)):
                spans = located(c, known)
                if spans is not None:
                    moved.append({"file": where, "symbol": symbol, "citation": f"{c.path}:{_spans(c)}",
                                  "now": f"{c.path}:{_format_spans(spans)}", "package": package_of(c.path)})
                    continue
            if text is None:
                add("lines that exist", f"no such lines in the installed {qualified(c.path)}")
            elif known is None:
                add("lines not yet recorded", f"no entry in {RECORD_FILE} (a new or moved citation: read the cited "
                                              "lines, then run check_skill.py --write-citations)")
            elif known["sha"] != fingerprint(text):
                number, line = changed_line(c, known.get("lines", "").split(), text)
                add(f"cited lines {known['first']!r}", f"changed at line {number}: {line.strip()[:80]!r} (re-read "
                                                      "the section against the code, then check_skill.py --write-citations)")
    return drift, moved, checked


def located(c: Citation, known: dict[str, Any]) -> tuple[tuple[int, int], ...] | None:
    """The spans at which the installed file holds the recorded text of ``c`` unchanged, when it
    moved: each span's recorded line fingerprints (``known["lines"]``, split by the spans'
    lengths) found as a run of lines, the one nearest the cited start where several match, and
    the whole text's fingerprint (``known["sha"]``) confirmed. None when the text changed or
    vanished (or the record predates per-line fingerprints)."""
    lines = source_lines(c.path)
    recorded = known.get("lines", "").split()
    if lines is None or len(recorded) != sum(b - a + 1 for a, b in c.spans):
        return None
    prints = [fingerprint(line)[:6] for line in lines]
    out, i = [], 0
    for a, b in c.spans:
        want = recorded[i:i + b - a + 1]
        i += len(want)
        starts = [s for s in range(len(prints) - len(want) + 1) if prints[s:s + len(want)] == want]
        if not starts:
            return None
        start = min(starts, key=lambda s: abs(s + 1 - a)) + 1
        out.append((start, start + len(want) - 1))
    text = "\n".join("\n".join(lines[a - 1:b]) for a, b in out)
    return tuple(out) if fingerprint(text) == known["sha"] and tuple(out) != c.spans else None


def relocate(files: list[Path]) -> list[dict[str, str]]:
    """Rewrite every moved citation of ``files`` at the lines where ``located`` finds its recorded
    text, in place, keeping how it was written (a short ``grpo.py:N`` stays short); returns the
    moves made as ``{"file": markdown path, "citation", "now"}``. ``check_skill.py
    --write-citations`` runs it before recording: a move needs no review."""
    record, moves = load_record(), []
    for md in files:
        lines = md.read_text(encoding="utf-8").split("\n")
        before = len(moves)
        for c in citations(md):
            known = record.get(c.key)
            text = cited_text(c)
            if known is None or (text is not None and fingerprint(text) == known["sha"]):
                continue
            spans = located(c, known)
            if spans is None:
                continue
            old, new = f"{c.path}:{_spans(c)}", f"{c.path}:{_format_spans(spans)}"
            lines[c.line - 1] = re.sub(rf"(?<![\w/.-]){re.escape(old)}(?![\d,-])", new, lines[c.line - 1], count=1)
            moves.append({"file": markdown.rel(md), "citation": old, "now": new})
        if len(moves) > before:
            md.write_text("\n".join(lines), encoding="utf-8")
    return moves


def package_of(path: str) -> str:
    """The distribution that installs a citation's first folder (``accelerate/state.py`` ->
    ``accelerate``; ``grpo.py`` -> ``palm-rlhf-pytorch``), from ``importlib.metadata``."""
    from importlib import metadata

    from packaging.utils import canonicalize_name
    top = qualified(path).split("/")[0]
    dists = metadata.packages_distributions().get(top) or [top]
    return canonicalize_name(dists[0])


def changed_line(c: Citation, recorded: list[str], text: str) -> tuple[int, str]:
    """(line number in the installed file, its text) of the first cited line whose fingerprint
    differs from ``recorded`` (``line_prints`` of the recorded text); the first line past the
    recorded ones when only lines were added, the first cited line when nothing was recorded."""
    numbers = [n for a, b in c.spans for n in range(a, b + 1)]
    lines, now = text.splitlines(), line_prints(text)
    i = next((i for i, (old, new) in enumerate(zip(recorded, now)) if old != new), min(len(recorded), len(now)))
    i = min(i, len(lines) - 1) if recorded else 0
    return numbers[i], lines[i]


def _spans(c: Citation) -> str:
    return _format_spans(c.spans)


def _format_spans(spans: tuple[tuple[int, int], ...]) -> str:
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


# Sections that make no claim about the library's code, so cite none: a whole file, or
# ``file#anchor`` for one section, with the reason.
_OURS = "this tree's own helpers and their measured runs"
_INDEX = "a table of links to the sections that cite"
NO_LIBRARY_CLAIM = {
    "references/installation.md": "this package: install, tested versions, exit codes",
    "references/reports.md": "the --json keys of this tree's helpers",
    "references/tool-reports.md": "the --json keys of this tree's helpers",
    "references/run-reports.md": "the --json keys and files of this tree's runs",
    "sub-skills/policy-optimization/references/inputs.md": "this tree's checks of its inputs, and their tests",
    "sub-skills/reward-modeling/references/preferences.md#layouts": "the layouts this tree reads (data_kit.layouts)",
    "sub-skills/reward-modeling/references/preferences.md#second-example": "this tree's second worked example and its figures",
    "references/probes.md": "the probe kit (scripts/probe_kit.py): what its helpers build and run",
    "sub-skills/policy-optimization/references/multi-node.md": "launch recipes for this tree's smoke helper",
    "sub-skills/policy-optimization/references/sizing.md": _OURS,
    **{f"sub-skills/policy-optimization/references/workflows.md#{a}": _OURS for a in (
        "the-smoke-helper", "options", "prompt-styles", "exit-codes", "learning-check", "measured-pass-rates",
        "plan-a-run", "accuracy-of-the-plan-measured")},
    **{f"sub-skills/policy-optimization/references/distributed.md#{a}": _OURS for a in (
        "check-first-the-smoke-helper-on-n-processes", "checking-that-ranks-stay-in-sync-in-your-own-run",
        "a-training-script")},
    "sub-skills/policy-optimization/references/distributed.md#beyond-one-machine": _INDEX,
    "sub-skills/policy-optimization/references/trainer-selection.md#measured-figures": _OURS,
    **{f"sub-skills/policy-optimization/references/training-run.md#{a}": _OURS for a in (
        "first-run", "watchdog-rules", "held-out-flat", "exit-codes", "python-api")},
    "sub-skills/policy-optimization/references/troubleshooting.md#symptom-index": _INDEX,
    "sub-skills/policy-optimization/references/troubleshooting.md#silent-failures": _INDEX,
}


def exempt(section: markdown.Section) -> bool:
    """Whether ``NO_LIBRARY_CLAIM`` lists the section or its file."""
    return section.file in NO_LIBRARY_CLAIM or section.where in NO_LIBRARY_CLAIM


def claims(section: markdown.Section) -> bool:
    """Whether a section has prose of its own (beyond its heading, comments and anchors) that is
    not the page intro (the text under the H1 says what the page covers and links on)."""
    if section.level <= 1 or "<!-- BEGIN GENERATED api:" in section.text:
        return False  # the intro; a generated signature block is compared with the library itself
    body = section.prose.split("\n", 1)[1] if "\n" in section.prose else ""
    body = re.sub(r"<!--.*?-->|<a id=[^>]*></a>", "", body, flags=re.DOTALL)
    return bool(body.strip())


def uncited_sections(files: list[Path]) -> list[dict[str, str]]:
    """Sections of the references with prose but no library citation, ``NO_LIBRARY_CLAIM`` aside."""
    drift = []
    for md in files:
        for section in markdown.sections(md):
            if exempt(section) or not claims(section):
                continue
            if not any(c.line >= section.line for c in citations_in(md, section)):
                drift.append({"file": section.where, "symbol": "section citations",
                              "documented": f"{section.title or 'the page intro'!r} cites no library lines",
                              "installed": "cite the lines behind its claim (file.py:N-M), or list it in "
                                           "skill_check/citations.py NO_LIBRARY_CLAIM if it makes none"})
    return drift


def citations_in(md: Path, section: markdown.Section) -> list[Citation]:
    """The citations inside ``section`` of ``md``."""
    end = section.line + section.text.count("\n")
    return [c for c in citations(md) if section.line <= c.line < end or (not section.level and c.line < end)]
