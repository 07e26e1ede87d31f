"""npyfeed.tf.dataset(gather="device") on the CPU device (what CI has): the arrays uploaded once, each step's host
part only start rows (the host never gathers a window), and batches equal to the numpy iterator's (the oracle) for
every order, shard policy, bounds policy that keeps samples, source dtype and storage dtype; checkpoints resume
anywhere in an epoch; over the device budget, shuffle="blocks" streams each block once per epoch (same batches,
same resume); another device than the host's CPU (a second logical CPU, as a GPU would be fed: copy_to_device)
gives the same batches there; a dropped dataset lets its device tensors go; bad arguments fail at construction.
The figures on a GPU come from bench/bench_gpu.py."""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
import textwrap
import weakref

import npyfeed
import numpy as np
import pytest

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow is not installed", allow_module_level=True)

WINDOW = 5
BATCH = 8
BUDGET = 2000  # shuffle="blocks": blocks of a key or two


@pytest.fixture(scope="module", params=["native", "numpy_function"])
def tf(request):
    """TensorFlow, with npyfeed.tf on one path: the host half of each step by the op library's ops, or by
    ``tf.numpy_function`` (the fallback); every in-process test runs on both."""
    tf = pytest.importorskip("tensorflow")
    import npyfeed.tf  # noqa: F401
    import npyfeed.tf._feed

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NPYFEED_TF_OPS", "1" if request.param == "native" else "0")
        assert (npyfeed.tf._feed.native_ops() is not None) == (request.param == "native")
        yield tf


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


def _pipeline(ds):
    """What npyfeed keeps for a dataset it returned: its plan (``batches``), the arrays on the device (``device``)."""
    import npyfeed.tf._pipeline

    return npyfeed.tf._pipeline.pipeline_of(ds)


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


@pytest.mark.parametrize("gather", ["host", "device"])
def test_1d_files_give_scalar_rows(tf, gather):
    """1-d factor and label files ((T,)): x_shape (W,), y_shape (), batches (B, W) and (B,), as numpy slices."""
    rng = np.random.default_rng(11)
    factors = {k: rng.standard_normal(40).astype(np.float32) for k in ("k1", "k2")}
    labels = {k: rng.standard_normal(40).astype(np.float32) for k in factors}
    index = [(int(f), int(lr), k) for k in factors for f, lr in zip(range(WINDOW - 1, 40, 3), range(0, 40, 3))]
    src = npyfeed.WindowSource.from_arrays(index, factors, labels, WINDOW, cache=False)
    assert (src.x_shape, src.y_shape) == ((WINDOW,), ())
    ds = npyfeed.tf.dataset(src, BATCH, gather=gather, device="/cpu:0")
    assert [s.shape.as_list() for s in ds.element_spec] == [[None, WINDOW], [None]]
    got = _pass(ds)
    want_x = np.stack([factors[k][f - WINDOW + 1:f + 1] for f, _, k in index])
    want_y = np.array([labels[k][lr] for _, lr, k in index])
    np.testing.assert_array_equal(np.concatenate([x for x, _ in got]), want_x, strict=True)
    np.testing.assert_array_equal(np.concatenate([y for _, y in got]), want_y, strict=True)


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


def _hard_values(dtype) -> np.ndarray:
    """Values where rounding to float16 or bfloat16 is easy to get wrong: signed zeros, subnormals, ties to even
    (halfway values, and a float64 just past a bfloat16 tie that float32 rounds onto it), the edge of overflow,
    infinities, NaN; then random values over 24 orders of magnitude (integers: ties, overflow, every size)."""
    special = [0.0, -0.0, 1.0, -1.0, 2.0**-25, 3 * 2.0**-25, 5 * 2.0**-25, 2.0**-25 * 1.0000001, 6.097555160522461e-05,
               6.103515625e-05, 65504.0, 65519.99, 65520.0, -65520.0, 1e5, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-8,
               1 + 3 * 2.0**-8, 1 + 2.0**-8 + 2.0**-40, -(1 + 2.0**-8 + 2.0**-40), 3.3895313892515355e38, 3.4e38,
               1e-40, -1e-45, np.inf, -np.inf, np.nan]
    rng = np.random.default_rng(11)
    if np.dtype(dtype).kind == "i":  # ties and overflow among integers; then random ones of every size
        special = [0, 1, -1, 2049, 2051, 4097, 4099, 65504, 65519, 65520, 70000, 2**24 + 1, 2**31 - 1, -2**31]
        return np.concatenate([special, rng.integers(-2**31, 2**31, 2500), rng.integers(-70000, 70000, 2500)]
                              ).astype(dtype)
    values = np.concatenate([special, rng.standard_normal(5000) * 10.0 ** rng.uniform(-12, 12, 5000)])
    with np.errstate(over="ignore", under="ignore"):
        return values.astype(dtype)


