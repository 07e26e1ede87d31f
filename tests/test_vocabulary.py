"""One vocabulary on every entry point (``WindowSource.plan``/``batches``/``epoch_order``/``num_batches``,
``nfk.PyDataset``, ``nft.WindowDataset``, ``nftf.dataset``): the same shard arguments
(``num_shards``/``shard_index``, ``shard_by``; torch's ``rank``/``world_size`` and tf's ``input_context`` as the
frameworks' own names, refused together with the plain ones), one epoch range ([0, 2**62)), one memory-budget
default (the same order, without ``memory_budget=``, through every entry point)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect

import npyfeed
import numpy as np
import pytest
from npyfeed._checks import EPOCH_LIMIT
from npyfeed.plan import DEFAULT_MEMORY_BUDGET


def _keras3() -> bool:
    try:
        return int(importlib.metadata.version("keras").split(".")[0]) >= 3
    except importlib.metadata.PackageNotFoundError:
        return False


HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_TF = importlib.util.find_spec("tensorflow") is not None


@pytest.fixture(scope="module")
def src():
    rng = np.random.default_rng(5)
    keys = "abcdefgh"
    factors = {k: rng.standard_normal((40, 3)).astype(np.float32) for k in keys}
    labels = {k: rng.standard_normal((40, 2)).astype(np.float32) for k in keys}
    index = [(int(f), int(f), k) for k in keys for f in range(3, 40, 3)]
    return npyfeed.WindowSource.from_arrays(index, factors, labels, 4)


def _entry_points():
    points = [npyfeed.WindowSource.plan, npyfeed.WindowSource.batches, npyfeed.WindowSource.epoch_order]
    if _keras3():
        import npyfeed.keras as nfk

        points.append(nfk.PyDataset.__init__)
    if HAVE_TORCH:
        import npyfeed.torch as nft

        points.append(nft.WindowDataset.__init__)
    if HAVE_TF:
        import npyfeed.tf as nftf

        points.append(nftf.dataset)
    return points


def test_every_entry_point_takes_the_same_shard_arguments_and_memory_budget_default():
    for function in _entry_points():
        parameters = inspect.signature(function).parameters
        name = function.__qualname__
        assert {"num_shards", "shard_index", "shard_by", "memory_budget"} <= set(parameters), name
        assert parameters["memory_budget"].default == DEFAULT_MEMORY_BUDGET, name
        assert parameters["shard_by"].default == "samples", name


def _plan_order(plan, epoch):
    return np.concatenate([plan.ids(epoch, b) for b in range(len(plan))])


def _orders(src, epoch, **shards):
    """The ids of epoch `epoch` as each entry point reads them, with the default memory budget."""
    kwargs = dict(shuffle="blocks", seed=3, **shards)
    orders = {
        "plan": src.plan(4, **kwargs).order(epoch),
        "plan(memory_budget=None)": src.plan(4, memory_budget=None, **kwargs).order(epoch),
        "epoch_order": src.epoch_order(epoch, **kwargs),
    }
    if _keras3():
        import npyfeed.keras as nfk

        orders["keras"] = _plan_order(nfk.PyDataset(src, 4, epoch=epoch, **kwargs).plan, epoch)
    if HAVE_TORCH:
        import npyfeed.torch as nft

        orders["torch"] = _plan_order(nft.WindowDataset(src, 4, epoch=epoch, **kwargs).plan, epoch)
    return orders


@pytest.mark.parametrize("shards", [{}, dict(num_shards=3, shard_index=1)], ids=["whole", "shard_1_of_3"])
def test_the_default_memory_budget_gives_the_same_order_everywhere(src, shards):
    orders = _orders(src, 2, **shards)
    reference = orders["plan"]
    for name, order in orders.items():
        np.testing.assert_array_equal(order, reference, err_msg=name)
    # The budget decides the order: a tiny one gives another (so the comparison above can fail).
    small = src.plan(4, shuffle="blocks", seed=3, memory_budget=1500, **shards).order(2)
    assert not np.array_equal(small, reference)
    # And the batches of the numpy iterator are those ids' samples.
    got = np.concatenate([y for _, y in src.batches(4, shuffle="blocks", seed=3, epoch=2, **shards)])
    np.testing.assert_array_equal(got, src.get(reference)[1])


@pytest.mark.parametrize("shuffle", [False, True], ids=["in_order", "shuffled"])
def test_shard_by_keys_on_the_adapters_is_the_plans(src, shuffle):
    kwargs = dict(shuffle=shuffle, seed=1, num_shards=3, shard_index=2, shard_by="keys")
    expected = src.plan(4, **kwargs).order(1)
    if _keras3():
        import npyfeed.keras as nfk

        ds = nfk.PyDataset(src, 4, epoch=1, **kwargs)
        assert ds.plan.shard_by == "keys"
        np.testing.assert_array_equal(_plan_order(ds.plan, 1), expected)
    if HAVE_TORCH:
        import npyfeed.torch as nft

        ds = nft.WindowDataset(src, 4, epoch=1, **kwargs)
        assert ds.plan.shard_by == "keys" and (ds.num_shards, ds.shard_index) == (3, 2)
        np.testing.assert_array_equal(_plan_order(ds.plan, 1), expected)


@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed")
def test_torch_rank_and_world_size_are_aliases(src):
    import npyfeed.torch as nft

    plain = nft.WindowDataset(src, 4, num_shards=3, shard_index=1)
    alias = nft.WindowDataset(src, 4, world_size=3, rank=1)
    for ds in (plain, alias):
        assert (ds.num_shards, ds.shard_index, ds.world_size, ds.rank) == (3, 1, 3, 1)
    np.testing.assert_array_equal(_plan_order(plain.plan, 0), _plan_order(alias.plan, 0))
    with pytest.raises(ValueError, match="not both"):
        nft.WindowDataset(src, 4, num_shards=3, rank=1)
    with pytest.raises(ValueError, match="not both"):
        nft.WindowDataset(src, 4, shard_index=1, world_size=3)


def _epoch_calls(src):
    calls = {
        "plan.ids": lambda e: src.plan(4).ids(e, 0),
        "plan.take": lambda e: src.plan(4).take(e, 0),
        "plan.order": lambda e: src.plan(4).order(e),
        "plan.batches": lambda e: src.plan(4).batches(e),
        "batches": lambda e: src.batches(4, epoch=e),
        "epoch_order": lambda e: src.epoch_order(e),
    }
    if _keras3():
        import npyfeed.keras as nfk

        calls["keras"] = lambda e: nfk.PyDataset(src, 4, epoch=e)
        calls["keras.set_epoch"] = lambda e: nfk.PyDataset(src, 4).set_epoch(e)
    if HAVE_TORCH:
        import npyfeed.torch as nft

        calls["torch"] = lambda e: nft.WindowDataset(src, 4, epoch=e)
        calls["torch.set_epoch"] = lambda e: nft.WindowDataset(src, 4).set_epoch(e)
        calls["torch.load_state_dict"] = lambda e: nft.WindowDataset(src, 4).load_state_dict(
            {"epoch": e, "batch": 0})
    return calls


def test_one_epoch_range_everywhere(src):
    assert EPOCH_LIMIT == 2**62
    for name, call in _epoch_calls(src).items():
        call(EPOCH_LIMIT - 1)
        for bad in (EPOCH_LIMIT, 2**64 - 1, -1):
            with pytest.raises(ValueError, match=r"epoch must be an integer in \[0, 2\*\*62\)"):
                call(bad)
                pytest.fail(name)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TF, reason="TensorFlow is not installed")
def test_tf_dataset_takes_the_plain_shard_arguments_and_the_same_defaults(src):
    import npyfeed.tf as nftf
    import tensorflow as tf

    kwargs = dict(shuffle="blocks", seed=3)
    expected = src.get(src.plan(4, num_shards=3, shard_index=1, **kwargs).order(2))[1]
    plain = nftf.dataset(src, 4, epoch=2, num_shards=3, shard_index=1, **kwargs)
    np.testing.assert_array_equal(np.concatenate([y.numpy() for _, y in plain]), expected)
    context = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=1, num_replicas_in_sync=3)
    strategy_way = nftf.dataset(src, 12, epoch=2, input_context=context, **kwargs)  # 12 over 3 replicas
    np.testing.assert_array_equal(np.concatenate([y.numpy() for _, y in strategy_way]), expected)
    for plain_kwargs in (dict(num_shards=3), dict(shard_index=1), dict(num_shards=3, shard_index=1)):
        with pytest.raises(ValueError, match="not both"):
            nftf.dataset(src, 12, input_context=context, **plain_kwargs)
    nftf.dataset(src, 4, epoch=EPOCH_LIMIT - 1)
    with pytest.raises(ValueError, match=r"epoch must be an integer in \[0, 2\*\*62\)"):
        nftf.dataset(src, 4, epoch=EPOCH_LIMIT)


def test_a_wrong_type_raises_the_packages_argument_type_error(src, tmp_path):
    # ArgumentTypeError is a TypeError and a ValueError: code catching either keeps working.
    from npyfeed._checks import ArgumentTypeError

    rng = np.random.default_rng(1)
    factors = {"a": rng.standard_normal((20, 3)).astype(np.float32)}
    labels = {"a": rng.standard_normal((20, 2)).astype(np.float32)}
    index = [(5, 5, "a")]
    for options in ({"features": [0, "1"]}, {"features": 1.5}, {"nan": "zero"}, {"normalize": 0.5},
                    {"normalize": "ab"}):
        with pytest.raises(ArgumentTypeError):
            npyfeed.WindowSource.from_arrays(index, factors, labels, 4, **options)
    with pytest.raises(ArgumentTypeError, match="expected a path"):
        npyfeed.read_header(3.5)
    with pytest.raises(ArgumentTypeError, match="cannot find npyfeed statistics"):
        npyfeed.stats.raw_counts_of(object())
    if _keras3():
        import npyfeed.keras as nfk

        with pytest.raises(ArgumentTypeError, match="workers"):
            nfk.PyDataset(src, 8, workers="1")
        with pytest.raises(ValueError, match="workers") as e:
            nfk.PyDataset(src, 8, workers=2)
        assert not isinstance(e.value, TypeError)
