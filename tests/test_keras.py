"""npyfeed.keras.PyDataset: item i is batch i of the current epoch, equal to the numpy iterator's (``src.batches``,
the oracle) for every order kind and shard; epochs follow Keras' on_epoch_begin/on_epoch_end (and its extra
on_epoch_end before the first epoch); ``model.fit`` on the TensorFlow, JAX and PyTorch backends (each in a subprocess:
the backend is chosen when Keras is first imported) sees exactly those batches, and a resumed fit
(``initial_epoch=k`` over a dataset made with ``epoch=k``) the epochs an uninterrupted one would have read."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import textwrap
import warnings

import npyfeed
import numpy as np
import pytest


def _keras_major() -> int:
    try:
        return int(importlib.metadata.version("keras").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return 0


if _keras_major() < 3:
    pytest.skip("npyfeed.keras needs Keras 3 (this stack has " + (
        f"Keras {importlib.metadata.version('keras')}" if _keras_major() else "no Keras") + ")",
        allow_module_level=True)

import npyfeed.keras as nfk  # noqa: E402

KINDS = [False, True, "blocks"]
KIND_IDS = ["in_order", "shuffled", "blocks"]
BUDGET = 1500  # bytes: blocks of one or two keys


@pytest.fixture(scope="module")
def src():
    rng = np.random.default_rng(7)
    keys = "abcdef"
    factors = {k: rng.standard_normal((30, 3)).astype(np.float32) for k in keys}
    labels = {k: rng.standard_normal((30, 2)).astype(np.float32) for k in keys}
    index = [(int(f), int(l), k) for k in keys for f, l in zip(rng.integers(3, 30, 9), rng.integers(0, 30, 9))]
    return npyfeed.WindowSource.from_arrays(index[:53], factors, labels, 4)


def _expected(src, epoch, **kwargs):
    return list(src.batches(5, epoch=epoch, memory_budget=BUDGET, **kwargs))


def _keras_epoch(ds) -> list:
    """One epoch the way Keras' fit reads it: on_epoch_begin, items 0..len-1, on_epoch_end."""
    ds.on_epoch_begin()
    out = [ds[i] for i in range(len(ds))]
    ds.on_epoch_end()
    return out


def _assert_same(got, expected):
    assert len(got) == len(expected)
    for (x, y), (ex, ey) in zip(got, expected):
        np.testing.assert_array_equal(x, ex, strict=True)
        np.testing.assert_array_equal(y, ey, strict=True)


