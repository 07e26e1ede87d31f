"""Shared by the window tests (tests/test_windows_*.py): data sets in the users' layout and the numpy reference.

The reference for sample ``(feature_index, label_index, key)`` is plain numpy slicing,
``factor[key][feature_index - W + 1 : feature_index + 1].astype(out)`` and ``label[key][label_index].astype(out)``,
with zero rows for rows outside the arrays under ``bounds="pad"``. Index parsing itself is in test_index.py.
"""


from __future__ import annotations

from pathlib import Path

import npyfeed
import numpy as np
from npyfeed import _layout

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
    for key in factors:
        factor, label = factors[key], labels[key]
        if fortran:  # np.save writes fortran_order=True for F-contiguous, non-C-contiguous arrays
            factor, label = np.asfortranarray(factor), np.asfortranarray(label)
        _layout.write_key(root, key, factor, label)
    _layout.layout_dirs(root)  # also for a data set of no keys
    _layout.write_index(root / "index.txt", _layout.index_text(entries) if index_text is None else index_text)
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


def many_keys_dataset(tmp_path: Path, count: int) -> DataSet:
    rng = np.random.default_rng(61)
    factors = {f"key{k:02d}": rng.standard_normal((10, 3)).astype(np.float32) for k in range(count)}
    labels = {k: rng.standard_normal((10, 1)).astype(np.float32) for k in factors}
    entries = [(5, 5, k) for k in factors]
    return write_dataset(tmp_path, factors, labels, entries, 3)
