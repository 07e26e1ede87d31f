"""Window batches against the numpy oracle: every source dtype and byte order, a Fortran-order factor
file, both output dtypes, every mode and `from_arrays`, shuffle on and off; merged and unmerged windows; reads
limited to the rows needed.

The numpy reference and the data sets: windows_data.py."""


from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import npyfeed
import numpy as np
import pytest
from windows_data import (
    MODES,
    OUT_DTYPES,
    assert_batch,
    check_epoch,
    open_source,
    random_entries,
    reference,
    sample_values,
    write_dataset,
)

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


@pytest.fixture(scope="module")
def past_the_caches(tmp_path_factory):
    """``past_the_caches(source)``: 3 keys of (600, 257) factors, W=17 (windows of 17,476 bytes as float32, at
    every offset mod 64 in a batch), 1,000 samples: one gather of all of them is 17.5 MB as float32, past the
    16 MiB from which windows are copied with streaming stores; a few samples leave their arrays (bounds='pad')."""
    cache = {}

    def get(source):
        if source not in cache:
            rng = np.random.default_rng(zlib.crc32(source.encode()) + 2)
            factors = {k: sample_values(rng, source, (600, 257)) for k in "abc"}
            labels = {k: sample_values(rng, source, (600, 3)) for k in "abc"}
            entries = [(int(rng.integers(16, 600)), int(rng.integers(0, 600)), "abc"[i % 3]) for i in range(994)]
            entries += [(0, 1, "a"), (5, 2, "b"), (599 + 16, 3, "c"), (599 + 3, 0, "a"), (16, 599, "b"), (599, 5, "c")]
            entries = [entries[i] for i in rng.permutation(len(entries))]
            cache[source] = write_dataset(tmp_path_factory.mktemp("past"), factors, labels, entries, 17)
        return cache[source]

    return get