@pytest.mark.parametrize("storage", ["float16", "bfloat16"])
@pytest.mark.parametrize("dtype", ["<f4", ">f8", "<f2", "<i4"])
def test_storage_dtype_rounds_hard_values_as_numpy(tf, storage, dtype):
    """Every item uploaded has the bits numpy's astype gives (ml_dtypes' for bfloat16): from float64 and float32
    data, and from float16 and integer data through float32, as the gather converts them."""
    import ml_dtypes  # TensorFlow's own dependency

    values = _hard_values(dtype)
    values = values[:len(values) // 6 * 6]
    factors = {"a": values[:len(values) // 2].reshape(-1, 3), "b": values[len(values) // 2:].reshape(-1, 3)}
    labels = {k: v[:, :2].copy() for k, v in factors.items()}
    index = [(f, f, k) for k, v in factors.items() for f in range(WINDOW - 1, len(v))]
    src = npyfeed.WindowSource.from_arrays(index, factors, labels, WINDOW, cache=False)
    ds = npyfeed.tf.dataset(src, BATCH, gather="device", storage_dtype=storage, device="/cpu:0")
    kind = np.float16 if storage == "float16" else ml_dtypes.bfloat16
    wide = np.float64 if np.dtype(dtype).kind == "f" and np.dtype(dtype).itemsize > 4 else np.float32
    for got, arrays in ((_pipeline(ds).device.factors, factors), (_pipeline(ds).device.labels, labels)):
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            want = np.concatenate([arrays["a"], arrays["b"]]).astype(wide).astype(kind)
        want = np.concatenate([want, np.zeros((1, want.shape[1]), kind)])
        got = got.numpy()
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_resident_upload_is_the_arrays_one_after_another(tf):
    """The upload: every key's array in the storage dtype (float64 data rounded once to float32, as numpy's
    astype), one after another in key order, then one zero row; read by the core through the source's readers."""
    src = _source("pad", dtype="<f8", out="float32")
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=2, gather="device")
    assert not _pipeline(ds).device.streams
    _assert_same(_pass(ds), list(src.batches(BATCH, shuffle=True, seed=2)))
    on_device = _pipeline(ds).device
    for got, arrays in ((on_device.factors, src._arrays[0]), (on_device.labels, src._arrays[1])):
        expected = np.concatenate([np.asarray(a, np.float64).reshape(len(a), -1) for a in arrays]).astype(np.float32)
        np.testing.assert_array_equal(got.numpy(), np.concatenate([expected, np.zeros((1, expected.shape[1]),
                                                                                      np.float32)]))


def _resident_bytes():
    """Bytes of this process's resident memory."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_the_device_holds_the_arrays_once(tf):
    """Memory held: the uploaded arrays once, not a second copy at construction (tf.constant kept two) nor at each
    iterator's start (tf.data's default rewrites copy captured tensors). Arrays of 48 MB, so that a copy stands
    far above the allocator's noise."""
    rng = np.random.default_rng(0)
    factors = {f"k{i}": rng.standard_normal((12000, 250)).astype(np.float32) for i in range(4)}
    labels = {k: np.zeros((12000, 1), np.float32) for k in factors}
    src = npyfeed.WindowSource.from_arrays([(f, f, k) for k in factors for f in range(4, 12000, 50)], factors,
                                           labels, WINDOW, cache=False)
    arrays = sum(a.nbytes for a in factors.values())
    gc.collect()
    before = _resident_bytes()
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, gather="device", device="/cpu:0")
    gc.collect()
    built = _resident_bytes()
    it = iter(ds)
    next(it)
    started = _resident_bytes()
    assert built - before < 1.3 * arrays, (built - before, arrays)
    assert started - built < 0.3 * arrays, (started - built, arrays)


