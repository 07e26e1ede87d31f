"""Window batches against the numpy oracle.

The reference for sample ``(feature_index, label_index, key)`` is plain numpy slicing,
``factor[key][feature_index - W + 1 : feature_index + 1].astype(out)`` and ``label[key][label_index].astype(out)``,
with zero rows for rows outside the arrays under ``bounds="pad"``. Covered: every source dtype and byte order, a
Fortran-order factor file, both output dtypes, every mode and `from_arrays`, shuffle on and off, every bounds
policy, merged and unmerged windows, 1-d labels and 3-d factors; `get`; the epoch order, shards, resume and
argument checks; the ownership and alignment of batch buffers; reads limited to the rows needed; more files than
descriptors may stay open, files replaced or truncated under a source; many Python threads, fork; the GIL;
closing iterators and interpreter exit with gathers in flight; the construction errors (missing, mismatched,
corrupt files). Index parsing itself is in test_index.py.

"""

from __future__ import annotations

import errno
import gc
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path

import npyfeed
import numpy as np
import pytest

MODES = ("auto", "mmap", "read", "direct", "arrays")  # "arrays": WindowSource.from_arrays over np.load'ed arrays
FILE_MODES = ("auto", "mmap", "read", "direct")
OUT_DTYPES = ("float32", "float64")
THREADS = 2

# ----------------------------------------------------------------------------------------------------------
# Data sets in the users' layout and the numpy reference


class DataSet:
    """``<root>/factor/<key>.npy``, ``<root>/label/<key>.npy`` and ``<root>/index.txt``.

    `factors` and `labels` hold the arrays as written (the oracle); `entries` the index lines, in order.
    """

    def __init__(self, root: Path, factors: dict, labels: dict, entries: list, window: int):
        self.root, self.factors, self.labels, self.entries, self.window = root, factors, labels, entries, window
        self.index = root / "index.txt"
        self.factor_dir = root / "factor"
        self.label_dir = root / "label"

    def loaded(self, which: str) -> dict:
        """The key -> array dict the users build with np.load."""
        directory = self.factor_dir if which == "factor" else self.label_dir
        return {k: np.load(directory / f"{k}.npy") for k in self.factors}


def write_dataset(root: Path, factors: dict, labels: dict, entries: list, window: int, *,
                  fortran: bool = False, index_text: str | None = None) -> DataSet:
    (root / "factor").mkdir(parents=True, exist_ok=True)
    (root / "label").mkdir(parents=True, exist_ok=True)
    for key in factors:
        factor, label = factors[key], labels[key]
        if fortran:  # np.save writes fortran_order=True for F-contiguous, non-C-contiguous arrays
            factor, label = np.asfortranarray(factor), np.asfortranarray(label)
        np.save(root / "factor" / f"{key}.npy", factor)
        np.save(root / "label" / f"{key}.npy", label)
    if index_text is None:
        index_text = "".join(f"{fi},{li},{key}\n" for fi, li, key in entries)
    (root / "index.txt").write_text(index_text)
    return DataSet(root, factors, labels, list(entries), window)


def open_source(ds: DataSet, mode: str, **kwargs) -> npyfeed.WindowSource:
    kwargs.setdefault("threads", THREADS)
    if mode == "arrays":
        return npyfeed.WindowSource.from_arrays(ds.index, ds.loaded("factor"), ds.loaded("label"), ds.window, **kwargs)
    return npyfeed.WindowSource(ds.index, ds.factor_dir, ds.label_dir, ds.window, mode=mode, **kwargs)


def reference(ds: DataSet, entries, out) -> tuple:
    """Per-sample numpy slicing; zero rows where the sample leaves its arrays (bounds='pad')."""
    out = np.dtype(out)
    W = ds.window
    xs, ys = [], []
    with np.errstate(over="ignore"):  # float64 -> float32 of 1e300 is inf, as a C cast gives
        for fi, li, key in entries:
            x, y = _reference_sample(ds, fi, li, key, out)
            xs.append(x)
            ys.append(y)
    first_x = ds.factors[next(iter(ds.factors))]
    first_y = ds.labels[next(iter(ds.labels))]
    x = np.stack(xs) if xs else np.zeros((0, W) + first_x.shape[1:], out)
    y = np.stack(ys) if ys else np.zeros((0,) + first_y.shape[1:], out)
    return x, y


def _reference_sample(ds: DataSet, fi: int, li: int, key: str, out: np.dtype) -> tuple:
    factor, label = ds.factors[key], ds.labels[key]
    W = ds.window
    if fi - W + 1 >= 0 and fi < len(factor):
        x = factor[fi - W + 1:fi + 1].astype(out)
    else:
        x = np.zeros((W,) + factor.shape[1:], out)
        for r in range(max(fi - W + 1, 0), min(fi + 1, len(factor))):
            x[r - (fi - W + 1)] = factor[r].astype(out)
    y = label[li].astype(out) if 0 <= li < len(label) else np.zeros(label.shape[1:], out)
    return x, y


def assert_batch(batch, expected) -> None:
    """Same type, dtype, shape and values (np.array_equal), and the same bytes (so -0.0 and inf too)."""
    assert isinstance(batch, tuple) and len(batch) == 2
    for actual, wanted in zip(batch, expected):
        assert type(actual) is np.ndarray
        assert actual.dtype == wanted.dtype
        assert actual.shape == wanted.shape
        assert actual.flags.c_contiguous
        assert np.array_equal(actual, wanted)
        assert actual.tobytes() == wanted.tobytes()


def check_epoch(src: npyfeed.WindowSource, ds: DataSet, out, batch_size: int, entries=None, **kwargs) -> int:
    """Iterates one epoch and compares every batch with the reference of `epoch_order`; returns the batch count."""
    entries = ds.entries if entries is None else entries
    order_kwargs = {k: kwargs[k] for k in ("shuffle", "seed", "num_shards", "shard_index") if k in kwargs}
    order = src.epoch_order(kwargs.get("epoch", 0), **order_kwargs)
    count = 0
    with src.batches(batch_size, **kwargs) as it:
        for b, batch in enumerate(it):
            ids = order[b * batch_size:(b + 1) * batch_size]
            assert_batch(batch, reference(ds, [entries[i] for i in ids], out))
            count += 1
    assert count == src.num_batches(batch_size, **{k: kwargs[k] for k in ("num_shards", "shard_index",
                                                                          "drop_remainder") if k in kwargs})
    return count


_SPECIALS = {  # values at the edges of each conversion, placed among the random ones
    "f2": [np.inf, -np.inf, -0.0, 2.0 ** -24, 2.0 ** -14, 65504.0, -65504.0, 1.0 + 2.0 ** -10],
    "f4": [np.inf, -np.inf, -0.0, 1.4e-45, 1.0e-40, 3.4e38, 1.0 + 2.0 ** -23],
    "f8": [1e300, -1e300, 1e-310, 1e-46, -0.0, 1.0 + 2.0 ** -24, 1.0 + 3 * 2.0 ** -24, 16777217.0,
           3.4028235677973366e38, np.inf],
}


