#!/usr/bin/env python3
"""Check that this skill's documentation still matches the installed palm-rlhf-pytorch.

The checks live in ``scripts/skill_check/`` (one module each; read its ``__init__.py``); each drift
is printed as one line ``file: symbol: documented X, installed Y``:

1. API record: every signature in ``scripts/api_record.json`` against the installed library.
2. Rendered docs: every generated signature block equals its rendering from the record.
3. SKILL.md files: validated with ``skills-ref``.
4. Paths: every relative link (and its ``#anchor``) and named file exists.
5. Arguments: every argument of the record has a behaviour entry in the reference that owns it.
6. Citations: every cited ``file.py:N-M`` holds the code recorded in ``scripts/citations.json``,
   and every reference section cites the library lines behind its claim.
7. Derived facts: numbers in prose that follow from a library default match the installed
   defaults; a default stated in prose is one the library has.
8. Context budget: the size of what an agent loads, within ``skill_check.budget.BUDGET``.

It also reports the installed and tested versions, warns when the installed library is outside
the tested range, and warns when it is run from a source checkout whose installed copy (the tree
``palm-rlhf-skill check`` reads) differs from it: reinstall.

Usage:
    check_skill.py                       # report on stdout: drift lines, then the verdict
    check_skill.py --json                # one JSON object on stdout
    check_skill.py --strict              # exit 1 also on another version's changes and on moved lines (CI)
    check_skill.py --dump-installed      # the installed API in the record's format (to update it)
    check_skill.py --render SYMBOL       # the markdown signature block for one record symbol
    check_skill.py --write-docs          # rewrite the generated blocks in the markdown from the record
    check_skill.py --write-citations     # record the cited lines' text (scripts/citations.json)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import skill_bootstrap  # noqa: E402,F401  (first: the runtime; a damaged file of the tree is then one line, exit 2)
import skill_runtime  # noqa: E402
from skill_check import api, citations, generated, markdown, report  # noqa: E402
from skill_runtime import exits, options, runner, streams, version_gate  # noqa: E402,F401

# The names other test files read as ``check_skill.X`` (read only; patch the skill_check modules).
anchors, code_blocks, strip_code_blocks = markdown.anchors, markdown.code_blocks, markdown.strip_code_blocks
markdown_files, skill_files = markdown.markdown_files, markdown.skill_files
generated_blocks, compare_docs = generated.generated_blocks, generated.compare_docs


def build_parser() -> argparse.ArgumentParser:
    """The command line; parsing imports neither torch nor the library."""
    parser = options.OneLineParser(
        prog=Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "check_skill.py",
        description="Compare this skill's documentation with the installed palm-rlhf-pytorch.",
        epilog="examples:\n  check_skill.py\n  check_skill.py --json\n  check_skill.py --strict   # maintainers, CI\n  palm-rlhf-skill check --json\n"
               "  check_skill.py --render palm_rlhf_pytorch.RLHFTrainer\n\n"
               "exit codes: 0 documentation matches (also when an installed version other than the pinned one "
               "changed or moved cited code: a warning names each section; --strict makes that 1); 1 drift found "
               "(one line each: 'file: symbol: documented X, installed Y'); 2 usage error; "
               "3 palm-rlhf-pytorch, torch or skills-ref missing, or shadowed by a file on the import path "
               "(--allow-untested: compare with that copy, with a warning)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="print one JSON report on stdout")
    mode.add_argument("--dump-installed", action="store_true",
                      help="print the record's api section regenerated from the installed library")
    mode.add_argument("--render", metavar="SYMBOL", help="print the markdown block for one record symbol")
    mode.add_argument("--write-docs", action="store_true",
                      help="rewrite the generated signature blocks in the markdown from the record")
    mode.add_argument("--write-citations", action="store_true",
                      help="record the text of every cited library line (scripts/citations.json), once checked")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 also when a package installed at another version than the pinned one "
                             "(scripts/api_record.json tested_with) changes cited code, or cited lines moved "
                             "(maintainers and CI: the docs cite the pinned versions exactly)")
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
        sys.stdout.write(generated.render_symbol(record, args.render))
        return exits.EXIT_OK
    if args.write_docs or args.write_citations:
        flag = "--write-docs" if args.write_docs else "--write-citations"
        if not (skill_runtime.SKILL_ROOT / "pyproject.toml").is_file():
            raise exits.SkillError(f"{flag} rewrites the repository's files: run it in a source "
                                   f"checkout, not in an installed copy ({skill_runtime.SKILL_ROOT})")
        if args.write_citations:
            version_gate.check_versions(allow_untested=True, allow_shadowed=args.allow_untested)
            for move in citations.relocate(markdown.markdown_files()):
                sys.stdout.write(f"moved {move['file']}: {move['citation']} -> {move['now']}\n")
            sys.stdout.write(f"rewrote {markdown.rel(citations.write_record(markdown.markdown_files()))}\n")
        for path in generated.write_docs(record, markdown.markdown_files()) if args.write_docs else []:
            sys.stdout.write(f"rewrote {markdown.rel(path)}\n")
        return exits.EXIT_OK
    if args.dump_installed:
        version_gate.check_versions(allow_untested=True, allow_shadowed=args.allow_untested)
        sys.stdout.write(api.record_json({**record, "api": api.dump_installed(record)}))
        return exits.EXIT_OK
    with streams.capture_library_output():
        result = report.run_checks(allow_shadowed=args.allow_untested, strict=args.strict)
    return runner.emit(result, args.json, report.summary, result["exit_code"])


if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
