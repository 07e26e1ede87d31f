"""npyfeed.torch.WindowDataset: each iter() is the next epoch of the numpy iterator (``src.batches``, the oracle)
for every order kind and rank, as tensors sharing npyfeed's batch memory; in a DataLoader; ranks from
torch.distributed; state_dict/load_state_dict (also through torchdata's StatefulDataLoader) resume with the next
batch, across epoch boundaries; worker processes and pickling are refused with the reason; gather="device" forms
the same batches on the device (the CPU here, a GPU where there is one), resident or streamed."""

from __future__ import annotations

import functools
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


@pytest.fixture(scope="module")
def pad_src():
    """Windows that start before their key's first row (bounds="pad": zero rows there), 1-d label files."""
    rng = np.random.default_rng(11)
    keys = "abcdefgh"
    factors = {k: rng.standard_normal((20 + i, 3)).astype(np.float32) for i, k in enumerate(keys)}
    labels = {k: rng.standard_normal(20 + i).astype(np.float32) for i, k in enumerate(keys)}
    index = [(f, f, k) for k in keys for f in range(20)]
    return npyfeed.WindowSource.from_arrays(index, factors, labels, 4, bounds="pad")


def _device_dataset(src, device, streamed, **kwargs):
    make = functools.partial(nft.WindowDataset, src, 5, memory_budget=BUDGET, gather="device", device=device, **kwargs)
    if not streamed:
        return make()
    # A byte under what the resident arrays and 4 batches need: over two blocks (BUDGET: blocks of a key or two).
    return make(device_memory_budget=make()._on_device.layout.needed_bytes - 1)


def _devices():
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("which", ["src", "pad_src"])
@pytest.mark.parametrize("shuffle, streamed", [(False, False), (True, False), ("blocks", False), ("blocks", True)],
                         ids=["in_order", "shuffled", "blocks", "blocks_streamed"])
def test_batches_formed_on_the_device_equal_the_numpy_iterator(request, device, which, shuffle, streamed):
    """gather="device": each pass is the next epoch of the numpy iterator, element for element, on the device;
    over the budget each block is uploaded once per epoch; a pass resumes at a saved batch, inside a group too."""
    src = request.getfixturevalue(which)
    ds = _device_dataset(src, device, streamed, shuffle=shuffle, seed=3, epoch=1, rank=1, world_size=2)
    assert ds._on_device.layout.streams == streamed
    resident_bytes = ds.stats()["device_bytes"]
    assert (resident_bytes == 0) == streamed  # resident: uploaded once, at construction
    kwargs = dict(shuffle=shuffle, seed=3, num_shards=2, shard_index=1)
    for epoch in (1, 2):
        got = list(ds)
        assert all(x.device.type == device and y.device.type == device for x, y in got)
        _assert_same([(x.cpu(), y.cpu()) for x, y in got], _expected(src, epoch, **kwargs))
    uploaded = ds.stats()["device_bytes"]
    assert uploaded > 2 * resident_bytes if streamed else uploaded == resident_bytes
    assert ds.stats()["batches"] == 2 * len(ds)
    start = 3
    if streamed:  # inside a group of several batches: its upload read, its first batches not served
        start = next(int(first) + 1 for first, end, _, _ in ds._on_device.host_rows.groups(4) if end - first > 1)
    ds.load_state_dict({"epoch": 4, "batch": start})
    _assert_same([(x.cpu(), y.cpu()) for x, y in ds], _expected(src, 4, start_batch=start, **kwargs))


@pytest.mark.parametrize("storage", ["float16", "bfloat16"])
def test_storage_dtype_rounds_once_as_torch(src, storage):
    """storage_dtype=: the arrays held in half precision, the batches converted back to float32 when formed: what
    rounding each value to that type gives."""
    ds = nft.WindowDataset(src, 5, shuffle=True, seed=2, gather="device", device="cpu", storage_dtype=storage)
    kind = getattr(torch, storage)
    got = list(ds)
    expected = _expected(src, 0, shuffle=True, seed=2)
    assert len(got) == len(expected)
    for (x, y), (ex, ey) in zip(got, expected):
        assert x.dtype == torch.float32
        assert torch.equal(x, torch.from_numpy(ex).to(kind).to(torch.float32))
        assert torch.equal(y, torch.from_numpy(ey).to(kind).to(torch.float32))
    assert not torch.equal(got[0][0], torch.from_numpy(expected[0][0]))  # rounded indeed


def test_device_gather_arguments(src, monkeypatch):
    with pytest.raises(ValueError, match="gather must be 'host' or 'device'"):
        nft.WindowDataset(src, 5, gather="gpu")
    with pytest.raises(TypeError, match="gather must be"):
        nft.WindowDataset(src, 5, gather=1)
    with pytest.raises(ValueError, match="needs device="):
        nft.WindowDataset(src, 5, gather="device")
    with pytest.raises(ValueError, match="gather='device' only"):
        nft.WindowDataset(src, 5, storage_dtype="float16")
    with pytest.raises(ValueError, match="storage_dtype"):
        nft.WindowDataset(src, 5, gather="device", device="cpu", storage_dtype="int8")
    with pytest.raises(ValueError, match=r"needs \d+ bytes .* over the device_memory_budget of 100 bytes.*shard_by"):
        nft.WindowDataset(src, 5, shuffle=True, gather="device", device="cpu", device_memory_budget=100)
    with pytest.raises(ValueError, match=r"holds 2 blocks of up to \d+ bytes.*device_memory_budget of 100 bytes"):
        nft.WindowDataset(src, 5, shuffle="blocks", memory_budget=BUDGET, gather="device", device="cpu",
                          device_memory_budget=100)
    with pytest.raises(ValueError, match="device_memory_budget"):
        nft.WindowDataset(src, 5, gather="device", device="cpu", device_memory_budget=0)
    with monkeypatch.context() as m:  # the default budget needs the free memory
        m.setattr(nft, "available_memory", lambda: None)
        with pytest.raises(ValueError, match="cannot tell the free memory of cpu; pass device_memory_budget"):
            nft.WindowDataset(src, 5, gather="device", device="cpu")
        assert nft.WindowDataset(src, 5, gather="device", device="cpu", device_memory_budget=1 << 20)
    transformed = npyfeed.WindowSource.from_arrays([(5, 5, "a")], {"a": np.ones((9, 3), np.float32)},
                                                   {"a": np.ones((9, 2), np.float32)}, 4, features=[0, 2])
    with pytest.raises(ValueError, match="does not apply features="):
        nft.WindowDataset(transformed, 1, gather="device", device="cpu")


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
