"""The wheel and the sdist carry the whole skill tree; the version lives in one place."""
from __future__ import annotations

import hashlib
import re
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from conftest import BIN, REPO, run
from palm_rlhf_skill import __version__, skill_root
from skill_tree import files_with_hashes, repo_skill_files

WHEEL_SKILL = "palm_rlhf_skill/skill/"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """sdist, then the wheel built from that sdist (python -m build), with the installed hatchling:
    a wheel that has everything proves the sdist had everything too."""
    out = tmp_path_factory.mktemp("dist")
    proc = run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)], out)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


def test_wheel_carries_every_skill_file_byte_for_byte(built):
    with zipfile.ZipFile(built["wheel"]) as wheel:
        carried = {name[len(WHEEL_SKILL):]: hashlib.sha256(wheel.read(name)).hexdigest()
                   for name in wheel.namelist() if name.startswith(WHEEL_SKILL)}
        names = wheel.namelist()
    assert carried == repo_skill_files()
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    modules = {n for n in names if n.startswith("palm_rlhf_skill/") and not n.startswith(WHEEL_SKILL)}
    assert modules == {f"palm_rlhf_skill/{p.name}" for p in (REPO / "src/palm_rlhf_skill").glob("*.py")}


def test_sdist_carries_the_tree_and_the_tests(built):
    with tarfile.open(built["sdist"]) as sdist:
        prefix = f"palm_rlhf_skill-{__version__}/"
        names = {m.name[len(prefix):] for m in sdist.getmembers() if m.isfile()}
    assert set(repo_skill_files()) <= names
    assert {"pyproject.toml", "README.md", ".ci/run", "tests/conftest.py", "src/palm_rlhf_skill/cli.py",
            "tools/verify_floors.py", ".claude-plugin/plugin.json", ".claude-plugin/marketplace.json",
            ".claude-plugin/icon.png"} <= names


def test_version_is_in_one_place_and_shown(built, empty_dir):
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    init = (REPO / "src/palm_rlhf_skill/__init__.py").read_text(encoding="utf-8")
    assert re.findall(r'^__version__ = "([^"]+)"$', init, re.MULTILINE) == [__version__]
    assert built["wheel"].name == f"palm_rlhf_skill-{__version__}-py3-none-any.whl"
    assert metadata.version("palm-rlhf-skill") == __version__  # the installed package agrees
    proc = run([str(BIN / "palm-rlhf-skill"), "--version"], empty_dir)
    assert proc.returncode == 0 and proc.stdout.strip() == f"palm-rlhf-skill {__version__}"


def test_the_cli_module_runs_under_python_m(empty_dir):
    """`python -m palm_rlhf_skill.cli doctor` printed nothing: the module had no __main__ guard."""
    proc = run([sys.executable, "-m", "palm_rlhf_skill.cli", "--version"], empty_dir)
    assert proc.returncode == 0 and proc.stdout.strip() == f"palm-rlhf-skill {__version__}", proc.stderr


def test_installed_package_finds_its_tree_with_importlib_resources():
    root = skill_root()
    # the installed wheel's copy when built, else the source checkout's root
    assert files_with_hashes(root / "sub-skills") == {k[len("sub-skills/"):]: v for k, v in
                                                      repo_skill_files().items() if k.startswith("sub-skills/")}
    assert (root / "SKILL.md").read_bytes() == (REPO / "SKILL.md").read_bytes()