def test_the_host_sends_start_rows_only(tf):
    src = _source("pad")
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, gather="device", drop_remainder=True)
    batches = _pass(ds)
    assert batches and all(x.shape == (BATCH, WINDOW, 3) for x, _ in batches)
    assert _pipeline(ds).batches.streams_started == 0  # the host gather never ran
    assert _pipeline(ds).device.host_bytes_per_step == 4 * 8 * BATCH  # four int64 per sample, no window
    host_bytes = BATCH * (WINDOW * 3 + 2) * 4
    assert _pipeline(ds).device.host_bytes_per_step < host_bytes


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
            every_key = sum(a.size + b.size for a, b in zip(*src._arrays)) * 4
            assert 0 < _pipeline(ds).device.uploaded_bytes < every_key / 2
    assert sorted(seen) == list(range(len(src)))


def _assert_resumes(tf, tmp_path, src, make, want, positions):
    """`make()`'s dataset repeated over two epochs yields `want`, and an iterator checkpointed at each of
    `positions` (in the first epoch, past its boundary) and restored over a new dataset yields the rest."""
    _assert_same(_pass(make().repeat(2)), want)
    for k in positions:
        it = iter(make().repeat(2))
        for _ in range(k):
            next(it)
        tf.train.Checkpoint(iterator=it).write(str(tmp_path / f"ckpt{k}"))
        restored = iter(make().repeat(2))
        tf.train.Checkpoint(iterator=restored).read(str(tmp_path / f"ckpt{k}")).assert_consumed()
        _assert_same([(x.numpy(), y.numpy()) for x, y in restored], want[k:])


def test_repeat_and_resume_from_a_checkpoint(tf, tmp_path):
    src = _source("pad")
    want = list(src.batches(BATCH, shuffle=True, seed=4, epoch=0)) + list(src.batches(BATCH, shuffle=True, seed=4,
                                                                                       epoch=1))
    half = len(want) // 2
    _assert_resumes(tf, tmp_path, src, lambda: npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=4, gather="device"),
                    want, [3, half + 1])


# -- over the device budget: shuffle="blocks" streams its blocks --------------------------------------------------
STREAM_KEYS, STREAM_ROWS = 12, 60
STREAM_BLOCKS = 6000  # memory_budget: blocks of up to 3000 bytes of data, two or three keys of 1200 bytes
STREAM_DEVICE = 12000  # device_memory_budget: under the 15,000 bytes every key would take, over two blocks


def _stream_source(bounds="skip", dtype="<f4", out="float32"):
    rng = np.random.default_rng(11)
    factors = {f"k{i:02d}": rng.standard_normal((STREAM_ROWS, 3)).astype(dtype) for i in range(STREAM_KEYS)}
    labels = {k: rng.standard_normal((STREAM_ROWS, 2)).astype(dtype) for k in factors}
    first = 0 if bounds == "pad" else WINDOW - 1
    index = [(f, f if bounds == "skip" else f + 2, k) for k in factors for f in range(first, STREAM_ROWS)]
    return npyfeed.WindowSource.from_arrays(index, factors, labels, WINDOW, bounds=bounds, dtype=out, cache=False)


def _streamed(src, device_memory_budget=STREAM_DEVICE, **kw):
    return npyfeed.tf.dataset(src, BATCH, shuffle="blocks", memory_budget=STREAM_BLOCKS, gather="device",
                              device_memory_budget=device_memory_budget, **kw)


@pytest.mark.parametrize("bounds", ["skip", "pad"])
def test_blocks_over_the_device_budget_stream_each_block_once_per_epoch(tf, bounds):
    src = _stream_source(bounds)
    ds = _streamed(src, seed=5)
    on_device = _pipeline(ds).device
    assert on_device.streams and on_device.needed_bytes <= STREAM_DEVICE
    data_bytes = STREAM_KEYS * STREAM_ROWS * (3 + 2) * 4
    for epoch in range(2):
        before = on_device.uploaded_bytes
        _assert_same(_pass(ds), list(src.batches(BATCH, shuffle="blocks", seed=5, epoch=epoch,
                                                 memory_budget=STREAM_BLOCKS)))
        table = on_device.groups(epoch)  # (first batch, end batch, first block, last block) per group
        blocks = int(table[-1, 3]) + 1
        straddlers = int((table[:, 2] != table[:, 3]).sum())
        assert blocks > 2 and straddlers < blocks
        # Every block once (and a zero row per group), plus the windows of the batches over two blocks.
        uploaded = on_device.uploaded_bytes - before
        straddler_bytes = straddlers * ((BATCH * WINDOW + 1) * 3 + (BATCH + 1) * 2) * 4
        assert data_bytes <= uploaded <= data_bytes + len(table) * 5 * 4 + straddler_bytes
        assert uploaded == npyfeed._core.testing.streamed_epoch_bytes(on_device.host_rows, epoch)  # counted without reading
    assert _pipeline(ds).batches.streams_started == 0  # the plan's host gather never ran
    assert on_device.host_bytes_per_step == 4 * 8 * BATCH  # per step, four int64 per sample
    # The plan's statistics: what was uploaded, and the samples of both epochs' batches formed on the device.
    assert ds.stats()["device_bytes"] == on_device.uploaded_bytes
    assert ds.stats()["samples"] == 2 * len(src)
    assert ds.stats()["batches"] == 2 * src.num_batches(BATCH)


