"""Window sources under load: more files than descriptors may stay open, files replaced under a source, many
gather threads and Python threads on one source, fork with gathers in flight.

The numpy reference and the data sets: windows_data.py."""


from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading

import npyfeed
import numpy as np
import pytest
from windows_data import (
    FILE_MODES,
    DataSet,
    assert_batch,
    check_epoch,
    open_source,
    reference,
    sample_values,
    write_dataset,
)

# ----------------------------------------------------------------------------------------------------------
# Many files, many threads, fork


@pytest.fixture
def low_fd_limit():
    """Lowers the soft limit on open files, so that a source cannot keep one descriptor per file open."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if len(os.listdir("/proc/self/fd")) > 150:
        pytest.skip("too many files open already")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        yield 256
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(scope="module")
def many_keys(tmp_path_factory) -> DataSet:
    """120 keys (240 files), two windows each, W=3: more files than a source keeps open under a limit of 256
    descriptors (it keeps them only while they use less than half the limit)."""
    rng = np.random.default_rng(91)
    factors = {f"m{k:03d}": sample_values(rng, "<f4" if k % 2 else "<f8", (12, 4)) for k in range(120)}
    labels = {k: sample_values(rng, "<f4", (12,)) for k in factors}
    entries = [(int(rng.integers(2, 12)), int(rng.integers(0, 12)), k) for k in factors for _ in range(2)]
    entries = [entries[i] for i in rng.permutation(len(entries))]
    return write_dataset(tmp_path_factory.mktemp("many"), factors, labels, entries, 3)


@pytest.fixture(scope="module")
def wide_keys(tmp_path_factory) -> DataSet:
    """1000 keys (2000 files), two windows each: a batch of 1000 samples reads ~630 files at once."""
    rng = np.random.default_rng(92)
    factors = {f"w{k:04d}": sample_values(rng, "<f4", (300, 16)) for k in range(1000)}
    labels = {k: sample_values(rng, "<f4", (300,)) for k in factors}
    entries = [(int(rng.integers(2, 300)), int(rng.integers(0, 300)), k) for k in factors for _ in range(2)]
    return write_dataset(tmp_path_factory.mktemp("wide"), factors, labels, entries, 3)


@pytest.mark.parametrize("mode", FILE_MODES)
def test_many_threads_stay_within_the_open_file_limit(wide_keys, low_fd_limit, mode):
    """64 threads (256 O_DIRECT workers) over 2000 files under `ulimit -n 256`: the gather's workers are
    bounded by the descriptor budget (half the limit), so no read fails with EMFILE."""
    src = open_source(wide_keys, mode, threads=64)
    for epoch in range(3):
        check_epoch(src, wide_keys, "float32", 1000, shuffle=True, seed=5, epoch=epoch)


def test_hitting_the_open_file_limit_names_it(many_keys, low_fd_limit):
    """Descriptors used up by someone else: the error says which limit was hit and what to do."""
    held = []
    try:
        with pytest.raises(OSError) as info:  # fill the descriptor table
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        assert info.value.errno == errno.EMFILE
        path = str(many_keys.factor_dir / "m000.npy")
        for mode in ("read", "mmap"):
            with pytest.raises(OSError) as info:
                npyfeed.load(path, mode=mode)
            assert info.value.errno == errno.EMFILE and info.value.filename == path
            assert "RLIMIT_NOFILE is 256" in str(info.value) and "ulimit -n" in str(info.value)
    finally:
        for fd in held:
            os.close(fd)


@pytest.mark.parametrize("mode", FILE_MODES)
def testmany_keys_dataset_beyond_the_open_file_limit(many_keys, low_fd_limit, mode):
    src = open_source(many_keys, mode)
    assert len(src.keys) == 120
    assert_batch(src.get(np.arange(len(src))), reference(many_keys, many_keys.entries, "float32"))
    check_epoch(src, many_keys, "float32", 64, shuffle=True, seed=2)


@pytest.mark.parametrize("change", ["replaced", "deleted"])
@pytest.mark.parametrize("mode", ["read", "direct"])
def test_file_replaced_after_opening(tmp_path, low_fd_limit, mode, change):
    """Without a descriptor kept open, a file is reopened per read: a different file under the same name is
    refused (ESTALE, naming it), never read as if it were the original; a deleted one is FileNotFoundError."""
    rng = np.random.default_rng(92)
    factors = {f"r{k:03d}": rng.standard_normal((12, 2)).astype(np.float32) for k in range(60)}
    labels = {k: rng.standard_normal((12, 1)).astype(np.float32) for k in factors}
    ds = write_dataset(tmp_path, factors, labels, [(5, 5, k) for k in factors], 3)
    src = open_source(ds, mode)
    path = ds.factor_dir / "r007.npy"
    if change == "replaced":
        np.save(tmp_path / "new.npy", np.zeros((12, 2), np.float32))
        os.replace(tmp_path / "new.npy", path)
    else:
        path.unlink()
    with pytest.raises(OSError, match="r007.npy") as info:
        src.get([7])
    assert info.value.errno == (errno.ESTALE if change == "replaced" else errno.ENOENT)
    assert isinstance(info.value, FileNotFoundError) == (change == "deleted")
    assert_batch(src.get([6, 8]), reference(ds, [ds.entries[6], ds.entries[8]], "float32"))


@pytest.mark.parametrize("threads", [1, 3, 8])
@pytest.mark.parametrize("mode", ["read", "mmap", "arrays"])
def test_thread_count_does_not_change_batches(small, mode, threads):
    src = open_source(small, mode, threads=threads)
    assert src.threads == threads
    assert_batch(src.get(np.arange(len(src))), reference(small, small.entries, "float32"))
    check_epoch(src, small, "float32", 9, shuffle=True, seed=threads)


@pytest.mark.parametrize("mode", ["read", "direct", "mmap", "arrays"])
def test_many_python_threads_on_one_source(small, mode):
    src = open_source(small, mode)
    n = len(src)
    errors = []

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            for _ in range(10):
                ids = rng.integers(0, n, int(rng.integers(1, 40)))
                assert_batch(src.get(ids), reference(small, [small.entries[i] for i in ids], "float32"))
            check_epoch(src, small, "float32", 7, shuffle=True, seed=seed, prefetch=3)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


_FORK_SCRIPT = textwrap.dedent("""
    import os, sys
    import numpy as np
    import npyfeed

    root = sys.argv[1]
    src = npyfeed.WindowSource(f"{root}/index.txt", f"{root}/factor", f"{root}/label", 6, mode=sys.argv[2])
    expected = [b for b in src.batches(8, shuffle=True)]
    it = src.batches(8, prefetch=4)
    next(it)  # the pool is running and gathers are in flight
    pid = os.fork()
    if pid == 0:
        code = 0
        batches = list(src.batches(8, shuffle=True))  # new iterators work in the child
        if len(batches) != len(expected) or not all(np.array_equal(a[0], b[0]) for a, b in zip(batches, expected)):
            code = 3
        try:
            next(it)  # an iterator from before the fork: an error, not a hang
            code = 4
        except ValueError as e:
            if "fork" not in str(e):
                code = 5
        os._exit(code)
    rest = list(it)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status), "parent", len(rest))
""")


@pytest.mark.parametrize("mode", ["read", "mmap"])
def test_fork_with_gathers_in_flight(small, mode):
    proc = subprocess.run([sys.executable, "-c", _FORK_SCRIPT, str(small.root), mode], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["child", "0", "parent", str(-(-len(small.entries) // 8) - 1)]
