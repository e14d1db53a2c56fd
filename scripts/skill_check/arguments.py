"""Every argument of the API record has a behaviour entry in the reference that owns its symbol.

An entry is a row of an argument table: a table right after a marker comment that names the
methods it covers, for example::

    <!-- arguments: grpo.RLHFTrainer.__init__ tpo.RLHFTrainer.__init__ -->
    | argument | does; interacts; trap | source |
    | --- | --- | --- |
    | `eps_clip` | ratio clip range ... | `grpo.py:293,392` |

Symbols are the record's without ``palm_rlhf_pytorch.``; ``trainers`` stands for the four trainer
classes. The first cell names one or more arguments (```*args```, ```**kwargs``` for the
variadic ones); the last cell cites the library lines, and each of its citations must hold one of
the row's arguments, so a row cannot cite unrelated lines. One row may serve several symbols (the
arguments shared by the trainers are written once).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skill_check import ROOT, citations, markdown

PREFIX = "palm_rlhf_pytorch."
TRAINERS = ("RLHFTrainer", "grpo.RLHFTrainer", "tpo.RLHFTrainer", "flowrl.FlowRLTrainer")
API_REFERENCE = "sub-skills/policy-optimization/references/api-reference.md"
# The reference that owns each symbol's entries (every other symbol: API_REFERENCE).
OWNERS = {"palm_rlhf_pytorch.PaLM": "sub-skills/palm-modeling/references/palm-api.md",
          "palm_rlhf_pytorch.RewardModel": "sub-skills/reward-modeling/references/reward-api.md",
          "palm_rlhf_pytorch.ImplicitPRM": "sub-skills/reward-modeling/references/implicit-prm.md"}
MARKER = re.compile(r"^<!-- arguments: (?P<methods>[^>]+?) -->\n(?P<table>(?:\|.*\n?)+)", re.MULTILINE)
NAME = re.compile(r"`(\*{0,2})([A-Za-z_]\w*)`")


@dataclass(frozen=True)
class Entry:
    """One row of an argument table: the methods its table covers, the arguments it names."""
    file: str
    line: int
    methods: tuple[tuple[str, str], ...]  # (record symbol, method)
    names: tuple[str, ...]
    cells: tuple[str, ...]


def owner(symbol: str) -> str:
    """The reference (skill-root relative) that holds ``symbol``'s argument entries."""
    return OWNERS.get(symbol, API_REFERENCE)


def expand(methods: str) -> list[tuple[str, str]]:
    """``"trainers.train PaLM.forward"`` -> ``[(record symbol, method), ...]``."""
    out = []
    for item in methods.split():
        symbol, _, method = item.rpartition(".")
        for short in (TRAINERS if symbol == "trainers" else (symbol,)):
            out.append((PREFIX + short, method))
    return out


def entries(md: Path) -> list[Entry]:
    """Every argument-table row of ``md``."""
    text = md.read_text(encoding="utf-8")
    out = []
    for m in MARKER.finditer(text):
        methods = tuple(expand(m["methods"]))
        first = text.count("\n", 0, m.start("table")) + 1
        for i, row in enumerate(m["table"].splitlines()[2:], start=2):  # after header and --- row
            cells = tuple(c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|")))
            names = tuple(n for _, n in NAME.findall(cells[0]))
            out.append(Entry(markdown.rel(md), first + i, methods, names, cells))
    return out


def parameters(record: dict[str, Any], symbol: str, method: str) -> list[dict[str, Any]] | None:
    """The record's parameters of ``symbol.method`` (None when the record has no such method)."""
    entry = record["api"].get(symbol)
    if entry is None or method not in entry["methods"]:
        return None
    return entry["methods"][method]["params"]


def check_arguments(record: dict[str, Any], files: list[Path]) -> tuple[list[dict[str, str]], int]:
    """Drift: an argument without an entry in its owner's reference (naming the file, the symbol
    and the argument), an entry for an argument none of its methods has, a marker naming a method
    the record lacks, a row without a behaviour or a citation, a citation without the row's
    argument. Returns (drift, entries checked)."""
    by_file = {markdown.rel(f): entries(f) for f in files}
    drift: list[dict[str, str]] = []

    def add(file: str, symbol: str, documented: str, installed: str) -> None:
        drift.append({"file": file, "symbol": symbol, "documented": documented, "installed": installed})

    covered = set()
    for file, rows in by_file.items():
        for e in rows:
            where = f"{file}:{e.line}"
            known = {p["name"] for s, m in e.methods for p in (parameters(record, s, m) or [])}
            for s, m in e.methods:
                if parameters(record, s, m) is None:
                    add(where, f"{s}.{m}", "an argument table for it", "no such method in the record")
                elif owner(s) == file:
                    covered |= {(s, m, n) for n in e.names}
            for n in e.names:
                if n not in known:
                    add(where, f"argument entry `{n}`", "an argument of " + ", ".join(f"{s}.{m}" for s, m in e.methods),
                        "no such argument")
            if not e.names or len(e.cells) < 3 or not e.cells[1]:
                add(where, "argument entry " + (e.cells[0] if e.cells else "?"), "argument | behaviour | source",
                    "a row without an argument or a behaviour")
            drift += _row_citations(where, e)
    for symbol, entry in record["api"].items():
        for method, doc in entry["methods"].items():
            for p in doc["params"]:
                if (symbol, method, p["name"]) not in covered:
                    add(owner(symbol), f"{symbol}.{method}({p['name']})", "no behaviour entry",
                        "an argument" + (f" (default {p['default']})" if p["default"] is not None else ""))
    return drift, sum(len(rows) for rows in by_file.values())


def _row_citations(where: str, e: Entry) -> list[dict[str, str]]:
    """A row cites at least one library line, and every citation holds one of its arguments."""
    found = [m for m in citations.CITE.finditer(e.cells[-1])] if e.cells else []
    if not found:
        return [{"file": where, "symbol": f"argument entry {e.cells[0]}", "documented": "a cited library line",
                 "installed": "none (cite file.py:N where the argument is read)"}]
    drift = []
    for m in found:
        c = citations.Citation(Path(ROOT / where.split(":")[0]), 0, m["path"], citations.parse_spans(m["spans"]), "")
        text = citations.current_text(c) or ""
        if not any(re.search(rf"\b{re.escape(n)}\b", text) for n in e.names):
            drift.append({"file": where, "symbol": f"argument entry {e.cells[0]}: citation {m[0]}",
                          "documented": "lines that read " + " or ".join(f"`{n}`" for n in e.names),
                          "installed": "none of them there: " + repr(text.splitlines()[0].strip()[:60] if text else "no such lines"),
                          "package": citations.package_of(m["path"])})
    return drift