def test_streamed_blocks_resume_from_a_checkpoint(tf, tmp_path):
    src = _stream_source("pad")
    want = [b for e in range(2) for b in src.batches(BATCH, shuffle="blocks", seed=6, epoch=e,
                                                     memory_budget=STREAM_BLOCKS)]
    half = len(want) // 2
    # In the first group, mid-epoch, at the boundary, past it: each restored iterator reads its block again.
    _assert_resumes(tf, tmp_path, src, lambda: _streamed(src, seed=6), want, [3, half // 2, half, half + 9])


@pytest.mark.parametrize("dtype", ["<f4", "<f8"])
def test_streamed_storage_dtype_rounds_once_as_numpy(tf, dtype):
    src = _stream_source("pad", dtype=dtype)
    ds = _streamed(src, seed=1, storage_dtype="float16", device_memory_budget=8000)  # the half that fits 12000
    assert _pipeline(ds).device.streams
    table = _pipeline(ds).device.groups(0)
    assert (table[:, 2] != table[:, 3]).any()  # batches over two blocks too
    # The source's values rounded to float16 once (from float64 too, as numpy's astype), returned as float32.
    ref = _stream_source("pad", dtype=dtype, out="float64")
    _assert_same(_pass(ds), list(ref.batches(BATCH, shuffle="blocks", seed=1, memory_budget=STREAM_BLOCKS)),
                 cast=lambda a: a.astype(np.float16).astype(np.float32))


SHORT_BATCH = 11  # no divisor of the stream sources' 672 or 720 samples: each epoch ends with a short batch


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_streamed_groups_hand_over_where_their_batches_end(tf, drop_remainder):
    """Each group says where its batches end in its start rows (`DeviceRows.group`'s last array, the core's batch
    sizes): SHORT_BATCH samples each, but for an epoch's last (kept unless drop_remainder). The batches cut there,
    on the op library and on the fallback, equal the numpy iterator's, the short last one included."""
    src = _stream_source("pad")
    n = len(src)
    assert n % SHORT_BATCH
    ds = npyfeed.tf.dataset(src, SHORT_BATCH, shuffle="blocks", memory_budget=STREAM_BLOCKS, gather="device",
                            device_memory_budget=STREAM_DEVICE, seed=3, drop_remainder=drop_remainder)
    host_rows = _pipeline(ds).device.host_rows
    assert _pipeline(ds).device.streams
    # Batch b of an epoch holds the samples [b * B, (b + 1) * B) of its order, as many of them as there are.
    num_batches = n // SHORT_BATCH if drop_remainder else -(-n // SHORT_BATCH)
    sizes = np.minimum(SHORT_BATCH, n - SHORT_BATCH * np.arange(num_batches))
    assert (sizes[-1] == SHORT_BATCH) == drop_remainder
    for epoch in range(2):
        table = host_rows.groups(epoch)
        assert table[0, 0] == 0 and table[-1, 1] == num_batches and (table[1:, 0] == table[:-1, 1]).all()
        assert (table[:, 2] != table[:, 3]).any() and (table[:, 1] - table[:, 0] > 1).any()
        for g, (first, end, _, _) in enumerate(table):
            _, _, start, lo, hi, label, ends = host_rows.group(epoch, g)
            assert ends.dtype == np.int64
            np.testing.assert_array_equal(ends, np.cumsum(sizes[first:end]))
            assert ends[0] > 0 and (np.diff(ends) > 0).all()
            assert ends[-1] == len(start) == len(lo) == len(hi) == len(label)
        got = _pass(ds)
        assert [len(x) for x, _ in got] == sizes.tolist()
        _assert_same(got, list(src.batches(SHORT_BATCH, shuffle="blocks", seed=3, epoch=epoch,
                                           memory_budget=STREAM_BLOCKS, drop_remainder=drop_remainder)))


def test_over_the_device_budget_other_orders_and_small_budgets_are_refused(tf):
    src = _stream_source("skip")
    for shuffle in (False, True):
        with pytest.raises(ValueError, match=r"needs \d+ bytes .* over the device_memory_budget of 12000 bytes; use "
                                             r"shuffle='blocks'.*shard_by='keys'.*storage_dtype"):
            npyfeed.tf.dataset(src, BATCH, shuffle=shuffle, gather="device", device_memory_budget=STREAM_DEVICE)
    with pytest.raises(ValueError, match=r"holds 2 blocks of up to \d+ bytes.*over the device_memory_budget of "
                                         r"4000 bytes; use a smaller memory_budget"):
        npyfeed.tf.dataset(src, BATCH, shuffle="blocks", memory_budget=STREAM_BLOCKS, gather="device",
                           device_memory_budget=4000)


def test_in_a_graph_large_arrays_stream_or_are_refused(tf, monkeypatch):
    """tf.compat.v1 / tf.estimator: resident arrays would be graph constants (2 GB protocol buffer limit): past
    GRAPH_CONSTANT_BYTES, shuffle="blocks" streams (same batches in a Session) and other orders are refused."""
    import npyfeed.tf._device

    monkeypatch.setattr(npyfeed.tf._device, "GRAPH_CONSTANT_BYTES", 5000)
    src = _stream_source("pad")
    graph = tf.Graph()
    with graph.as_default():
        ds = npyfeed.tf.dataset(src, BATCH, shuffle="blocks", memory_budget=STREAM_BLOCKS, seed=8, gather="device")
        assert _pipeline(ds).device.streams
        x, y = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        with tf.compat.v1.Session() as session:
            got = [tuple(session.run([x, y])) for _ in range(len(_pipeline(ds).batches))]
        with pytest.raises(ValueError, match=r"in a graph .* graph constants, at most 5000 bytes.*shuffle='blocks'"):
            npyfeed.tf.dataset(src, BATCH, shuffle=True, gather="device")
    _assert_same(got, list(src.batches(BATCH, shuffle="blocks", memory_budget=STREAM_BLOCKS, seed=8)))


def test_streamed_file_replaced_after_construction_names_it(tf, tmp_path):
    from npyfeed._layout import index_text, write_index, write_key

    rng = np.random.default_rng(3)
    rows = {}
    for i in range(STREAM_KEYS):
        key = f"k{i:02d}"
        write_key(tmp_path, key, rng.standard_normal((STREAM_ROWS, 3)).astype("<f4"),
                  rng.standard_normal((STREAM_ROWS, 2)).astype("<f4"))
        rows[key] = range(WINDOW - 1, STREAM_ROWS)
    lines = [(f, f, k) for k, r in rows.items() for f in r]
    index = write_index(tmp_path / "index.txt", index_text(lines))
    src = npyfeed.WindowSource([index], tmp_path / "factor", tmp_path / "label", WINDOW, cache=False)
    ds = _streamed(src, seed=2)
    assert _pipeline(ds).device.streams
    victim = tmp_path / "factor" / "k07.npy"
    it = iter(ds)
    next(it)  # past the epoch's start: the change is found by the read of a block, as shuffle="blocks" reads it
    np.save(victim, np.zeros((STREAM_ROWS - 9, 3), "<f4"))  # written over with an array of another shape
    with pytest.raises(tf.errors.OpError, match=r"changed since it was opened \(truncated: .*k07\.npy"):
        for _ in it:
            pass


@pytest.mark.parametrize("mode", ["mmap", "read", "direct"])
def test_resident_upload_refuses_a_file_changed_since_the_source_opened_it(tf, tmp_path, mode):
    """The upload reads through the source's own readers, after checking the files it opened: a file renamed
    over after the source opened it, by an array of the same shape, is refused, naming it (as the host's next
    epoch refuses it); never uploaded in place of the one the source opened."""
    from npyfeed._layout import index_text, write_index, write_key

    rng = np.random.default_rng(4)
    for i in range(6):
        write_key(tmp_path, f"k{i}", rng.standard_normal((40, 3)).astype("<f4"),
                  rng.standard_normal((40, 2)).astype("<f4"))
    index = write_index(tmp_path / "index.txt", index_text([(f, f, f"k{i}") for i in range(6)
                                                            for f in range(WINDOW - 1, 40)]))
    src = npyfeed.WindowSource([index], tmp_path / "factor", tmp_path / "label", WINDOW, mode=mode, cache=False)
    for kind in ("factor", "label"):
        victim = tmp_path / kind / "k2.npy"
        np.save(tmp_path / "new.npy", np.full(np.load(victim).shape, 7, "<f4"))
        os.replace(tmp_path / "new.npy", victim)
    with pytest.raises(npyfeed.FileChangedError, match="replaced by another file") as info:
        npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=1, gather="device", device="/cpu:0")
    assert info.value.filename == str(tmp_path / "factor" / "k2.npy")
    assert "2 files of this source changed in all" in str(info.value)
    with pytest.raises(npyfeed.FileChangedError):
        src.batches(BATCH, shuffle=True, seed=1)


@pytest.mark.parametrize("compress", [False, True], ids=["stored", "deflated"])
@pytest.mark.parametrize("streamed", [False, True], ids=["resident", "streamed"])
def test_npz_sources(tf, tmp_path, compress, streamed):
    """Arrays that are members of `.npz` archives are uploaded from where the source holds them (stored: a
    mapping of the archive; deflated: inflated at open), resident and streamed by blocks."""
    rng = np.random.default_rng(12)
    save = np.savez_compressed if compress else np.savez
    for kind in ("factor", "label"):
        (tmp_path / kind).mkdir()
    keys = [f"k{i}" for i in range(STREAM_KEYS)]
    for k in keys:
        save(tmp_path / "factor" / f"{k}.npz", rng.standard_normal((STREAM_ROWS, 3)).astype("<f4"))
        save(tmp_path / "label" / f"{k}.npz", rng.standard_normal((STREAM_ROWS, 2)).astype("<f4"))
    (tmp_path / "index.txt").write_text("".join(f"{f},{f},{k}\n" for k in keys for f in range(WINDOW - 1, STREAM_ROWS)))
    src = npyfeed.WindowSource([tmp_path / "index.txt"], tmp_path / "factor", tmp_path / "label", WINDOW, cache=False)
    assert all(f.endswith(".npz") for f in src.files)
    if streamed:
        ds = _streamed(src, seed=4)
        want = list(src.batches(BATCH, shuffle="blocks", seed=4, memory_budget=STREAM_BLOCKS))
    else:
        ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=4, gather="device", device="/cpu:0")
        want = list(src.batches(BATCH, shuffle=True, seed=4))
    assert _pipeline(ds).device.streams == streamed
    _assert_same(_pass(ds), want)


