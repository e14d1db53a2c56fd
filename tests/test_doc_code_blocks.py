"""Every Python code block in the skill tree's markdown runs (tiny sizes, CPU, a temp directory).

Blocks of one file run in order in one namespace, like a reader following the page. A block is
skipped only when an HTML comment ``<!-- skip-test: reason -->`` stands right before its fence.
Files are discovered with ``check_skill.markdown_files`` (every ``*.md`` of SKILL.md, references/,
scripts/, sub-skills/), so pages other helpers add are picked up without listing them here.
"""
from __future__ import annotations

import contextlib
import io
import re
import sys

import pytest

from conftest import REPO, load_script

check = load_script(REPO / "scripts" / "check_skill.py", "check_skill")
SKIP = re.compile(r"<!--\s*skip-test:(?P<reason>[^>]*)-->\s*$")
PYTHON = {"python", "py", "python3"}


def python_blocks(path):
    """``(line, body, skip_reason or None)`` for each python block of ``path``."""
    text = path.read_text(encoding="utf-8")
    for line, info, body, start, _ in check.code_blocks(text):
        if info.split()[:1] and info.split()[0].lower() in PYTHON:
            before = text[:start].rstrip("\n").rsplit("\n", 1)[-1]
            m = SKIP.search(before)
            yield line, body, (m["reason"].strip() if m else None)


FILES = [p for p in check.markdown_files() if any(True for _ in python_blocks(p))]


@pytest.fixture(autouse=True)
def private_import_path(monkeypatch):
    """Blocks put the installed tree's ``scripts/`` folders first on ``sys.path`` and may import a
    module of the tree from there: each file runs with a copy of ``sys.path``, and the modules it
    imported from the installed tree are dropped afterwards, so later tests import the checkout's."""
    from palm_rlhf_skill import skill_root
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    installed = str(skill_root().resolve())
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(installed):
            del sys.modules[name]


def test_discovery_finds_the_skill_tree():
    names = {p.relative_to(REPO).as_posix() for p in check.markdown_files()}
    assert "SKILL.md" in names
    assert "sub-skills/policy-optimization/references/api-reference.md" in names
    assert not any(n.startswith((".venv", "tests", "src")) for n in names)


@pytest.mark.parametrize("path", FILES, ids=[p.relative_to(REPO).as_posix() for p in FILES])
def test_python_blocks_run(path, tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    torch.manual_seed(0)
    namespace = {"__name__": "__doc_block__"}
    ran = 0
    for line, body, skip in python_blocks(path):
        where = f"{path.relative_to(REPO).as_posix()}:{line}"
        if skip is not None:
            assert skip, f"{where}: a skip-test marker needs a reason"
            continue
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                exec(compile(body, where, "exec"), namespace)
        except Exception as exc:  # noqa: BLE001 - report which block failed and why
            pytest.fail(f"code block at {where} failed: {type(exc).__name__}: {exc}\n"
                        f"stdout: {out.getvalue()[-1000:]}")
        ran += 1
    assert ran, f"{path}: every python block is skipped"


def test_skips_are_rare():
    blocks = [b for p in check.markdown_files() for b in python_blocks(p)]
    skipped = [b for b in blocks if b[2] is not None]
    assert len(skipped) <= max(1, len(blocks) // 10), f"{len(skipped)} of {len(blocks)} python blocks skipped"


def test_an_expected_error_check_can_fail():
    """A block that checks an error with ``try: call(); raise AssertionError(...) except E: pass``
    passes whatever the call does when E is AssertionError (or a parent of it): the raise meant to
    say "no error" is caught by the same clause. Each such check must tell them apart."""
    caught = re.compile(r"raise AssertionError\([^)]*\)\n(?P<indent>\s*)except (AssertionError|Exception|BaseException)"
                        r"(?: as \w+)?:\n(?P=indent)\s+pass\b")
    vacuous = [f"{p.relative_to(REPO).as_posix()}:{line}" for p in FILES for line, body, _ in python_blocks(p)
               if caught.search(body)]
    assert not vacuous, f"an expected-error check that cannot fail: {vacuous}"
