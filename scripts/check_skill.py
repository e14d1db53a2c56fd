#!/usr/bin/env python3
"""Check that this skill's documentation still matches the installed palm-rlhf-pytorch.

Four checks, each drift printed as one line ``file: symbol: documented X, installed Y``:

1. API record: every signature in ``scripts/api_record.json`` (parameter names, kinds and default
   reprs) against ``inspect.signature`` of the installed library.
2. Rendered docs: every generated signature block in the markdown (between
   ``<!-- BEGIN GENERATED api: SYMBOL -->`` and ``<!-- END GENERATED -->``) equals its rendering
   from the record, so the reference cannot disagree with the record.
3. SKILL.md files: each one validated with the ``skills-ref`` Agent Skills validator (the root skill
   under its real name ``palm-rlhf-pytorch``), allowing only the Claude Code extension key
   ``disable-model-invocation``.
4. Paths: every relative markdown link (and its ``#anchor``) and every file path named in inline
   code or a shell block exists.
5. Context budget: the size of what an agent loads, in characters and approximate tokens, within
   the one table ``BUDGET`` (root description, each SKILL.md body, each reference), with Claude
   Code's own projection (``claude plugin details``) when a ``claude`` executable is on PATH.

It also reports the installed and tested versions and warns when the installed library is outside
the tested range.

Usage:
    check_skill.py                       # report on stdout: drift lines, then the verdict
    check_skill.py --json                # one JSON object on stdout
    check_skill.py --dump-installed      # the installed API in the record's format (to update it)
    check_skill.py --render SYMBOL       # the markdown signature block for one record symbol
    check_skill.py --write-docs          # rewrite the generated blocks in the markdown from the record
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))
import skill_runtime  # noqa: E402
from skill_runtime import exits, options, reporting, runner, streams, version_gate  # noqa: E402

ROOT = skill_runtime.SKILL_ROOT
RECORD_FILE = "scripts/api_record.json"
ROOT_SKILL_NAME = "palm-rlhf-pytorch"  # the root folder may be named otherwise (repo, wheel: skill/)
# Claude Code's extension key: sub-skills are loaded by the router, never auto-invoked by the
# model; the Agent Skills spec (and so skills-ref) does not know it, so it is allowed by name
# (why, for readers: references/installation.md#checking-the-skill-files).
ALLOWED_EXTENSION_KEYS = {"disable-model-invocation"}
SKILL_PARTS = ("SKILL.md", "references", "scripts", "sub-skills")  # what the wheel ships
# Files of the source project that the markdown may name but the wheel's skill tree does not ship.
PROJECT_FILES = {"pyproject.toml", "README.md", "tools/verify_floors.py"}
PATH_EXTENSIONS = ("md", "py", "json", "txt", "toml", "yaml", "yml", "sh", "cfg")
BEGIN = re.compile(r"<!-- BEGIN GENERATED api: (?P<symbol>[\w.]+) -->\n(?P<body>.*?)<!-- END GENERATED -->",
                   re.DOTALL)


# --- the installed API ---------------------------------------------------------------------------

def resolve(symbol: str) -> Any:
    """Import ``palm_rlhf_pytorch.grpo.RLHFTrainer``-style dotted names (module, then attribute)."""
    module_name, _, attr = symbol.rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


def underlying(func: Any) -> Any:
    """The function a decorator wraps: follows ``__wrapped__`` (functools.wraps), then a closure
    holding exactly one function when the wrapper's own signature is only ``(self, *args,
    **kwargs)``: ``palm_rlhf_pytorch/utils.py``'s ``eval_decorator`` (on ``PaLM.generate`` and the
    actors' ``generate``) does not use functools.wraps."""
    while True:
        func = inspect.unwrap(func)
        kinds = {p.kind for p in inspect.signature(func).parameters.values() if p.name != "self"}
        cells = [c.cell_contents for c in (getattr(func, "__closure__", None) or ())
                 if inspect.isfunction(c.cell_contents)]
        if kinds <= {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD} and len(cells) == 1:
            func = cells[0]
            continue
        return func


def default_repr(value: Any) -> str:
    """``repr()`` of a default, with functions named ``module.qualname`` (no memory address)."""
    if callable(value) and hasattr(value, "__qualname__") and not isinstance(value, type):
        return f"{getattr(value, '__module__', None) or '?'}.{value.__qualname__}"
    return repr(value)