def _run_with_two_cpus(tmp_path, body: str) -> str:
    """Runs `body` in a new Python with two logical CPUs (set before TensorFlow starts) and this folder's test
    helpers importable; its stdout."""
    script = tmp_path / "two_cpus.py"
    script.write_text("import sys\nimport numpy as np\nimport tensorflow as tf\n"
                      "cpu = tf.config.list_physical_devices('CPU')[0]\n"
                      "tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)\n"
                      f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n" + textwrap.dedent(body))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_mirrored_strategy_per_replica_pipelines_each_on_its_device(tmp_path):
    """MirroredStrategy over two devices in one process: with PER_REPLICA input, each replica's pipeline reads its
    shard and forms its batches on its own device; the default (one pipeline for both) is refused, saying so."""
    out = _run_with_two_cpus(tmp_path, """
        import npyfeed, npyfeed.tf
        from test_tf_device import BATCH, _assert_same, _stream_source
        src = _stream_source("pad")
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        make = lambda ctx: npyfeed.tf.dataset(src, 2 * BATCH, shuffle=True, seed=3, gather="device",
                                              input_context=ctx)
        try:
            strategy.distribute_datasets_from_function(make)
        except ValueError as e:
            print("refused" if "PER_REPLICA" in str(e) else e)
        options = tf.distribute.InputOptions(
            experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
            experimental_place_dataset_on_device=True, experimental_fetch_to_device=False)
        per_replica = [[], []]
        for x, y in strategy.distribute_datasets_from_function(make, options):
            for i in range(2):
                assert x.values[i].device.endswith(f"CPU:{i}"), x.values[i].device
                per_replica[i].append((x.values[i].numpy(), y.values[i].numpy()))
        for i in range(2):
            _assert_same(per_replica[i], list(src.batches(BATCH, shuffle=True, seed=3, num_shards=2, shard_index=i)))
        print("per replica", *map(len, per_replica))
    """)
    shard = len(_stream_source("pad")) // 2  # an even count: two equal shards
    n = (shard + BATCH - 1) // BATCH
    assert out.split() == ["refused", "per", "replica", str(n), str(n)]


def test_another_device_than_the_host_gets_its_batches_there(tmp_path):
    """A second logical CPU stands for a GPU: the start rows (and, streamed, the groups) go there by
    copy_to_device, and the batches are formed there, equal to the numpy iterator's. Own process: logical
    devices are set before TensorFlow starts."""
    out = _run_with_two_cpus(tmp_path, """
        import npyfeed, npyfeed.tf
        from test_tf_device import BATCH, STREAM_BLOCKS, _assert_same, _pass, _stream_source, _streamed
        src = _stream_source("pad")
        for ds, want in [
                (npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=2, gather="device", device="/cpu:1"),
                 src.batches(BATCH, shuffle=True, seed=2)),
                (_streamed(src, seed=2, device="/cpu:1"),
                 src.batches(BATCH, shuffle="blocks", seed=2, memory_budget=STREAM_BLOCKS))]:
            got = _pass(ds)
            _assert_same(got, list(want))
            x, y = next(iter(ds))
            assert x.device.endswith("CPU:1") and y.device.endswith("CPU:1"), (x.device, y.device)
            print("streams" if npyfeed.tf._pipeline.pipeline_of(ds).device.streams else "resident", len(got))
        with tf.device("/cpu:1"):  # the default device: the enclosing scope's
            x, _ = next(iter(npyfeed.tf.dataset(src, BATCH, gather="device")))
        print(x.device.endswith("CPU:1"))
    """)
    n = -(-len(_stream_source("pad")) // BATCH)
    assert out.split() == ["resident", str(n), "streams", str(n), "True"]


def test_a_dropped_dataset_lets_its_device_arrays_go(tf):
    src = _source("pad")
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, gather="device")
    _pass(ds)
    arrays = weakref.ref(_pipeline(ds).device)
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
    with pytest.raises(ValueError, match="PER_REPLICA.*one process per GPU"):
        npyfeed.tf.dataset(src, BATCH, gather="device", input_context=context)


@pytest.mark.parametrize("streamed", [False, True], ids=["resident", "streamed"])
def test_keras_fit(tf, streamed):
    src = _stream_source("pad")
    ds = _streamed(src, seed=1) if streamed else npyfeed.tf.dataset(src, BATCH, shuffle=True, gather="device")
    assert _pipeline(ds).device.streams == streamed
    model = tf.keras.Sequential([tf.keras.layers.Input((WINDOW, 3)), tf.keras.layers.Flatten(),
                                 tf.keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    history = model.fit(ds, epochs=2, verbose=0, shuffle=False)
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()


# -- The GPU memory probe (no GPU here: a fake CUDA runtime and fake TensorFlow allocator facts) ----------------

class _FakeCudart:
    """libcudart's cudaGetDevice/cudaSetDevice/cudaMemGetInfo over per-device (free, total), recording calls."""

    def __init__(self, memory, current=0):
        self.memory = memory
        self.current = current
        self.calls = []

    def cudaGetDevice(self, out):  # noqa: N802 - CUDA's names
        self.calls.append(("get",))
        out._obj.value = self.current
        return 0

    def cudaSetDevice(self, device):  # noqa: N802
        self.calls.append(("set", device))
        if not 0 <= device < len(self.memory):
            return 101  # cudaErrorInvalidDevice
        self.current = device
        return 0

    def cudaMemGetInfo(self, free, total):  # noqa: N802
        self.calls.append(("info", self.current))
        free._obj.value, total._obj.value = self.memory[self.current]
        return 0


GIB = 1 << 30


@pytest.fixture
def fake_gpus(tf, monkeypatch):
    """Two GPUs as TensorFlow and the CUDA runtime would describe them; returns (cudart, settings)."""
    from npyfeed.tf import _device

    cudart = _FakeCudart([(1 * GIB, 80 * GIB), (2 * GIB, 80 * GIB)], current=0)
    settings = {"growth": False, "configs": {}, "in_use": {0: 5 * GIB, 1: 3 * GIB}}
    physical = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(2)]
    monkeypatch.setattr(_device, "_cudart", lambda: cudart)
    settings["visible"] = physical
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: physical if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind=None: settings["visible"])
    monkeypatch.setattr(tf.config, "get_logical_device_configuration",
                        lambda gpu: settings["configs"].get(gpu.name))
    monkeypatch.setattr(tf.config.experimental, "get_memory_growth", lambda gpu: settings["growth"])
    monkeypatch.setattr(tf.config.experimental, "get_memory_info",
                        lambda name: {"current": settings["in_use"][int(name.split(":")[-1])], "peak": 0})
    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)
    return cudart, settings


