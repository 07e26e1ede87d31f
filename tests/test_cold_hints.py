"""Batches from a cold page cache: a cold batch's read-ahead hints are submitted off the consumer's thread, and
(where reads are not queued) the batch's gather starts once they are in. Batches are the same as np.load's in
every mode, with io_uring and without, with the epoch run to its end or closed while hints are still queued.

Proven cold with mincore (npyfeed.warm(check=True)); where the files cannot be evicted (e.g. tmpfs), skipped.
The launch-once and launch-after-cancel rules of prepared jobs are in tests/cpp/test_thread_pool.cpp.
"""

from __future__ import annotations

import subprocess
import sys

import npyfeed
import numpy as np
import pytest
from npyfeed.bench import measure
from windows_data import check_epoch, open_source, write_dataset

ROWS, COLS, WINDOW = 4_000, 64, 8  # 1 MB factor files: each batch's windows lie far apart


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    rng = np.random.default_rng(11)
    keys = [f"k{i:02d}" for i in range(12)]
    factors = {k: rng.standard_normal((ROWS, COLS), dtype=np.float32) for k in keys}
    labels = {k: rng.standard_normal((ROWS, 3), dtype=np.float32) for k in keys}
    # Windows spread over each file (and a few at its edges), so that most batches read what none before did.
    entries = [(int(f), int(rng.integers(0, ROWS)), k) for k in keys
               for f in list(rng.integers(WINDOW - 1, ROWS, 38)) + [WINDOW - 1, ROWS - 1]]
    entries = [entries[i] for i in rng.permutation(len(entries))]
    return write_dataset(tmp_path_factory.mktemp("cold"), factors, labels, entries, WINDOW)


def data_files(ds):
    return [str(p) for p in sorted(ds.factor_dir.glob("*.npy")) + sorted(ds.label_dir.glob("*.npy"))]


def make_cold(ds) -> None:
    files = data_files(ds)
    measure.evict(files)
    report = npyfeed.warm(files, check=True, lock=False)
    if report.resident_after > report.bytes // 10:
        pytest.skip(f"this filesystem keeps the files cached ({report.resident_after} of {report.bytes} bytes)")


@pytest.mark.parametrize("io_uring", ["1", "0"])
@pytest.mark.parametrize("mode", ["mmap", "read", "direct"])
def test_cold_epochs_equal_numpy(dataset, mode, io_uring, monkeypatch):
    monkeypatch.setenv("NPYFEED_IO_URING", io_uring)  # read when the source is opened
    make_cold(dataset)
    src = open_source(dataset, mode)
    assert check_epoch(src, dataset, np.float32, 32, shuffle=True, prefetch=3) > 0
    # Another epoch, cold again (a source's mappings keep their pages cached: a new source), read ahead
    # deeper than it is long at first.
    del src
    make_cold(dataset)
    src = open_source(dataset, mode)
    assert check_epoch(src, dataset, np.float32, 16, shuffle=True, seed=5, epoch=1, prefetch=8) > 0


@pytest.mark.parametrize("mode", ["mmap", "read"])
def test_closing_while_cold_hints_are_queued(dataset, mode):
    """Batches read ahead, their hints not yet in, then the iterator is closed: it returns, and an epoch of a
    source that closed one so has the right batches."""
    for _ in range(3):
        make_cold(dataset)
        src = open_source(dataset, mode)
        with src.batches(8, shuffle=True, prefetch=8) as it:
            next(it)
        del it, src
    make_cold(dataset)
    src = open_source(dataset, mode)
    with src.batches(8, shuffle=True, prefetch=8) as it:
        next(it)
    assert check_epoch(src, dataset, np.float32, 64, shuffle=True, epoch=2) > 0


_COUNT_POOL_THREADS = """
import os, sys, npyfeed
index, factor_dir, label_dir, mode = sys.argv[1:]
src = npyfeed.WindowSource(index, factor_dir, label_dir, 4, mode=mode, threads=2, cache=False)
names = []
for tid in os.listdir("/proc/self/task"):
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            names.append(f.read().strip())
    except FileNotFoundError:  # a thread that ended meanwhile
        pass
print(len(src.keys), sum(name == "npyfeed" for name in names))
"""


@pytest.mark.parametrize("mode", ["mmap", "read", "direct"])
def test_opens_wait_for_the_device_many_at_a_time_only_where_files_are_not_cached(tmp_path, mode):
    """An open of files not in the page cache waits for a read per file: 16 keys are opened at once (the
    device answers them together), whatever `threads`. Of cached files, `threads` keys at once (more would only
    contend for memory), except in mode "direct", whose reads never come from the cache. Seen as the npyfeed
    threads a fresh process has after the open; the source is np.load's either way."""
    rng = np.random.default_rng(3)
    keys = [f"k{i:02d}" for i in range(40)]
    factors = {k: rng.standard_normal((64, 4), dtype=np.float32) for k in keys}
    labels = {k: rng.standard_normal((64, 1), dtype=np.float32) for k in keys}
    ds = write_dataset(tmp_path, factors, labels, [(10, 3, k) for k in keys], 4)

    def pool_threads_after_open() -> int:
        out = subprocess.run([sys.executable, "-c", _COUNT_POOL_THREADS, str(ds.index), str(ds.factor_dir),
                              str(ds.label_dir), mode], capture_output=True, text=True, timeout=120, cwd="/")
        assert out.returncode == 0, out.stderr
        opened, threads = map(int, out.stdout.split())
        assert opened == len(keys)
        return threads

    make_cold(ds)
    assert pool_threads_after_open() >= 16
    npyfeed.warm(data_files(ds), lock=False)
    warm_threads = pool_threads_after_open()
    if mode == "direct":
        assert warm_threads >= 16
    else:
        assert warm_threads <= 4  # the index's and the open's: 2 threads each at most
    make_cold(ds)
    assert check_epoch(open_source(ds, mode), ds, np.float32, 16, shuffle=True) > 0
