"""The code keeps its style: ``ruff check`` (rules in pyproject.toml) and ``clang-format`` (.clang-format) pass.

Both tools come with the ``test`` extra, pinned in .ci/constraints*.txt (another clang-format version may lay
code out differently). To fix: ``ruff check --fix .`` and ``clang-format -i <files>``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    # The test environment's own scripts first (a venv not on PATH), then PATH.
    local = Path(sys.executable).parent / name
    path = str(local) if local.exists() else shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (pip install '.[test]')")
    return path


def _tracked(*patterns: str) -> list:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return out.stdout.split()


def test_ruff_check_passes():
    proc = subprocess.run([_tool("ruff"), "check", "--output-format", "concise", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_clang_format_leaves_the_cpp_sources_unchanged():
    files = _tracked("csrc/*.cpp", "csrc/*.hpp", "tests/*.cpp", "tests/*.hpp", "tests/*.c")
    assert len(files) > 20
    proc = subprocess.run([_tool("clang-format"), "--dry-run", "--Werror", *files], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]


def test_pre_commit_runs_the_same_checks_locally():
    """.pre-commit-config.yaml runs these two checks, as local hooks (no hook repository fetched)."""
    config = (ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8")
    repos = [line.split(":", 1)[1].strip() for line in config.splitlines() if line.strip().startswith("- repo:")]
    assert repos == ["local"]
    assert "entry: ruff check" in config and "entry: clang-format --dry-run --Werror" in config