@pytest.mark.parametrize("streaming, prefetch", [("1", "1"), ("1", "0"), ("0", "1"), ("0", "0"), (None, None)])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("source", ["<f4", "<f8", ">f4", "<f2", ">f2", ">f8"])
def test_batches_copied_with_streaming_stores_equal_numpy(past_the_caches, source, mode, streaming, prefetch,
                                                          monkeypatch):
    """Windows copied into the batch with streaming stores (NPYFEED_STREAMING=1; by default from 16 MiB a batch:
    the whole-epoch gather here) or memcpy (=0), their source read once fetched ahead with a non-temporal hint
    (NPYFEED_PREFETCH=1) or not (=0), or as this CPU's defaults: the same bytes as numpy slicing, converted or
    not."""
    for name, value in (("NPYFEED_STREAMING", streaming), ("NPYFEED_PREFETCH", prefetch)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    ds = past_the_caches(source)
    n = len(ds.entries)
    for out in OUT_DTYPES:
        src = open_source(ds, mode, dtype=out, bounds="pad")
        assert_batch(src.get(np.arange(n)), reference(ds, ds.entries, out))
        check_epoch(src, ds, out, 64, shuffle=True, seed=3)


def _assert_float32_bits(ds, want):
    """Every sample of `ds` gathered to float32 ("mmap" and "read") has `want`'s bits (np.array_equal cannot see NaN
    payloads; the bytes can)."""
    for mode in ("mmap", "read"):
        x, _ = open_source(ds, mode).get(np.arange(len(ds.entries)))
        assert x.dtype == np.float32 and x.shape == want.shape
        differ = np.flatnonzero(x.view(np.uint32) != want.view(np.uint32))
        assert differ.size == 0, f"{mode}: {differ.size} elements differ, the first at {differ[0]}"


@pytest.mark.parametrize("streaming", ["1", "0"])
@pytest.mark.parametrize("source", ["<f2", ">f2", "<f8", ">f8", ">f4"])
def test_float_conversions_keep_every_bit_as_numpy(tmp_path, source, streaming, monkeypatch):
    """float16 (every bit pattern, signalling NaNs with their payload among them), float64 (NaN payloads,
    rounding, overflow, subnormals) and big-endian float32 (any bits) to float32 by the vector loops, written past
    the caches or not: numpy's `astype` bit for bit (np.array_equal cannot see NaN payloads; the bytes can)."""
    monkeypatch.setenv("NPYFEED_STREAMING", streaming)
    dtype = np.dtype(source)
    rows, cols, window = 256, 264, 9
    if dtype.itemsize == 2:
        bits = np.arange(rows * cols, dtype=np.uint32) % 65536
        values = bits.astype(np.uint16).view(np.float16)
    else:
        native = np.dtype(f"u{dtype.itemsize}")
        bits = np.random.default_rng(5).integers(0, np.iinfo(native).max, rows * cols, dtype=native, endpoint=True)
        bits[::7] |= native.type({4: 0x7F800000, 8: 0x7FF0000000000000}[dtype.itemsize])  # NaN with a payload, or inf
        values = bits.view(dtype.newbyteorder("="))
    factor = values.reshape(rows, cols).astype(dtype)  # in the file's byte order, the same values
    label = np.zeros((rows, 1), dtype)
    entries = [(f, f, "k") for f in range(window - 1, rows)]
    ds = write_dataset(tmp_path, {"k": factor}, {"k": label}, entries, window)
    with np.errstate(invalid="ignore", over="ignore"):
        want = np.stack([factor[f - window + 1:f + 1] for f, _, _ in entries]).astype(np.float32)
    _assert_float32_bits(ds, want)


@pytest.mark.parametrize("streaming", ["1", "0"])
@pytest.mark.parametrize("source", ["|b1", "|i1", "|u1", "<i2", ">i2", "<u2", ">u2", "<i4", ">i4", "<u4", ">u4",
                                    "<i8", ">u8"])
def test_integer_conversions_keep_every_bit_as_numpy(tmp_path, source, streaming, monkeypatch):
    """Bools (any byte but 0 is True) and integers (every 8- and 16-bit value, any 32- and 64-bit bits: float32
    rounds those) to float32 by the vector loops (the 8- to 32-bit ones), written past the caches or not:
    numpy's `astype`, bit for bit."""
    monkeypatch.setenv("NPYFEED_STREAMING", streaming)
    dtype = np.dtype(source)
    rows, cols, window = 256, 264, 9
    native = np.dtype(f"u{dtype.itemsize}")
    if dtype.itemsize <= 2:
        bits = (np.arange(rows * cols) % (1 << 8 * dtype.itemsize)).astype(native)
    else:
        bits = np.random.default_rng(7).integers(0, np.iinfo(native).max, rows * cols, dtype=native, endpoint=True)
    if dtype.kind == "b":
        bits = np.where(bits % 3 == 0, 0, bits)  # zeros among the bytes
    values = bits.view(dtype.newbyteorder("="))
    factor = values.reshape(rows, cols).astype(dtype)  # in the file's byte order, the same values
    label = np.zeros((rows, 1), dtype)
    entries = [(f, f, "k") for f in range(window - 1, rows)]
    ds = write_dataset(tmp_path, {"k": factor}, {"k": label}, entries, window)
    want = np.stack([np.load(ds.factor_dir / "k.npy")[f - window + 1:f + 1] for f, _, _ in entries])
    want = want.astype(np.float32)
    _assert_float32_bits(ds, want)


def test_streamed_paths_without_avx512_equal_numpy(tmp_path):
    """NPYFEED_AVX512=0, read once when a process starts, keeps the streamed copies and options to SSE2 and AVX2:
    the path of CPUs without AVX-512. The streamed tests again in such a process, whatever this CPU has."""
    env = dict(os.environ, NPYFEED_AVX512="0")
    probe = subprocess.run([sys.executable, "-c", "from npyfeed import _core; print(_core.uses_avx512())"],
                           env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "False"
    tests = Path(__file__).parent
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "run"),
         str(tests / "test_windows_gather.py"), str(tests / "test_features.py"),
         "-k", "copied_with_streaming_stores or written_past_the_caches or keep_every_bit"],
        env=env, cwd=tests.parent, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout


_DIRECT_REFUSED = """
    from pathlib import Path
    import numpy as np
    from windows_data import (assert_batch, check_epoch, open_source, random_entries, reference, sample_values,
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