def test_the_probe_does_not_change_the_current_device(fake_gpus):
    from npyfeed.tf._device import device_free_bytes

    cudart, _ = fake_gpus
    cudart.current = 0
    device_free_bytes("/gpu:1")
    assert cudart.calls == [("get",), ("set", 1), ("info", 1), ("set", 0)]
    assert cudart.current == 0  # restored
    cudart.calls.clear()
    device_free_bytes("/gpu:0")  # already current: never switched
    assert cudart.calls == [("get",), ("info", 0)]
    assert cudart.current == 0


def test_tensorflow_pool_counts_as_available(fake_gpus, monkeypatch):
    from npyfeed.tf._device import device_free_bytes

    cudart, settings = fake_gpus
    # TensorFlow's default: its pool took nearly all of GPU 1 (CUDA reports 2 GiB free of 80); its tensors use 3.
    assert device_free_bytes("/gpu:1") == 77 * GIB
    # Memory growth: TensorFlow takes from the device as it needs; what is free on the device is what is left.
    settings["growth"] = True
    assert device_free_bytes("/gpu:1") == 2 * GIB
    settings["growth"] = False
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    assert device_free_bytes("/gpu:1") == 2 * GIB
    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH")
    # A memory limit: TensorFlow's pool is at most that, whatever the device has free.
    import tensorflow as tf

    settings["configs"]["/physical_device:GPU:1"] = [tf.config.LogicalDeviceConfiguration(memory_limit=10 * 1024)]
    assert device_free_bytes("/gpu:1") == 7 * GIB
    assert cudart.current == 0


