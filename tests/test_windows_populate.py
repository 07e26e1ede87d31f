"""Mapped files populated ahead of the gather (mode "mmap"): the cached pages of every file are mapped into the
process at the first gather, by a worker of the background pool (the lowest priority), so that a first pass takes
no page fault per page.

Proven from /proc/self/smaps: after one small batch, a file's mapping is resident in this process (its Rss)
in full where populating is on, and only around the windows read where it is off (NPYFEED_POPULATE=0). Pages
not in the page cache are never read for it, and batches are the same either way (np.load is the oracle).
Truncated files under a populated mapping are in test_fault_guard.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import npyfeed
import numpy as np
import pytest
from npyfeed.bench import measure

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="smaps and MADV_POPULATE_READ: Linux")

ROWS, COLS, WINDOW = 20_000, 64, 4  # 5 MB per factor file: one batch of a few windows touches a sliver of it
KEYS = ("a", "b", "c")
WAIT_S = 60  # the populate of 15 MB takes milliseconds; this only bounds a hang


def kernel_at_least(major: int, minor: int) -> bool:
    release = os.uname().release.split("-")[0].split(".")
    return (int(release[0]), int(release[1])) >= (major, minor)


needs_populate_read = pytest.mark.skipif(not kernel_at_least(5, 14), reason="MADV_POPULATE_READ: Linux >= 5.14")


@pytest.fixture()
def dataset(tmp_path):
    (tmp_path / "factors").mkdir()
    (tmp_path / "labels").mkdir()
    rng = np.random.default_rng(7)
    lines = []
    for key in KEYS:
        np.save(tmp_path / "factors" / f"{key}.npy", rng.standard_normal((ROWS, COLS), dtype=np.float32))
        np.save(tmp_path / "labels" / f"{key}.npy", rng.standard_normal((ROWS, 2), dtype=np.float32))
        lines += [f"{r},{r},{key}" for r in range(WINDOW - 1, ROWS, 7)]
    (tmp_path / "index.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


def source(d, **kw):
    return npyfeed.WindowSource(str(d / "index.txt"), str(d / "factors"), str(d / "labels"), WINDOW, mode="mmap",
                                threads=2, **kw)


def mapped_kb(path) -> int:
    """Rss (kB) of this process's mappings of `path`."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's first line
                inside = len(fields) >= 6 and fields[-1] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def file_kb(path) -> int:
    return os.path.getsize(path) // 1024


def warm(d):
    for sub in ("factors", "labels"):
        for key in KEYS:
            (d / sub / f"{key}.npy").read_bytes()


def evict(path):
    measure.evict([path])


def wait_for(predicate) -> bool:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def expected(d, ids, src):
    factors = {k: np.load(d / "factors" / f"{k}.npy") for k in KEYS}
    labels = {k: np.load(d / "labels" / f"{k}.npy") for k in KEYS}
    lines = (d / "index.txt").read_text().split()
    x, y = [], []
    for i in ids:
        f, l, key = lines[i].split(",")
        x.append(factors[key][int(f) - WINDOW + 1:int(f) + 1])
        y.append(labels[key][int(l)])
    return np.stack(x), np.stack(y)


@needs_populate_read
def test_first_gather_populates_every_cached_file(dataset, monkeypatch):
    monkeypatch.delenv("NPYFEED_POPULATE", raising=False)
    warm(dataset)
    src = source(dataset)
    ids = np.array([0, 1, len(src) - 1])
    x, y = src.get(ids)
    want_x, want_y = expected(dataset, ids, src)
    assert np.array_equal(x, want_x) and np.array_equal(y, want_y)
    for sub in ("factors", "labels"):
        for key in KEYS:
            path = dataset / sub / f"{key}.npy"
            assert wait_for(lambda p=path: mapped_kb(p) >= file_kb(p) - 4), (path, mapped_kb(path), file_kb(path))


def test_populate_off_maps_only_what_is_read(dataset, monkeypatch):
    monkeypatch.setenv("NPYFEED_POPULATE", "0")
    warm(dataset)
    src = source(dataset)
    x, y = src.get(np.array([0, 1, len(src) - 1]))
    time.sleep(0.2)  # time a populate would have had
    path = dataset / "factors" / "b.npy"
    assert mapped_kb(path) < file_kb(path) // 4, (mapped_kb(path), file_kb(path))


