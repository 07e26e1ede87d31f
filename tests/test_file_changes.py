"""A file changed under a running source: never served unannounced, the same outcome on every path.

The matrix: {renamed over with the same shape, rewritten in place with the same size, truncated, grown by rows,
deleted, made unreadable} x {mmap, read, direct} x {host shuffle=True, host shuffle="blocks", device resident
(shuffle=True and "blocks"), device streamed, and npyfeed.tf.dataset's host gather} x {`.npy`, `.npz`}. The change comes after the source opened its
files and before an epoch starts: that epoch refuses it, naming the file and what changed (docs/safety.md,
"Files changed under a running job"). Then a change in the middle of an epoch: the paths that hold the file
finish the epoch from the file they opened, the blocks paths refuse at the block that reads it again.
"""

from __future__ import annotations

import errno
import os

import npyfeed
import numpy as np
import pytest
from npyfeed._layout import index_text, write_index

KEYS = [f"k{i}" for i in range(8)]
ROWS, F, L = 40, 3, 2
WINDOW, BATCH = 4, 8
BUDGET = 1600  # shuffle="blocks": 800 bytes of data a key, so a block of one key and two blocks held at once
NEW = -7.0  # the values of every replacement: never in the original data (all >= 0)
VICTIM = "k1"
CHANGES = ["renamed_over", "rewritten_in_place", "truncated", "grown", "deleted", "made_unreadable"]
# What the refusal says was changed (file.cpp's check_same_file), per change.
SAYS = {"renamed_over": "replaced by another file", "rewritten_in_place": "written in place",
        "truncated": "truncated", "grown": "grown", "deleted": "deleted since it was opened"}
# The numpy iterator, npyfeed.tf.dataset (the host gather), and batches formed on the device (resident or streamed).
PATHS = ["numpy-shuffle", "numpy-blocks", "tf-shuffle", "tf-blocks", "device-resident-shuffle",
         "device-resident-blocks", "device-streamed"]


def _factor(i: int) -> np.ndarray:
    return (1000 * i + np.arange(ROWS * F, dtype=np.float32)).reshape(ROWS, F)


def _label(i: int) -> np.ndarray:
    return (1000 * i + np.arange(ROWS * L, dtype=np.float32)).reshape(ROWS, L)


def _save(path_without_suffix, array: np.ndarray, fmt: str) -> str:
    if fmt == "npy":
        np.save(f"{path_without_suffix}.npy", array)
        return f"{path_without_suffix}.npy"
    np.savez(f"{path_without_suffix}.npz", array)  # one stored member
    return f"{path_without_suffix}.npz"


def _data_set(base, fmt: str) -> str:
    for kind, make in (("factor", _factor), ("label", _label)):
        os.makedirs(base / kind, exist_ok=True)
        for i, key in enumerate(KEYS):
            path = _save(base / kind / key, make(i), fmt)
            # An hour old, so that a change now always moves the modification time (whatever the clock's tick).
            old = os.stat(path).st_mtime_ns - 3600 * 10**9
            os.utime(path, ns=(old, old))
    return write_index(base / "index.txt", index_text((f, f, k) for k in KEYS for f in range(WINDOW - 1, ROWS)))


