"""The plan (``WindowSource.plan``): batch b of epoch e by position, in any order and from several threads at once,
equal to the numpy iterator's batch b of epoch e (``src.batches``, the oracle) and to ``src.get(plan.ids(e, b))``;
``take`` serves them from a stream that reads ahead: in order from one stream, any other position from a new one.
Every order kind (none, global, blocks) and shard layout."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import npyfeed
import numpy as np
import pytest

SAMPLES = 53
KINDS = [False, True, "blocks"]
KIND_IDS = ["in_order", "shuffled", "blocks"]
BUDGET = 1500  # bytes: blocks of one or two keys (a key holds 30 rows of 5 float64: 1.2 kB)


@pytest.fixture(scope="module")
def src():
    rng = np.random.default_rng(11)
    keys = "abcdef"
    factors = {k: rng.standard_normal((30, 3)) for k in keys}
    labels = {k: rng.standard_normal((30, 2)) for k in keys}
    index = [(int(f), int(l), k) for k in keys for f, l in zip(rng.integers(3, 30, 9), rng.integers(0, 30, 9))]
    return npyfeed.WindowSource.from_arrays(index[:SAMPLES], factors, labels, 4)


def _plan(src, batch_size, shuffle=True, seed=4, num_shards=1, shard_index=0, drop_remainder=False, prefetch=2):
    return src.plan(batch_size, shuffle=shuffle, seed=seed, num_shards=num_shards, shard_index=shard_index,
                    drop_remainder=drop_remainder, memory_budget=BUDGET, prefetch=prefetch)


def _expected(src, batch_size, epoch, **kwargs):
    return list(src.batches(batch_size, epoch=epoch, memory_budget=BUDGET, **kwargs))


def _assert_batch(got, expected):
    x, y = got
    assert x.ctypes.data % 64 == 0
    np.testing.assert_array_equal(x, expected[0], strict=True)
    np.testing.assert_array_equal(y, expected[1], strict=True)


@pytest.mark.parametrize("shuffle", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("num_shards, shard_index", [(1, 0), (3, 2)], ids=["whole", "shard_2_of_3"])
@pytest.mark.parametrize("drop_remainder", [False, True], ids=["keep_remainder", "drop_remainder"])
def test_any_batch_of_any_epoch_equals_the_numpy_iterator(src, shuffle, num_shards, shard_index, drop_remainder):
    kwargs = dict(shuffle=shuffle, seed=4, num_shards=num_shards, shard_index=shard_index,
                  drop_remainder=drop_remainder)
    plan = _plan(src, 5, **kwargs)
    expected = {e: _expected(src, 5, e, **kwargs) for e in (0, 1, 7)}
    assert len(plan) == len(expected[0]) == src.num_batches(5, num_shards=num_shards, shard_index=shard_index,
                                                            drop_remainder=drop_remainder)
    wanted = [(e, b) for e in expected for b in range(len(plan))]
    rng = np.random.default_rng(0)
    for i in rng.permutation(len(wanted)):  # any order
        e, b = wanted[i]
        ids = plan.ids(e, b)
        assert ids.dtype == np.int64
        _assert_batch(src.get(ids), expected[e][b])
        _assert_batch(plan.take(e, b), expected[e][b])
    for e in expected:
        order = plan.order(e)
        np.testing.assert_array_equal(order, src.epoch_order(e, shuffle=shuffle, seed=4, num_shards=num_shards,
                                                             shard_index=shard_index, memory_budget=BUDGET))
        assert len(order) == plan.num_samples
        ids = np.concatenate([plan.ids(e, b) for b in range(len(plan))])
        np.testing.assert_array_equal(ids, order[:len(ids)])
        assert len(ids) == (len(order) // 5 * 5 if drop_remainder else len(order))
    if shuffle:
        assert not np.array_equal(plan.ids(0, 0), plan.ids(1, 0))  # epochs differ


@pytest.mark.parametrize("shuffle", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("num_shards", [1, 2, 5])
def test_shards_together_cover_each_epoch_exactly_once(src, shuffle, num_shards):
    for epoch in (0, 3):
        seen = []
        for shard in range(num_shards):
            plan = _plan(src, 4, shuffle=shuffle, num_shards=num_shards, shard_index=shard)
            seen += [i for b in range(len(plan)) for i in plan.ids(epoch, b)]
            assert len(plan) == -(-len(range(shard, SAMPLES, num_shards)) // 4)  # one formula for every order
        assert sorted(seen) == list(range(SAMPLES))


@pytest.mark.parametrize("shuffle", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("method", ["ids", "take"])
def test_concurrent_calls_from_threads(src, shuffle, method):
    """ids computes each position on its own; take serves one call at a time from a stream: positions asked out
    of order by racing threads still get their batch."""
    plan = _plan(src, 4, shuffle=shuffle)
    call = (lambda e, b: src.get(plan.ids(e, b))) if method == "ids" else plan.take
    wanted = [(e, b) for e in range(3) for b in range(len(plan))]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda eb: call(*eb), wanted))
    expected = {e: _expected(src, 4, e, shuffle=shuffle, seed=4) for e in range(3)}
    for (e, b), batch in zip(wanted, got):
        _assert_batch(batch, expected[e][b])


def test_held_batches_are_not_overwritten(src):
    plan = _plan(src, 4)
    held = [plan.take(0, b) for b in range(len(plan))]
    held += [plan.take(1, b) for b in range(len(plan))]  # more than the pool keeps
    expected = _expected(src, 4, 0, shuffle=True, seed=4) + _expected(src, 4, 1, shuffle=True, seed=4)
    for got, want in zip(held, expected):
        _assert_batch(got, want)


@pytest.mark.parametrize("shuffle", [True, "blocks"], ids=["shuffled", "blocks"])
@pytest.mark.parametrize("prefetch", [1, 3])
def test_take_in_order_from_one_stream_any_other_position_from_a_new_one(src, shuffle, prefetch):
    plan = _plan(src, 5, shuffle=shuffle, num_shards=3, shard_index=1, prefetch=prefetch)
    n = len(plan)
    expected = {e: _expected(src, 5, e, shuffle=shuffle, seed=4, num_shards=3, shard_index=1) for e in range(3)}
    # Epoch 0 in order, then a jump back (a restored checkpoint), a jump ahead, epoch 2 from its middle.
    positions = [(0, b) for b in range(n)] + [(1, 1), (1, 2), (1, 0), (1, 3), (2, n - 2), (2, n - 1), (0, 0)]
    for e, b in positions:
        _assert_batch(plan.take(e, b), expected[e][b])
    # One stream for epoch 0, then one per position that was not the next: (1, 1), (1, 0), (1, 3), (2, n - 2)
    # and (0, 0); (1, 2) and (2, n - 1) were.
    assert plan._core.streams_started == 6
    held = [plan.take(0, b) for b in range(1, n)]  # every batch held at once: none overwritten
    for got, want in zip(held, expected[0][1:]):
        _assert_batch(got, want)
    assert plan._core.streams_started == 6
    plan.close()
    plan.close()
    _assert_batch(plan.take(0, 2), expected[0][2])  # a new stream
    assert plan._core.streams_started == 7


def test_plans_of_one_source_share_its_samples_by_key(src):
    first = _plan(src, 4, shuffle="blocks")
    second = _plan(src, 8, shuffle="blocks", seed=9)
    assert first._core.samples_by_key is second._core.samples_by_key is src._samples_by_key
    assert src._samples_by_key.runs  # the index lists each key's lines together: no memory per sample


def test_plan_describes_itself(src):
    plan = _plan(src, 5, shuffle="blocks", num_shards=3, shard_index=1)
    assert (plan.batch_size, plan.shuffle, plan.seed, plan.num_shards, plan.shard_index) == (5, "blocks", 4, 3, 1)
    assert plan.memory_budget == BUDGET and plan.source is src
    assert plan.num_samples == len(range(1, SAMPLES, 3))
    assert "shard 1 of 3" in repr(plan)
    unshuffled = src.plan(5, seed=123)
    assert unshuffled.seed == 0 and unshuffled.memory_budget is None  # what does not decide the order is not kept


@pytest.mark.parametrize("shuffle", KINDS, ids=KIND_IDS)
def test_bad_positions(src, shuffle):
    plan = _plan(src, 8, shuffle=shuffle)
    assert len(plan) == 7
    for call in (plan.ids, plan.take):
        with pytest.raises(IndexError, match="batch 7 out of range for 7"):
            call(0, 7)
        with pytest.raises(ValueError, match="batch"):
            call(0, -1)
        with pytest.raises(ValueError, match="epoch"):
            call(-1, 0)
        with pytest.raises(TypeError, match="epoch"):
            call(1.0, 0)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(batch_size=0), ValueError, "batch_size"),
    (dict(batch_size=2.0), TypeError, "batch_size"),
    (dict(num_shards=2, shard_index=2), ValueError, "shard_index"),
    (dict(num_shards=0), ValueError, "num_shards"),
    (dict(shard_index=True), TypeError, "shard_index"),
    (dict(seed=2**64, shuffle=True), ValueError, "seed"),
    (dict(seed="1", shuffle=True), TypeError, "seed"),
    (dict(shuffle="bricks"), ValueError, "shuffle"),
    (dict(shuffle="blocks", memory_budget=0), ValueError, "memory_budget"),
    (dict(prefetch=0), ValueError, "prefetch"),
], ids=["batch_size", "batch_size_type", "shard_index", "num_shards", "shard_type", "seed", "seed_type", "shuffle",
        "memory_budget", "prefetch"])
def test_bad_arguments(src, kwargs, error, match):
    kwargs = dict(kwargs)
    batch_size = kwargs.pop("batch_size", 8)
    with pytest.raises(error, match=match):
        src.plan(batch_size, **kwargs)


def test_a_wrong_type_is_also_a_value_error(src):
    """npyfeed 0.2 raised ValueError for wrong types too: code that catches it keeps working."""
    with pytest.raises(ValueError, match="batch_size"):
        src.plan(1.5)
    with pytest.raises(TypeError, match="batch_size"):
        src.plan(1.5)


@pytest.mark.parametrize("shuffle", [False, True], ids=["in_order", "shuffled"])
@pytest.mark.parametrize("num_shards", [1, 2, 4])
def test_shards_of_whole_keys(src, shuffle, num_shards):
    """shard_by="keys": each shard a set of whole keys, balanced by sample count, together every sample exactly
    once per epoch; its epoch its own samples (index order, or a seeded permutation per epoch)."""
    key_of = {i: src.describe(i).split("key ")[1].split(",")[0] for i in range(len(src))}
    counts = {}
    for k in key_of.values():
        counts[k] = counts.get(k, 0) + 1
    for epoch in (0, 5):
        seen, owner, sizes = [], {}, []
        for shard in range(num_shards):
            plan = src.plan(4, shuffle=shuffle, seed=4, num_shards=num_shards, shard_index=shard, shard_by="keys")
            order = plan.order(epoch)
            ids = np.concatenate([plan.ids(epoch, b) for b in range(len(plan))])
            np.testing.assert_array_equal(ids, order)
            expected = list(src.batches(4, shuffle=shuffle, seed=4, epoch=epoch, num_shards=num_shards,
                                        shard_index=shard, shard_by="keys"))
            assert len(expected) == len(plan) == src.num_batches(4, num_shards=num_shards, shard_index=shard,
                                                                 shard_by="keys")
            for b, want in enumerate(expected):
                _assert_batch(src.get(plan.ids(epoch, b)), want)
                _assert_batch(plan.take(epoch, b), want)
            assert (list(order) == sorted(order)) == (not shuffle or len(order) < 2)
            for i in order:
                assert owner.setdefault(key_of[int(i)], shard) == shard  # a key is in one shard only
            seen += order.tolist()
            sizes.append(len(order))
        assert sorted(seen) == list(range(SAMPLES))
        assert max(sizes) - min(sizes) <= max(counts.values())
    if shuffle:
        plan = src.plan(4, shuffle=True, seed=4, num_shards=num_shards, shard_by="keys")
        assert not np.array_equal(plan.order(0), plan.order(1))  # a new permutation each epoch


def test_shard_by_keys_arguments(src):
    with pytest.raises(ValueError, match="shard_by"):
        src.plan(4, shard_by="rows")
    with pytest.raises(TypeError, match="shard_by"):
        src.plan(4, shard_by=1)
    with pytest.raises(ValueError, match="blocks"):
        src.plan(4, shuffle="blocks", shard_by="keys")
