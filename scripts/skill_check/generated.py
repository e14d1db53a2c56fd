"""The blocks rendered from the record into the markdown: rendering, rewriting, drift.

Two kinds: ``<!-- BEGIN GENERATED api: SYMBOL -->`` (a record symbol's signatures and returns) and
``<!-- BEGIN GENERATED torch-verified -->`` (the record's ``torch_verified`` rows as a table), each
closed by ``<!-- END GENERATED -->``."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any, Iterator

from skill_check import markdown

BEGIN = re.compile(r"<!-- BEGIN GENERATED (?:api: (?P<symbol>[\w.]+)|(?P<table>torch-verified)) -->\n"
                   r"(?P<body>.*?)<!-- END GENERATED -->", re.DOTALL)
TORCH_COLUMNS = ("torch", "device", "python", "accelerate", "date", "result", "by")


def render_params(params: list[dict[str, Any]]) -> str:
    """Record parameters as Python signature text: ``a, *, b=1, **kwargs``."""
    parts, star_done = [], False
    for p in params:
        if p["kind"] == "KEYWORD_ONLY" and not star_done:
            parts.append("*")
            star_done = True
        if p["kind"] == "VAR_POSITIONAL":
            parts.append("*" + p["name"])
            star_done = True
        elif p["kind"] == "VAR_KEYWORD":
            parts.append("**" + p["name"])
        else:
            parts.append(p["name"] if p["default"] is None else f"{p['name']}={p['default']}")
    return ", ".join(parts)


def render_symbol(record: dict[str, Any], symbol: str) -> str:
    """The markdown block for one record symbol: a python signature block, then one line per
    method saying what it returns (from the record's ``returns``)."""
    entry = record["api"][symbol]
    short = symbol.rpartition(".")[2]
    lines = ["```text"]
    for method, doc in entry["methods"].items():
        head = short if method == "__init__" else f"{short}.{method}"
        params = render_params(doc["params"])
        lines += textwrap.wrap(f"{head}({params})", width=96, subsequent_indent="    ",
                               break_on_hyphens=False)
    lines.append("```")
    returns = [(m, d["returns"]) for m, d in entry["methods"].items() if d.get("returns")]
    if returns:
        lines.append("")
        lines += [f"- `{m}` returns {r}" for m, r in returns]
    return "\n".join(lines) + "\n"


def render_torch_verified(record: dict[str, Any]) -> str:
    """The record's ``torch_verified`` rows as a markdown table (references/installation.md)."""
    lines = ["| " + " | ".join(TORCH_COLUMNS) + " |", "| " + " | ".join("---" for _ in TORCH_COLUMNS) + " |"]
    lines += ["| " + " | ".join(str(row.get(c, "-")).replace("|", "/") for c in TORCH_COLUMNS) + " |"
              for row in record.get("torch_verified", [])]
    return "\n".join(lines) + "\n"


def render(record: dict[str, Any], m: re.Match) -> str:
    """The body a generated block should hold."""
    return render_torch_verified(record) if m["table"] else render_symbol(record, m["symbol"])


def generated_blocks(text: str) -> Iterator[re.Match]:
    """Generated blocks of a markdown text (groups ``symbol`` or ``table``, and ``body``)."""
    return BEGIN.finditer(text)


def write_docs(record: dict[str, Any], files: list[Path]) -> list[Path]:
    """Rewrite every generated block in ``files`` from the record; return the files changed."""
    changed = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        new = BEGIN.sub(lambda m: m[0][:m.start("body") - m.start()] + render(record, m) + "<!-- END GENERATED -->", text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def compare_docs(record: dict[str, Any], files: list[Path]) -> list[dict[str, str]]:
    """Generated blocks that differ from their rendering, naming the first differing line."""
    drift = []
    for path in files:
        for m in generated_blocks(path.read_text(encoding="utf-8")):
            name, body = m["symbol"] or m["table"], m["body"]
            if m["symbol"] and m["symbol"] not in record["api"]:
                drift.append({"file": markdown.rel(path), "symbol": name, "documented": "a generated block",
                              "installed": "no such symbol in the record"})
                continue
            want = render(record, m)
            if body != want:
                doc_lines, want_lines = body.splitlines(), want.splitlines()
                i = next((i for i, (a, b) in enumerate(zip(doc_lines, want_lines)) if a != b),
                         min(len(doc_lines), len(want_lines)))
                drift.append({"file": markdown.rel(path), "symbol": name,
                              "documented": repr(doc_lines[i] if i < len(doc_lines) else "<end>"),
                              "installed": "record renders " + repr(want_lines[i] if i < len(want_lines) else "<end>")
                              + " (run check_skill.py --write-docs)"})
    return drift
