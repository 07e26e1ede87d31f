"""The gather's per-row options against numpy: ``features=`` / ``label_columns=`` (fancy indexing), ``nan=`` /
``posinf=`` / ``neginf=`` (``np.nan_to_num``), ``normalize=`` (``(x - mean) / std`` in the output dtype).

A data set with NaN and infinities in its factors and labels, read in every mode (mmap, read, direct, arrays in
memory, ``.npz`` archives), C and Fortran order, through ``get``, ``batches`` (plain and ``shuffle="blocks"``) and
``npyfeed.tf.dataset``; N-d rows (the flattened row's columns, a mean broadcast to the row); only the selected
columns read from a Fortran-order file; the construction errors, each naming the argument and the value.
"""

from __future__ import annotations

import os
from pathlib import Path

import npyfeed
import numpy as np
import pytest

WINDOW = 4
ROWS = 30
COLS = 6
LABEL_COLS = 3
KEYS = ("a", "b", "c")
MODES = ("mmap", "read", "direct", "arrays", "npz")


def _poisoned(rng, shape, dtype) -> np.ndarray:
    """Normal values with NaN, +inf and -inf scattered through them (every column gets some)."""
    a = rng.standard_normal(shape).astype(dtype) * 3 + 1
    flat = a.reshape(-1)
    for value, every in ((np.nan, 5), (np.inf, 7), (-np.inf, 11)):
        flat[rng.integers(0, every, 1)[0]::every] = value
    return a


def _entries():
    # Windows near both ends of every key, repeats, keys interleaved.
    out = []
    for i in range(24):
        key = KEYS[i % 3]
        out.append((WINDOW - 1 + (i * 7) % (ROWS - WINDOW + 1), (i * 5) % ROWS, key))
    out.append(out[3])
    return out


