"""``WindowSource.dense``: every window of every key, no index file, against numpy slicing.

The reference for sample ``j`` of key ``k`` is ``factor[k][i - W + 1 : i + 1]`` and ``label[k][i + horizon]`` with
``i = W - 1 + j * stride``, keys sorted by name (or as given), windows whose label row is past the end left out.
Covered: strides and horizons, keys of different lengths (and one too short for any window), label files shorter
than factor files, every read mode and ``.npz`` sources, the gather options, ``batches`` (plain, shuffled, shards,
``shuffle="blocks"``) and ``npyfeed.tf.dataset``, ``describe``, and the construction errors.
"""

from __future__ import annotations

import os

import npyfeed
import numpy as np
import pytest

LENGTHS = {"b": 23, "a": 40, "c": 3, "d": 31}  # "c" holds no window of 4 rows
LABEL_LENGTHS = {"b": 23, "a": 37, "c": 3, "d": 31}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("dense")
    rng = np.random.default_rng(5)
    factors, labels = {}, {}
    for sub in ("factor", "label", "factor_npz", "label_npz"):
        (root / sub).mkdir()
    for k, n in LENGTHS.items():
        factors[k] = rng.standard_normal((n, 5)).astype(np.float32)
        factors[k][rng.integers(0, n), 2] = np.nan
        labels[k] = rng.standard_normal((LABEL_LENGTHS[k], 2))
        np.save(root / "factor" / f"{k}.npy", factors[k])
        np.save(root / "label" / f"{k}.npy", labels[k])
        np.savez(root / "factor_npz" / f"{k}.npz", factors[k])
        np.savez(root / "label_npz" / f"{k}.npz", labels[k])
    np.save(root / "factor" / "unlabelled.npy", factors["a"])  # no label file: not a key
    (root / "factor" / "notes.txt").write_text("not an array")
    return root, factors, labels


def expected(factors, labels, window, stride, horizon, keys=None):
    xs, ys, where = [], [], []
    for k in keys or sorted(LENGTHS):
        f, l = factors[k], labels[k]
        for i in range(window - 1, len(f), stride):
            if i + horizon >= len(l):
                break
            xs.append(f[i - window + 1:i + 1].astype(np.float32))
            ys.append(l[i + horizon].astype(np.float32))
            where.append((k, i))
    return np.stack(xs), np.stack(ys), where


@pytest.mark.parametrize("mode", ["mmap", "read", "direct", "npz"])
@pytest.mark.parametrize("window,stride,horizon", [(4, 1, 0), (4, 3, 2), (1, 5, 0), (10, 2, 7)])
def test_dense_matches_numpy(data, mode, window, stride, horizon):
    root, factors, labels = data
    sub = "_npz" if mode == "npz" else ""
    src = npyfeed.WindowSource.dense(root / f"factor{sub}", root / f"label{sub}", window, stride=stride,
                                     horizon=horizon, mode="read" if mode == "npz" else mode, threads=2)
    want_x, want_y, where = expected(factors, labels, window, stride, horizon)
    assert src.keys == sorted(LENGTHS)
    assert len(src) == len(want_x)
    x, y = src.get(np.arange(len(src)))
    np.testing.assert_array_equal(x, want_x, strict=True)
    np.testing.assert_array_equal(y, want_y, strict=True)
    k, i = where[-1]
    assert src.describe(len(src) - 1).startswith(f"dense sample {len(src) - 1}: key '{k}', window rows "
                                                 f"[{i - window + 1}, {i + 1}) of ")
    assert f"label row {i + horizon} of " in src.describe(len(src) - 1)


