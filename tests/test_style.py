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


def _package_imports() -> dict:
    """{module: the npyfeed modules it imports}, read from the sources with ast: every import, at module level or
    inside a function (a lazy import closes a circle as surely), a submodule's parent packages included (importing
    ``npyfeed.tf._feed`` runs ``npyfeed/tf/__init__.py`` first); the root package ``npyfeed`` is left out (every
    module imports names from it once it is initialised)."""
    import ast

    package = ROOT / "python" / "npyfeed"
    modules = {}
    for path in package.rglob("*.py"):
        parts = ["npyfeed", *path.relative_to(package).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)

    def targets(name: str) -> set:
        found = set()
        pieces = name.split(".")
        for n in range(2, len(pieces) + 1):  # the parents, then the module
            if ".".join(pieces[:n]) in modules:
                found.add(".".join(pieces[:n]))
        return found

    graph = {}
    for name, (path, is_package) in modules.items():
        here = name.split(".") if is_package else name.split(".")[:-1]
        # The packages Python has begun to import before this module runs: importing a submodule of them is fine.
        ancestors = {".".join(here[:n]) for n in range(2, len(here) + 1)}
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("npyfeed."):
                        edges |= targets(alias.name) - ancestors
            elif isinstance(node, ast.ImportFrom):
                base = (here[:len(here) - node.level + 1] if node.level else [])
                base = ".".join(base + ([node.module] if node.module else []))
                if not base.startswith("npyfeed"):
                    continue
                submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
                for submodule in submodules:
                    edges |= targets(submodule) - ancestors
                edges |= targets(base) - ancestors
                if len(submodules) < len(node.names) and base in modules and base != "npyfeed":
                    edges.add(base)  # names from `base`'s own namespace: it must have run to its end
        graph[name] = edges - {name}
    return graph


def test_the_package_has_no_import_circle():
    graph = _package_imports()
    assert graph["npyfeed.bench._run"] >= {"npyfeed.bench._report", "npyfeed.bench._text", "npyfeed._layout"}
    assert "npyfeed.tf._feed" in graph["npyfeed._build_info"]
    state: dict = {}
    path: list = []

    def visit(module):
        state[module] = "open"
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                circle = path[path.index(imported):] + [imported]
                pytest.fail("import circle: " + " -> ".join(circle))
            if imported not in state:
                visit(imported)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
