"""The hostile `.npz` corpus (tests/corpus/make_npz_corpus.py) against npyfeed, with np.load as the oracle.

Accepted archives equal ``dict(np.load(path))`` in every mode; refused ones raise the documented type naming the
archive (and the member, where there is one); where npyfeed refuses what numpy reads, the case says why and
DIFFERENCES.md lists it. ``npyfeed scan --data`` lists exactly the refused archives.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import npyfeed
import numpy as np
import pytest
from corpus import make_npz_corpus as mz
from test_npz import check_same_as_np_load

TESTS_DIR = Path(__file__).resolve().parent
MODES = ("mmap", "read", "direct")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    return mz.write_all(tmp_path_factory.mktemp("npz_corpus"))


def _skip_without_zlib(case: mz.Case) -> None:
    if case.needs_zlib and not npyfeed._core.have_inflate:
        pytest.skip("npyfeed was built without zlib")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", mz.CASES, ids=lambda c: c.id)
def test_case(case: mz.Case, mode: str, corpus):
    _skip_without_zlib(case)
    path = corpus[case.id]
    if case.accepted:
        check_same_as_np_load(npyfeed.load(path, mode=mode), path, mode)
        return
    with pytest.raises(Exception) as info:
        npyfeed.load(path, mode=mode)
    error = info.value
    assert type(error).__name__ == case.expect, f"{case.id}: raised {type(error).__name__}: {error}"
    assert str(path) in str(error), f"{case.id}: the message does not name the archive: {error}"
    assert case.says in str(error).lower(), f"{case.id}: the message does not say {case.says!r}: {error}"
    if isinstance(error, npyfeed.NpyFormatError):
        assert error.path == str(path)


@pytest.mark.parametrize("case", mz.CASES, ids=lambda c: c.id)
def test_numpy_outcome_and_differences(case: mz.Case, corpus):
    """npyfeed accepts only what numpy accepts; whatever numpy reads and npyfeed refuses is a documented difference."""
    seen = mz.numpy_outcome(corpus[case.id])
    if case.accepted:
        assert seen == mz.ACCEPT
    elif seen == mz.ACCEPT:
        assert case.differs, f"{case.id}: numpy reads it, npyfeed refuses: say why (differs=)"
    if case.differs:
        documented = (TESTS_DIR / "corpus" / "DIFFERENCES.md").read_text()
        assert f"`{case.id}`" in documented, f"{case.id} is not in DIFFERENCES.md"


def test_headers_only_refuse_the_directory_cases_too(corpus):
    # read_npz_headers (npyfeed scan without --data) checks directories and member headers, not data.
    for case_id in ("duplicate_member_names", "overlapping_members", "zip_bomb_ratio", "truncated_central_directory",
                    "object_member", "member_header_leading_newline_indent"):
        with pytest.raises(npyfeed.NpyFormatError, match="npz") as info:
            npyfeed._core.read_npz_headers(os.fsencode(corpus[case_id]), 10000)
        assert info.value.path == str(corpus[case_id])


def test_failures_leak_no_descriptors(corpus):
    refused = [corpus[c.id] for c in mz.CASES if not c.accepted
               and not (c.needs_zlib and not npyfeed._core.have_inflate)]
    where = str(Path(refused[0]).parent)
    for _ in range(2):
        for path in refused:
            for mode in MODES:
                with pytest.raises((ValueError, OSError)):
                    npyfeed.load(path, mode=mode)
    fds = [os.readlink(f"/proc/self/fd/{n}") for n in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{n}")]
    assert [f for f in fds if f.startswith(where)] == []
    with open("/proc/self/maps") as f:
        assert [line for line in f if where in line] == []


def test_scan_lists_exactly_the_refused_archives(corpus):
    root = Path(corpus["savez_stored"]).parent
    proc = subprocess.run([sys.executable, "-m", "npyfeed", "scan", "--data", "--quiet", str(root)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert ".npy/.npz file" in proc.stdout
    listed = {line.split(": ", 1)[0].strip() for line in proc.stdout.split("Bad files:\n", 1)[1].splitlines()}
    runnable = [c for c in mz.CASES if not (c.needs_zlib and not npyfeed._core.have_inflate)]
    assert listed == {str(corpus[c.id]) for c in runnable if not c.accepted}


def test_scan_without_data_reports_archive_members(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((3, 4), np.float32))
    proc = subprocess.run([sys.executable, "-m", "npyfeed", "scan", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 ok, 0 bad" in proc.stdout and "<f4" in proc.stdout and "(3, 4)" in proc.stdout
