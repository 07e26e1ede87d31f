"""``python/npyfeed/_core.pyi`` matches the compiled module: ``mypy.stubtest`` finds nothing missing, extra or
inconsistent, beyond the allowlist's entries (tests/stubtest-allowlist.txt: only what stubtest cannot understand
about pybind11 classes, each with its reason). Unused allowlist entries fail too, so the list stays tight.

pybind11 functions carry no inspectable signature, so stubtest checks that every name exists on both sides and
the classes' members, not parameter names or types.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ALLOWLIST = Path(__file__).resolve().parent / "stubtest-allowlist.txt"


def test_core_stub_matches_the_compiled_module(tmp_path):
    pytest.importorskip("mypy")
    # From an empty folder, so that no project configuration applies and nothing is written in the tree.
    proc = subprocess.run([sys.executable, "-m", "mypy.stubtest", "npyfeed._core", "--allowlist", str(ALLOWLIST)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
