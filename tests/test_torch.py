"""npyfeed.torch.WindowDataset: each iter() is the next epoch of the numpy iterator (``src.batches``, the oracle)
for every order kind and rank, as tensors sharing npyfeed's batch memory; in a DataLoader; ranks from
torch.distributed; state_dict/load_state_dict (also through torchdata's StatefulDataLoader) resume with the next
batch, across epoch boundaries; worker processes and pickling are refused with the reason."""

from __future__ import annotations

import pickle

import npyfeed
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'npyfeed[torch]')")
import npyfeed.torch as nft  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

KINDS = [False, True, "blocks"]
KIND_IDS = ["in_order", "shuffled", "blocks"]
BUDGET = 1500  # bytes: blocks of one or two keys


@pytest.fixture(scope="module")
def src():
    rng = np.random.default_rng(9)
    keys = "abcdef"
    factors = {k: rng.standard_normal((30, 3)).astype(np.float32) for k in keys}
    labels = {k: rng.standard_normal((30, 2)).astype(np.float32) for k in keys}
    index = [(int(f), int(l), k) for k in keys for f, l in zip(rng.integers(3, 30, 9), rng.integers(0, 30, 9))]
    return npyfeed.WindowSource.from_arrays(index[:53], factors, labels, 4)


def _expected(src, epoch, start_batch=0, **kwargs):
    return list(src.batches(5, epoch=epoch, start_batch=start_batch, memory_budget=BUDGET, **kwargs))


def _assert_same(got, expected):
    assert len(got) == len(expected)
    for (x, y), (ex, ey) in zip(got, expected):
        assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
        assert x.dtype == torch.float32 and x.data_ptr() % 64 == 0
        np.testing.assert_array_equal(x.numpy(), ex, strict=True)
        np.testing.assert_array_equal(y.numpy(), ey, strict=True)


@pytest.mark.parametrize("shuffle", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("world_size, rank", [(1, 0), (3, 2)], ids=["whole", "rank_2_of_3"])
@pytest.mark.parametrize("drop_remainder", [False, True], ids=["keep_remainder", "drop_remainder"])
def test_each_pass_is_the_next_epoch_of_the_numpy_iterator(src, shuffle, world_size, rank, drop_remainder):
    kwargs = dict(shuffle=shuffle, seed=3, num_shards=world_size, shard_index=rank, drop_remainder=drop_remainder)
    ds = nft.WindowDataset(src, 5, shuffle=shuffle, seed=3, epoch=2, rank=rank, world_size=world_size,
                           drop_remainder=drop_remainder, memory_budget=BUDGET)
    assert (ds.rank, ds.world_size) == (rank, world_size)
    assert len(ds) == src.num_batches(5, num_shards=world_size, shard_index=rank, drop_remainder=drop_remainder)
    _assert_same(list(ds), _expected(src, 2, **kwargs))
    _assert_same(list(DataLoader(ds, batch_size=None, num_workers=0)), _expected(src, 3, **kwargs))
    ds.set_epoch(7)
    _assert_same(list(ds), _expected(src, 7, **kwargs))
    assert ds.epoch == 8
    assert ds.stats()["batches"] == 3 * len(ds) and ds.stats() == ds.plan.stats()


@pytest.mark.parametrize("shuffle", KINDS, ids=KIND_IDS)
def test_ranks_together_cover_each_epoch_exactly_once(src, shuffle):
    for epoch in (0, 5):
        seen = []
        for rank in range(4):
            ds = nft.WindowDataset(src, 5, shuffle=shuffle, seed=1, epoch=epoch, rank=rank, world_size=4,
                                   memory_budget=BUDGET)
            seen += [ds.plan.ids(epoch, b) for b in range(len(ds))]
        np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(len(src)))


def test_tensors_share_the_batch_memory(src, monkeypatch):
    arrays = []
    real = torch.from_numpy

    def from_numpy(a):
        arrays.append(a)
        return real(a)

    monkeypatch.setattr(nft.torch, "from_numpy", from_numpy)
    for x, y in DataLoader(nft.WindowDataset(src, 5, shuffle=True), batch_size=None, num_workers=0):
        assert x.data_ptr() == arrays[-2].ctypes.data and y.data_ptr() == arrays[-1].ctypes.data


