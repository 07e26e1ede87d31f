"""npyfeed.tf.dataset(gather="device") on the CPU device (what CI has): the arrays uploaded once, each step's host
part only start rows (the host never gathers a window), and batches equal to the numpy iterator's (the oracle) for
every order, shard policy, bounds policy that keeps samples, source dtype and storage dtype; checkpoints resume; a
dropped dataset lets its device tensors go; bad arguments fail at construction. The figures on a GPU come from
bench/bench_gpu.py."""

from __future__ import annotations

import gc
import importlib.util
import weakref

import npyfeed
import numpy as np
import pytest

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow is not installed", allow_module_level=True)

WINDOW = 5
BATCH = 8
BUDGET = 2000  # shuffle="blocks": blocks of a key or two


@pytest.fixture(scope="module")
def tf():
    tf = pytest.importorskip("tensorflow")
    import npyfeed.tf  # noqa: F401

    return tf


def _inputs(bounds="error", dtype="<f4", keys="abcde"):
    """(index, factors, labels): keys of 30-50 rows of 3 features and 2 labels."""
    rng = np.random.default_rng(7)
    factors = {k: (rng.standard_normal((30 + 5 * i, 3)) * 10).astype(dtype) for i, k in enumerate(keys)}
    labels = {k: rng.standard_normal((len(v), 2)).astype(dtype) for k, v in factors.items()}
    if bounds == "error":
        index = [(int(f), int(f), k) for k, v in factors.items() for f in rng.integers(WINDOW - 1, len(v), 9)]
    else:  # windows and label rows past either end of their arrays
        index = [(int(f), int(lr), k) for k, v in factors.items()
                 for f, lr in zip(rng.integers(-3, len(v) + 4, 9), rng.integers(-2, len(v) + 2, 9))]
    return index, factors, labels


def _source(bounds="error", dtype="<f4", out="float32", keys="abcde"):
    return npyfeed.WindowSource.from_arrays(*_inputs(bounds, dtype, keys), WINDOW, dtype=out, bounds=bounds,
                                            cache=False)


def _pass(ds):
    return [(x.numpy(), y.numpy()) for x, y in ds]


def _assert_same(got, want, cast=None):
    assert len(got) == len(want)
    for (gx, gy), (wx, wy) in zip(got, want):
        if cast is not None:
            wx, wy = cast(wx), cast(wy)
        np.testing.assert_array_equal(gx, wx, strict=True)
        np.testing.assert_array_equal(gy, wy, strict=True)


@pytest.mark.parametrize("shuffle", [False, True, "blocks"], ids=["in_order", "shuffled", "blocks"])
@pytest.mark.parametrize("bounds", ["skip", "pad"])
def test_batches_equal_the_numpy_iterator(tf, shuffle, bounds):
    src = _source(bounds)
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=shuffle, seed=3, memory_budget=BUDGET, gather="device",
                            device="/cpu:0")
    for epoch in range(2):  # each pass the next epoch, as with gather="host"
        _assert_same(_pass(ds), list(src.batches(BATCH, shuffle=shuffle, seed=3, epoch=epoch, memory_budget=BUDGET)))


@pytest.mark.parametrize("dtype, out", [("<f2", "float32"), ("<f4", "float32"), ("<f8", "float64"), (">f8", "float32"),
                                        ("<i2", "float32")])
def test_source_dtypes(tf, dtype, out):
    src = _source("pad", dtype=dtype, out=out)
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=1, gather="device")
    _assert_same(_pass(ds), list(src.batches(BATCH, shuffle=True, seed=1)))


@pytest.mark.parametrize("storage", ["float16", "bfloat16"])
def test_storage_dtype_rounds_once_as_numpy(tf, storage):
    import ml_dtypes  # TensorFlow's own dependency

    src = _source("pad", dtype="<f8", out="float32")
    kind = np.float16 if storage == "float16" else ml_dtypes.bfloat16
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, gather="device", storage_dtype=storage)
    # The source's float64 values rounded to the storage type (numpy's astype), returned as float32.
    ref = _source("pad", dtype="<f8", out="float64")
    _assert_same(_pass(ds), list(ref.batches(BATCH, shuffle=True)), cast=lambda a: a.astype(kind).astype(np.float32))