@pytest.mark.parametrize("shuffle", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("num_shards, shard_index", [(1, 0), (3, 2)], ids=["whole", "shard_2_of_3"])
@pytest.mark.parametrize("drop_remainder", [False, True], ids=["keep_remainder", "drop_remainder"])
def test_each_keras_epoch_is_the_next_epoch_of_the_numpy_iterator(src, shuffle, num_shards, shard_index,
                                                                  drop_remainder):
    kwargs = dict(shuffle=shuffle, seed=3, num_shards=num_shards, shard_index=shard_index,
                  drop_remainder=drop_remainder)
    ds = nfk.PyDataset(src, 5, epoch=4, memory_budget=BUDGET, **kwargs)
    assert isinstance(ds, __import__("keras").utils.PyDataset)
    assert len(ds) == src.num_batches(5, num_shards=num_shards, shard_index=shard_index, drop_remainder=drop_remainder)
    ds.on_epoch_end()  # Keras' EpochIterator.reset() before the first epoch: no epoch has begun, nothing moves
    assert ds.epoch == 4
    _ = ds[0], ds[1]  # the TensorFlow backend's spec probe, before the first epoch begins
    ds.on_epoch_begin()  # the JAX backend's model build: item 0 inside a begin/end pair
    _ = ds[0]
    ds.on_epoch_end()
    assert ds.epoch == 4
    for epoch in (4, 5, 6):
        _assert_same(_keras_epoch(ds), _expected(src, epoch, **kwargs))
    assert ds.epoch == 7
    if shuffle:
        assert not np.array_equal(_expected(src, 4, **kwargs)[0][0], _expected(src, 5, **kwargs)[0][0])


@pytest.mark.parametrize("shuffle", KINDS, ids=KIND_IDS)
def test_shards_together_cover_each_epoch_exactly_once(src, shuffle):
    for epoch in (0, 2):
        ids = []
        for shard in range(3):
            ds = nfk.PyDataset(src, 5, shuffle=shuffle, seed=1, epoch=epoch, num_shards=3, shard_index=shard,
                               memory_budget=BUDGET)
            ids += [ds.plan.ids(epoch, b) for b in range(len(ds))]
        np.testing.assert_array_equal(np.sort(np.concatenate(ids)), np.arange(len(src)))


def test_steps_per_epoch_shorter_than_an_epoch(src):
    ds = nfk.PyDataset(src, 5, shuffle=True, seed=2)  # 11 batches, Keras epochs of 4 steps: it carries on
    got = []
    for start in (0, 4, 8, 0, 4):
        ds.on_epoch_begin()
        got += [ds[i] for i in range(start, min(start + 4, len(ds)))]
        ds.on_epoch_end()
    _assert_same(got, _expected(src, 0, shuffle=True, seed=2) + _expected(src, 1, shuffle=True, seed=2)[:8])
    assert ds.epoch == 1


def test_set_epoch_and_plain_iteration(src):
    ds = nfk.PyDataset(src, 5, shuffle=True, seed=2)
    ds.set_epoch(9)
    _assert_same(list(ds), _expected(src, 9, shuffle=True, seed=2))  # keras.utils.PyDataset.__iter__
    assert "epoch 9" in repr(ds)


def test_stats_and_the_stats_callback(src, capsys):
    ds = nfk.PyDataset(src, 5, shuffle=True, seed=2)
    callback = nfk.StatsCallback(ds)
    for epoch in range(2):  # as fit calls them: the model's callbacks around the dataset's epoch
        callback.on_epoch_begin(epoch)
        got = _keras_epoch(ds)
        logs = {}
        callback.on_epoch_end(epoch, logs)
        assert callback.epochs[epoch]["batches"] == len(ds) == 11
        assert callback.epochs[epoch]["bytes"] == sum(x.nbytes + y.nbytes for x, y in got)
        assert logs["npyfeed_wait_fraction"] == callback.epochs[epoch]["wait_fraction"]
    assert ds.stats()["samples"] == 2 * 53 and ds.stats() == ds.plan.stats()
    assert capsys.readouterr().out.count("npyfeed, epoch") == 2


@pytest.mark.parametrize("shuffle", [False, True], ids=["in_order", "shuffled"])
def test_batches_out_of_order_are_right_and_warn_once(src, shuffle):
    ds = nfk.PyDataset(src, 5, shuffle=shuffle, seed=2)
    expected = _expected(src, 0, shuffle=shuffle, seed=2)
    order = np.random.default_rng(0).permutation(len(ds))  # what fit(shuffle=True) does to a PyDataset
    with pytest.warns(UserWarning, match="shuffle=False to model.fit") as record:
        got = [ds[int(i)] for i in order]
    assert len(record) == 1
    _assert_same(got, [expected[i] for i in order])


def test_blocks_out_of_order_is_refused(src):
    ds = nfk.PyDataset(src, 5, shuffle="blocks", memory_budget=BUDGET)
    ds[0]
    with pytest.raises(RuntimeError, match="shuffle=False to model.fit"):
        ds[3]


def test_workers_and_multiprocessing(src):
    with pytest.raises(ValueError, match="use_multiprocessing=True is not supported"):
        nfk.PyDataset(src, 5, use_multiprocessing=True)
    with pytest.raises(ValueError, match="workers=4"):
        nfk.PyDataset(src, 5, workers=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = nfk.PyDataset(src, 5, workers=1, max_queue_size=3)
    assert ds.workers == 1 and not ds.use_multiprocessing and ds.max_queue_size == 3


def test_bad_arguments_are_the_plans(src):
    with pytest.raises(ValueError, match="batch_size"):
        nfk.PyDataset(src, 0)
    with pytest.raises(ValueError, match="shuffle"):
        nfk.PyDataset(src, 5, shuffle="files")
    with pytest.raises(IndexError):
        nfk.PyDataset(src, 5)[11]


# model.fit in a fresh interpreter per backend. A Record layer (run_eagerly=True: concrete arrays) keeps every
# batch the model was called with; the oracle is src.batches of the same epochs. Then a resumed fit.
FIT = textwrap.dedent("""
    import os, sys
    import numpy as np
    import keras
    import npyfeed, npyfeed.keras
    assert keras.backend.backend() == os.environ["KERAS_BACKEND"], keras.backend.backend()

    rng = np.random.default_rng(5)
    factors = {k: rng.standard_normal((40, 3)).astype(np.float32) for k in "abc"}
    labels = {k: rng.standard_normal((40, 2)).astype(np.float32) for k in "abc"}
    index = [(int(r), int(r), k) for k in "abc" for r in rng.integers(3, 40, 15)]
    src = npyfeed.WindowSource.from_arrays(index, factors, labels, 4)
    KW = dict(shuffle=SHUFFLE, seed=11, memory_budget=2000)
    seen = []

    class Record(keras.layers.Layer):
        def call(self, x):
            try:  # a concrete batch (run_eagerly), not a symbolic build's KerasTensor or JAX tracer
                seen.append(np.array(x))
            except Exception:
                pass
            return x

    def model():
        m = keras.Sequential([keras.Input((4, 3)), Record(), keras.layers.Flatten(), keras.layers.Dense(2)])
        m.compile("sgd", "mse", run_eagerly=True)
        return m

    def check(epochs):
        want = [x for e in epochs for x, _ in src.batches(8, epoch=e, **KW)]
        assert len(seen) == len(want), (len(seen), len(want))
        for got, x in zip(seen, want):
            np.testing.assert_array_equal(got, x)
        seen.clear()

    ds = npyfeed.keras.PyDataset(src, 8, **KW)
    stats = npyfeed.keras.StatsCallback(ds, verbose=0)
    model().fit(ds, epochs=3, shuffle=False, verbose=0, callbacks=[stats])
    check([0, 1, 2])
    # Each epoch's batches (a backend may read a batch more around the first epoch: building the model).
    assert [len(ds) <= e["batches"] <= len(ds) + 2 for e in stats.epochs] == [True] * 3, stats.epochs
    ds = npyfeed.keras.PyDataset(src, 8, epoch=2, **KW)     # a restart after 2 epochs: epoch=initial_epoch
    model().fit(ds, epochs=4, initial_epoch=2, shuffle=False, verbose=0)
    check([2, 3])
    m = keras.Sequential([keras.Input((4, 3)), keras.layers.Flatten(), keras.layers.Dense(2)])
    m.compile("sgd", "mse")                                 # compiled (tf.function / jax.jit)
    history = m.fit(npyfeed.keras.PyDataset(src, 8, drop_remainder=True, **KW), epochs=2, shuffle=False, verbose=0)
    assert np.all(np.isfinite(history.history["loss"])), history.history
    print("OK")
""")


EXTRA = {"tensorflow": "tf", "jax": "keras", "torch": "torch"}  # the extra that installs each backend


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [True, "blocks"], ids=["shuffled", "blocks"])
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_model_fit_reads_the_epochs_and_resumes(backend, shuffle, tmp_path):
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed (pip install 'npyfeed[{EXTRA[backend]}]')")
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu",
               CUDA_VISIBLE_DEVICES="")
    code = FIT.replace("SHUFFLE", repr(shuffle))
    proc = subprocess.run([sys.executable, "-W", "error::UserWarning:npyfeed", "-c", code], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr[-4000:]