def test_logical_devices_map_to_their_gpu(fake_gpus):
    """Two logical devices on GPU 0 (each with its limit): logical GPU 2 is physical GPU 1."""
    import tensorflow as tf
    from npyfeed.tf._device import device_free_bytes

    cudart, settings = fake_gpus
    settings["configs"]["/physical_device:GPU:0"] = [tf.config.LogicalDeviceConfiguration(memory_limit=4096)] * 2
    settings["in_use"] = {0: 1 * GIB, 1: 0, 2: 3 * GIB}
    assert device_free_bytes("/gpu:1") == 4 * GIB
    cudart.calls.clear()
    assert device_free_bytes("/gpu:2") == 77 * GIB
    assert ("set", 1) in cudart.calls and cudart.current == 0
    assert device_free_bytes("/gpu:3") is None  # no such logical device


def test_the_rule(tf):
    from npyfeed.tf._device import tensorflow_free_bytes

    assert tensorflow_free_bytes(1 * GIB, 80 * GIB, 5 * GIB, growth=False, limit=None) == 75 * GIB
    assert tensorflow_free_bytes(60 * GIB, 80 * GIB, 0, growth=False, limit=None) == 80 * GIB  # pool not taken yet
    assert tensorflow_free_bytes(1 * GIB, 80 * GIB, 5 * GIB, growth=True, limit=None) == 1 * GIB
    assert tensorflow_free_bytes(1 * GIB, 80 * GIB, 5 * GIB, growth=True, limit=4 * GIB) == 0


def test_a_hidden_gpu_is_skipped(fake_gpus):
    """tf.config.set_visible_devices hides GPU 0: logical GPU 0 is CUDA device 1."""
    from npyfeed.tf._device import device_free_bytes

    cudart, settings = fake_gpus
    settings["visible"] = settings["visible"][1:]
    settings["growth"] = True
    assert device_free_bytes("/gpu:0") == 2 * GIB  # GPU 1's free memory
    assert ("set", 1) in cudart.calls and cudart.current == 0
    assert device_free_bytes("/gpu:1") is None