def test_the_host_sends_start_rows_only(tf):
    src = _source("pad")
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, gather="device", drop_remainder=True)
    batches = _pass(ds)
    assert batches and all(x.shape == (BATCH, WINDOW, 3) for x, _ in batches)
    assert ds._npyfeed_batches.streams_started == 0  # the host gather never ran
    assert ds._npyfeed_device.host_bytes_per_step == 4 * 8 * BATCH  # four int64 per sample, no window
    host_bytes = BATCH * (WINDOW * 3 + 2) * 4
    assert ds._npyfeed_device.host_bytes_per_step < host_bytes


@pytest.mark.parametrize("shard_by", ["samples", "keys"])
def test_shards_cover_each_epoch_once(tf, shard_by):
    src = _source("error", keys="abcdefg")
    seen, sizes = [], []
    for i in range(3):
        context = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=i, num_replicas_in_sync=3)
        ds = npyfeed.tf.dataset(src, 3 * 4, shuffle=True, seed=2, gather="device", shard_by=shard_by,
                                input_context=context)
        got = _pass(ds)
        want = list(src.batches(4, shuffle=True, seed=2, num_shards=3, shard_index=i, shard_by=shard_by))
        _assert_same(got, want)
        ids = src.epoch_order(0, shuffle=True, seed=2, num_shards=3, shard_index=i, shard_by=shard_by)
        seen += ids.tolist()
        sizes.append(len(ids))
        if shard_by == "keys":  # each pipeline uploads its own keys only
            assert ds._npyfeed_device.factor_rows.sum() < sum(len(a) for a in src._arrays[0])
    assert sorted(seen) == list(range(len(src)))


def test_repeat_and_resume_from_a_checkpoint(tf, tmp_path):
    src = _source("pad")
    want = list(src.batches(BATCH, shuffle=True, seed=4, epoch=0)) + list(src.batches(BATCH, shuffle=True, seed=4,
                                                                                       epoch=1))
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=4, gather="device").repeat(2)
    _assert_same(_pass(ds), want)
    it = iter(npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=4, gather="device").repeat(2))
    for _ in range(len(want) // 2 + 1):  # past the epoch boundary
        next(it)
    tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt"))
    restored = iter(npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=4, gather="device").repeat(2))
    tf.train.Checkpoint(iterator=restored).read(str(tmp_path / "ckpt")).assert_consumed()
    _assert_same([(x.numpy(), y.numpy()) for x, y in restored], want[len(want) // 2 + 1:])


def test_a_dropped_dataset_lets_its_device_arrays_go(tf):
    src = _source("pad")
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, gather="device")
    _pass(ds)
    arrays = weakref.ref(ds._npyfeed_device)
    del ds
    gc.collect()
    assert arrays() is None


def test_bad_arguments_fail_at_construction(tf):
    src = _source("pad")
    with pytest.raises(ValueError, match="gather"):
        npyfeed.tf.dataset(src, BATCH, gather="gpu")
    with pytest.raises(ValueError, match="GPU"):
        npyfeed.tf.dataset(src, BATCH, gather="device", device="/gpu:7")
    with pytest.raises(ValueError, match=r"needs \d+ bytes .* over the device_memory_budget of 100 bytes.*shard_by"):
        npyfeed.tf.dataset(src, BATCH, gather="device", device_memory_budget=100)
    with pytest.raises(ValueError, match="storage_dtype"):
        npyfeed.tf.dataset(src, BATCH, gather="device", storage_dtype="int8")
    with pytest.raises(ValueError, match="gather='device' only"):
        npyfeed.tf.dataset(src, BATCH, storage_dtype="float16")
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=2)
    with pytest.raises(ValueError, match="one process per GPU"):
        npyfeed.tf.dataset(src, BATCH, gather="device", input_context=context)


def test_keras_fit(tf):
    src = _source("pad")
    model = tf.keras.Sequential([tf.keras.layers.Input((WINDOW, 3)), tf.keras.layers.Flatten(),
                                 tf.keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    history = model.fit(npyfeed.tf.dataset(src, BATCH, shuffle=True, gather="device"), epochs=2, verbose=0,
                        shuffle=False)
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()