def _change(path: str, change: str, fmt: str) -> None:
    if change == "renamed_over":  # the safe refresh: written beside, then renamed over
        tmp = os.path.join(os.path.dirname(path), "tmp-new")
        os.replace(_save(tmp, np.full((ROWS, F), NEW, np.float32), fmt), path)
    elif change == "rewritten_in_place":  # same size, other bytes
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.seek(size - ROWS * F * 4 // 2)
            f.write(np.full(ROWS * F // 2, NEW, np.float32).tobytes()[: size - f.tell()])
    elif change == "truncated":
        os.truncate(path, os.path.getsize(path) - 5 * F * 4)
    elif change == "grown":  # rows appended (the header still says ROWS: np.load reads the old rows)
        with open(path, "ab") as f:
            f.write(np.full((5, F), NEW, np.float32).tobytes())
    elif change == "deleted":
        os.unlink(path)
    else:
        os.chmod(path, 0)


def _source(base, index: str, mode: str) -> npyfeed.WindowSource:
    return npyfeed.WindowSource([index], base / "factor", base / "label", WINDOW, mode=mode, cache=False)


def _read(src, path: str) -> list:
    """One epoch of `src` through `path`, as numpy batches."""
    shuffle = True if path.endswith("shuffle") else "blocks"
    if path.startswith("numpy"):
        return list(src.batches(BATCH, shuffle=shuffle, seed=1, memory_budget=BUDGET))
    import npyfeed.tf

    if path.startswith("tf"):
        return [(x.numpy(), y.numpy()) for x, y in npyfeed.tf.dataset(src, BATCH, shuffle=shuffle, seed=1,
                                                                       memory_budget=BUDGET)]
    kw = {"device_memory_budget": 4000} if path == "device-streamed" else {}  # the keys take 6,600 bytes
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=shuffle, seed=1, memory_budget=BUDGET, gather="device",
                            device="/cpu:0", **kw)
    if path == "device-streamed":
        assert npyfeed.tf._pipeline.pipeline_of(ds).device.streams
    return [(x.numpy(), y.numpy()) for x, y in ds]


def _refusal(path: str):
    """What a refused read raises on `path`: npyfeed's own error from the numpy iterator (and where the device's
    dataset is made: its upload), TensorFlow's around it in a graph."""
    if path.startswith("numpy"):
        return OSError
    import tensorflow as tf

    return (OSError, tf.errors.OpError)


@pytest.mark.parametrize("fmt", ["npy", "npz"])
@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("mode", ["mmap", "read", "direct"])
@pytest.mark.parametrize("path", PATHS)
def test_a_file_changed_before_an_epoch_is_refused_by_it(tmp_path, path, mode, change, fmt):
    if not path.startswith("numpy"):
        pytest.importorskip("tensorflow")
    index = _data_set(tmp_path, fmt)
    src = _source(tmp_path, index, mode)
    want = list(src.batches(BATCH, shuffle=True if "shuffle" in path else "blocks", seed=1, memory_budget=BUDGET))
    if not path.startswith("numpy"):  # TensorFlow's batches are the numpy iterator's: here, before any change
        assert [x.tolist() for x, _ in _read(src, path)] == [x.tolist() for x, _ in want]
    victim = str(tmp_path / "factor" / f"{VICTIM}.{fmt}")
    _change(victim, change, fmt)
    try:
        if change == "made_unreadable":
            # The file is the one opened (its bytes, size and time unchanged): served where it can be read (as
            # root, or from what the source holds); refused as unreadable where it is opened again.
            try:
                got = _read(src, path)
            except _refusal(path) as e:
                assert os.geteuid() != 0, e
                assert "Permission denied" in str(e) and victim in str(e)
                return
            assert len(got) == len(want)
            for (gx, gy), (wx, wy) in zip(got, want):
                np.testing.assert_array_equal(gx, wx)
                np.testing.assert_array_equal(gy, wy)
            return
        with pytest.raises(_refusal(path)) as info:
            _read(src, path)
        message = str(info.value)
        assert victim in message and SAYS[change] in message, message
        if isinstance(info.value, OSError):
            want_type = FileNotFoundError if change == "deleted" else npyfeed.FileChangedError
            assert type(info.value) is want_type
            assert info.value.errno == (errno.ENOENT if change == "deleted" else errno.ESTALE)
            assert info.value.filename == victim
    finally:
        if os.path.exists(victim):
            os.chmod(victim, 0o644)


@pytest.mark.parametrize("mode", ["mmap", "read", "direct"])
def test_renamed_over_mid_epoch_the_epoch_ends_on_the_old_file_and_the_next_refuses(tmp_path, mode):
    """Paths that hold each file (a mapping or a descriptor) finish the epoch from the file they opened; the next
    epoch refuses the new one. No batch ever holds the new values."""
    index = _data_set(tmp_path, "npy")
    src = _source(tmp_path, index, mode)
    want = list(src.batches(BATCH, shuffle=True, seed=1, epoch=1))
    victim = str(tmp_path / "factor" / f"{VICTIM}.npy")
    plan = src.plan(BATCH, shuffle=True, seed=1, prefetch=1)
    got = [plan.take(1, 0)]
    _change(victim, "renamed_over", "npy")
    got += [plan.take(1, b) for b in range(1, len(plan))]
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gy, wy)
    with pytest.raises(npyfeed.FileChangedError, match=f"{victim}.*|replaced by another file"):
        plan.take(2, 0)


@pytest.mark.parametrize("fmt", ["npy", "npz"])
@pytest.mark.parametrize("mode", ["mmap", "read", "direct"])
def test_renamed_over_mid_epoch_a_blocks_epoch_refuses_the_block_that_reads_it(tmp_path, mode, fmt):
    """shuffle="blocks" reads each `.npy` file again for its block: a file changed since the source opened it is
    refused there, in the same epoch, naming it; every batch before holds the original data. A `.npz` member is
    held by the source (inflated, read or mapped at open), never read again: its epoch ends on what the source
    holds, and the next epoch refuses the archive."""
    index = _data_set(tmp_path, fmt)
    src = _source(tmp_path, index, mode)
    want = list(src.batches(BATCH, shuffle="blocks", seed=1, memory_budget=BUDGET))
    plan = src.plan(BATCH, shuffle="blocks", seed=1, memory_budget=BUDGET, prefetch=1)
    got = [plan.take(0, 0)]  # the epoch's files checked; its first blocks read
    victims = [str(tmp_path / "factor" / f"{key}.{fmt}") for key in KEYS]
    for victim in victims:  # every factor file: those of the blocks not read yet are read after this
        _change(victim, "renamed_over", fmt)
    with pytest.raises(npyfeed.FileChangedError) as info:
        for b in range(1, len(plan)):
            got.append(plan.take(0, b))
        assert fmt == "npz" and len(got) == len(want)
        plan.take(1, 0)
    assert "replaced by another file" in str(info.value) and info.value.filename in victims
    assert 1 <= len(got) <= len(want)
    if fmt == "npy":
        assert len(got) < len(want)
    for (gx, gy), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gy, wy)


def test_every_changed_file_is_counted(tmp_path):
    index = _data_set(tmp_path, "npy")
    src = _source(tmp_path, index, "mmap")
    for key in KEYS[:3]:
        _change(str(tmp_path / "factor" / f"{key}.npy"), "rewritten_in_place", "npy")
    with pytest.raises(npyfeed.FileChangedError,
                       match=r"written in place.*3 files of this source changed in all.*k0\.npy"):
        list(src.batches(BATCH))
    # A new source reads the new data.
    fresh = _source(tmp_path, index, "mmap")
    x, _ = fresh.get(np.arange(len(fresh)))
    assert (x == NEW).any()


def test_random_access_serves_the_files_the_source_opened(tmp_path):
    """`src.get` is no epoch: it reads the files the source holds (here the mapping of the file renamed over)."""
    index = _data_set(tmp_path, "npy")
    src = _source(tmp_path, index, "mmap")
    ids = np.arange(len(src))
    x0, y0 = src.get(ids)
    _change(str(tmp_path / "factor" / f"{VICTIM}.npy"), "renamed_over", "npy")
    x1, y1 = src.get(ids)
    np.testing.assert_array_equal(x1, x0)
    np.testing.assert_array_equal(y1, y0)