@needs_populate_read
def test_populate_reads_nothing_from_the_disk(dataset, monkeypatch):
    monkeypatch.delenv("NPYFEED_POPULATE", raising=False)
    warm(dataset)
    cold = dataset / "factors" / "c.npy"
    evict(cold)
    src = source(dataset)
    x, _ = src.get(np.array([0]))  # key "a": starts the populate
    warm_path = dataset / "factors" / "b.npy"
    assert wait_for(lambda: mapped_kb(warm_path) >= file_kb(warm_path) - 4)
    assert wait_for(lambda: mapped_kb(dataset / "labels" / "c.npy") >= file_kb(dataset / "labels" / "c.npy") - 4)
    # The populate is done (it maps files in key order, factor then label): the evicted file stayed unread.
    assert mapped_kb(cold) < file_kb(cold) // 4, (mapped_kb(cold), file_kb(cold))


@needs_populate_read
def test_the_populate_never_holds_up_a_gather(dataset, monkeypatch):
    # A pool hands a worker to a job until its items run out: the populate (one item per 8 MiB of every file, for
    # seconds at the users' 14,000 keys) once held a gather worker so, and a source of one thread gathered nothing
    # until it ended. It runs on the background pool (its workers at the lowest priority: tests/cpp/
    # test_thread_pool.cpp): with every worker of it held, a one-thread source still gathers, and populates
    # nothing until they are let go.
    monkeypatch.delenv("NPYFEED_POPULATE", raising=False)
    warm(dataset)
    src = npyfeed.WindowSource(str(dataset / "index.txt"), str(dataset / "factors"), str(dataset / "labels"),
                               WINDOW, mode="mmap", threads=1)
    path = dataset / "factors" / "b.npy"
    hold = npyfeed._core.testing.BackgroundPoolHold()
    try:
        ids = np.array([0, len(src) - 1])
        for _ in range(3):  # the first gather queues the populate; the next ones would wait behind it on a gather worker
            x, y = src.get(ids)
        want_x, want_y = expected(dataset, ids, src)
        assert np.array_equal(x, want_x) and np.array_equal(y, want_y)
        time.sleep(0.2)
        assert mapped_kb(path) < file_kb(path) // 4, (mapped_kb(path), file_kb(path))
    finally:
        hold.release()
    assert wait_for(lambda: mapped_kb(path) >= file_kb(path) - 4), (mapped_kb(path), file_kb(path))


@needs_populate_read
def test_batches_are_the_same_with_and_without_populate(dataset, monkeypatch):
    warm(dataset)
    out = {}
    for value in ("0", "1"):
        monkeypatch.setenv("NPYFEED_POPULATE", value)
        src = source(dataset)
        out[value] = [(x.copy(), y.copy()) for x, y in src.batches(64, shuffle=True, seed=3)]
        del src
    assert len(out["0"]) == len(out["1"])
    for (x0, y0), (x1, y1) in zip(out["0"], out["1"]):
        assert np.array_equal(x0, x1) and np.array_equal(y0, y1)
    src = source(dataset)
    ids = src.epoch_order(0, shuffle=True, seed=3)[:64]
    want_x, want_y = expected(dataset, ids, src)
    assert np.array_equal(out["1"][0][0], want_x) and np.array_equal(out["1"][0][1], want_y)


@needs_populate_read
def test_a_file_truncated_before_the_populate_raises_no_sigbus(dataset):
    # In a child: a SIGBUS would kill it, not the test run. The populate meets the truncated file at the first
    # gather; it must stop quietly there, and a read of the lost rows must still raise NpyFormatError naming it.
    victim = dataset / "factors" / "a.npy"
    code = textwrap.dedent(
        f"""
        import json, os, time
        import numpy as np
        import npyfeed
        src = npyfeed.WindowSource({str(dataset / "index.txt")!r}, {str(dataset / "factors")!r},
                                   {str(dataset / "labels")!r}, {WINDOW}, mode="mmap", threads=2)
        os.truncate({str(victim)!r}, 1000)
        x, y = src.get(np.array([len(src) - 1]))  # key "c": starts the populate over every file
        time.sleep(0.5)
        try:
            src.get(np.array([len(src) // 6]))  # key "a", past the truncation
            error = None
        except npyfeed.NpyFormatError as e:
            error = str(e)
        print(json.dumps({{"error": error}}))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    error = json.loads(proc.stdout.strip().splitlines()[-1])["error"]
    assert error is not None and str(victim) in error and "shrank" in error, error
