"""Access to window samples: `get`, the epoch order (shuffle, shards, resume, argument checks) and the batch
buffers (contiguous, 64-byte aligned, owned, never recycled while referenced).

The numpy reference and the data sets: windows_data.py."""


from __future__ import annotations

import gc

import npyfeed
import numpy as np
import pytest
from windows_data import MODES, assert_batch, check_epoch, open_source, reference

# ----------------------------------------------------------------------------------------------------------
# get()


@pytest.mark.parametrize("mode", MODES)
def test_get_arbitrary_ids(small, mode):
    src = open_source(small, mode)
    n = len(src)
    rng = np.random.default_rng(42)
    for ids in ([0], [n - 1], [5, 5, 5], [3, 1, 3, 0, n - 1, 1], list(rng.integers(0, n, 100)),
                np.arange(n)[::-1], np.arange(n, dtype=np.int32), np.array([2, 7], np.uint8)):
        expected = reference(small, [small.entries[int(i)] for i in ids], "float32")
        assert_batch(src.get(ids), expected)


@pytest.mark.parametrize("mode", MODES)
def test_get_empty(small, mode):
    src = open_source(small, mode)
    for ids in ([], np.array([], np.int64)):
        x, y = src.get(ids)
        assert x.shape == (0, 6, 5) and x.dtype == np.float32
        assert y.shape == (0, 2) and y.dtype == np.float32


@pytest.mark.parametrize("bad", [[-1], [60], [0, 1, 60], [2**40], [-2**63]])
def test_get_out_of_range_raises_index_error(small, bad):
    src = open_source(small, "read")
    assert len(src) == 60
    with pytest.raises(IndexError, match="out of range"):
        src.get(bad)
    assert_batch(src.get([0]), reference(small, small.entries[:1], "float32"))  # still usable


@pytest.mark.parametrize("bad", [[0.5], [[0, 1]], ["a"], 3])
def test_get_wrong_type(small, bad):
    with pytest.raises(TypeError):
        open_source(small, "mmap").get(bad)


# ----------------------------------------------------------------------------------------------------------
# The epoch order: shuffle, shards, resume


def test_epoch_order_is_a_seeded_permutation(ordered):
    src = open_source(ordered, "mmap")
    other = open_source(ordered, "arrays", threads=1)  # a second source: the order depends on nothing else
    n = len(src)
    identity = np.arange(n)
    assert np.array_equal(src.epoch_order(0), identity)
    assert np.array_equal(src.epoch_order(5), identity)
    orders = {}
    for seed in (0, 1, 2**64 - 1):
        for epoch in (0, 1, 2, 2**62 - 1):
            order = src.epoch_order(epoch, shuffle=True, seed=seed)
            assert order.dtype == np.int64 and order.shape == (n,)
            assert np.array_equal(np.sort(order), identity)
            assert np.array_equal(order, src.epoch_order(epoch, shuffle=True, seed=seed))
            assert np.array_equal(order, other.epoch_order(epoch, shuffle=True, seed=seed))
            orders[seed, epoch] = tuple(order)
    assert len(set(orders.values())) == len(orders)  # every (seed, epoch) gives its own order


def test_epoch_order_is_the_same_on_any_machine():
    """Pinned values: a restarted job (another machine, another npyfeed build) must see the same order."""
    src = npyfeed.WindowSource.from_arrays([(0, 0, "a")] * 10, {"a": np.zeros((3, 1))}, {"a": np.zeros((3, 1))}, 1)
    # The order of npyfeed 0.2 (IndexShuffle: a Feistel bijection, O(1) memory); 0.1 had a Fisher-Yates order.
    assert src.epoch_order(0, shuffle=True, seed=0).tolist() == [8, 2, 7, 3, 0, 1, 4, 6, 9, 5]
    assert src.epoch_order(1, shuffle=True, seed=0).tolist() == [3, 7, 9, 2, 0, 5, 4, 1, 8, 6]
    assert src.epoch_order(0, shuffle=True, seed=2**64 - 1).tolist() == [2, 8, 1, 9, 4, 7, 0, 5, 6, 3]