def sample_values(rng: np.random.Generator, dtype, shape) -> np.ndarray:
    """Seeded values of `dtype` (either byte order), with the edge cases of the conversion to float."""
    dtype = np.dtype(dtype)
    native = dtype.newbyteorder("=")
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(native)
        values = rng.integers(info.min, info.max, size=shape, dtype=native, endpoint=True)
        flat = values.reshape(-1)
        flat[:2] = [info.min, info.max]
        return values.astype(dtype)
    values = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)
    flat = values.reshape(-1)
    specials = _SPECIALS[f"f{dtype.itemsize}"]
    flat[rng.choice(flat.size, len(specials), replace=False)] = specials
    with np.errstate(over="ignore"):
        return values.astype(dtype)


def random_entries(rng: np.random.Generator, factors: dict, labels: dict, window: int, per_key: int = 10) -> list:
    """Per key: a cluster of overlapping windows (repeats too), both edges, a few anywhere; then interleaved."""
    entries = []
    for key, factor in factors.items():
        rows, label_rows = len(factor), len(labels[key])
        lo = window - 1 + int(rng.integers(0, max(rows - window - 12, 1)))
        features = list(rng.integers(lo, min(lo + 12, rows), per_key - 4)) + [window - 1, rows - 1]
        features += list(rng.integers(window - 1, rows, 2))
        entries += [(int(f), int(rng.integers(0, label_rows)), key) for f in features]
    return [entries[i] for i in rng.permutation(len(entries))]


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> DataSet:
    """6 keys of (30..60, 5) float64 factors and (rows, 2) float32 labels; W=6; 60 samples."""
    rng = np.random.default_rng(41)
    factors = {f"s{k}": sample_values(rng, "<f8", (int(rng.integers(30, 61)), 5)) for k in range(6)}
    labels = {k: sample_values(rng, "<f4", (len(v), 2)) for k, v in factors.items()}
    entries = random_entries(rng, factors, labels, 6, per_key=10)
    return write_dataset(tmp_path_factory.mktemp("small"), factors, labels, entries, 6)


@pytest.fixture(scope="module")
def ordered(tmp_path_factory) -> DataSet:
    """103 samples over 4 keys (a prime, so batches and shards never divide it evenly)."""
    rng = np.random.default_rng(51)
    factors = {f"o{k}": sample_values(rng, "<f4", (80, 3)) for k in range(4)}
    labels = {k: sample_values(rng, "<f4", (80, 1)) for k in factors}
    entries = [(int(rng.integers(3, 80)), int(rng.integers(0, 80)), f"o{int(rng.integers(0, 4))}") for _ in range(103)]
    return write_dataset(tmp_path_factory.mktemp("ordered"), factors, labels, entries, 4)


# ----------------------------------------------------------------------------------------------------------
# The matrix: source dtypes x output dtypes x modes, shuffle on and off


SOURCES = ["<f4", "<f8", "<f2", ">f4", ">f8", ">f2", "<i2", ">i2", "|u1", "|i1", "<i4", ">i4", "<i8", "<u2",
           "<u4", "<u8", "|b1", "F<f4", "F>f8", "F<f2"]  # "F": a Fortran-order factor and label file


