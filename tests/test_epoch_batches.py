"""The core's EpochBatches (npyfeed.tf's gather): batch b of epoch e on demand, in any order and from several
threads at once, equal to the numpy iterator's batch b of epoch e (``src.batches``, the oracle); and ``take``,
the same batches from a stream that reads ahead: in order from one stream, any other position from a new one."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import npyfeed
import numpy as np
import pytest
from npyfeed import _core

SAMPLES = 53


@pytest.fixture(scope="module")
def src():
    rng = np.random.default_rng(11)
    factors = {k: rng.standard_normal((30, 3)) for k in "abc"}
    labels = {k: rng.standard_normal((30, 2)) for k in "abc"}
    index = [(int(f), int(l), k) for k in "abc" for f, l in zip(rng.integers(3, 30, 18), rng.integers(0, 30, 18))]
    return npyfeed.WindowSource.from_arrays(index[:SAMPLES], factors, labels, 4)


def _make(src, batch_size, shuffle=True, seed=4, num_shards=1, shard_index=0, drop_remainder=False, prefetch=2):
    return _core.EpochBatches(src._core, shuffle, seed, num_shards, shard_index, batch_size, drop_remainder, 8,
                              prefetch)


@pytest.mark.parametrize("shuffle", [False, True], ids=["in_order", "shuffled"])
@pytest.mark.parametrize("num_shards, shard_index", [(1, 0), (3, 2)], ids=["whole", "shard_2_of_3"])
@pytest.mark.parametrize("drop_remainder", [False, True], ids=["keep_remainder", "drop_remainder"])
def test_any_batch_of_any_epoch_equals_the_numpy_iterator(src, shuffle, num_shards, shard_index, drop_remainder):
    kwargs = dict(shuffle=shuffle, seed=4, num_shards=num_shards, shard_index=shard_index,
                  drop_remainder=drop_remainder)
    batches = _make(src, 5, **kwargs)
    expected = {e: list(src.batches(5, epoch=e, **kwargs)) for e in (0, 1, 7)}
    assert batches.num_batches == len(expected[0]) == src.num_batches(5, num_shards=num_shards,
                                                                      shard_index=shard_index,
                                                                      drop_remainder=drop_remainder)
    wanted = [(e, b) for e in expected for b in range(batches.num_batches)]
    rng = np.random.default_rng(0)
    for i in rng.permutation(len(wanted)):  # any order
        e, b = wanted[i]
        x, y = batches.get(e, b)
        assert x.ctypes.data % 64 == 0
        np.testing.assert_array_equal(x, expected[e][b][0], strict=True)
        np.testing.assert_array_equal(y, expected[e][b][1], strict=True)
    if shuffle:
        assert not np.array_equal(batches.get(0, 0)[1], batches.get(1, 0)[1])  # epochs differ


@pytest.mark.parametrize("method", ["get", "take"])
def test_concurrent_calls_from_threads(src, method):
    """get gathers each position on its own; take serves one call at a time from a stream: positions asked out
    of order by racing threads still get their batch."""
    batches = _make(src, 4)
    call = getattr(batches, method)
    wanted = [(e, b) for e in range(3) for b in range(batches.num_batches)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda eb: call(*eb), wanted))
    for (e, b), (x, y) in zip(wanted, got):
        ex, ey = list(src.batches(4, shuffle=True, seed=4, epoch=e))[b]
        np.testing.assert_array_equal(x, ex, strict=True)
        np.testing.assert_array_equal(y, ey, strict=True)


def test_held_batches_are_not_overwritten(src):
    batches = _make(src, 4)
    held = [batches.get(0, b) for b in range(batches.num_batches)]
    held += [batches.get(1, b) for b in range(batches.num_batches)]  # more than the pool keeps
    expected = list(src.batches(4, shuffle=True, seed=4, epoch=0)) + list(src.batches(4, shuffle=True, seed=4, epoch=1))
    for (x, y), (ex, ey) in zip(held, expected):
        np.testing.assert_array_equal(x, ex, strict=True)
        np.testing.assert_array_equal(y, ey, strict=True)


@pytest.mark.parametrize("prefetch", [1, 3])
def test_take_in_order_from_one_stream_any_other_position_from_a_new_one(src, prefetch):
    batches = _make(src, 5, num_shards=3, shard_index=1, prefetch=prefetch)
    n = batches.num_batches
    expected = {e: list(src.batches(5, shuffle=True, seed=4, epoch=e, num_shards=3, shard_index=1)) for e in range(3)}
    # Epoch 0 in order, then a jump back (a restored checkpoint), a jump ahead, epoch 2 from its middle.
    positions = [(0, b) for b in range(n)] + [(1, 1), (1, 2), (1, 0), (1, 3), (2, n - 2), (2, n - 1), (0, 0)]
    for e, b in positions:
        x, y = batches.take(e, b)
        assert x.ctypes.data % 64 == 0
        np.testing.assert_array_equal(x, expected[e][b][0], strict=True)
        np.testing.assert_array_equal(y, expected[e][b][1], strict=True)
    # One stream for epoch 0, then one per position that was not the next: (1, 1), (1, 0), (1, 3), (2, n - 2)
    # and (0, 0); (1, 2) and (2, n - 1) were.
    assert batches.streams_started == 6
    held = [batches.take(0, b) for b in range(1, n)]  # every batch held at once: none overwritten
    for (x, y), (ex, ey) in zip(held, expected[0][1:]):
        np.testing.assert_array_equal(x, ex, strict=True)
        np.testing.assert_array_equal(y, ey, strict=True)
    assert batches.streams_started == 6
    batches.close()
    batches.close()
    np.testing.assert_array_equal(batches.take(0, 2)[1], expected[0][2][1], strict=True)  # a new stream
    assert batches.streams_started == 7


def test_bad_arguments(src):
    batches = _make(src, 8)
    with pytest.raises(IndexError, match="batch 7 out of range for 7"):
        batches.get(0, 7)
    with pytest.raises(IndexError, match="batch 7 out of range for 7"):
        batches.take(0, 7)
    with pytest.raises(ValueError, match="shard_index"):
        _make(src, 8, num_shards=2, shard_index=2)
    with pytest.raises(ValueError, match="batch_size"):
        _make(src, 0)