@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_follow_epoch_order_and_differ_between_epochs(ordered, shuffle):
    src = open_source(ordered, "read")
    first = [x for x, _ in src.batches(10, shuffle=shuffle, seed=4, epoch=0)]
    again = [x for x, _ in src.batches(10, shuffle=shuffle, seed=4, epoch=0)]
    later = [x for x, _ in src.batches(10, shuffle=shuffle, seed=4, epoch=1)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again)) and len(first) == len(again) == 11
    assert all(np.array_equal(a, b) for a, b in zip(first, later)) != shuffle
    for epoch in (0, 1):
        check_epoch(src, ordered, "float32", 10, shuffle=shuffle, seed=4, epoch=epoch)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_shards_are_disjoint_and_complete(ordered, shuffle, drop_remainder):
    src = open_source(ordered, "mmap")
    n = len(src)
    parts = [src.epoch_order(2, shuffle=shuffle, seed=3, num_shards=3, shard_index=i) for i in range(3)]
    assert [len(p) for p in parts] == [35, 34, 34]
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))  # disjoint and covering
    seen = []
    for i in range(3):
        kwargs = dict(shuffle=shuffle, seed=3, epoch=2, num_shards=3, shard_index=i, drop_remainder=drop_remainder)
        batches = check_epoch(src, ordered, "float32", 8, **kwargs)
        assert batches == (len(parts[i]) // 8 if drop_remainder else -(-len(parts[i]) // 8))
        for x, _ in src.batches(8, **kwargs):
            seen.append(x)
    if not drop_remainder:
        everything = reference(ordered, ordered.entries, "float32")[0]
        got = np.concatenate(seen)
        # The union over the shards is every sample exactly once (compare as sorted rows of bytes).
        key = lambda a: sorted(r.tobytes() for r in a)  # noqa: E731
        assert key(got) == key(everything)


@pytest.mark.parametrize("batch_size, shards, drop, expected", [
    (10, 1, False, 11), (10, 1, True, 10), (103, 1, False, 1), (103, 1, True, 1), (104, 1, False, 1),
    (104, 1, True, 0), (1, 1, False, 103), (8, 3, False, 5), (8, 3, True, 4), (7, 3, True, 5), (200, 2, True, 0)])
def test_num_batches_matches_iterator(ordered, batch_size, shards, drop, expected):
    src = open_source(ordered, "mmap")
    assert src.num_batches(batch_size, num_shards=shards, drop_remainder=drop) == expected
    it = src.batches(batch_size, num_shards=shards, drop_remainder=drop)
    assert len(it) == expected
    sizes = []
    for x, y in it:
        sizes.append(len(x))
        assert len(y) == len(x)
        assert len(it) == expected - len(sizes)
    assert len(sizes) == expected
    if drop:
        assert all(s == batch_size for s in sizes)
    elif sizes:
        assert all(s == batch_size for s in sizes[:-1]) and 1 <= sizes[-1] <= batch_size
        assert sum(sizes) == len(range(0, len(src), shards))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_resume_equals_tail_of_full_epoch(ordered, shuffle, drop_remainder):
    src = open_source(ordered, "read")
    kwargs = dict(shuffle=shuffle, seed=6, epoch=3, num_shards=2, shard_index=1, drop_remainder=drop_remainder)
    full = list(src.batches(6, **kwargs))
    total = src.num_batches(6, num_shards=2, shard_index=1, drop_remainder=drop_remainder)
    assert len(full) == total == (8 if drop_remainder else 9)
    for k in (0, 1, 4, total - 1, total):
        it = src.batches(6, start_batch=k, **kwargs)
        assert len(it) == total - k
        tail = list(it)
        assert len(tail) == total - k
        for (x, y), (fx, fy) in zip(tail, full[k:]):
            assert np.array_equal(x, fx) and np.array_equal(y, fy)


@pytest.mark.parametrize("kwargs", [
    dict(batch_size=0), dict(batch_size=-1), dict(batch_size=1.5), dict(batch_size=True),
    dict(prefetch=0), dict(prefetch=-2), dict(prefetch=1.0),
    dict(start_batch=-1), dict(start_batch=12), dict(start_batch=1.0),
    dict(num_shards=0), dict(num_shards=-1), dict(num_shards=3, shard_index=3), dict(shard_index=-1),
    dict(num_shards=2, shard_index=2), dict(seed=-1), dict(epoch=-1), dict(seed=2**64), dict(seed=1.5),
], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_invalid_batches_arguments(ordered, kwargs):
    src = open_source(ordered, "mmap")
    kwargs = dict(kwargs)
    batch_size = kwargs.pop("batch_size", 10)
    name = next(iter(kwargs), "batch_size")
    if "shard_index" in kwargs:
        name = "shard_index" if kwargs.get("num_shards", 1) >= 1 else "num_shards"
    with pytest.raises(ValueError, match=name):
        src.batches(batch_size, shuffle=True, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(num_shards=0), dict(num_shards=2, shard_index=2), dict(shard_index=-1)])
def test_invalid_shards_in_epoch_order_and_num_batches(ordered, kwargs):
    src = open_source(ordered, "mmap")
    with pytest.raises(ValueError):
        src.epoch_order(0, **kwargs)
    with pytest.raises(ValueError):
        src.num_batches(4, **kwargs)
    with pytest.raises(ValueError, match="batch_size"):
        src.num_batches(0)


# ----------------------------------------------------------------------------------------------------------
# Batch buffers: contiguous, 64-byte aligned, owned, never recycled while referenced


@pytest.mark.parametrize("mode", MODES)
def test_batch_arrays_are_aligned_and_owned(small, mode):
    src = open_source(small, mode)
    batches = [src.get([1, 2, 3])] + list(src.batches(7, shuffle=True))
    for x, y in batches:
        for a in (x, y):
            assert a.flags.c_contiguous
            assert a.ctypes.data % 64 == 0
            assert a.base is not None and not a.flags.owndata


@pytest.mark.parametrize("mode", ["mmap", "read", "arrays"])
def test_batches_stay_valid_while_referenced(ordered, mode):
    """Keep some batches (or only views of them), drop the others so their buffers are recycled; the kept ones
    must not change while the iterator runs on, nor after the iterator and the source are gone."""
    src = open_source(ordered, mode)
    order = src.epoch_order(1, shuffle=True, seed=12)
    kept = []
    it = src.batches(3, shuffle=True, seed=12, epoch=1, prefetch=2)
    for b, (x, y) in enumerate(it):
        ids = order[b * 3:(b + 1) * 3]
        if b % 3 == 0:
            kept.append(("whole", ids, x, y))
        elif b % 3 == 1:
            kept.append(("views", ids, x[1:], y[:, ::-1]))  # only views survive: their base keeps the buffer
        del x, y
        if b == 5:  # a second iterator over the same source shares nothing with the first
            other = list(src.batches(3))
    del it, src, other
    gc.collect()
    for kind, ids, x, y in kept:
        ex, ey = reference(ordered, [ordered.entries[i] for i in ids], "float32")
        if kind == "views":
            ex, ey = ex[1:], ey[:, ::-1]
        assert np.array_equal(x, ex) and np.array_equal(y, ey)
    assert len(kept) == 24


def test_batches_writable_without_affecting_later_batches(ordered):
    src = open_source(ordered, "mmap")
    it = src.batches(5)
    x0, _ = next(it)
    assert x0.flags.writeable  # the user's own copy, e.g. for normalising in place
    x0[...] = np.nan  # scribbling on it changes nothing else
    del x0
    for b, (x, y) in enumerate(it, start=1):
        assert_batch((x, y), reference(ordered, ordered.entries[b * 5:(b + 1) * 5], "float32"))
    assert_batch(src.get(np.arange(5)), reference(ordered, ordered.entries[:5], "float32"))


def test_from_arrays_keeps_its_arrays_alive(ordered):
    factors, labels = ordered.loaded("factor"), ordered.loaded("label")
    it = npyfeed.WindowSource.from_arrays(ordered.index, factors, labels, ordered.window).batches(9)
    src = npyfeed.WindowSource.from_arrays(ordered.index, factors, labels, ordered.window)
    del factors, labels
    gc.collect()
    for b, batch in enumerate(it):  # the iterator alone keeps its source and the arrays alive
        assert_batch(batch, reference(ordered, ordered.entries[b * 9:(b + 1) * 9], "float32"))
    assert_batch(src.get(np.arange(len(src))), reference(ordered, ordered.entries, "float32"))