def describe_signature(func: Any) -> list[dict[str, Any]]:
    """Parameters of ``func`` (``self`` dropped) as ``{name, kind, default}`` dicts.

    ``kind`` is the ``inspect.Parameter`` kind name (``POSITIONAL_OR_KEYWORD``, ``KEYWORD_ONLY``,
    ``VAR_POSITIONAL``, ``VAR_KEYWORD``); ``default`` is ``default_repr()`` of the default, or ``None``
    when the parameter has none. beartype-wrapped ``__init__``s keep their signature through
    ``functools.wraps``, so ``inspect.signature`` sees the library's own parameters.
    """
    params = list(inspect.signature(underlying(func)).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return [{"name": p.name, "kind": p.kind.name,
             "default": None if p.default is inspect.Parameter.empty else default_repr(p.default)}
            for p in params]


def installed_api(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The installed signatures of every symbol and method the record names.

    Returns ``{symbol: {method: [param, ...] or None when the method is missing}}``; a symbol the
    library no longer has maps to ``None``. Raises ImportError when palm_rlhf_pytorch is missing.
    """
    out: dict[str, Any] = {}
    for symbol, entry in record["api"].items():
        try:
            obj = resolve(symbol)
        except (ImportError, AttributeError):
            out[symbol] = None
            continue
        methods = {}
        for method in entry["methods"]:
            func = getattr(obj, method, None)
            methods[method] = describe_signature(func) if callable(func) else None
        out[symbol] = methods
    return out


def dump_installed(record: dict[str, Any]) -> dict[str, Any]:
    """The record's ``api`` section regenerated from the installed library, keeping the documented
    ``returns`` text. ``--dump-installed`` prints the whole record with it; that wrote the first
    version of ``scripts/api_record.json`` (palm-rlhf-pytorch 0.8.0)."""
    installed = installed_api(record)
    api = {}
    for symbol, entry in record["api"].items():
        methods = {}
        for method, doc in entry["methods"].items():
            methods[method] = {"params": installed[symbol][method],
                               **{k: v for k, v in doc.items() if k != "params"}}
        api[symbol] = {**{k: v for k, v in entry.items() if k != "methods"}, "methods": methods}
    return api


def record_json(record: dict[str, Any]) -> str:
    """The record as JSON text, one line per parameter so a diff shows one changed default."""
    text = json.dumps(record, indent=2)
    return re.sub(r'\{\s+"name": ("[^"]*"),\s+"kind": ("[^"]*"),\s+"default": (null|"(?:[^"\\]|\\.)*")\s+\}',
                  r'{"name": \1, "kind": \2, "default": \3}', text) + "\n"


def compare_api(record: dict[str, Any], installed: dict[str, Any]) -> list[dict[str, str]]:
    """Drift between the record and the installed signatures, one dict per difference."""
    drift = []

    def add(symbol: str, documented: str, found: str) -> None:
        drift.append({"file": RECORD_FILE, "symbol": symbol, "documented": documented, "installed": found})

    for symbol, entry in record["api"].items():
        if installed[symbol] is None:
            add(symbol, "present", "missing")
            continue
        for method, doc in entry["methods"].items():
            name = f"{symbol}.{method}"
            got = installed[symbol][method]
            if got is None:
                add(name, "present", "missing")
                continue
            want = {p["name"]: p for p in doc["params"]}
            have = {p["name"]: p for p in got}
            for pname in want.keys() - have.keys():
                add(f"{name}({pname})", "parameter present", "missing")
            for pname in have.keys() - want.keys():
                add(f"{name}({pname})", "missing", f"parameter present (default {have[pname]['default']})")
            for pname in want.keys() & have.keys():
                for key in ("kind", "default"):
                    if want[pname][key] != have[pname][key]:
                        add(f"{name}({pname})", f"{key} {want[pname][key]}", f"{key} {have[pname][key]}")
            common = [p for p in want if p in have]
            if [p for p in have if p in want] != common:
                add(name, "order " + ", ".join(common), "order " + ", ".join(p for p in have if p in want))
    return drift


# --- rendering the reference from the record -----------------------------------------------------

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


def generated_blocks(text: str) -> Iterator[re.Match]:
    """Generated signature blocks of a markdown text (groups ``symbol`` and ``body``)."""
    return BEGIN.finditer(text)


def write_docs(record: dict[str, Any], files: list[Path]) -> list[Path]:
    """Rewrite every generated block in ``files`` from the record; return the files changed."""
    changed = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        new = BEGIN.sub(lambda m: f"<!-- BEGIN GENERATED api: {m['symbol']} -->\n"
                        f"{render_symbol(record, m['symbol'])}<!-- END GENERATED -->", text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def compare_docs(record: dict[str, Any], files: list[Path]) -> list[dict[str, str]]:
    """Generated blocks that differ from their rendering, naming the first differing line."""
    drift = []
    for path in files:
        for m in generated_blocks(path.read_text(encoding="utf-8")):
            symbol, body = m["symbol"], m["body"]
            if symbol not in record["api"]:
                drift.append({"file": rel(path), "symbol": symbol, "documented": "a generated block",
                              "installed": "no such symbol in the record"})
                continue
            want = render_symbol(record, symbol)
            if body != want:
                doc_lines, want_lines = body.splitlines(), want.splitlines()
                i = next((i for i, (a, b) in enumerate(zip(doc_lines, want_lines)) if a != b),
                         min(len(doc_lines), len(want_lines)))
                drift.append({"file": rel(path), "symbol": symbol,
                              "documented": repr(doc_lines[i] if i < len(doc_lines) else "<end>"),
                              "installed": "record renders " + repr(want_lines[i] if i < len(want_lines) else "<end>")
                              + " (run check_skill.py --write-docs)"})
    return drift


# --- markdown discovery, links and paths ---------------------------------------------------------

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


FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                   re.DOTALL | re.MULTILINE)


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
    found = {slug(h) for h in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.MULTILINE)}
    return found | set(re.findall(r"""\bid=["']([^"']+)["']""", text))


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
        text = strip_code_blocks(raw)
        for m in LINK.finditer(text):
            target = m["target"].strip("<>")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
                continue  # URL or mailto:
            checked += 1
            file_part, _, anchor = target.partition("#")
            dest = (md.parent / file_part) if file_part else md
            line = text.count("\n", 0, m.start()) + 1
            if not dest.exists():
                drift.append({"file": f"{rel(md)}:{line}", "symbol": f"link {target}",
                              "documented": "a file that exists", "installed": "missing"})
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                drift.append({"file": f"{rel(md)}:{line}", "symbol": f"link {target}",
                              "documented": f"anchor #{anchor}", "installed": f"no such anchor in {rel(dest)}"})
        named = [(text.count("\n", 0, m.start()) + 1, m["path"]) for m in INLINE_PATH.finditer(text)]
        for first, info, body, _, _ in code_blocks(raw):
            if info.split()[:1] in (["bash"], ["sh"], ["shell"], ["console"]):
                named += [(first + body.count("\n", 0, m.start()), m["path"]) for m in SHELL_PATH.finditer(body)]
        for line, name in named:
            if name.startswith(("/", "~")) or name in PROJECT_FILES:
                continue
            checked += 1
            if not any((base / name).exists() for base in path_bases(md)):
                drift.append({"file": f"{rel(md)}:{line}", "symbol": f"path {name}",
                              "documented": "a file that exists", "installed": "missing"})
    return drift, checked


# --- SKILL.md validation with skills-ref ---------------------------------------------------------

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
            drift += [{"file": rel(md), "symbol": "frontmatter", "documented": "valid (skills-ref)",
                       "installed": e} for e in errors]
    return drift


# --- context budget ------------------------------------------------------------------------------

# Agents preload every skill's name and description; a SKILL.md body loads when the skill is
# used, a reference when the body's load condition sends the agent there. Tokens are estimated as
# characters / CHARS_PER_TOKEN (Claude Code's `plugin details` projects ~116 tokens for the root's
# 445 characters of name and description: 3.8 characters a token). The budget, in one table:
CHARS_PER_TOKEN = 4
BUDGET = {
    "root description chars": 1024,  # Agent Skills spec: a description is at most 1,024 characters
    "body lines": 499,               # Agent Skills guidance: a SKILL.md body under 500 lines
    "body tokens": 5000,             # ... and about 5,000 tokens
    # Each reference: its size on 2026-11-30, after the routing rework and the split of the
    # --json schemas (reports.md), the several-machine recipes (multi-node.md) and the sizing table
    # (sizing.md) out of workflows.md and distributed.md, plus 15%, rounded up to 250 tokens.
    # reports.md: 7204 tokens after the key tables of plan, plan --execute, doctor, bench and list
    # were added (QA D6; each compared with a real report by a test), plus 15%.
    # api-reference.md: 5250 -> 5500 after the held-out check (LR-schedule and best-of-n recipes,
    # tpo_eta, GRPO entropy bonus and value_clip semantics: ~5350 tokens, trimmed), plus headroom.
    # distributed.md 4250 -> 4750 and reward-api.md 4250 -> 4750 after the third knowledge test
    # (batch per rank, seeding, checkpoints, bf16; reward modules the trainers accept, binned
    # sampling attributes): ~4400 and ~4310 tokens, plus about 10%.
    # A reference not listed gets "*".
    "reference tokens": {
        "references/glossary.md": 1000,
        "references/installation.md": 2250,
        "references/probes.md": 1500,  # the probe kit and three worked probes: ~1190 tokens, plus about 25%
        "references/reports.md": 8500,
        "sub-skills/palm-modeling/references/lora-scopes.md": 1000,
        "sub-skills/palm-modeling/references/palm-api.md": 3750,  # 4th knowledge test: size, qk_scale, flash GPUs, label leak (~3670)
        "sub-skills/policy-optimization/references/api-reference.md": 5500,
        "sub-skills/policy-optimization/references/distributed.md": 4750,
        "sub-skills/policy-optimization/references/multi-node.md": 1500,
        "sub-skills/policy-optimization/references/sizing.md": 1000,
        "sub-skills/policy-optimization/references/trainer-selection.md": 2750,
        "sub-skills/policy-optimization/references/troubleshooting.md": 15750,
        "sub-skills/policy-optimization/references/workflows.md": 8250,
        "sub-skills/reward-modeling/references/implicit-prm.md": 1500,
        "sub-skills/reward-modeling/references/reward-api.md": 4750,
        "*": 2000,
    },
}
CLAUDE_DETAILS_TIMEOUT_S = 60


def tokens(chars: int) -> int:
    """Approximate tokens for ``chars`` characters (``CHARS_PER_TOKEN`` a token, rounded up)."""
    return -(-chars // CHARS_PER_TOKEN)


def frontmatter_and_body(path: Path) -> tuple[dict[str, Any], str]:
    """A SKILL.md's frontmatter (skills-ref's parser) and its body."""
    from skills_ref.parser import parse_frontmatter
    return parse_frontmatter(path.read_text(encoding="utf-8"))


def context_budget(files: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Size of each part an agent loads, against ``BUDGET``: the root's name and description
    (always loaded), each SKILL.md body, each reference. Returns (rows, drift): rows are
    ``{file, part, lines, chars, tokens, limit, within}``; drift names every part over its limit."""
    rows = []
    for md in files:
        name = rel(md)
        if md.name == "SKILL.md":
            meta, body = frontmatter_and_body(md)
            if md.parent.resolve() == ROOT.resolve():
                chars = len(meta.get("name", "")) + len(meta.get("description", ""))
                limit = BUDGET["root description chars"]
                rows.append({"file": name, "part": "name and description (always loaded)", "lines": None,
                             "chars": chars, "tokens": tokens(chars), "limit": f"description <= {limit} chars",
                             "within": len(meta.get("description", "")) <= limit})
            lines = len(body.splitlines())
            rows.append({"file": name, "part": "body", "lines": lines, "chars": len(body),
                         "tokens": tokens(len(body)),
                         "limit": f"< {BUDGET['body lines'] + 1} lines, <= {BUDGET['body tokens']} tokens",
                         "within": lines <= BUDGET["body lines"] and tokens(len(body)) <= BUDGET["body tokens"]})
        elif "references" in md.relative_to(ROOT).parts:
            text = md.read_text(encoding="utf-8")
            limit = BUDGET["reference tokens"].get(name, BUDGET["reference tokens"]["*"])
            rows.append({"file": name, "part": "reference", "lines": len(text.splitlines()), "chars": len(text),
                         "tokens": tokens(len(text)), "limit": f"<= {limit} tokens",
                         "within": tokens(len(text)) <= limit})
    drift = [{"file": r["file"], "symbol": f"context budget ({r['part']})", "documented": r["limit"],
              "installed": f"{r['lines']} lines, " * (r["lines"] is not None) + f"{r['chars']} chars, ~{r['tokens']} tokens"}
             for r in rows if not r["within"]]
    return rows, drift


def claude_details(root: Path = ROOT) -> dict[str, Any]:
    """Claude Code's own projection of the plugin's token cost: ``claude --plugin-dir ROOT plugin
    details NAME`` when a ``claude`` executable is on PATH and ROOT holds the plugin manifest
    (``.claude-plugin/plugin.json``, in a source checkout; installed copies have none). It reads
    only local files; a throwaway HOME keeps it from writing the user's settings and telemetry.
    Returns ``{"always_on_tokens", "on_invoke_tokens"}`` (per session; per use of the skill), or
    ``{"unavailable": why}``. Never raises."""
    manifest = root / ".claude-plugin" / "plugin.json"
    claude = shutil.which("claude")
    if claude is None or not manifest.is_file():
        return {"unavailable": "no `claude` on PATH" if claude is None else
                f"no plugin manifest in {root} (a source checkout has .claude-plugin/plugin.json)"}
    name = json.loads(manifest.read_text(encoding="utf-8"))["name"]
    with tempfile.TemporaryDirectory(prefix="palm-rlhf-skill-claude-") as home:
        env = {**os.environ, "HOME": home, "DISABLE_TELEMETRY": "1",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}
        try:
            proc = subprocess.run([claude, "--plugin-dir", str(root), "plugin", "details", name],
                                  capture_output=True, text=True, timeout=CLAUDE_DETAILS_TIMEOUT_S, env=env)
        except (OSError, subprocess.TimeoutExpired) as err:
            return {"unavailable": f"claude plugin details failed: {exits.one_line(err)}"}
    count = r"~(\d+(?:\.\d+)?k?)"  # Claude Code rounds: "~116", "~1.8k"
    always = re.search(rf"Always-on:\s+{count} tok", proc.stdout)
    row = re.search(rf"^\s+{re.escape(name)}\s+{count}\s+{count}\s*$", proc.stdout, re.MULTILINE)
    if proc.returncode != 0 or not always or not row:
        return {"unavailable": f"claude plugin details exit {proc.returncode}: "
                               + (proc.stderr.strip().splitlines() or ["unexpected output"])[-1]}
    return {"always_on_tokens": _rounded_tokens(always.group(1)), "on_invoke_tokens": _rounded_tokens(row.group(2))}


def _rounded_tokens(text: str) -> int:
    """A token count as ``claude plugin details`` prints it (``"116"``, ``"1.8k"``) as an int."""
    return round(float(text[:-1]) * 1000) if text.endswith("k") else int(text)


# --- command line --------------------------------------------------------------------------------

def run_checks(allow_shadowed: bool = False) -> dict[str, Any]:
    """Every check; returns the report. The docs are compared with any installed version. Raises
    SkillError(3) when the library is missing, or when a file on the import path shadows one of
    its modules, unless ``allow_shadowed`` (``--allow-untested``: compare with that copy, e.g. a
    maintainer's edited library on PYTHONPATH, with a warning)."""
    env = version_gate.check_versions(allow_untested=True, allow_shadowed=allow_shadowed)
    record = version_gate.load_api_record()
    files = markdown_files()
    api_drift = compare_api(record, installed_api(record))
    doc_drift = compare_docs(record, files)
    skill_drift = validate_skills(skill_files())
    path_drift, paths_checked = check_paths(files)
    budget, budget_drift = context_budget(files)
    drift = api_drift + doc_drift + skill_drift + path_drift + budget_drift
    methods = sum(len(e["methods"]) for e in record["api"].values())
    return {
        "status": "ok" if not drift else "drift",
        "versions": env["versions"],
        "tested": env["tested"],
        "warnings": env["warnings"],
        "counts": {"symbols": len(record["api"]), "methods": methods,
                   "generated_blocks": sum(len(list(generated_blocks(f.read_text(encoding="utf-8")))) for f in files),
                   "skill_files": len(skill_files()), "markdown_files": len(files),
                   "links_and_paths": paths_checked},
        "budget": {"chars_per_token": CHARS_PER_TOKEN, "parts": budget, "claude_details": claude_details()},
        "drift": drift,
    }


def drift_line(d: dict[str, str]) -> str:
    """One drift as ``file: symbol: documented X, installed Y``."""
    return f"{d['file']}: {d['symbol']}: documented {d['documented']}, installed {d['installed']}"


def summary(report: dict[str, Any]) -> str:
    """The plain report: each drift in full, versions, warnings, the context budget (parts within
    their limit counted, those over it in full), then the verdict with the next step."""
    v, t, c = report["versions"], report["tested"], report["counts"]
    lines = [drift_line(d) for d in report["drift"]]
    lines.append(f"palm-rlhf-pytorch installed {v['palm-rlhf-pytorch']}, tested {t['palm-rlhf-pytorch']} "
                 f"(supported {t['supported']}); torch {v['torch']}")
    lines += [f"warning: {w}" for w in report["warnings"]]
    lines += budget_lines(report["budget"])
    checked = (f"{c['symbols']} symbols / {c['methods']} methods, {c['generated_blocks']} generated blocks, "
               f"{c['skill_files']} SKILL.md, {c['links_and_paths']} links and paths in {c['markdown_files']} "
               "markdown files and the context budget")
    if report["status"] == "ok":
        lines.append(f"check: OK (exit 0): the docs match the installed library ({checked}); next: "
                     + reporting.FIRST_COMMAND)
    else:
        lines.append(f"check: DRIFT (exit 1): {len(report['drift'])} difference(s), listed above ({checked}); "
                     "next: fix the docs or the record (scripts/api_record.json) where each line points")
    return "\n".join(lines)


def budget_lines(budget: dict[str, Any]) -> list[str]:
    """The context budget: how many parts are within their limits, each part over its limit in
    full, and Claude Code's projection."""
    parts = budget["parts"]
    over = [r for r in parts if not r["within"]]
    lines = [f"context budget (~tokens = chars / {budget['chars_per_token']}): {len(parts) - len(over)} of "
             f"{len(parts)} parts within their limits (--json lists every part)"]
    for r in over:
        size = (f"{r['lines']} lines, " if r["lines"] is not None else "") + f"{r['chars']} chars, ~{r['tokens']} tok"
        lines.append(f"  OVER {r['file']} {r['part']}: {size} ({r['limit']})")
    details = budget["claude_details"]
    lines.append("  claude plugin details: " + (
        f"~{details['always_on_tokens']} tok always on, ~{details['on_invoke_tokens']} tok when the skill is used"
        if "always_on_tokens" in details else f"not read ({details['unavailable']})"))
    return lines


def build_parser() -> argparse.ArgumentParser:
    """The command line; parsing imports neither torch nor the library."""
    parser = options.OneLineParser(
        prog=Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "check_skill.py",
        description="Compare this skill's documentation with the installed palm-rlhf-pytorch.",
        epilog="examples:\n  check_skill.py\n  check_skill.py --json\n  palm-rlhf-skill check --json\n"
               "  check_skill.py --render palm_rlhf_pytorch.RLHFTrainer\n\n"
               "exit codes: 0 documentation matches; 1 drift found (one line each: "
               "'file: symbol: documented X, installed Y'); 2 usage error; "
               "3 palm-rlhf-pytorch, torch or skills-ref missing, or shadowed by a file on the import path "
               "(--allow-untested: compare with that copy, with a warning)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="print one JSON report on stdout")
    mode.add_argument("--dump-installed", action="store_true",
                      help="print the record's api section regenerated from the installed library")
    mode.add_argument("--render", metavar="SYMBOL", help="print the markdown block for one record symbol")
    mode.add_argument("--write-docs", action="store_true",
                      help="rewrite the generated signature blocks in the markdown from the record")
    options.add_allow_untested_option(parser)  # check: range always allowed; a shadow (an edited library copy) compared
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the mode chosen on the command line; return the exit code (SkillError propagates)."""
    args = build_parser().parse_args(argv)
    record = version_gate.load_api_record()
    if args.render:
        if args.render not in record["api"]:
            raise exits.SkillError(f"--render {args.render!r}: not in the record; one of "
                                + ", ".join(record["api"]))
        sys.stdout.write(render_symbol(record, args.render))
        return exits.EXIT_OK
    if args.write_docs:
        if not (skill_runtime.SKILL_ROOT / "pyproject.toml").is_file():
            raise exits.SkillError("--write-docs rewrites the repository's markdown: run it in a source "
                                f"checkout, not in an installed copy ({skill_runtime.SKILL_ROOT})")
        for path in write_docs(record, markdown_files()):
            sys.stdout.write(f"rewrote {rel(path)}\n")
        return exits.EXIT_OK
    if args.dump_installed:
        version_gate.check_versions(allow_untested=True, allow_shadowed=args.allow_untested)
        sys.stdout.write(record_json({**record, "api": dump_installed(record)}))
        return exits.EXIT_OK
    with streams.capture_library_output():
        report = run_checks(allow_shadowed=args.allow_untested)
    return runner.emit(report, args.json, summary, exits.EXIT_OK if report["status"] == "ok" else exits.EXIT_CHECK_FAILED)


if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