def test_rank_and_world_size_come_from_torch_distributed(src, monkeypatch):
    dist = torch.distributed
    assert nft.WindowDataset(src, 5).world_size == 1  # not initialised: 0 of 1
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 3)
    ds = nft.WindowDataset(src, 5, shuffle=True, seed=4)
    assert (ds.rank, ds.world_size) == (1, 3)
    _assert_same(list(ds), _expected(src, 0, shuffle=True, seed=4, num_shards=3, shard_index=1))
    assert nft.WindowDataset(src, 5, rank=0, world_size=2).world_size == 2  # explicit arguments win


def test_a_real_process_group(src, tmp_path):
    dist = torch.distributed
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ds = nft.WindowDataset(src, 5, shuffle=True)
        assert (ds.rank, ds.world_size) == (0, 1)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("shuffle", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("stop_after", [3, 11, 14])  # within the first epoch, at its end (11 batches), in the next
def test_state_dict_resumes_with_the_next_batch(src, shuffle, stop_after):
    kwargs = dict(shuffle=shuffle, seed=6, memory_budget=BUDGET)
    ds = nft.WindowDataset(src, 5, epoch=1, **kwargs)
    assert len(ds) == 11
    taken, it = 0, iter(ds)
    while taken < stop_after:
        try:
            next(it)
            taken += 1
        except StopIteration:
            it = iter(ds)
    state = ds.state_dict()
    assert state == {"epoch": 1 + stop_after // 11, "batch": stop_after % 11}
    assert pickle.loads(pickle.dumps(state)) == state  # plain data
    resumed = nft.WindowDataset(src, 5, **kwargs)
    resumed.load_state_dict(state)
    e, b = state["epoch"], state["batch"]
    _assert_same(list(resumed), _expected(src, e, start_batch=b, shuffle=shuffle, seed=6))
    _assert_same(list(resumed), _expected(src, e + 1, shuffle=shuffle, seed=6))


def test_load_state_dict_checks_the_state(src):
    ds = nft.WindowDataset(src, 5)
    ds.load_state_dict({"epoch": 3, "batch": len(ds)})  # after an epoch's last batch: the next epoch's first
    assert ds.state_dict() == {"epoch": 4, "batch": 0}
    for bad in ({"epoch": 1}, None, {"epoch": 1, "batch": len(ds) + 1}, {"epoch": -1, "batch": 0}):
        with pytest.raises(ValueError):
            ds.load_state_dict(bad)


def test_stateful_dataloader_resumes_with_the_next_batch(src):
    sdl = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")
    kwargs = dict(shuffle=True, seed=8)
    loader = sdl.StatefulDataLoader(nft.WindowDataset(src, 5, **kwargs), batch_size=None, num_workers=0)
    first = list(loader)  # epoch 0
    it = iter(loader)  # epoch 1
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    restarted = sdl.StatefulDataLoader(nft.WindowDataset(src, 5, **kwargs), batch_size=None, num_workers=0)
    restarted.load_state_dict(state)
    _assert_same(first, _expected(src, 0, **kwargs))
    _assert_same(list(restarted), _expected(src, 1, start_batch=4, **kwargs))
    _assert_same(list(restarted), _expected(src, 2, **kwargs))


def test_worker_processes_and_pickling_are_refused(src, monkeypatch):
    ds = nft.WindowDataset(src, 5)
    # A spawned worker gets the dataset pickled: refused before any process starts. (A forked one is not
    # started here: this process has TensorFlow's and JAX's threads, and JAX warns at any fork.)
    with pytest.raises(RuntimeError, match="num_workers=0"):
        list(DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="spawn"))
    with pytest.raises(RuntimeError, match="num_workers=0"):
        pickle.dumps(ds)
    # Inside a worker (a forked one has the dataset without pickling), iterating is refused.
    monkeypatch.setattr(nft, "get_worker_info", lambda: object())
    with pytest.raises(RuntimeError, match="num_workers=0"):
        next(iter(ds))


@pytest.mark.parametrize("loader", ["default", "batch_size=4", "stateful"])
def test_a_loader_that_batches_the_batches_is_refused(src, loader):
    """DataLoader(ds) (batch_size=1 by default) would wrap each batch in one more dimension, (1, 5, W, F): refused
    when the pass starts, naming batch_size=None; with it, the batches are the numpy iterator's."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = nft.WindowDataset(src, 5)
    make = {"default": lambda **kw: DataLoader(ds, **kw), "batch_size=4": lambda: DataLoader(ds, batch_size=4),
            "stateful": lambda **kw: StatefulDataLoader(ds, **kw)}[loader]
    with pytest.raises(ValueError, match=r"whole batches: use DataLoader\(ds, batch_size=None\)"):
        iter(make())
    assert ds.epoch == 0 and ds.state_dict() == {"epoch": 0, "batch": 0}  # nothing was read
    if loader in ("default", "stateful"):
        _assert_same(list(make(batch_size=None)), _expected(src, 0))


def test_pin_memory(src):
    if not torch.cuda.is_available():
        pytest.skip("pin_memory needs an accelerator")
    for x, _y in DataLoader(nft.WindowDataset(src, 5), batch_size=None, num_workers=0, pin_memory=True):
        assert x.is_pinned()


def test_device_must_be_a_cuda_device(src):
    with pytest.raises(ValueError, match="CUDA device"):
        nft.WindowDataset(src, 5, device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            nft.WindowDataset(src, 5, device="cuda")


def test_pinned_plan_batches_are_page_locked_for_cuda(src):
    """Plan.batches(pin_memory=True) with PyTorch's own CUDA runtime: CUDA reports the batches as page-locked."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.cuda.init()
    plan = src.plan(5, shuffle=True, seed=4)
    with plan.batches(0, pin_memory=True) as pinned, plan.batches(0) as plain:
        for (x, y), (px, py) in zip(pinned, plain):
            assert torch.from_numpy(x).is_pinned() and torch.from_numpy(y).is_pinned()
            assert not torch.from_numpy(px).is_pinned()
            np.testing.assert_array_equal(x, px, strict=True)
            np.testing.assert_array_equal(y, py, strict=True)


@pytest.mark.parametrize("shuffle", KINDS, ids=KIND_IDS)
def test_batches_on_the_gpu_equal_the_numpy_iterator(src, shuffle):
    """device=: page-locked buffers copied on a stream of their own; on the GPU, each pass is the next epoch of
    the numpy iterator, element for element, also when the GPU is kept busy between batches (the host then
    gathers into buffers whose copies may still be running: they must not be)."""
    if not torch.cuda.is_available():
        pytest.skip("device= needs a CUDA GPU")
    ds = nft.WindowDataset(src, 5, shuffle=shuffle, seed=3, epoch=1, memory_budget=BUDGET, device="cuda")
    busy = torch.randn((2048, 2048), device="cuda")
    for epoch in (1, 2):
        got = []
        for x, y in ds:
            assert x.device.type == "cuda" and y.device.type == "cuda"
            for _ in range(3):  # work queued before the next copy's wait
                busy = torch.tanh(busy @ busy) / 2048
            got.append((x.cpu(), y.cpu()))
        _assert_same(got, _expected(src, epoch, shuffle=shuffle, seed=3))
    assert ds.epoch == 3


RANK = """
import sys
import numpy as np
import torch.distributed as dist
import npyfeed, npyfeed.torch

rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
rng = np.random.default_rng(9)
factors = {k: rng.standard_normal((30, 3)).astype(np.float32) for k in "abc"}
labels = {k: rng.standard_normal((30, 2)).astype(np.float32) for k in "abc"}
src = npyfeed.WindowSource.from_arrays([(r, r, k) for k in "abc" for r in range(3, 30)], factors, labels, 4)
ds = npyfeed.torch.WindowDataset(src, 5, shuffle=True, seed=2)  # rank and world size from the process group
assert (ds.rank, ds.world_size) == (rank, 2)
ids = []
for epoch in range(2):
    for b, (x, _y) in enumerate(ds):
        expected = src.get(ds.plan.ids(epoch, b))[0]
        assert np.array_equal(x.numpy(), expected)
        ids.append(ds.plan.ids(epoch, b) + epoch * len(src))
np.save(out, np.concatenate(ids))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_ranks_of_a_process_group_read_each_epoch_exactly_once(tmp_path):
    import subprocess
    import sys

    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(tmp_path / "store"),
                               str(tmp_path / f"ids{rank}.npy")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for rank in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, out + err[-4000:]
    ids = np.concatenate([np.load(tmp_path / f"ids{rank}.npy") for rank in range(2)])
    np.testing.assert_array_equal(np.sort(ids), np.arange(2 * 81))  # 2 epochs of 81 samples, each once