def test_dense_keys_given_and_options(data):
    root, factors, labels = data
    keys = ["d", "a"]
    options = {"features": [4, 0], "label_columns": [1], "nan": -1.0, "normalize": ([1.0, 2.0], [2.0, 4.0])}
    src = npyfeed.WindowSource.dense(root / "factor", root / "label", 5, stride=2, horizon=1, keys=keys, **options)
    want_x, want_y, _ = expected(factors, labels, 5, 2, 1, keys)
    want_x = (np.where(np.isnan(want_x), np.float32(-1), want_x)[:, :, [4, 0]] - np.float32([1, 2])) / np.float32([2, 4])
    assert src.keys == keys and src.x_shape == (5, 2) and src.y_shape == (1,)
    x, y = src.get(np.arange(len(src)))
    np.testing.assert_allclose(x, want_x, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(y, want_y[:, [1]])


@pytest.mark.parametrize("shuffle", [False, True, "blocks"])
def test_dense_batches_and_shards(data, shuffle):
    root, factors, labels = data
    src = npyfeed.WindowSource.dense(root / "factor", root / "label", 4, stride=2, horizon=1, threads=2)
    want_x, want_y, _ = expected(factors, labels, 4, 2, 1)
    budget = 2 * 40 * 5 * 4  # blocks of about one key
    seen = []
    for shard in range(2):
        order = src.epoch_order(shuffle=shuffle, seed=9, num_shards=2, shard_index=shard, memory_budget=budget)
        got = list(src.batches(3, shuffle=shuffle, seed=9, num_shards=2, shard_index=shard, memory_budget=budget))
        x = np.concatenate([b[0] for b in got])
        y = np.concatenate([b[1] for b in got])
        np.testing.assert_array_equal(x, want_x[order])
        np.testing.assert_array_equal(y, want_y[order])
        seen += order.tolist()
    assert sorted(seen) == list(range(len(src)))  # shards disjoint, together the epoch


def test_dense_tf_dataset(data):
    tf = pytest.importorskip("tensorflow")
    import npyfeed.tf

    root, factors, labels = data
    src = npyfeed.WindowSource.dense(root / "factor", root / "label", 4, features=slice(0, 3))
    ds = npyfeed.tf.dataset(src, 4, drop_remainder=True)
    assert tuple(ds.element_spec[0].shape) == (4, 4, 3)
    assert ds.element_spec[0].dtype == tf.float32
    want_x, _, _ = expected(factors, labels, 4, 1, 0)
    x = np.concatenate([b[0] for b in ds.as_numpy_iterator()])
    np.testing.assert_array_equal(x, want_x[:len(x), :, :3])


ERRORS = {
    "stride-zero": ({"stride": 0}, ValueError, "stride must be at least 1, got 0"),
    "horizon-negative": ({"horizon": -1}, ValueError, "horizon must be at least 0, got -1"),
    "stride-float": ({"stride": 1.5}, TypeError, "stride must be an integer, got 1.5"),
    "horizon-bool": ({"horizon": True}, TypeError, "horizon must be an integer, got True"),
    "keys-string": ({"keys": "a"}, TypeError, "keys must be a sequence of key names"),
    "keys-int": ({"keys": ["a", 3]}, TypeError, "keys must be strings, got 3"),
    "keys-path": ({"keys": ["../a"]}, ValueError, "keys: '../a' cannot name a file"),
    "keys-twice": ({"keys": ["a", "a"]}, ValueError, "keys: 'a' is given twice"),
    "keys-missing": ({"keys": ["a", "zz"]}, FileNotFoundError, "zz"),
    "no-window-fits": ({"keys": ["c"]}, ValueError, "no window of 4 rows"),
    "horizon-too-far": ({"horizon": 100}, ValueError, "horizon 100"),
    "feature-out-of-range": ({"features": [5]}, ValueError, "features: column 5"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_dense_bad_arguments(data, case):
    root, _, _ = data
    options, error, text = ERRORS[case]
    with pytest.raises(error) as info:
        npyfeed.WindowSource.dense(root / "factor", root / "label", 4, **options)
    assert text in str(info.value)


def test_dense_no_key(tmp_path):
    (tmp_path / "f").mkdir()
    (tmp_path / "l").mkdir()
    np.save(tmp_path / "f" / "a.npy", np.zeros((10, 2)))
    with pytest.raises(ValueError, match="no key has a factor file"):
        npyfeed.WindowSource.dense(tmp_path / "f", tmp_path / "l", 4)


def test_a_file_name_that_is_not_utf8_is_named(tmp_path):
    """A key is UTF-8 text: a file whose name is not (a GBK name, listed with surrogate escapes) is a ValueError
    naming it, not a TypeError from the binding; keys= can leave it out."""
    gbk = os.fsdecode("中国".encode("gbk"))
    for folder in ("f", "l"):
        (tmp_path / folder).mkdir()
        for key in ("ok", gbk):
            np.save(tmp_path / folder / f"{key}.npy", np.arange(40.0).reshape(20, 2))
    with pytest.raises(ValueError, match="the file name is not UTF-8 text, and keys are"):
        npyfeed.WindowSource.dense(tmp_path / "f", tmp_path / "l", 4)
    assert npyfeed.WindowSource.dense(tmp_path / "f", tmp_path / "l", 4, keys=["ok"]).keys == ["ok"]
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        npyfeed.WindowSource.dense(tmp_path / "f", tmp_path / "l", 4, keys=["ok", gbk])
