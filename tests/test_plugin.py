"""How agent users install skills: the Claude Code plugin and marketplace manifests
(``.claude-plugin/``) and the cross-agent ``skills`` CLI.

The manifests agree with the Python package (one version, description, license and author).
Where Node is installed (npx), the pinned validator ``claude plugin validate --strict`` (Claude
Code 2.1.328) passes on a clean copy of the repository with the plugin directory's checks, the
pinned ``skills`` CLI installs a copy whose smoke runs by path, and ``palm-rlhf-skill check`` reads
Claude Code's projected token cost. The first run downloads both packages (about 525 MB of npm
cache, mostly Claude Code's binary); later runs use the cache.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import REPO, run_json
from palm_rlhf_skill import __version__
from palm_rlhf_skill.install import skill_name
from skill_tree import files_with_hashes, repo_skill_files

CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.328"
SKILLS_CLI_VERSION = "1.5.18"  # the newest skills release that runs on Node 20 (1.5.19+ need 22.20)
NPX = shutil.which("npx")
needs_npx = pytest.mark.skipif(NPX is None, reason="npx (Node.js) is not installed: the plugin "
                                                   "validator and the skills CLI run through it")
NPX_TIMEOUT_S = 600  # a first run downloads the packages
PLUGIN = json.loads((REPO / ".claude-plugin" / "plugin.json").read_text(encoding="utf-8"))
MARKETPLACE = json.loads((REPO / ".claude-plugin" / "marketplace.json").read_text(encoding="utf-8"))
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# What skills 1.5.18's copyDirectory leaves out (dist/cli.mjs: EXCLUDE_DIRS, EXCLUDE_FILES).
SKILLS_CLI_SKIPS_DIRS = {".git", "__pycache__", "__pypackages__"}
SKILLS_CLI_SKIPS_FILES = {"metadata.json"}


def test_manifests_agree_with_the_package():
    assert PLUGIN["name"] == skill_name(REPO) == "palm-rlhf-pytorch"
    assert PLUGIN["version"] == __version__, "bump .claude-plugin/plugin.json with __init__.__version__"
    assert PLUGIN["description"] == PROJECT["description"]
    assert PLUGIN["license"] == PROJECT["license"]
    assert PLUGIN["author"] == {"name": PROJECT["authors"][0]["name"]} == MARKETPLACE["owner"]
    assert PLUGIN["skills"] == ["./"]  # the router at the root; its sub-skills are loaded through it
    assert MARKETPLACE["plugins"] == [{"name": PLUGIN["name"], "source": "./"}]
    assert "version" not in MARKETPLACE["plugins"][0]  # one home for the version: plugin.json


def test_icon_is_a_square_png_the_plugin_directory_accepts():
    """The plugin directory takes a square PNG or JPEG, 512 to 2048 px a side, under 2 MB."""
    icon = REPO / PLUGIN["icon"]
    data = icon.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width == height and 512 <= width <= 2048 and len(data) < 2 * 1024 * 1024


def test_readme_install_lines_name_the_manifests_and_the_pinned_cli():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "/plugin marketplace add OWNER/REPO" in readme
    assert f"/plugin install {PLUGIN['name']}@{MARKETPLACE['name']}" in readme
    assert f"npx skills@{SKILLS_CLI_VERSION} add OWNER/REPO -a claude-code --copy" in readme


@pytest.fixture(scope="module")
def clean_copy(tmp_path_factory) -> Path:
    """The repository as a fresh clone holds it: git's tracked and untracked-but-not-ignored files
    (no .venv, caches or build output). Without git (an sdist), everything but those."""
    dest = tmp_path_factory.mktemp("clone") / "palm-rlhf-skill"
    if (REPO / ".git").exists() and shutil.which("git"):
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
        for name in filter(None, listed):
            if (REPO / name).is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, dest / name)
    else:
        shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(
            ".venv", "__pycache__", ".pytest_cache", "build", "dist", "*.egg-info"))
    return dest


@pytest.fixture(scope="module")
def npx_env(tmp_path_factory) -> dict[str, str]:
    """A throwaway HOME (Claude Code writes its settings and telemetry there), npm's usual cache
    (so the packages download once per machine), and no telemetry."""
    npm = shutil.which("npm")
    cache = (subprocess.run([npm, "config", "get", "cache"], capture_output=True, text=True).stdout.strip()
             if npm else str(Path.home() / ".npm"))
    return {**os.environ, "HOME": str(tmp_path_factory.mktemp("home")), "npm_config_cache": cache,
            "npm_config_update_notifier": "false", "DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}


def npx(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([NPX, "--yes", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=NPX_TIMEOUT_S)


@needs_npx
@pytest.mark.parametrize("target", [".", ".claude-plugin/plugin.json"], ids=["marketplace", "plugin"])
def test_claude_plugin_validate_strict_passes_on_a_clean_copy(clean_copy, npx_env, target):
    proc = npx([CLAUDE_CODE, "plugin", "validate", "--strict", "--profile", "directory", "--json", target],
               clean_copy, npx_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["success"] is True and report["strict"] is True
    manifest = report["manifest"]
    assert manifest["type"] == ("marketplace" if target == "." else "plugin")
    assert manifest["errors"] == [] and manifest["warnings"] == [], manifest
    assert report["provides"]["skills"] == [f"{PLUGIN['name']}:{skill_name(REPO)}"]
    directory = report["directory"]  # the plugin directory's checks: nothing found, nothing skipped
    assert directory["findings"] == [] and directory["undecided"] == [] and directory["failure"] is None
    assert directory["incomplete"] is False, directory


@needs_npx
def test_skills_cli_installs_a_copy_whose_smoke_runs_by_path(clean_copy, npx_env, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    proc = npx([f"skills@{SKILLS_CLI_VERSION}", "add", str(clean_copy), "-y", "-a", "claude-code", "--copy"],
               project, npx_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    dest = project / ".claude" / "skills" / PLUGIN["name"]
    assert sorted(p.name for p in project.iterdir()) == [".claude", "skills-lock.json"]
    # what it copies: the skill's whole folder, here the repository, less the CLI's own skips
    expected = {name: digest for name, digest in files_with_hashes(clean_copy).items()
                if not SKILLS_CLI_SKIPS_DIRS & set(name.split("/")[:-1])
                and name.rsplit("/", 1)[-1] not in SKILLS_CLI_SKIPS_FILES}
    assert files_with_hashes(dest) == expected
    assert {top.split("/")[0] for top in expected} >= {"tests", "src", ".ci", ".claude-plugin"}  # as README says
    tree = repo_skill_files()
    assert {name: digest for name, digest in files_with_hashes(dest).items() if name in tree} == tree

    script = dest / "sub-skills" / "policy-optimization" / "scripts" / "tiny_rlhf_smoke.py"
    probe = ("import runpy, sys\n"
             "sys.modules['palm_rlhf_skill'] = None  # only palm-rlhf-pytorch: the package is not used\n"
             f"sys.argv = [{str(script)!r}, '--construct-only', '--json', '--device', 'cpu']\n"
             f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    proc, report = run_json([sys.executable, "-I", "-c", probe], project)
    assert proc.returncode == 0 and report["status"] == "ok", proc.stderr[-2000:]


@needs_npx
def test_check_reads_claude_codes_projected_token_cost(npx_env):
    """`palm-rlhf-skill check` runs `claude plugin details` when claude is on PATH; its projection
    of the always-loaded cost, and of the root SKILL.md body's on-invoke cost (printed rounded, "~1.8k"),
    agree with check's own characters / 4 estimates within 25%."""
    where = npx(["-p", CLAUDE_CODE, "-c", "command -v claude"], REPO, npx_env)
    assert where.returncode == 0 and where.stdout.strip(), where.stderr[-2000:]
    env = {**npx_env, "PATH": f"{Path(where.stdout.strip()).parent}{os.pathsep}{npx_env['PATH']}"}
    proc, report = run_json([sys.executable, str(REPO / "scripts" / "check_skill.py"), "--json"], REPO, env=env)
    assert proc.returncode == 0, report["drift"]
    details = report["budget"]["claude_details"]
    assert set(details) == {"always_on_tokens", "on_invoke_tokens"}, details
    ours = next(p for p in report["budget"]["parts"] if p["part"].startswith("name and description"))
    assert abs(ours["tokens"] - details["always_on_tokens"]) <= 0.25 * details["always_on_tokens"]
    body = next(p for p in report["budget"]["parts"] if p["file"] == "SKILL.md" and p["part"] == "body")
    assert abs(body["tokens"] - details["on_invoke_tokens"]) <= 0.25 * details["on_invoke_tokens"], (body, details)