@pytest.fixture(scope="module")
def dtype_dataset(tmp_path_factory):
    """``dtype_dataset(source) -> DataSet``: 5 keys of (40..70, 6) factors and (rows+2, 3) labels, W=8."""
    cache = {}

    def get(source):
        if source not in cache:
            fortran = source.startswith("F")
            dtype = np.dtype(source.lstrip("F"))
            rng = np.random.default_rng(zlib.crc32(source.encode()))
            factors, labels = {}, {}
            for k in range(5):
                rows = int(rng.integers(40, 71))
                factors[f"key{k}"] = sample_values(rng, dtype, (rows, 6))
                labels[f"key{k}"] = sample_values(rng, dtype, (rows + 2, 3))
            entries = random_entries(rng, factors, labels, 8)
            root = tmp_path_factory.mktemp("dtype")
            cache[source] = write_dataset(root, factors, labels, entries, 8, fortran=fortran)
        return cache[source]

    return get


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("out", OUT_DTYPES)
@pytest.mark.parametrize("source", SOURCES)
def test_batches_equal_numpy_slicing(dtype_dataset, source, out, mode):
    ds = dtype_dataset(source)
    if source.startswith("F"):
        assert npyfeed.read_header(ds.factor_dir / "key0.npy").fortran_order
        assert npyfeed.read_header(ds.label_dir / "key0.npy").fortran_order
    src = open_source(ds, mode, dtype=out)
    n = len(ds.entries)
    assert len(src) == n
    assert src.x_shape == (8, 6) and src.y_shape == (3,)
    assert src.dtype == np.dtype(out)
    assert src.skipped == 0
    for shuffle in (False, True):
        order = src.epoch_order(3, shuffle=shuffle, seed=11)
        assert np.array_equal(np.sort(order), np.arange(n))
        assert shuffle != np.array_equal(order, np.arange(n))
        assert check_epoch(src, ds, out, 7, shuffle=shuffle, seed=11, epoch=3) == -(-n // 7)
    # Every sample in one gather: the most merging.
    assert_batch(src.get(np.arange(n)), reference(ds, ds.entries, out))


# ----------------------------------------------------------------------------------------------------------
# Merging: wide rows, so that windows far apart are read separately


@pytest.fixture(scope="module")
def wide_dataset(tmp_path_factory):
    """``wide_dataset(source)``: (1000, 256) and (700, 256) factors, W=20; windows close together, far apart, and
    64 and 65 rows apart (the edge of the 64 KiB merge gap for float32 rows)."""
    cache = {}

    def get(source):
        if source not in cache:
            rng = np.random.default_rng(zlib.crc32(source.encode()) + 1)
            dtype = np.dtype(source)
            factors = {"a": sample_values(rng, dtype, (1000, 256)), "b": sample_values(rng, dtype, (700, 256))}
            labels = {"a": sample_values(rng, dtype, (1000, 2)), "b": sample_values(rng, dtype, (700, 2))}
            features_a = [165, 249, 334, 999, 19, 19, 500, 501, 502, 505, 760, 761, 899]
            features_b = [19, 350, 351, 699, 60, 600]
            entries = [(f, int(rng.integers(0, 1000)), "a") for f in features_a]
            entries += [(f, int(rng.integers(0, 700)), "b") for f in features_b]
            entries = [entries[i] for i in rng.permutation(len(entries))]
            root = tmp_path_factory.mktemp("wide")
            cache[source] = write_dataset(root, factors, labels, entries, 20)
        return cache[source]

    return get


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("out", OUT_DTYPES)
@pytest.mark.parametrize("source", ["<f4", "<f8", "<f2", ">f4"])
def test_windows_far_apart_and_close_together(wide_dataset, source, out, mode):
    ds = wide_dataset(source)
    src = open_source(ds, mode, dtype=out)
    n = len(ds.entries)
    assert_batch(src.get(np.arange(n)), reference(ds, ds.entries, out))  # one gather: merges where close
    ids = np.array([3, 3, n - 1, 0, 5])
    assert_batch(src.get(ids), reference(ds, [ds.entries[i] for i in ids], out))
    check_epoch(src, ds, out, 3, shuffle=True, seed=5)  # small batches: mostly single windows


@pytest.fixture(scope="module")
def long_chain(tmp_path_factory):
    """One (9000, 512) float32 factor (18 MiB) with a window every 40 rows: a chain of overlapping reads longer
    than the 16 MiB a merged read may span."""
    rng = np.random.default_rng(99)
    factors = {"big": rng.standard_normal((9000, 512), dtype=np.float32)}
    labels = {"big": rng.standard_normal((9000, 1), dtype=np.float32)}
    entries = [(f, int(rng.integers(0, 9000)), "big") for f in range(15, 9000, 40)]
    return write_dataset(tmp_path_factory.mktemp("chain"), factors, labels, entries, 16)


@pytest.mark.parametrize("mode", MODES)
def test_merge_chain_longer_than_the_span_limit(long_chain, mode):
    src = open_source(long_chain, mode)
    n = len(long_chain.entries)
    assert_batch(src.get(np.arange(n)), reference(long_chain, long_chain.entries, "float32"))
    ids = np.arange(n)[::-1].copy()
    assert_batch(src.get(ids), reference(long_chain, [long_chain.entries[i] for i in ids], "float32"))


_DIRECT_REFUSED = """
    from pathlib import Path
    import numpy as np
    from test_windows import (assert_batch, check_epoch, open_source, random_entries, reference, sample_values,
                              write_dataset)

    rng = np.random.default_rng(3)
    factors = {"a": sample_values(rng, "<f4", (300, 40)), "b": sample_values(rng, "<f8", (200, 40))}
    labels = {"a": sample_values(rng, "<f4", (300, 2)), "b": sample_values(rng, "<f8", (200, 2))}
    ds = write_dataset(Path(sys.argv[1]), factors, labels, random_entries(rng, factors, labels, 10), 10)
    src = open_source(ds, "direct")
    check_epoch(src, ds, "float32", 4, shuffle=True)
    assert_batch(src.get(np.arange(len(src))), reference(ds, ds.entries, "float32"))
    print("fallback ok")
"""


def test_direct_mode_where_o_direct_is_refused(tmp_path):
    """On a filesystem that refuses O_DIRECT (a ramfs: tmpfs accepts it since Linux 6.6), mode='direct' falls
    back to plain reads and gives the same batches."""
    from _sandbox import run_on_ramfs

    mountpoint = tmp_path / "ramfs"
    mountpoint.mkdir()
    proc = run_on_ramfs(_DIRECT_REFUSED, mountpoint)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fallback ok" in proc.stdout


def _rchar() -> int:
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


@pytest.mark.parametrize("mode", ["read", "direct"])
def test_read_modes_read_only_the_rows_needed(long_chain, mode):
    """An 18 MiB factor file and one 32 KiB window: reads (counted by the kernel) stay far below the file size."""
    if not os.path.exists("/proc/self/io"):
        pytest.skip("no /proc/self/io")
    src = open_source(long_chain, mode)
    before = _rchar()
    batch = src.get([100])
    batch2 = src.get([3, 3])
    read = _rchar() - before
    assert read < (1 << 20), read
    assert_batch(batch, reference(long_chain, [long_chain.entries[100]], "float32"))
    assert_batch(batch2, reference(long_chain, [long_chain.entries[3]] * 2, "float32"))


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
def test_many_keys_beyond_the_open_file_limit(many_keys, low_fd_limit, mode):
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


# ----------------------------------------------------------------------------------------------------------
# Shapes: 1-d labels, 3-d factors, 3-d labels


@pytest.mark.parametrize("mode", MODES)
def test_1d_labels_and_3d_factors(tmp_path, mode):
    rng = np.random.default_rng(21)
    factors = {k: sample_values(rng, "<f8", (int(rng.integers(20, 40)), 3, 4)) for k in ("p", "q", "r")}
    labels = {k: sample_values(rng, "<i4", (len(v),)) for k, v in factors.items()}
    entries = random_entries(rng, factors, labels, 5, per_key=8)
    ds = write_dataset(tmp_path, factors, labels, entries, 5)
    src = open_source(ds, mode)
    assert src.x_shape == (5, 3, 4) and src.y_shape == ()
    x, y = src.get(np.arange(len(src)))
    assert x.shape == (len(entries), 5, 3, 4) and y.shape == (len(entries),)
    assert_batch((x, y), reference(ds, entries, "float32"))
    check_epoch(src, ds, "float32", 5, shuffle=True, seed=1)


@pytest.mark.parametrize("mode", MODES)
def test_3d_labels_with_padding(tmp_path, mode):
    rng = np.random.default_rng(22)
    factors = {"a": sample_values(rng, "<f4", (12, 3, 2)), "b": sample_values(rng, "<u2", (9, 3, 2))}
    labels = {"a": sample_values(rng, "<f2", (12, 2, 2)), "b": sample_values(rng, "<f2", (5, 2, 2))}
    entries = [(0, 0, "a"), (11, 11, "a"), (13, 12, "a"), (3, 4, "b"), (8, 5, "b"), (-1, -1, "b"), (2, 2, "b")]
    ds = write_dataset(tmp_path, factors, labels, entries, 4)
    src = open_source(ds, mode, bounds="pad", dtype="float64")
    assert src.x_shape == (4, 3, 2) and src.y_shape == (2, 2)
    assert_batch(src.get(np.arange(len(entries))), reference(ds, entries, "float64"))
    check_epoch(src, ds, "float64", 3, shuffle=True, seed=2)


def test_fortran_3d_factor_is_refused(tmp_path):
    rng = np.random.default_rng(23)
    factors = {"a": np.asfortranarray(rng.standard_normal((10, 2, 3)))}
    labels = {"a": rng.standard_normal((10, 1))}
    ds = write_dataset(tmp_path, factors, labels, [(5, 1, "a")], 3, fortran=True)
    for mode in FILE_MODES:
        with pytest.raises(ValueError, match="a.npy.*Fortran"):
            open_source(ds, mode)
    # In memory, Fortran arrays of any rank are copied to C order first.
    assert_batch(open_source(ds, "arrays").get([0]), reference(ds, ds.entries, "float32"))


# ----------------------------------------------------------------------------------------------------------
# bounds=


@pytest.fixture
def bounds_dataset(tmp_path):
    """Key 'a': 30 factor rows, 25 label rows; key 'b': 12 and 12. W=5. Good and bad lines mixed; line 2 is blank
    (so index lines and sample numbers differ)."""
    rng = np.random.default_rng(31)
    factors = {"a": sample_values(rng, "<f4", (30, 4)), "b": sample_values(rng, "<f8", (12, 4))}
    labels = {"a": sample_values(rng, "<f4", (25, 2)), "b": sample_values(rng, "<f8", (12, 2))}
    entries = [
        (10, 3, "a"),   # ok
        (2, 3, "a"),    # window starts before row 0: rows [-2, 3)
        (29, 24, "a"),  # ok: last factor row, last label row
        (30, 0, "a"),   # ends one past the last row
        (-3, 1, "a"),   # entirely before
        (40, 2, "a"),   # entirely after
        (12, 25, "a"),  # label row past the end
        (12, -1, "a"),  # negative label row
        (11, 4, "a"),   # ok, overlaps the bad ones around it
        (4, 0, "b"),    # ok: first full window
        (0, 11, "b"),   # starts before row 0
        (11, 11, "b"),  # ok
        (13, 12, "b"),  # both out
        (9, 5, "a"),    # ok
    ]
    good = [0, 2, 8, 9, 11, 13]
    lines = [f"{fi},{li},{key}" for fi, li, key in entries]
    text = lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n"
    ds = write_dataset(tmp_path, factors, labels, entries, 5, index_text=text)
    ds.good = good
    return ds


def _line_of(sample_position: int) -> int:
    return 1 if sample_position == 0 else sample_position + 2  # line 2 is blank


@pytest.mark.parametrize("mode", MODES)
def test_bounds_error_names_file_line_key_and_rows(bounds_dataset, mode):
    ds = bounds_dataset
    with pytest.raises(IndexError) as info:
        open_source(ds, mode)
    message = str(info.value)
    # The first bad line: sample 1, (2, 3, 'a'), on line 3.
    assert f"{ds.index}:3:" in message
    assert "'a'" in message
    assert "[-2, 3)" in message
    if mode != "arrays":
        assert str(ds.factor_dir / "a.npy") in message


@pytest.mark.parametrize("position", [1, 3, 4, 5, 6, 7, 10, 12])
def test_bounds_error_for_each_kind_of_bad_line(tmp_path, bounds_dataset, position):
    ds = bounds_dataset
    fi, li, key = ds.entries[position]
    good_lines = [f"{e[0]},{e[1]},{e[2]}" for i, e in enumerate(ds.entries) if i in ds.good]
    index = tmp_path / "one_bad.txt"
    index.write_text("\n".join(good_lines[:3] + [f"  {fi} , {li} , {key}  "] + good_lines[3:]) + "\n")
    with pytest.raises(IndexError) as info:
        npyfeed.WindowSource(index, ds.factor_dir, ds.label_dir, 5, mode="read")
    message = str(info.value)
    assert f"{index}:4:" in message
    assert f"'{key}'" in message
    rows = len(ds.factors[key])
    if fi - 4 < 0 or fi >= rows:
        assert f"[{fi - 4}, {fi + 1})" in message
        assert f"{rows} rows" in message
    else:
        assert f"label row {li}" in message
        assert str(ds.label_dir / f"{key}.npy") in message
    with pytest.raises(IndexError, match=rf"<index list>:1: key '{key}'"):
        npyfeed.WindowSource.from_arrays([(fi, li, key)], ds.factors, ds.labels, 5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("out", OUT_DTYPES)
def test_bounds_skip_drops_and_counts(bounds_dataset, mode, out):
    ds = bounds_dataset
    src = open_source(ds, mode, bounds="skip", dtype=out)
    good = [ds.entries[i] for i in ds.good]
    assert len(src) == len(good)
    assert src.skipped == len(ds.entries) - len(good)
    for sample, position in enumerate(ds.good):
        fi, li, key = ds.entries[position]
        assert src.describe(sample) == (f"{ds.index}:{_line_of(position)}: key '{key}', feature_index {fi}, "
                                        f"label_index {li}")
    for bad in (len(good), -1):
        with pytest.raises(IndexError):
            src.describe(bad)
    assert_batch(src.get(np.arange(len(good))), reference(ds, good, out))
    for shuffle in (False, True):
        check_epoch(src, ds, out, 4, entries=good, shuffle=shuffle, seed=8)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("out", OUT_DTYPES)
def test_bounds_pad_zero_fills(bounds_dataset, mode, out):
    ds = bounds_dataset
    src = open_source(ds, mode, bounds="pad", dtype=out)
    assert len(src) == len(ds.entries) and src.skipped == 0
    x, y = src.get(np.arange(len(ds.entries)))
    assert_batch((x, y), reference(ds, ds.entries, out))
    assert np.all(x[1, :2] == 0) and np.all(x[5] == 0) and np.all(y[6] == 0) and np.all(y[7] == 0)
    assert np.any(x[1, 2:] != 0)  # the rows inside the array are real
    for shuffle in (False, True):
        check_epoch(src, ds, out, 3, shuffle=shuffle, seed=9)
    # Alone in a gather, each padded sample is its own merge group.
    for i in range(len(ds.entries)):
        assert_batch(src.get([i]), reference(ds, [ds.entries[i]], out))


@pytest.mark.parametrize("feature", [-2**63, -2**63 + 1])
def test_bounds_error_for_extreme_feature_index(feature):
    factors = {"a": np.ones((20, 2), np.float32)}
    labels = {"a": np.ones((20,), np.float32)}
    with pytest.raises(IndexError, match="key 'a'"):
        npyfeed.WindowSource.from_arrays([(feature, 0, "a")], factors, labels, 3)
    src = npyfeed.WindowSource.from_arrays([(feature, 0, "a"), (5, 0, "a")], factors, labels, 3, bounds="skip")
    assert len(src) == 1 and src.skipped == 1


@pytest.mark.parametrize("feature", [2**63 - 1, 2**63 - 3, 2**62, -2**62])
def test_huge_feature_index(feature):
    factors = {"a": np.arange(40, dtype=np.float32).reshape(20, 2) + 1}
    labels = {"a": np.ones((20,), np.float32)}
    with pytest.raises(IndexError, match="key 'a'"):
        npyfeed.WindowSource.from_arrays([(feature, 0, "a")], factors, labels, 3)
    skip = npyfeed.WindowSource.from_arrays([(feature, 0, "a"), (5, 0, "a")], factors, labels, 3, bounds="skip")
    assert len(skip) == 1 and skip.skipped == 1
    pad = npyfeed.WindowSource.from_arrays([(feature, 0, "a"), (5, 0, "a")], factors, labels, 3, bounds="pad")
    x, y = pad.get([0, 1])
    assert np.all(x[0] == 0) and np.array_equal(x[1], factors["a"][3:6])


# ----------------------------------------------------------------------------------------------------------
# get()


@pytest.mark.parametrize("mode", MODES)
def test_get_arbitrary_ids(small, mode):
    src = open_source(small, mode)
    n = len(src)
    rng = np.random.default_rng(42)
    for ids in ([0], [n - 1], [5, 5, 5], [3, 1, 3, 0, n - 1, 1], list(rng.integers(0, n, 100)),
                np.arange(n)[::-1], np.arange(n, dtype=np.int32), np.array([2, 7], np.uint8)):
        expected = reference(small, [small.entries[int(i)] for i in ids], "float32")
        assert_batch(src.get(ids), expected)


@pytest.mark.parametrize("mode", MODES)
def test_get_empty(small, mode):
    src = open_source(small, mode)
    for ids in ([], np.array([], np.int64)):
        x, y = src.get(ids)
        assert x.shape == (0, 6, 5) and x.dtype == np.float32
        assert y.shape == (0, 2) and y.dtype == np.float32


@pytest.mark.parametrize("bad", [[-1], [60], [0, 1, 60], [2**40], [-2**63]])
def test_get_out_of_range_raises_index_error(small, bad):
    src = open_source(small, "read")
    assert len(src) == 60
    with pytest.raises(IndexError, match="out of range"):
        src.get(bad)
    assert_batch(src.get([0]), reference(small, small.entries[:1], "float32"))  # still usable


@pytest.mark.parametrize("bad", [[0.5], [[0, 1]], ["a"], 3])
def test_get_wrong_type(small, bad):
    with pytest.raises(TypeError):
        open_source(small, "mmap").get(bad)


# ----------------------------------------------------------------------------------------------------------
# The epoch order: shuffle, shards, resume


def test_epoch_order_is_a_seeded_permutation(ordered):
    src = open_source(ordered, "mmap")
    other = open_source(ordered, "arrays", threads=1)  # a second source: the order depends on nothing else
    n = len(src)
    identity = np.arange(n)
    assert np.array_equal(src.epoch_order(0), identity)
    assert np.array_equal(src.epoch_order(5), identity)
    orders = {}
    for seed in (0, 1, 2**64 - 1):
        for epoch in (0, 1, 2, 2**64 - 1):
            order = src.epoch_order(epoch, shuffle=True, seed=seed)
            assert order.dtype == np.int64 and order.shape == (n,)
            assert np.array_equal(np.sort(order), identity)
            assert np.array_equal(order, src.epoch_order(epoch, shuffle=True, seed=seed))
            assert np.array_equal(order, other.epoch_order(epoch, shuffle=True, seed=seed))
            orders[seed, epoch] = tuple(order)
    assert len(set(orders.values())) == len(orders)  # every (seed, epoch) gives its own order


def test_epoch_order_is_the_same_on_any_machine():
    """Pinned values: a restarted job (another machine, another npyfeed build) must see the same order."""
    src = npyfeed.WindowSource.from_arrays([(0, 0, "a")] * 10, {"a": np.zeros((3, 1))}, {"a": np.zeros((3, 1))}, 1)
    # The order of npyfeed 0.2 (IndexShuffle: a Feistel bijection, O(1) memory); 0.1 had a Fisher-Yates order.
    assert src.epoch_order(0, shuffle=True, seed=0).tolist() == [8, 2, 7, 3, 0, 1, 4, 6, 9, 5]
    assert src.epoch_order(1, shuffle=True, seed=0).tolist() == [3, 7, 9, 2, 0, 5, 4, 1, 8, 6]
    assert src.epoch_order(0, shuffle=True, seed=2**64 - 1).tolist() == [2, 8, 1, 9, 4, 7, 0, 5, 6, 3]


@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_follow_epoch_order_and_differ_between_epochs(ordered, shuffle):
    src = open_source(ordered, "read")
    first = [x for x, _ in src.batches(10, shuffle=shuffle, seed=4, epoch=0)]
    again = [x for x, _ in src.batches(10, shuffle=shuffle, seed=4, epoch=0)]
    later = [x for x, _ in src.batches(10, shuffle=shuffle, seed=4, epoch=1)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again)) and len(first) == len(again) == 11
    assert all(np.array_equal(a, b) for a, b in zip(first, later)) != shuffle
    for epoch in (0, 1):
        check_epoch(src, ordered, "float32", 10, shuffle=shuffle, seed=4, epoch=epoch)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_shards_are_disjoint_and_complete(ordered, shuffle, drop_remainder):
    src = open_source(ordered, "mmap")
    n = len(src)
    parts = [src.epoch_order(2, shuffle=shuffle, seed=3, num_shards=3, shard_index=i) for i in range(3)]
    assert [len(p) for p in parts] == [35, 34, 34]
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))  # disjoint and covering
    seen = []
    for i in range(3):
        kwargs = dict(shuffle=shuffle, seed=3, epoch=2, num_shards=3, shard_index=i, drop_remainder=drop_remainder)
        batches = check_epoch(src, ordered, "float32", 8, **kwargs)
        assert batches == (len(parts[i]) // 8 if drop_remainder else -(-len(parts[i]) // 8))
        for x, _ in src.batches(8, **kwargs):
            seen.append(x)
    if not drop_remainder:
        everything = reference(ordered, ordered.entries, "float32")[0]
        got = np.concatenate(seen)
        # The union over the shards is every sample exactly once (compare as sorted rows of bytes).
        key = lambda a: sorted(r.tobytes() for r in a)  # noqa: E731
        assert key(got) == key(everything)


@pytest.mark.parametrize("batch_size, shards, drop, expected", [
    (10, 1, False, 11), (10, 1, True, 10), (103, 1, False, 1), (103, 1, True, 1), (104, 1, False, 1),
    (104, 1, True, 0), (1, 1, False, 103), (8, 3, False, 5), (8, 3, True, 4), (7, 3, True, 5), (200, 2, True, 0)])
def test_num_batches_matches_iterator(ordered, batch_size, shards, drop, expected):
    src = open_source(ordered, "mmap")
    assert src.num_batches(batch_size, num_shards=shards, drop_remainder=drop) == expected
    it = src.batches(batch_size, num_shards=shards, drop_remainder=drop)
    assert len(it) == expected
    sizes = []
    for x, y in it:
        sizes.append(len(x))
        assert len(y) == len(x)
        assert len(it) == expected - len(sizes)
    assert len(sizes) == expected
    if drop:
        assert all(s == batch_size for s in sizes)
    elif sizes:
        assert all(s == batch_size for s in sizes[:-1]) and 1 <= sizes[-1] <= batch_size
        assert sum(sizes) == len(range(0, len(src), shards))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_resume_equals_tail_of_full_epoch(ordered, shuffle, drop_remainder):
    src = open_source(ordered, "read")
    kwargs = dict(shuffle=shuffle, seed=6, epoch=3, num_shards=2, shard_index=1, drop_remainder=drop_remainder)
    full = list(src.batches(6, **kwargs))
    total = src.num_batches(6, num_shards=2, shard_index=1, drop_remainder=drop_remainder)
    assert len(full) == total == (8 if drop_remainder else 9)
    for k in (0, 1, 4, total - 1, total):
        it = src.batches(6, start_batch=k, **kwargs)
        assert len(it) == total - k
        tail = list(it)
        assert len(tail) == total - k
        for (x, y), (fx, fy) in zip(tail, full[k:]):
            assert np.array_equal(x, fx) and np.array_equal(y, fy)


@pytest.mark.parametrize("kwargs", [
    dict(batch_size=0), dict(batch_size=-1), dict(batch_size=1.5), dict(batch_size=True),
    dict(prefetch=0), dict(prefetch=-2), dict(prefetch=1.0),
    dict(start_batch=-1), dict(start_batch=12), dict(start_batch=1.0),
    dict(num_shards=0), dict(num_shards=-1), dict(num_shards=3, shard_index=3), dict(shard_index=-1),
    dict(num_shards=2, shard_index=2), dict(seed=-1), dict(epoch=-1), dict(seed=2**64), dict(seed=1.5),
], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_invalid_batches_arguments(ordered, kwargs):
    src = open_source(ordered, "mmap")
    kwargs = dict(kwargs)
    batch_size = kwargs.pop("batch_size", 10)
    name = next(iter(kwargs), "batch_size")
    if "shard_index" in kwargs:
        name = "shard_index" if kwargs.get("num_shards", 1) >= 1 else "num_shards"
    with pytest.raises(ValueError, match=name):
        src.batches(batch_size, shuffle=True, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(num_shards=0), dict(num_shards=2, shard_index=2), dict(shard_index=-1)])
def test_invalid_shards_in_epoch_order_and_num_batches(ordered, kwargs):
    src = open_source(ordered, "mmap")
    with pytest.raises(ValueError):
        src.epoch_order(0, **kwargs)
    with pytest.raises(ValueError):
        src.num_batches(4, **kwargs)
    with pytest.raises(ValueError, match="batch_size"):
        src.num_batches(0)


# ----------------------------------------------------------------------------------------------------------
# Batch buffers: contiguous, 64-byte aligned, owned, never recycled while referenced


@pytest.mark.parametrize("mode", MODES)
def test_batch_arrays_are_aligned_and_owned(small, mode):
    src = open_source(small, mode)
    batches = [src.get([1, 2, 3])] + list(src.batches(7, shuffle=True))
    for x, y in batches:
        for a in (x, y):
            assert a.flags.c_contiguous
            assert a.ctypes.data % 64 == 0
            assert a.base is not None and not a.flags.owndata


@pytest.mark.parametrize("mode", ["mmap", "read", "arrays"])
def test_batches_stay_valid_while_referenced(ordered, mode):
    """Keep some batches (or only views of them), drop the others so their buffers are recycled; the kept ones
    must not change while the iterator runs on, nor after the iterator and the source are gone."""
    src = open_source(ordered, mode)
    order = src.epoch_order(1, shuffle=True, seed=12)
    kept = []
    it = src.batches(3, shuffle=True, seed=12, epoch=1, prefetch=2)
    for b, (x, y) in enumerate(it):
        ids = order[b * 3:(b + 1) * 3]
        if b % 3 == 0:
            kept.append(("whole", ids, x, y))
        elif b % 3 == 1:
            kept.append(("views", ids, x[1:], y[:, ::-1]))  # only views survive: their base keeps the buffer
        del x, y
        if b == 5:  # a second iterator over the same source shares nothing with the first
            other = list(src.batches(3))
    del it, src, other
    gc.collect()
    for kind, ids, x, y in kept:
        ex, ey = reference(ordered, [ordered.entries[i] for i in ids], "float32")
        if kind == "views":
            ex, ey = ex[1:], ey[:, ::-1]
        assert np.array_equal(x, ex) and np.array_equal(y, ey)
    assert len(kept) == 24


def test_batches_writable_without_affecting_later_batches(ordered):
    src = open_source(ordered, "mmap")
    it = src.batches(5)
    x0, _ = next(it)
    assert x0.flags.writeable  # the user's own copy, e.g. for normalising in place
    x0[...] = np.nan  # scribbling on it changes nothing else
    del x0
    for b, (x, y) in enumerate(it, start=1):
        assert_batch((x, y), reference(ordered, ordered.entries[b * 5:(b + 1) * 5], "float32"))
    assert_batch(src.get(np.arange(5)), reference(ordered, ordered.entries[:5], "float32"))


def test_from_arrays_keeps_its_arrays_alive(ordered):
    factors, labels = ordered.loaded("factor"), ordered.loaded("label")
    it = npyfeed.WindowSource.from_arrays(ordered.index, factors, labels, ordered.window).batches(9)
    src = npyfeed.WindowSource.from_arrays(ordered.index, factors, labels, ordered.window)
    del factors, labels
    gc.collect()
    for b, batch in enumerate(it):  # the iterator alone keeps its source and the arrays alive
        assert_batch(batch, reference(ordered, ordered.entries[b * 9:(b + 1) * 9], "float32"))
    assert_batch(src.get(np.arange(len(src))), reference(ordered, ordered.entries, "float32"))


# ----------------------------------------------------------------------------------------------------------
# from_arrays: the users' migration path


def test_from_arrays_with_load_factor_files(small):
    paths = sorted(small.factor_dir.glob("*.npy"))
    for mode in ("auto", "mmap"):
        factors = npyfeed.load_factor_files(paths, mode=mode)
        labels = npyfeed.load_factor_files(sorted(small.label_dir.glob("*.npy")), {}, mode=mode)
        assert set(factors) == set(small.factors)
        for index in (small.index, str(small.index), [small.index], [str(small.index)]):
            src = npyfeed.WindowSource.from_arrays(index, factors, labels, small.window, threads=THREADS)
            assert src.mode == "memory" and len(src) == len(small.entries)
            check_epoch(src, small, "float32", 8, shuffle=True, seed=1)
        files = open_source(small, "read")
        arrays = npyfeed.WindowSource.from_arrays(small.index, factors, labels, small.window)
        for (x1, y1), (x2, y2) in zip(files.batches(16), arrays.batches(16)):
            assert np.array_equal(x1, x2) and np.array_equal(y1, y2)


def test_from_arrays_keeps_its_arrays_alive_until_the_source_is_gone(small):
    """The core holds the arrays itself (not a Python attribute): an iterator outliving every other reference
    still reads them, and they are freed once the source and its iterators are gone."""
    import weakref

    factors = {k: v.copy() for k, v in small.factors.items()}
    labels = {k: v.copy() for k, v in small.labels.items()}
    refs = [weakref.ref(a) for a in (*factors.values(), *labels.values())]
    src = npyfeed.WindowSource.from_arrays(small.index, factors, labels, small.window, threads=THREADS)
    it = src.batches(len(small.entries))
    del factors, labels, src
    gc.collect()
    assert all(r() is not None for r in refs)
    x, y = next(it)
    assert_batch((x, y), reference(small, small.entries, "float32"))
    it.close()
    del it
    deadline = time.monotonic() + 5  # a pool worker may hold the finished read-ahead for a moment
    while any(r() is not None for r in refs) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert all(r() is None for r in refs)


def test_from_arrays_with_tuples_and_odd_arrays(small):
    entries = [(np.int64(fi), int(li), key) for fi, li, key in small.entries]
    # Non-contiguous and Fortran-order arrays are accepted (copied once to C order).
    factors = {k: np.asfortranarray(v) for k, v in small.factors.items()}
    labels = {k: np.repeat(v, 2, axis=1)[:, ::2] for k, v in small.labels.items()}
    assert not labels["s0"].flags.c_contiguous and not factors["s0"].flags.c_contiguous
    src = npyfeed.WindowSource.from_arrays(entries, factors, labels, small.window, dtype="float64")
    assert src.keys == list(dict.fromkeys(k for _, _, k in small.entries))
    assert_batch(src.get(np.arange(len(entries))), reference(small, small.entries, "float64"))


def test_from_arrays_missing_keys(small):
    factors = dict(small.factors)
    labels = dict(small.labels)
    del factors["s1"], labels["s4"]
    with pytest.raises(KeyError, match="2 of 6 keys.*'s1'.*'s4'|2 of 6 keys.*'s4'.*'s1'"):
        npyfeed.WindowSource.from_arrays(small.index, factors, labels, small.window)


@pytest.mark.parametrize("index, error", [([], ValueError), ([(1, 2)], ValueError), ([(1.5, 2, "a")], ValueError),
                                          ([(1, 2, "a/b")], ValueError), ([(1, 2, "")], ValueError)])
def test_from_arrays_bad_tuples(index, error):
    arrays = {"a": np.zeros((5, 2)), "a/b": np.zeros((5, 2)), "": np.zeros((5, 2))}
    with pytest.raises(error):
        npyfeed.WindowSource.from_arrays(index, arrays, arrays, 1)


# ----------------------------------------------------------------------------------------------------------
# Construction errors: arguments, missing, mismatched and corrupt files


@pytest.mark.parametrize("kwargs, match", [
    (dict(window=0), "window"), (dict(window=-3), "window"), (dict(window=2.0), "window"),
    (dict(window=True), "window"),
    (dict(dtype="int32"), "dtype"), (dict(dtype="float16"), "dtype"), (dict(bounds="clip"), "bounds"),
    (dict(mode="fast"), "mode"), (dict(threads=0), "threads")])
def test_invalid_source_arguments(small, kwargs, match):
    kwargs = dict(kwargs)
    window = kwargs.pop("window", small.window)
    with pytest.raises(ValueError, match=match):
        npyfeed.WindowSource(small.index, small.factor_dir, small.label_dir, window, **kwargs)
    kwargs.pop("mode", None)
    if kwargs or window != small.window:
        with pytest.raises(ValueError, match=match):
            npyfeed.WindowSource.from_arrays(small.index, small.factors, small.labels, window, **kwargs)


def _many_keys(tmp_path: Path, count: int) -> DataSet:
    rng = np.random.default_rng(61)
    factors = {f"key{k:02d}": rng.standard_normal((10, 3)).astype(np.float32) for k in range(count)}
    labels = {k: rng.standard_normal((10, 1)).astype(np.float32) for k in factors}
    entries = [(5, 5, k) for k in factors]
    return write_dataset(tmp_path, factors, labels, entries, 3)


@pytest.mark.parametrize("mode", FILE_MODES)
def test_missing_key_files_are_listed(tmp_path, mode):
    ds = _many_keys(tmp_path, 9)
    for k in range(1, 9):
        (ds.factor_dir / f"key{k:02d}.npy").unlink()
    (ds.label_dir / "key02.npy").unlink()
    with pytest.raises(FileNotFoundError) as info:
        open_source(ds, mode)
    message = str(info.value)
    assert "8 of 9 keys" in message
    for k in range(1, 6):  # the first few, with their paths
        assert f"'key{k:02d}'" in message and str(ds.factor_dir / f"key{k:02d}.npy") in message
    assert str(ds.label_dir / "key02.npy") in message
    assert "'key08'" not in message and "..." in message
    assert info.value.filename is not None and "key0" in str(info.value.filename)


def test_one_missing_label_file(tmp_path):
    ds = _many_keys(tmp_path, 3)
    (ds.label_dir / "key01.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"1 of 3 keys.*'key01'.*label.key01\.npy"):
        open_source(ds, "read")


def test_missing_directory(tmp_path):
    ds = _many_keys(tmp_path, 2)
    with pytest.raises(FileNotFoundError):
        npyfeed.WindowSource(ds.index, tmp_path / "nowhere", ds.label_dir, 3)


@pytest.mark.parametrize("which", ["factor", "label"])
@pytest.mark.parametrize("mode", FILE_MODES)
def test_row_shapes_must_match(tmp_path, which, mode):
    ds = _many_keys(tmp_path, 4)
    directory = ds.factor_dir if which == "factor" else ds.label_dir
    np.save(directory / "key02.npy", np.zeros((10, 5), np.float32))
    with pytest.raises(ValueError) as info:
        open_source(ds, mode)
    message = str(info.value)
    assert str(directory / "key02.npy") in message and str(directory / "key00.npy") in message
    assert re.search(r"\(5, ?\)", message)  # the shapes, too


@pytest.mark.parametrize("mode", MODES)
def test_row_shapes_must_match_in_memory(small, mode):
    factors = dict(small.factors)
    factors["s3"] = np.zeros((40, 4))
    with pytest.raises(ValueError, match=r"factors\['s3'\].*factors\['s\d'\]|factors\['s\d'\].*factors\['s3'\]"):
        npyfeed.WindowSource.from_arrays(small.index, factors, small.labels, small.window)


@pytest.mark.parametrize("damage", ["magic", "header", "truncated", "empty"])
@pytest.mark.parametrize("mode", FILE_MODES)
def test_corrupt_factor_file(tmp_path, damage, mode):
    ds = _many_keys(tmp_path, 3)
    path = ds.factor_dir / "key01.npy"
    data = path.read_bytes()
    if damage == "magic":
        data = b"\x93NUMPZ" + data[6:]
    elif damage == "header":
        data = data.replace(b"'descr'", b"'descx'")
    elif damage == "truncated":
        data = data[:-5]
    else:
        data = b""
    path.write_bytes(data)
    with pytest.raises(npyfeed.NpyFormatError) as info:
        open_source(ds, mode)
    assert isinstance(info.value, ValueError)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("dtype", ["<c8", "<U2", "<M8[s]", [("a", "<f4")]])
def test_unconvertible_dtype(tmp_path, dtype):
    ds = _many_keys(tmp_path, 2)
    path = ds.factor_dir / "key01.npy"
    np.save(path, np.zeros((10, 3), dtype))
    for mode in FILE_MODES:
        with pytest.raises(ValueError, match="key01.npy"):
            open_source(ds, mode)
    with pytest.raises(ValueError):
        npyfeed.WindowSource.from_arrays(ds.index, {**ds.factors, "key01": np.zeros((10, 3), dtype)}, ds.labels, 3)


@pytest.mark.parametrize("mode", ["read", "direct"])
def test_file_truncated_after_opening(tmp_path, mode):
    """A file that shrinks under a running job: the gather raises naming the file, it never returns garbage."""
    ds = _many_keys(tmp_path, 3)
    src = open_source(ds, mode)
    path = ds.factor_dir / "key01.npy"
    with open(path, "r+b") as fh:
        fh.truncate(130)
    with pytest.raises(npyfeed.NpyFormatError, match="key01.npy"):
        src.get([1])
    with pytest.raises(npyfeed.NpyFormatError, match="key01.npy"):
        list(src.batches(1, prefetch=3))
    assert_batch(src.get([0, 2]), reference(ds, [ds.entries[0], ds.entries[2]], "float32"))


# ----------------------------------------------------------------------------------------------------------
# Iterators: close, with, break, interpreter exit


def test_close_mid_epoch(ordered):
    src = open_source(ordered, "read")
    it = src.batches(4, prefetch=4)
    first = next(it)
    assert len(it) == 25
    it.close()
    it.close()  # idempotent
    with pytest.raises(StopIteration):
        next(it)
    assert list(it) == [] and len(it) == 0
    assert_batch(first, reference(ordered, ordered.entries[:4], "float32"))
    check_epoch(src, ordered, "float32", 4)  # the source is fine


def test_with_block_closes(ordered):
    src = open_source(ordered, "mmap")
    with src.batches(4, prefetch=3, shuffle=True) as it:
        batch = next(it)
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    order = src.epoch_order(0, shuffle=True)
    assert_batch(batch, reference(ordered, [ordered.entries[i] for i in order[:4]], "float32"))
    with pytest.raises(RuntimeError):
        with src.batches(4) as it:
            next(it)
            raise RuntimeError("user error inside the block")
    assert list(it) == []


@pytest.mark.parametrize("mode", ["read", "arrays"])
def test_break_then_delete(ordered, mode):
    src = open_source(ordered, mode)
    held = []
    for _ in range(5):
        for b, batch in enumerate(src.batches(2, prefetch=6, shuffle=True)):
            held.append(batch)
            if b == 2:
                break  # the abandoned iterator goes at once, with gathers possibly still in flight
    del src
    gc.collect()
    order = npyfeed.WindowSource.from_arrays(ordered.index, ordered.factors, ordered.labels, 4).epoch_order(
        0, shuffle=True)
    for i, batch in enumerate(held):
        b = i % 3
        assert_batch(batch, reference(ordered, [ordered.entries[j] for j in order[2 * b:2 * b + 2]], "float32"))


def test_errors_in_read_ahead_reach_the_caller(tmp_path):
    ds = _many_keys(tmp_path, 10)
    src = open_source(ds, "read")
    it = src.batches(1, prefetch=4)
    assert_batch(next(it), reference(ds, ds.entries[:1], "float32"))  # batches 1-4 are in flight now
    with open(ds.factor_dir / "key08.npy", "r+b") as fh:
        fh.truncate(100)
    for b in range(1, 8):
        assert_batch(next(it), reference(ds, ds.entries[b:b + 1], "float32"))
    with pytest.raises(npyfeed.NpyFormatError, match="key08.npy"):
        next(it)
    it.close()


_EXIT_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import npyfeed

    how, root = sys.argv[1], sys.argv[2]
    if how.startswith("arrays"):
        load = lambda d: {k: np.load(f"{root}/{d}/{k}.npy") for k in ("k0", "k1", "k2", "k3")}
        src = npyfeed.WindowSource.from_arrays(f"{root}/index.txt", load("factor"), load("label"), 50)
    else:
        src = npyfeed.WindowSource(f"{root}/index.txt", f"{root}/factor", f"{root}/label", 50, mode="read")
    it = src.batches(64, prefetch=4, shuffle=True)
    for b, (x, y) in enumerate(it):
        if b == 1:
            print("mid-epoch", flush=True)
            if how.endswith("sys.exit"):
                sys.exit(0)
            if how.endswith("raise"):
                raise SystemExit
            break
    # "end": the script ends with the iterator alive and gathers in flight
""")


@pytest.fixture(scope="module")
def exit_dataset(tmp_path_factory) -> DataSet:
    rng = np.random.default_rng(71)
    factors = {f"k{k}": rng.standard_normal((3000, 64), dtype=np.float32) for k in range(4)}
    labels = {k: rng.standard_normal((3000, 2), dtype=np.float32) for k in factors}
    entries = [(int(rng.integers(49, 3000)), int(rng.integers(0, 3000)), f"k{int(rng.integers(0, 4))}")
               for _ in range(64 * 40)]
    return write_dataset(tmp_path_factory.mktemp("exit"), factors, labels, entries, 50)


@pytest.mark.parametrize("how", ["end", "sys.exit", "raise", "arrays-end", "arrays-sys.exit"])
def test_interpreter_exit_mid_epoch(exit_dataset, how):
    proc = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, how, str(exit_dataset.root)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "mid-epoch" in proc.stdout
    assert "Fatal Python error" not in proc.stderr and "terminate" not in proc.stderr


_DAEMON_SCRIPT = textwrap.dedent("""
    import sys, threading
    import npyfeed

    root = sys.argv[1]
    src = npyfeed.WindowSource(f"{root}/index.txt", f"{root}/factor", f"{root}/label", 50, mode="mmap")
    started = threading.Event()

    def feed():  # like a framework's input thread: still gathering when the interpreter exits
        while True:
            for _ in src.batches(64, prefetch=4, shuffle=True):
                started.set()

    threading.Thread(target=feed, daemon=True).start()
    started.wait()
    print("exiting", flush=True)
""")


def test_interpreter_exit_with_a_daemon_thread_gathering(exit_dataset):
    for _ in range(3):  # the thread is inside a gather at exit nearly always; three tries make it certain
        proc = subprocess.run([sys.executable, "-c", _DAEMON_SCRIPT, str(exit_dataset.root)],
                              capture_output=True, text=True, timeout=60)
        assert "exiting" in proc.stdout
        assert proc.returncode == 0, proc.stderr
        assert "Fatal Python error" not in proc.stderr and "terminate" not in proc.stderr


# ----------------------------------------------------------------------------------------------------------
# The GIL


@pytest.fixture(scope="module")
def large_dataset(tmp_path_factory) -> DataSet:
    """8 files of (2400, 256) float32, 2048 samples of W=100: batches of 256 are 26 MB."""
    rng = np.random.default_rng(81)
    factors = {f"g{k}": rng.standard_normal((2400, 256), dtype=np.float32) for k in range(8)}
    labels = {k: rng.standard_normal((2400, 4), dtype=np.float32) for k in factors}
    entries = [(int(rng.integers(99, 2400)), int(rng.integers(0, 2400)), f"g{int(rng.integers(0, 8))}")
               for _ in range(256 * 8)]
    return write_dataset(tmp_path_factory.mktemp("large"), factors, labels, entries, 100)


@pytest.mark.parametrize("mode", ["mmap", "read"])
def test_gil_released_during_gathers(large_dataset, mode):
    """Another Python thread keeps counting while the main thread gathers large batches.

    The counting thread gives up the GIL after every 50 counts (a short sleep: one "cycle"), so the main thread
    gets it back at once when it needs it; with a huge switch interval the interpreter never takes the GIL from
    a thread by force. The counting thread can therefore run only while the main thread has released the GIL
    itself: were a gather done with the GIL held, the count would advance by at most one cycle per place where
    the GIL is let go (about three per call), not by many cycles per call.
    """
    src = open_source(large_dataset, mode, threads=1)  # leave the other core to the counting thread
    state = {"stop": False, "cycles": 0}
    started = threading.Event()

    def count():
        started.set()
        n = 0
        while not state["stop"]:
            n += 1
            if n % 50 == 0:
                state["cycles"] += 1
                time.sleep(1e-5)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    thread = threading.Thread(target=count)
    try:
        thread.start()
        started.wait()
        before = state["cycles"]
        calls = 0
        for _ in src.batches(512, prefetch=1):  # 52 MB per batch
            calls += 1
        x, y = src.get(np.arange(1024))  # 105 MB in one gather
        calls += 1
        after = state["cycles"]
    finally:
        state["stop"] = True
        thread.join()
        sys.setswitchinterval(old)
    assert calls == 5
    assert x.shape == (1024, 100, 256) and y.shape == (1024, 4)
    assert after - before >= 10 * calls, (after - before, calls)
    assert_batch((np.ascontiguousarray(x[::97]), y[::97].copy()), reference(large_dataset, large_dataset.entries[:1024:97], "float32"))


def test_close_from_another_thread_while_next_waits(tmp_path):
    # close() may come from another thread while next() waits for a gather: the waiting next() then ends the
    # iteration (StopIteration) instead of racing on the read-ahead queue.
    import threading

    rng = np.random.default_rng(7)
    factors = {f"k{i}": rng.standard_normal((400, 64), dtype=np.float32) for i in range(4)}
    labels = {k: rng.standard_normal((400, 2), dtype=np.float32) for k in factors}
    index = [(int(f), int(f), k) for k in factors for f in range(49, 400)]
    src = npyfeed.WindowSource.from_arrays(index, factors, labels, 50)
    for _ in range(20):
        it = src.batches(64, prefetch=4, shuffle=True)
        first = next(it)
        closer = threading.Thread(target=it.close)
        got = []
        closer.start()
        try:
            for batch in it:
                got.append(batch)
        finally:
            closer.join()
        assert first[0].shape == (64, 50, 64)
        assert len(got) <= src.num_batches(64) - 1
        assert all(x.shape[1:] == (50, 64) and np.isfinite(x).all() for x, _ in got)
        assert next(it, None) is None
