"""Shared test helpers: repo paths, loading a skill-tree script in-process, running it as a CLI."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "sub-skills" / "policy-optimization" / "scripts" / "tiny_rlhf_smoke.py"
BIN = Path(sys.executable).parent


def load_script(path: Path, name: str | None = None):
    """Import a skill-tree script by path as a module (what an in-process test calls)."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def run(cmd: list[str], cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a command and capture text output; CUDA hidden so runs are CPU on any machine."""
    full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def run_json(cmd: list[str], cwd: Path, **kwargs) -> tuple[subprocess.CompletedProcess, dict]:
    proc = run(cmd, cwd, **kwargs)
    assert proc.stdout.strip(), f"no stdout; stderr: {proc.stderr[-2000:]}"
    return proc, json.loads(proc.stdout)


@pytest.fixture(scope="session")
def smoke():
    """The smoke helper loaded in-process from the skill tree."""
    return load_script(SMOKE, "tiny_rlhf_smoke")


@pytest.fixture
def empty_dir(tmp_path: Path) -> Path:
    d = tmp_path / "cwd"
    d.mkdir()
    return d
