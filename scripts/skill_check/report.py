"""Every check in order, the report (``--json``) and its plain text."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from skill_check import ROOT, api, arguments, budget, citations, derived, generated, install_state, markdown, paths, skills
from skill_runtime import reporting, version_gate


def run_checks(allow_shadowed: bool = False, strict: bool = False) -> dict[str, Any]:
    """Every check; returns the report. The docs are compared with any installed version. Raises
    SkillError(3) when the library is missing, or when a file on the import path shadows one of
    its modules, unless ``allow_shadowed`` (``--allow-untested``: compare with that copy, e.g. a
    maintainer's edited library on PYTHONPATH, with a warning).

    Drift that a package installed at another version than the pinned one explains (its cited
    code, or the library's signatures and defaults, differ: ``pinned_differences``) goes to
    ``version_drift``; cited text found at other lines goes to ``moved``; the rest is ``drift``.
    ``status`` is the first that is not empty of "drift", "version_drift", "moved", else "ok";
    ``exit_code`` is 1 for drift, and with ``strict`` (maintainers, CI) for any of the three."""
    env = version_gate.check_versions(allow_untested=True, allow_shadowed=allow_shadowed)
    state = install_state.install_state(ROOT, Path.cwd())
    warnings = env["warnings"] + [w for w in [install_state.warning(state)] if w]
    record = version_gate.load_api_record()
    files = markdown.markdown_files()
    references = markdown.reference_files()
    installed = api.installed_api(record)
    skill_drift = skills.validate_skills(markdown.skill_files())  # first: exit 3 without skills-ref
    argument_drift, entries = arguments.check_arguments(record, files)
    citation_drift, moved, cited = citations.check_citations(files)
    path_drift, paths_checked = paths.check_paths(files)
    code_drift, code_checked = paths.check_code_links(paths.code_files(), files)
    parts, budget_drift = budget.context_budget(files)
    library = canonicalize_name(record["library"])
    found = (by(library, api.compare_api(record, installed)) + generated.compare_docs(record, files)
             + skill_drift + path_drift + code_drift + argument_drift + citation_drift
             + citations.uncited_sections(references) + by(library, derived.check_facts(record, installed, ROOT))
             + by(library, derived.check_default_claims(installed, files, ROOT))
             + derived.check_version_mentions(record, files) + budget_drift)
    differences = pinned_differences(record, {d["package"] for d in found + moved if d.get("package")})
    drift = [d for d in found if d.get("package") not in differences]
    version_drift = [d for d in found if d.get("package") in differences]
    status = next((name for name, items in (("drift", drift), ("version_drift", version_drift), ("moved", moved))
                   if items), "ok")
    methods = sum(len(e["methods"]) for e in record["api"].values())
    return {
        "status": status,
        "strict": strict,
        "exit_code": 1 if drift or (strict and status != "ok") else 0,
        "versions": env["versions"],
        "tested": env["tested"],
        "pinned": {name: {"installed": installed_v, "pinned": pinned_v}
                   for name, (installed_v, pinned_v) in sorted(differences.items())},
        "warnings": warnings,
        "install": state,
        "counts": {"symbols": len(record["api"]), "methods": methods,
                   "generated_blocks": sum(len(list(generated.generated_blocks(f.read_text(encoding="utf-8"))))
                                           for f in files),
                   "skill_files": len(markdown.skill_files()), "markdown_files": len(files),
                   "links_and_paths": paths_checked + code_checked, "argument_entries": entries, "citations": cited,
                   "derived_facts": len(derived.FACTS)},
        "budget": {"chars_per_token": budget.CHARS_PER_TOKEN, "parts": parts, "claude_details": budget.claude_details()},
        "drift": drift,
        "version_drift": version_drift,
        "moved": moved,
    }


def by(package: str, drift: list[dict[str, str]]) -> list[dict[str, str]]:
    """``drift`` whose cause is the installed ``package`` (signatures, defaults), so tagged."""
    return [{**d, "package": package} for d in drift]


def pinned_differences(record: dict[str, Any], packages: set[str]) -> dict[str, tuple[str | None, str]]:
    """Of ``packages`` (distribution names), those installed at another version than the one the
    docs were checked with (``tested_with`` in scripts/api_record.json, the same pins as the
    repository's constraints.txt): ``{name: (installed, pinned)}``. A local build label is not a
    difference (``2.13.0+cpu`` is torch 2.13.0); a package the record does not pin never is."""
    from packaging.version import InvalidVersion, Version

    pinned = {canonicalize_name(record["library"]): record["tested_version"],
              **{canonicalize_name(k): v for k, v in record["tested_with"].items()}}
    out = {}
    for name in sorted(packages & pinned.keys()):
        now = version_gate.installed_version(name)
        try:
            same = now is not None and Version(now).public == Version(pinned[name]).public
        except InvalidVersion:
            same = now == pinned[name]
        if not same:
            out[name] = (now, pinned[name])
    return out


def drift_line(d: dict[str, str]) -> str:
    """One drift as ``file: symbol: documented X, installed Y``."""
    return f"{d['file']}: {d['symbol']}: documented {d['documented']}, installed {d['installed']}"


def summary(report: dict[str, Any]) -> str:
    """The plain report: each drift in full, each moved citation, a warning per package installed
    at another version than the docs were checked with (naming the sections whose cited code
    differs there), versions, warnings, the context budget (parts within their limit counted, those
    over it in full), then the verdict with the next step."""
    v, t, c = report["versions"], report["tested"], report["counts"]
    lines = [drift_line(d) for d in report["drift"]]
    lines += [f"{m['file']}: moved: {m['citation']} is at {m['now']} in the installed {m['package']}"
              for m in report["moved"]]
    for name, pin in report["pinned"].items():
        sections = sorted({d["file"] for d in report["version_drift"] if d["package"] == name})
        moves = sum(m["package"] == name for m in report["moved"])
        lines.append(f"warning: {name} {pin['installed']} is installed; the docs were checked with {pin['pinned']}: "
                     + (f"its code differs from what {len(sections)} section(s) say: {', '.join(sections)}"
                        if sections else "what they cite is unchanged")
                     + (f"; {moves} cited range(s) stand at other lines" if moves else ""))
    lines.append(f"palm-rlhf-pytorch installed {v['palm-rlhf-pytorch']}, tested {t['palm-rlhf-pytorch']} "
                 f"(supported {t['supported']}); torch {v['torch']}")
    lines += [f"warning: {w}" for w in report["warnings"]]
    lines += budget_lines(report["budget"])
    checked = (f"{c['symbols']} symbols / {c['methods']} methods, {c['generated_blocks']} generated blocks, "
               f"{c['argument_entries']} argument entries, {c['citations']} citations, {c['derived_facts']} derived "
               f"facts, {c['skill_files']} SKILL.md, {c['links_and_paths']} links and paths in {c['markdown_files']} "
               "markdown files and the context budget")
    stale = report["install"]["stale"]
    code, status = report["exit_code"], report["status"]
    strict = " under --strict" if code and status != "drift" else ""
    if status == "drift":
        lines.append(f"check: DRIFT (exit 1): {len(report['drift'])} difference(s), listed above ({checked}); next: "
                     + ("these are the installed copy's: reinstall from the checkout and check again (warning above)"
                        if stale else "fix the docs or the record where each line points (scripts/api_record.json: "
                        "--dump-installed; scripts/citations.json: --write-citations)"))
    elif status == "version_drift":
        lines.append(f"check: VERSION DRIFT (exit {code}{strict}): the docs match the installed library except "
                     f"{len(report['version_drift'])} place(s) where a package differs from the version they were "
                     f"checked with (warning above; {checked}); next: "
                     + ("pip install -c constraints.txt '.[test]' for the pinned versions, or review each place, "
                        "then check_skill.py --write-citations" if code
                        else "read those sections against your installed code; " + reporting.FIRST_COMMAND))
    elif status == "moved":
        lines.append(f"check: OK (exit {code}{strict}): the docs match the installed library; {len(report['moved'])} "
                     f"cited range(s) stand at other lines, listed above ({checked}); next: "
                     + ("check_skill.py --write-citations rewrites them" if code else reporting.FIRST_COMMAND))
    else:
        lines.append(f"check: OK (exit 0): the docs match the installed library ({checked}); next: "
                     + ("reinstall from the checkout, then check again (warning above)" if stale
                        else reporting.FIRST_COMMAND))
    return "\n".join(lines)


def budget_lines(report_budget: dict[str, Any]) -> list[str]:
    """The context budget: how many parts are within their limits, each part over its limit in
    full, and Claude Code's projection."""
    parts = report_budget["parts"]
    over = [r for r in parts if not r["within"]]
    lines = [f"context budget (~tokens = chars / {report_budget['chars_per_token']}): {len(parts) - len(over)} of "
             f"{len(parts)} parts within their limits (--json lists every part)"]
    for r in over:
        size = (f"{r['lines']} lines, " if r["lines"] is not None else "") + f"{r['chars']} chars, ~{r['tokens']} tok"
        lines.append(f"  OVER {r['file']} {r['part']}: {size} ({r['limit']})")
    details = report_budget["claude_details"]
    lines.append("  claude plugin details: " + (
        f"~{details['always_on_tokens']} tok always on, ~{details['on_invoke_tokens']} tok when the skill is used"
        if "always_on_tokens" in details else f"not read ({details['unavailable']})"))
    return lines
