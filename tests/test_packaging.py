"""The artifacts of .ci/wheels (the sdist and the manylinux wheels in ``NPYFEED_DIST_DIR``; the wheel leg of
.ci/run sets it): what each holds and leaves out, and their metadata. Skipped when no artifacts are named.

The sdist must hold every file CMakeLists.txt compiles and every header, the wheel both compiled libraries; neither
may hold tests, benchmark data, build folders or in-place builds, and the wheel vendors no shared library.
"""

from __future__ import annotations

import email.parser
import os
import re
import tarfile
import zipfile
from pathlib import Path

import npyfeed
import pytest

ROOT = Path(__file__).resolve().parent.parent
DIST = os.environ.get("NPYFEED_DIST_DIR")

pytestmark = pytest.mark.skipif(not DIST, reason="NPYFEED_DIST_DIR names no artifacts of .ci/wheels")

# Paths (relative to the artifact's root) that must never be packed.
# What no artifact holds: the repository's own folders at its root (the package has a bench/ of its own), and
# build or cache folders anywhere.
FORBIDDEN = re.compile(r"^(tests|bench|docs|\.ci)(/|$)|(^|/)(build|dist|__pycache__|\.pytest_cache|\.hypothesis)(/|$)")


def _artifacts(pattern: str) -> list[Path]:
    found = sorted(Path(DIST).glob(pattern))
    assert found, f"no {pattern} in {DIST}"
    return found


def _sdist_names() -> tuple[str, list[str]]:
    (sdist,) = _artifacts("npyfeed-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    top = f"npyfeed-{npyfeed.__version__}/"
    assert all(n == top.rstrip("/") or n.startswith(top) for n in names), "one top folder, named for the version"
    return top, [n[len(top):] for n in names if n.startswith(top)]


def _metadata(text: str):
    return email.parser.Parser().parsestr(text)


def test_sdist_holds_what_the_build_needs():
    _, names = _sdist_names()
    files = set(names)
    for needed in ("pyproject.toml", "CMakeLists.txt", "README.md", "LICENSE", "PKG-INFO",
                   "python/npyfeed/__init__.py", "python/npyfeed/_core.pyi", "python/npyfeed/py.typed"):
        assert needed in files, needed
    compiled = set(re.findall(r"csrc/[\w/]+\.cpp", (ROOT / "CMakeLists.txt").read_text()))
    assert compiled and compiled <= files, sorted(compiled - files)
    headers = {str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*") if p.suffix in (".h", ".hpp")}
    assert headers <= files, sorted(headers - files)
    python = {str(p.relative_to(ROOT)) for p in (ROOT / "python/npyfeed").rglob("*.py")}
    assert "python/npyfeed/tf/_compat.py" in python and "python/npyfeed/bench/_run.py" in python
    assert python <= files, sorted(python - files)


def test_sdist_leaves_out_tests_data_and_builds():
    _, names = _sdist_names()
    bad = [n for n in names if FORBIDDEN.search(n) or n.endswith((".so", ".whl", ".npy", ".npz", ".o", ".a"))]
    assert not bad, bad


def test_wheels_hold_both_libraries_and_nothing_else_compiled():
    for wheel in _artifacts("npyfeed-*.whl"):
        # The platform tag: manylinux_2_28_x86_64, possibly compounded with an older one that the symbols allow
        # (auditwheel's "manylinux_2_26_x86_64.manylinux_2_28_x86_64").
        platforms = wheel.name[:-len(".whl")].split("-")[-1].split(".")
        assert platforms and all(re.fullmatch(r"manylinux_2_\d+_x86_64", p) for p in platforms), wheel.name
        assert max(int(p.split("_")[2]) for p in platforms) <= 28, wheel.name
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
        libraries = sorted(n for n in names if ".so" in Path(n).name)
        assert len(libraries) == 2, libraries  # nothing vendored by auditwheel, no stray in-place build
        assert re.fullmatch(r"npyfeed/_core\.cpython-\d+-x86_64-linux-gnu\.so", libraries[0]), libraries
        assert libraries[1] == "npyfeed/_tf_ops.so"
        for needed in ("npyfeed/__init__.py", "npyfeed/_core.pyi", "npyfeed/py.typed"):
            assert needed in names, needed
        python = {f"npyfeed/{p.relative_to(ROOT / 'python/npyfeed').as_posix()}"
                  for p in (ROOT / "python/npyfeed").rglob("*.py")}
        assert python <= set(names), sorted(python - set(names))  # the subpackages (tf/, bench/) too
        bad = [n for n in names if FORBIDDEN.search(n) or n.endswith((".npy", ".npz", ".pyc"))]
        assert not bad, bad
        assert any(re.fullmatch(r"npyfeed-[^/]+\.dist-info/licenses/LICENSE", n) for n in names)


def test_metadata_is_complete():
    with zipfile.ZipFile(_artifacts("npyfeed-*.whl")[0]) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        meta = _metadata(z.read(name).decode())
    (sdist,) = _artifacts("npyfeed-*.tar.gz")
    with tarfile.open(sdist) as tar:
        pkg_info = _metadata(tar.extractfile(f"npyfeed-{npyfeed.__version__}/PKG-INFO").read().decode())
    for m in (meta, pkg_info):
        assert m["Name"] == "npyfeed" and m["Version"] == npyfeed.__version__
        assert m["Requires-Python"] == ">=3.9"
        assert m["License-Expression"] == "MIT" and m["License-File"] == "LICENSE"
        classifiers = m.get_all("Classifier")
        assert "Operating System :: POSIX :: Linux" in classifiers and "Typing :: Typed" in classifiers
        assert len(m.get_all("Project-URL")) >= 2
        assert any(r.startswith("numpy") for r in m.get_all("Requires-Dist"))
        assert m["Description-Content-Type"] == "text/markdown" and m.get_payload().startswith("# npyfeed")