class DataSet:
    def __init__(self, root: Path, fortran: bool, factor_shape=(ROWS, COLS), dtype=np.float32):
        rng = np.random.default_rng(42)
        self.root = root
        self.factors = {k: _poisoned(rng, factor_shape, dtype) for k in KEYS}
        self.labels = {k: _poisoned(rng, (ROWS, LABEL_COLS), np.float64) for k in KEYS}
        self.entries = _entries()
        for sub in ("factor", "label", "factor_npz", "label_npz"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        for k in KEYS:
            f, l = self.factors[k], self.labels[k]
            if fortran and f.ndim == 2:
                f, l = np.asfortranarray(f), np.asfortranarray(l)
            np.save(root / "factor" / f"{k}.npy", f)
            np.save(root / "label" / f"{k}.npy", l)
            np.savez(root / "factor_npz" / f"{k}.npz", x=f)
            np.savez_compressed(root / "label_npz" / f"{k}.npz", y=l)
        (root / "index.txt").write_text("".join(f"{fi},{li},{k}\n" for fi, li, k in self.entries))
        if fortran and factor_shape == (ROWS, COLS):
            assert npyfeed.read_header(root / "factor" / "a.npy").fortran_order

    def open(self, mode: str, **kwargs) -> npyfeed.WindowSource:
        kwargs.setdefault("threads", 2)
        if mode == "arrays":
            return npyfeed.WindowSource.from_arrays(self.root / "index.txt", self.factors, self.labels, WINDOW, **kwargs)
        if mode == "npz":
            return npyfeed.WindowSource(self.root / "index.txt", self.root / "factor_npz", self.root / "label_npz",
                                        WINDOW, mode="read", **kwargs)
        return npyfeed.WindowSource(self.root / "index.txt", self.root / "factor", self.root / "label", WINDOW,
                                    mode=mode, **kwargs)

    def expected(self, dtype="float32", features=None, label_columns=None, nan=None, posinf=None, neginf=None,
                 normalize=None, **_):
        """The numpy reference, sample by sample."""
        xs, ys = [], []
        for fi, li, k in self.entries:
            x = self.factors[k][fi - WINDOW + 1:fi + 1].astype(dtype)
            y = self.labels[k][li].astype(dtype)
            if features is not None:
                x = x.reshape(WINDOW, -1)[:, features]
            if label_columns is not None:
                y = y.reshape(-1)[label_columns]
            x, y = _replace(x, nan, posinf, neginf), _replace(y, nan, posinf, neginf)
            if normalize is not None:
                x = (x - np.asarray(normalize[0], dtype=dtype)) / np.asarray(normalize[1], dtype=dtype)
            xs.append(x)
            ys.append(y)
        return np.stack(xs), np.stack(ys)


def _replace(a: np.ndarray, nan, posinf, neginf) -> np.ndarray:
    """np.nan_to_num, where None keeps the value (nan_to_num itself has no such choice)."""
    if nan is not None and posinf is not None and neginf is not None:
        return np.nan_to_num(a, nan=nan, posinf=posinf, neginf=neginf)
    a = a.copy()
    if nan is not None:
        a[np.isnan(a)] = nan
    if posinf is not None:
        a[a == np.inf] = posinf
    if neginf is not None:
        a[a == -np.inf] = neginf
    return a


def _assert_matches(actual, expected, normalized: bool):
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    if normalized:
        # Computed in the output dtype as numpy does: equal but for ulp-scale differences.
        eps = np.finfo(expected.dtype).eps
        np.testing.assert_allclose(actual, expected, rtol=4 * eps, atol=4 * eps)
    else:
        np.testing.assert_array_equal(actual, expected, strict=True)


@pytest.fixture(scope="module", params=[False, True], ids=["C", "F"])
def dataset(request, tmp_path_factory):
    return DataSet(tmp_path_factory.mktemp("features-" + ("F" if request.param else "C")), request.param)


MEAN = np.array([0.5, -1.0, 2.0, 0.25, 1.5, -0.75])
STD = np.array([2.0, 0.5, 3.0, 1.25, 4.0, 0.3])

# One id per option combination; each is checked in every mode, both orders.
CASES = {
    "plain": {},
    "features-list": {"features": [4, 0, 0, 5]},
    "features-negative": {"features": [-1, 2, -6]},
    "features-slice": {"features": slice(1, 5)},
    "features-slice-step": {"features": slice(None, None, -2)},
    "features-array": {"features": np.array([3, 1], dtype=np.int32)},
    "label-columns": {"label_columns": [2, 0, 2]},
    "label-columns-slice": {"label_columns": slice(1, None)},
    "nan-to-num": {"nan": 0.0, "posinf": 1e6, "neginf": -1e6},
    "nan-only": {"nan": -7.5},
    "posinf-only": {"posinf": 3.0},
    "neginf-only": {"neginf": -3.0},
    "normalize": {"normalize": (MEAN, STD)},
    "normalize-scalar": {"normalize": (1.0, 2.0)},
    "everything": {"features": [5, 1, 2], "label_columns": [1], "nan": 0.0, "posinf": 10.0, "neginf": -10.0,
                   "normalize": (MEAN[[5, 1, 2]].astype(np.float32), STD[[5, 1, 2]])},
    "everything-float64": {"features": slice(0, 3), "nan": 1.0, "posinf": 2.0, "neginf": 3.0,
                           "normalize": (MEAN[:3], STD[:3]), "dtype": "float64"},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(CASES))
def test_get_matches_numpy(dataset, mode, case):
    options = CASES[case]
    src = dataset.open(mode, **options)
    want_x, want_y = dataset.expected(**options)
    assert src.x_shape == want_x.shape[1:]
    assert src.y_shape == want_y.shape[1:]
    x, y = src.get(np.arange(len(src)))
    _assert_matches(x, want_x, "normalize" in options)
    _assert_matches(y, want_y, False)
    if "nan" in options and "posinf" in options and "neginf" in options:
        assert np.isfinite(x).all() and np.isfinite(y).all()


@pytest.mark.parametrize("mode", ["mmap", "read", "arrays"])
@pytest.mark.parametrize("shuffle", [False, True, "blocks"])
def test_batches_honour_the_options(dataset, mode, shuffle):
    options = CASES["everything"]
    src = dataset.open(mode, **options)
    want_x, want_y = dataset.expected(**options)
    budget = 4 * ROWS * (COLS * 4 + LABEL_COLS * 8)  # about two keys per block: several blocks
    order = src.epoch_order(shuffle=shuffle, seed=3, memory_budget=budget)
    got = list(src.batches(5, shuffle=shuffle, seed=3, memory_budget=budget))
    x = np.concatenate([b[0] for b in got])
    y = np.concatenate([b[1] for b in got])
    _assert_matches(x, want_x[order], True)
    _assert_matches(y, want_y[order], False)


def test_tf_dataset_shapes_and_values(dataset):
    tf = pytest.importorskip("tensorflow")
    import npyfeed.tf

    options = CASES["everything"]
    src = dataset.open("mmap", **options)
    want_x, want_y = dataset.expected(**options)
    ds = npyfeed.tf.dataset(src, 5, drop_remainder=True)
    x_spec, y_spec = ds.element_spec
    assert tuple(x_spec.shape) == (5, WINDOW, 3) and x_spec.dtype == tf.float32
    assert tuple(y_spec.shape) == (5, 1)
    got = list(ds.as_numpy_iterator())
    n = 5 * len(got)
    _assert_matches(np.concatenate([b[0] for b in got]), want_x[:n], True)
    _assert_matches(np.concatenate([b[1] for b in got]), want_y[:n], False)


def test_nd_rows_select_from_the_flattened_row(tmp_path):
    ds = DataSet(tmp_path, False, factor_shape=(ROWS, 2, 3))
    for mode in ("mmap", "arrays"):
        src = ds.open(mode, features=[5, 0, 3], nan=0.0)
        assert src.x_shape == (WINDOW, 3)
        x, _ = src.get(np.arange(len(src)))
        _assert_matches(x, ds.expected(features=[5, 0, 3], nan=0.0)[0], False)
        # Without a selection the row keeps its shape, and a mean of shape (3,) broadcasts to (2, 3).
        mean, std = np.array([1.0, 2.0, 3.0]), np.array([[2.0, 1.0, 0.5]])
        src = ds.open(mode, normalize=(mean, std), posinf=5.0)
        assert src.x_shape == (WINDOW, 2, 3)
        x, _ = src.get(np.arange(len(src)))
        _assert_matches(x, ds.expected(normalize=(mean, std), posinf=5.0)[0], True)


def test_integer_sources_are_selected_and_normalized(tmp_path):
    ds = DataSet(tmp_path, False)
    for k in KEYS:  # int16 factors, stored big-endian: the conversion and the selection in one pass
        ds.factors[k] = (np.arange(ROWS * COLS).reshape(ROWS, COLS) % 97 - 40).astype(">i2")
        np.save(tmp_path / "factor" / f"{k}.npy", ds.factors[k])
    options = {"features": [3, 1, 1], "normalize": ([1, 2, 3], [4, 5, 6]), "nan": 0.0}
    for mode in ("mmap", "read", "arrays"):
        src = ds.open(mode, **options)
        x, _ = src.get(np.arange(len(src)))
        _assert_matches(x, ds.expected(**options)[0], True)


def test_pad_rows_stay_zeros(tmp_path):
    ds = DataSet(tmp_path, False)
    index = [(1, 0, "a"), (ROWS + 1, ROWS + 3, "b")]  # a window before row 0, one past the end; a label past it
    src = npyfeed.WindowSource.from_arrays(index, ds.factors, ds.labels, WINDOW, bounds="pad", features=[0, 2],
                                           label_columns=[1], nan=0.0, normalize=([1.0, 1.0], [2.0, 2.0]))
    x, y = src.get([0, 1])
    assert (x[0, :2] == 0).all() and (x[1, 2:] == 0).all() and (y[1] == 0).all()
    want = (_replace(ds.factors["a"][:2][:, [0, 2]], 0.0, None, None) - np.float32(1)) / np.float32(2)
    np.testing.assert_allclose(x[0, 2:], want, rtol=1e-6)


WIDE = 333  # windows of 5,328 bytes as float32: written past the caches from 4 KiB on


def _sparsely_poisoned(rng, shape, dtype) -> np.ndarray:
    """Normal values; NaN, +inf and -inf in every fifth row only (blocks with and without one)."""
    a = rng.standard_normal(shape).astype(dtype) * 3 + 1
    for r in range(1, shape[0], 5):
        a[r, r % 7::9] = np.nan
        a[r, r % 5::13] = np.inf
        a[r, r % 3::17] = -np.inf
    return a


@pytest.mark.parametrize("source", ["float32", "float64"])
@pytest.mark.parametrize("streaming, prefetch", [("1", "1"), ("1", "0"), ("0", "1")])
def test_options_written_past_the_caches_match_numpy(tmp_path, source, streaming, prefetch, monkeypatch):
    """Replaced and normalised windows written with streaming stores (NPYFEED_STREAMING=1; by default from
    16 MiB a batch) or through the caches (=0): numpy's values, in every mode, output dtype and order."""
    monkeypatch.setenv("NPYFEED_STREAMING", streaming)
    monkeypatch.setenv("NPYFEED_PREFETCH", prefetch)  # the source read once fetched ahead (=1) or not
    ds = DataSet(tmp_path, False, factor_shape=(ROWS, WIDE), dtype=source)
    rng = np.random.default_rng(7)
    for k in KEYS:
        ds.factors[k] = _sparsely_poisoned(rng, (ROWS, WIDE), source)
        np.save(tmp_path / "factor" / f"{k}.npy", ds.factors[k])
        np.savez(tmp_path / "factor_npz" / f"{k}.npz", x=ds.factors[k])
    mean = np.linspace(-1.0, 2.0, WIDE)
    std = np.linspace(0.5, 3.0, WIDE)
    cases = [{"nan": 0.0, "posinf": 1e6, "neginf": -1e6}, {"nan": -7.5}, {"normalize": (mean, std)},
             {"nan": 0.0, "posinf": 9.0, "neginf": -9.0, "normalize": (mean, std)},
             {"nan": 1.0, "normalize": (mean, std), "dtype": "float64"},
             {"features": slice(None, None, 3), "nan": 0.0, "normalize": (mean[::3], std[::3])}]
    for options in cases:
        want_x, want_y = ds.expected(**options)
        for mode in MODES:
            src = ds.open(mode, **options)
            x, y = src.get(np.arange(len(src)))
            _assert_matches(x, want_x, "normalize" in options)
            _assert_matches(y, want_y, False)
            # Overlapping windows of a key one after another (sorted), and shuffled.
            for shuffle in (False, True):
                order = src.epoch_order(shuffle=shuffle, seed=5)
                got = list(src.batches(7, shuffle=shuffle, seed=5))
                _assert_matches(np.concatenate([b[0] for b in got]), want_x[order], "normalize" in options)


def _bytes_read() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs /proc/self/io")
def test_fortran_files_read_only_the_selected_columns(tmp_path):
    rows, cols = 4000, 64
    rng = np.random.default_rng(1)
    (tmp_path / "f").mkdir()
    (tmp_path / "l").mkdir()
    factor = rng.standard_normal((rows, cols)).astype(np.float32)
    np.save(tmp_path / "f" / "a.npy", np.asfortranarray(factor))
    np.save(tmp_path / "l" / "a.npy", np.zeros(rows))
    (tmp_path / "index.txt").write_text("".join(f"{i},{i},a\n" for i in range(99, rows, 37)))
    read = {}
    for name, features in (("all", None), ("two", [7, 40])):
        src = npyfeed.WindowSource(tmp_path / "index.txt", tmp_path / "f", tmp_path / "l", 100, mode="read",
                                   threads=1, features=features)
        before = _bytes_read()
        x, _ = src.get(np.arange(len(src)))
        read[name] = _bytes_read() - before
        ends = np.arange(99, rows, 37)
        want = np.stack([factor[e - 99:e + 1] for e in ends])
        np.testing.assert_array_equal(x, want if features is None else want[:, :, features])
    assert read["two"] * 8 < read["all"], read


# Construction errors: (options, exception, text the message must hold).
ERRORS = {
    "feature-out-of-range": ({"features": [0, 6]}, ValueError, "features: column 6"),
    "feature-negative-out-of-range": ({"features": [-7]}, ValueError, "features: column -7"),
    "label-column-out-of-range": ({"label_columns": [3]}, ValueError, "label_columns: column 3"),
    "features-empty": ({"features": []}, ValueError, "features: selects no columns"),
    "features-empty-slice": ({"features": slice(6, None)}, ValueError, "features: slice(6, None, None)"),
    "features-zero-step": ({"features": slice(None, None, 0)}, ValueError, "features: slice step cannot be zero"),
    "features-string": ({"features": "012"}, TypeError, "features must be a sequence of integers or a slice"),
    "features-floats": ({"features": [1.0, 2.0]}, TypeError, "features must be a sequence of integers"),
    "features-bools": ({"features": [True]}, TypeError, "features must be a sequence of integers"),
    "features-int": ({"features": 3}, TypeError, "features must be a sequence of integers or a slice, got 3"),
    "features-float-array": ({"features": np.array([1.0])}, TypeError, "features must be a sequence of integers"),
    "features-slice-floats": ({"features": slice(0.5, 3)}, TypeError, "features: slice bounds must be integers"),
    "label-columns-type": ({"label_columns": {1: 2}}, TypeError, "label_columns must be a sequence of integers"),
    "nan-type": ({"nan": "0"}, TypeError, "nan must be a float or None, got '0'"),
    "posinf-type": ({"posinf": True}, TypeError, "posinf must be a float or None, got True"),
    "normalize-not-pair": ({"normalize": MEAN}, TypeError, "normalize must be a (mean, std) pair"),
    "normalize-triple": ({"normalize": (MEAN, STD, STD)}, TypeError, "normalize must be a (mean, std) pair"),
    "mean-shape": ({"normalize": (MEAN[:5], STD)}, ValueError, "normalize: mean of shape (5,) does not broadcast"),
    "std-shape": ({"normalize": (MEAN, np.ones((2, 6)))}, ValueError, "normalize: std of shape (2, 6)"),
    "std-shape-after-selection": ({"features": [0, 1], "normalize": (MEAN, STD)}, ValueError,
                                  "mean of shape (6,) does not broadcast to the rows of shape (2,)"),
    "mean-dtype": ({"normalize": (["a"] * 6, STD)}, ValueError, "normalize: mean has dtype <U1"),
    "std-dtype-complex": ({"normalize": (MEAN, STD + 1j)}, ValueError, "normalize: std has dtype complex128"),
    "std-zero": ({"normalize": (MEAN, np.where(np.arange(6) == 4, 0.0, 1.0))}, ValueError,
                 "normalize: std[4] is 0.0 (the std must be positive and finite"),
    "std-negative": ({"normalize": (MEAN, -STD)}, ValueError, "normalize: std[0] is -2.0"),
    "std-nan": ({"normalize": (MEAN, np.full(6, np.nan))}, ValueError, "normalize: std[0] is nan"),
    "std-inf": ({"normalize": (MEAN, np.full(6, np.inf))}, ValueError, "normalize: std[0] is inf"),
    "std-zero-as-float32": ({"normalize": (MEAN, np.full(6, 1e-50))}, ValueError, "std[0] is 1e-50"),
    "mean-nan": ({"normalize": (np.full(6, np.nan), STD)}, ValueError, "normalize: mean[0] is nan"),
}


@pytest.mark.parametrize("mode", ["mmap", "arrays"])
@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_options_fail_at_construction(dataset, mode, case):
    options, error, text = ERRORS[case]
    with pytest.raises(error) as info:
        dataset.open(mode, **options)
    assert text in str(info.value)


def test_tiny_std_is_fine_in_float64(dataset):
    options = {"normalize": (0.0, 1e-50), "dtype": "float64", "nan": 0.0, "posinf": 0.0, "neginf": 0.0}
    src = dataset.open("arrays", **options)
    x, _ = src.get(np.arange(len(src)))
    _assert_matches(x, dataset.expected(**options)[0], True)


def test_docstring_examples_run():
    import doctest

    import npyfeed.windows

    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
    for obj in (npyfeed.windows.WindowSource, npyfeed.windows.WindowSource.from_arrays,
                npyfeed.windows.WindowSource.dense):
        for test in finder.find(obj, globs={"np": np, "WindowSource": npyfeed.WindowSource}):
            runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.attempted > 0 and results.failed == 0
